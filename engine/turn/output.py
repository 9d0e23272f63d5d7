"""Model output: call the model, validate its answer against the stage schema, repair once.

The model proposes an envelope (``reply``, ``updates``, ``actions``,
``language``). It is parsed and validated against the stage's output schema;
on failure one repair call quotes the most relevant validation error (path and
message, ``jsonschema.exceptions.best_match``); if that fails too, the stage's
declared fallback reply is sent and nothing of the bad output is applied.

A null the model wrote for a property the stage's schema does not require and does not
let be null (a strict form, engine.llm.strict, makes the model write every property)
reads as the property's absence: it is dropped before validation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jsonschema.exceptions import best_match
from referencing.exceptions import Unresolvable

from ..boundary.sanitize import Rejected, model_json, printable
from ..errors import ModelError
from ..funnel.compiled import CompiledStage
from ..llm.models import Completion, Model, ModelRequest
from ..llm.strict import drop_forced_nulls
from ..records.calls import Call
from .stream import ReplyStream


@dataclass
class Answer:
    """What the model answered, as the engine will apply it."""

    envelope: dict[str, Any]
    completions: list[Completion]
    failures: int = 0
    fallback: bool = False
    error: str | None = None
    attempts: int = 0  # HTTP calls made, failed ones and retries included
    # Action calls the stage does not allow, dropped from an otherwise valid answer: the
    # reply and the allowed parts are kept, these are refused with a notice (steps.apply).
    dropped: list[dict[str, Any]] = field(default_factory=list)
    # The calls of a request that gave no answer at all (the first, or the repair, timed
    # out or failed after its retries): they spent time and tokens too, and are recorded.
    failed: list[Call] = field(default_factory=list)
    # The first call's request (its chat, schema and deadline): a claims repair
    # (engine.turn.truth) continues that chat, within the same deadline.
    request: ModelRequest | None = field(default=None, repr=False)

    @property
    def model(self) -> str | None:
        """The model that gave the last answer (a fallback model, when the primary failed)."""
        return self.completions[-1].model if self.completions else None


async def ask(model: Model, stage: CompiledStage, messages: list[dict[str, str]],
          session_id: str, turn: int, text: str,
          reply_check: Callable[[dict[str, Any]], str | None] | None = None,
          stable: int = 0, stream: ReplyStream | None = None, spent: float = 0.0,
          trimmed: tuple[str, ...] = (), fallback_reply: str | None = None) -> Answer:
    """Call the model, validate, repair once, else the stage's fallback.

    ``reply_check`` is one more validation of a schema-valid envelope (the reply's
    language, engine.turn.language): it returns the problem for the repair call, or None.
    Never raises for a model failure: the answer carries the error. Both calls
    share one deadline, ``model.deadline`` seconds from now. ``stable``: how many leading
    messages the next turn repeats (engine.turn.budget.Fitted.stable), for the prompt cache.
    ``stream``: the reply is shown as the model writes it (engine.turn.stream); a
    rejected answer is marked there, so that what replaces it says so. ``spent``: seconds
    the turn already waited on its way here (semantic recall's query), taken from the
    deadline. ``trimmed``: what the prompt budget cut (engine.turn.budget.Fitted.trimmed),
    carried on the request. ``fallback_reply``: the stage's fallback in the customer's
    language (``Turn.say``), picked by the caller, which knows the session; without it the
    stage's plain text (or the first language of its map).
    """
    deadline = time.monotonic() + stage.spec.model.deadline - spent
    on_text = stream.text if stream is not None else None
    request = ModelRequest(messages=messages, schema=stage.schema, stage=stage.spec.name,
                           settings=stage.spec.model, session_id=session_id, turn=turn,
                           user_text=text, deadline=deadline, stable=stable, on_text=on_text,
                           trimmed=trimmed)
    fallback = {"reply": fallback_reply if fallback_reply is not None
                else stage.spec.fallback.pick(None, None)}
    completions: list[Completion] = []
    try:
        first = await model.complete(request)
    except ModelError as exc:
        _reject(stream)
        return Answer(fallback, completions, fallback=True, error=str(exc),
                      attempts=exc.attempts, failed=list(exc.calls))
    completions.append(first)
    envelope, problem, dropped = _checked(parse_kept(stage, first.text), reply_check)
    if envelope is not None:
        return Answer(envelope, completions, attempts=first.attempts, dropped=dropped,
                      request=request)
    _reject(stream)
    repair = ModelRequest(
        messages=[*messages, {"role": "assistant", "content": printable(first.text, 4000)},
                  {"role": "user", "content": (
                      f"Your last answer was rejected: {problem}. Answer again with one "
                      "JSON object that satisfies the output schema; keep the same meaning.")}],
        schema=stage.schema, stage=stage.spec.name, settings=stage.spec.model,
        session_id=session_id, turn=turn, user_text=text, attempt=1, deadline=deadline,
        stable=stable, on_text=on_text)
    try:
        second = await model.complete(repair)
    except ModelError as exc:
        _reject(stream)
        return Answer(fallback, completions, failures=1, fallback=True,
                      error=f"{problem}; repair call failed: {exc}",
                      attempts=first.attempts + exc.attempts, failed=list(exc.calls))
    completions.append(second)
    attempts = first.attempts + second.attempts
    envelope, problem2, dropped = _checked(parse_kept(stage, second.text), reply_check)
    if envelope is not None:
        return Answer(envelope, completions, failures=1, attempts=attempts, dropped=dropped,
                      request=request)
    _reject(stream)
    return Answer(fallback, completions, failures=2, fallback=True,
                  error=f"{problem}; after repair: {problem2}", attempts=attempts)


async def repair_claims(model: Model, stage: CompiledStage, answer: Answer, problem: str,
                        fallback: str,
                        reply_check: Callable[[dict[str, Any]], str | None] | None = None,
                        stream: ReplyStream | None = None) -> Answer:
    """Ask the model once more for an ``answer`` whose reply made claims nothing backs
    (engine.claims): ``problem`` quotes each conflict. The new answer is validated as
    the first was (schema, language); one that fails, or a call that fails, gives the
    stage's ``fallback`` reply. The calls of ``answer`` stay counted in the result."""
    request = answer.request
    failures = answer.failures + 1
    if request is None or not answer.completions:  # pragma: no cover - a fallback has none
        return Answer({"reply": fallback}, answer.completions, failures=failures,
                      fallback=True, error=problem, attempts=answer.attempts)
    _reject(stream)
    repair = ModelRequest(
        messages=[*request.messages,
                  {"role": "assistant", "content": printable(answer.completions[-1].text, 4000)},
                  {"role": "user", "content": (
                      f"Your last reply was not sent: it claims what the shop cannot back: "
                      f"{problem}. Answer again with one JSON object that satisfies the output "
                      "schema: correct those claims from the catalog and the state, or leave "
                      "them out; keep the rest of the reply and the same updates and actions.")}],
        schema=request.schema, stage=request.stage, settings=request.settings,
        session_id=request.session_id, turn=request.turn, user_text=request.user_text,
        attempt=1 + answer.failures, deadline=request.deadline, stable=request.stable,
        on_text=request.on_text)
    completions = list(answer.completions)
    try:
        again = await model.complete(repair)
    except ModelError as exc:
        _reject(stream)
        return Answer({"reply": fallback}, completions, failures=failures, fallback=True,
                      error=f"reply claims refused: {problem}; repair call failed: {exc}",
                      attempts=answer.attempts + exc.attempts,
                      failed=[*answer.failed, *exc.calls])
    completions.append(again)
    attempts = answer.attempts + again.attempts
    envelope, invalid, dropped = _checked(parse_kept(stage, again.text), reply_check)
    if envelope is not None:
        return Answer(envelope, completions, failures=failures, attempts=attempts,
                      dropped=dropped, failed=list(answer.failed), request=request)
    _reject(stream)
    return Answer({"reply": fallback}, completions, failures=failures + 1, fallback=True,
                  error=f"reply claims refused: {problem}; after repair: {invalid}",
                  attempts=attempts, failed=list(answer.failed))


def _reject(stream: ReplyStream | None) -> None:
    if stream is not None:
        stream.rejected()


Kept = tuple[dict[str, Any] | None, str, list[dict[str, Any]]]


def _checked(parsed: Kept, check: Callable[[dict[str, Any]], str | None] | None) -> Kept:
    envelope, problem, dropped = parsed
    if envelope is None or check is None:
        return parsed
    problem = check(envelope) or ""
    return (None, problem, []) if problem else (envelope, "", dropped)


def parse_kept(stage: CompiledStage, text: str) -> Kept:
    """:func:`parse_output`, keeping an answer whose only fault is an action the stage does
    not allow: (envelope without those calls, "", the calls dropped).

    Throwing the whole answer away for one refused action (a repair, then the
    fallback) costs the customer the reply; the engine refuses the action instead.
    """
    envelope, problem = parse_output(stage, text)
    if envelope is not None:
        return envelope, problem, []
    try:
        data = _loaded(stage, text)
    except Rejected:
        return envelope, problem, []
    calls = data.get("actions")
    if not isinstance(calls, list):
        return envelope, problem, []
    dropped = [c for c in calls if isinstance(c, dict)
               and c.get("type") not in stage.allowed_actions]
    if not dropped:
        return envelope, problem, []
    kept = [c for c in calls if not any(c is d for d in dropped)]
    data = {**data, "actions": kept}
    if not kept and "actions" not in stage.schema.get("properties", {}):
        data.pop("actions")
    if stage.validator.is_valid(data):
        return data, "", dropped
    return envelope, problem, []


def _loaded(stage: CompiledStage, text: str) -> dict[str, Any]:
    """The envelope in ``text`` (:func:`model_json`), without the nulls a strict form
    forced (engine.llm.strict.drop_forced_nulls)."""
    data = model_json(text)
    if "null" in text:  # most answers hold none: no walk
        drop_forced_nulls(data, stage.schema)
    return data


def parse_output(stage: CompiledStage, text: str) -> tuple[dict[str, Any] | None, str]:
    """Parse and validate a model output; return (envelope, "") or (None, the problem).

    The text crosses the sanitizing boundary first (:mod:`engine.boundary.sanitize`: strict
    JSON, bounded, clean strings, a usable envelope); then the stage schema. The
    problem names the JSON path and message of the most relevant validation error
    (``jsonschema.exceptions.best_match``), for the repair call. Never raises: a
    schema that cannot be evaluated (a dangling ``$ref``) makes the output invalid,
    so the turn ends in the fallback and the turn record names the schema's fault.
    """
    try:
        data = _loaded(stage, text)
    except Rejected as exc:
        return None, str(exc)
    fast = stage.fast_validator
    if fast is not None and fast.is_valid(data):
        return data, ""  # the common case; jsonschema below only explains a rejection
    try:
        error = best_match(stage.validator.iter_errors(data))
    except (Unresolvable, RecursionError) as exc:
        where = stage.spec.schema.name if stage.spec.schema else "(derived)"
        return None, (f"the output schema {where} cannot be evaluated "
                      f"({type(exc).__name__}: {str(exc)[:200]}); fix the schema")
    if error is not None:
        return None, f"at {error.json_path}: {error.message[:300]}"
    return data, ""
