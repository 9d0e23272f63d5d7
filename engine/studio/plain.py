"""An answer the engine refuses, in plain words, and the stage prompt as the model reads it.

The repair call tells a model what JSON Schema found ("at $.updates.customer: Additional
properties are not allowed ('phone' was unexpected)"); a product owner playing the model
reads instead "this stage may not change `customer.phone` (it may change customer.name,
pet.type, ...)". :func:`refusal` walks every validation error of the answer, not only the
first, and says each in the funnel's terms: fields by their state path, actions by name.

:func:`stage_prompt` renders the current stage's prompt for the session as it is, with
the functions a turn uses (engine.turn.prompts, engine.turn.budget): the messages the
model would get, the customer's message and the recent ones shown as placeholders.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from jsonschema.exceptions import ValidationError

from ..funnel.compiled import CompiledFunnel, CompiledStage
from ..turn.budget import stable_part, turn_part
from ..turn.prompts import at_level, build_context, prompt_data, render_parts

__all__ = ["refusal", "stage_prompt"]

_TYPES = {"string": "text", "number": "a number", "integer": "a whole number",
          "boolean": "true or false", "array": "a list", "object": "an object ({...})",
          "null": "null"}
_MAX = 12  # sentences at most


def _json_type(value: Any) -> str:
    for kind, py in (("boolean", bool), ("integer", int), ("number", float), ("string", str),
                     ("array", list), ("object", dict)):
        if isinstance(value, py):
            return _TYPES[kind]
    return "null"


def _where(path: Iterable[Any]) -> str:
    """``updates.pet.type`` -> ``pet.type`` (a field); ``actions.0.reason`` ->
    ``actions[0].reason``."""
    parts = list(path)
    field = bool(parts) and parts[0] == "updates"
    if field:
        parts = parts[1:]
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or ("the updates" if field else "the answer")


def _allowed(stage: CompiledStage) -> list[str]:
    """The field paths the stage's updates may set (the schema's leaves, two deep)."""
    updates = (stage.schema.get("properties") or {}).get("updates") or {}
    out = []
    for name, node in (updates.get("properties") or {}).items():
        props = node.get("properties") if isinstance(node, dict) else None
        out += [f"{name}.{k}" for k in props] if props else [name]
    return out


def _sentences(error: ValidationError, stage: CompiledStage) -> list[str]:
    path, kind, value, schema = list(error.absolute_path), error.validator, error.instance, \
        error.schema if isinstance(error.schema, dict) else {}
    where = _where(path)
    if kind == "additionalProperties" and isinstance(value, dict):
        known = set(schema.get("properties") or {})
        extra = [k for k in value if k not in known]
        if path[:1] == ["updates"] or path == ["updates"]:
            allowed = _allowed(stage)
            may = f" (it may change {', '.join(allowed)})" if allowed else \
                " (it may change no field)"
            return [f"this stage may not change `{_where([*path, k])}`{may}" for k in extra]
        return [f"`{k}` is not part of {'an answer' if not path else '`' + where + '`'} "
                f"(it has {', '.join(sorted(known))})" for k in extra]
    if kind == "required" and isinstance(value, dict):
        missing = [k for k in schema.get("required") or () if k not in value]
        return [f"{'the answer' if not path else '`' + where + '`'} needs `{k}`"
                for k in missing]
    if kind in ("oneOf", "anyOf") and path[:1] == ["actions"] and isinstance(value, dict):
        variants = _variants(stage)
        offered = sorted(v for v in variants if v is not None)
        name = str(value.get("type"))
        if name not in offered:
            return [f"this stage offers no action `{name}` (it offers "
                    f"{', '.join(offered) or 'none'})"]
        at = variants.index(name)
        inner = [e for e in error.context or ()
                 if list(e.relative_schema_path)[:1] == [at]]
        return [s for e in inner for s in _sentences(e, stage)] or \
            [f"`{where}`: the action `{name}` is not filled in as it should be"]
    if kind == "const" and path[-1:] == ["type"] and path[:1] == ["actions"]:
        return []  # said by the oneOf above
    if kind == "enum":
        return [f"`{where}` is one of {', '.join(map(str, schema.get('enum') or ()))}; "
                f"not {value!r}"]
    if kind == "type":
        expected = schema.get("type")
        names = [_TYPES.get(str(t), str(t)) for t in (expected if isinstance(expected, list)
                                                       else [expected])]
        return [f"`{where}` is {' or '.join(names)}, not {_json_type(value)}"]
    if kind in ("maxLength", "minLength") and isinstance(value, str):
        if kind == "minLength":
            return [f"`{where}` may not be empty" if schema.get("minLength") == 1 else
                    f"`{where}` has at least {schema.get('minLength')} characters"]
        return [f"`{where}` has at most {schema.get('maxLength')} characters (this one "
                f"has {len(value)})"]
    if kind in ("maximum", "minimum", "exclusiveMaximum", "exclusiveMinimum"):
        word = {"maximum": "at most", "minimum": "at least", "exclusiveMaximum": "below",
                "exclusiveMinimum": "above"}[kind]
        return [f"`{where}` is {word} {schema.get(kind)}; not {value!r}"]
    if kind in ("maxItems", "minItems") and isinstance(value, list):
        word = "at most" if kind == "maxItems" else "at least"
        return [f"`{where}` holds {word} {schema.get(kind)} (this one holds {len(value)})"]
    if kind == "pattern" and path[-1:] == ["language"]:
        return [f"`{where}` is a two-letter language code such as `en`; not {value!r}"]
    return [f"`{where}`: {error.message[:200]}"]


def _variants(stage: CompiledStage) -> list[str | None]:
    """The actions the stage offers, in its schema's ``oneOf`` order."""
    root = stage.schema
    items = ((root.get("properties") or {}).get("actions") or {}).get("items") or {}
    out: list[str | None] = []
    for alt in items.get("oneOf") or items.get("anyOf") or [items]:
        ref = alt.get("$ref") if isinstance(alt, dict) else None
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            alt = (root.get("$defs") or {}).get(ref.rsplit("/", 1)[-1]) or {}
        const = ((alt.get("properties") or {}).get("type") or {}).get("const") \
            if isinstance(alt, dict) else None
        out.append(str(const) if const is not None else None)
    return out


def refusal(stage: CompiledStage, output: str, problem: str) -> list[str]:
    """Why the engine refuses ``output`` in ``stage``, sentence by sentence; ``problem``
    (what the repair call quotes) when the schema is not what refused it (the
    sanitizing boundary: blank text, control characters, size)."""
    try:
        data = json.loads(output)
    except ValueError:
        return ["the answer is not JSON: a model answers with one JSON object, such as "
                '{"reply": "Hello!"}']
    if not isinstance(data, dict):
        return [f"the answer is one JSON object ({{...}}), not {_json_type(data)}"]
    out: list[str] = []
    for error in sorted(stage.validator.iter_errors(data), key=lambda e: list(map(str, e.path))):
        for sentence in _sentences(error, stage):
            if sentence not in out:
                out.append(sentence)
    if not out:
        m = re.match(r"at \$\.?([^:]*): (.*)", problem, re.S)
        out = [f"`{m.group(1) or 'the answer'}`: {m.group(2)}" if m else problem]
    return out[:_MAX]


def stage_prompt(funnel: CompiledFunnel, row: Mapping[str, Any], stage_name: str,
                 now: datetime | None = None) -> dict[str, Any]:
    """The stage's prompt for the session's state as the model would read it next turn:
    the chat the turn assembles (system parts, summary and notices as data), with
    placeholders for the recent messages and the customer's message."""
    stage = funnel.stage(stage_name)
    state = dict(row)
    moment = (now or datetime.now(UTC)).isoformat()
    context = build_context(funnel, stage, state, state, customer_message="", messages=[],
                            returning=False, idle_seconds=None, now=moment)
    parts = render_parts(stage, at_level(funnel, stage, state, context, 0))
    summary, notices = prompt_data(funnel, state, state)
    window = stage.spec.memory.window
    recent = {"role": "…", "content": f"(the last {window} messages of the conversation)"}
    messages = [*stable_part(parts, summary, []), recent,
                *turn_part(parts, notices, "(the customer's next message)")]
    return {"stage": stage_name, "description": stage.spec.description,
            "messages": messages}
