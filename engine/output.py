"""Model output: call the model, validate its answer against the stage schema, repair once.

The model proposes an envelope (``reply``, ``updates``, ``actions``,
``language``). It is parsed and validated against the stage's output schema;
on failure one repair call quotes the most relevant validation error (path and
message, ``jsonschema.exceptions.best_match``); if that fails too, the stage's
declared fallback reply is sent and nothing of the bad output is applied.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from jsonschema.exceptions import best_match

from .errors import ModelError
from .funnel import CompiledStage
from .models import Completion, Model, ModelRequest

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


@dataclass
class Answer:
    """What the model answered, as the engine will apply it."""

    envelope: dict[str, Any]
    completions: list[Completion]
    failures: int = 0
    fallback: bool = False
    error: str | None = None


async def ask(model: Model, stage: CompiledStage, messages: list[dict[str, str]],
          session_id: str, turn: int, text: str,
          reply_check: Callable[[dict[str, Any]], str | None] | None = None) -> Answer:
    """Call the model, validate, repair once, else the stage's fallback.

    ``reply_check`` is one more validation of a schema-valid envelope (the reply's
    language, engine.language): it returns the problem for the repair call, or None.
    Never raises for a model failure: the answer carries the error.
    """
    request = ModelRequest(messages=messages, schema=stage.schema, stage=stage.spec.name,
                           settings=stage.spec.model, session_id=session_id, turn=turn,
                           user_text=text)
    fallback = {"reply": stage.spec.fallback}
    completions: list[Completion] = []
    try:
        first = await model.complete(request)
    except ModelError as exc:
        return Answer(fallback, completions, fallback=True, error=str(exc))
    completions.append(first)
    envelope, problem = _checked(parse_output(stage, first.text), reply_check)
    if envelope is not None:
        return Answer(envelope, completions)
    repair = ModelRequest(
        messages=[*messages, {"role": "assistant", "content": first.text[:4000]},
                  {"role": "user", "content": (
                      f"Your last answer was rejected: {problem}. Answer again with one "
                      "JSON object that satisfies the output schema; keep the same meaning.")}],
        schema=stage.schema, stage=stage.spec.name, settings=stage.spec.model,
        session_id=session_id, turn=turn, user_text=text, attempt=1)
    try:
        second = await model.complete(repair)
    except ModelError as exc:
        return Answer(fallback, completions, failures=1, fallback=True,
                       error=f"{problem}; repair call failed: {exc}")
    completions.append(second)
    envelope, problem2 = _checked(parse_output(stage, second.text), reply_check)
    if envelope is not None:
        return Answer(envelope, completions, failures=1)
    return Answer(fallback, completions, failures=2, fallback=True,
                   error=f"{problem}; after repair: {problem2}")


def _checked(parsed: tuple[dict[str, Any] | None, str],
             check: Callable[[dict[str, Any]], str | None] | None
             ) -> tuple[dict[str, Any] | None, str]:
    envelope, problem = parsed
    if envelope is None or check is None:
        return parsed
    problem = check(envelope) or ""
    return (None, problem) if problem else (envelope, "")


def parse_output(stage: CompiledStage, text: str) -> tuple[dict[str, Any] | None, str]:
    """Parse and validate a model output; return (envelope, "") or (None, the problem).

    The problem names the JSON path and message of the most relevant
    validation error (``jsonschema.exceptions.best_match``), for the repair call.
    """
    fenced = _FENCE.match(text)
    raw = fenced.group(1) if fenced else text.strip()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:  # the standard library accepts a little more, and words its errors better
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            return None, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if not isinstance(data, dict):
        return None, "the output must be a JSON object with `reply`"
    error = best_match(stage.validator.iter_errors(data))
    if error is not None:
        return None, f"at {error.json_path}: {error.message}"
    # The envelope's shape is checked here too: a schema that passes `funnel validate`
    # need not type `updates` or `actions` items, and the turn must not crash on them.
    if not isinstance(data.get("updates") or {}, dict):
        return None, "at $.updates: must be an object of state fields"
    actions = data.get("actions") or []
    if not isinstance(actions, list) or not all(isinstance(a, dict) for a in actions):
        return None, "at $.actions: must be a list of objects, each with a `type`"
    return data, ""
