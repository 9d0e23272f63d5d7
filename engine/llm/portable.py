"""The portable form of a stage schema: what is sent to a model, never what is enforced.

Providers and grammar-based servers (llama.cpp, vLLM's guided decoding,
Ollama) each accept a different subset of JSON Schema; a keyword one of
them cannot compile makes it drop the request or ignore the schema. The
portable form keeps what constrains the *shape* of the answer and moves the
rest into words:

- local ``$ref``s (``#/$defs/...``, ``#/definitions/...``) are inlined and
  ``$defs``/``definitions``/``$schema``/``$id`` dropped (recursive references
  stop at :data:`MAX_DEPTH` as ``{}``);
- ``oneOf`` becomes ``anyOf`` (the same answers pass when the branches are
  disjoint, as an envelope's action types are);
- bounds (``minLength``, ``maxLength``, ``pattern``, ``format``, ``minimum``,
  ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``, ``multipleOf``,
  ``minItems``, ``maxItems``, ``uniqueItems``, ``minProperties``,
  ``maxProperties``) move into the ``description`` as a sentence, e.g.
  ``"What the customer sees. (at most 1500 characters; at least 1 character)"``;
- ``type``, ``properties``, ``required``, ``additionalProperties``, ``items``,
  ``enum``, ``const``, ``anyOf``, ``allOf``, ``description`` and ``title`` stay.

The engine still validates every answer against the full stage schema; a bound
the model did not keep is caught there and repaired once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_DEPTH = 32

_KEEP = frozenset({"type", "properties", "required", "additionalProperties", "items", "enum",
                   "const", "anyOf", "allOf", "description", "title", "default"})
_SUBSCHEMA_LISTS = ("anyOf", "allOf", "oneOf")
_BOUNDS: dict[str, str] = {
    "minLength": "at least {} characters",
    "maxLength": "at most {} characters",
    "pattern": "matching the regular expression {}",
    "format": "in {} format",
    "minimum": "at least {}",
    "maximum": "at most {}",
    "exclusiveMinimum": "more than {}",
    "exclusiveMaximum": "less than {}",
    "multipleOf": "a multiple of {}",
    "minItems": "at least {} items",
    "maxItems": "at most {} items",
    "uniqueItems": "items unique",
    "minProperties": "at least {} keys",
    "maxProperties": "at most {} keys",
}


def portable_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The portable form of ``schema`` (see the module docstring); the input is not changed."""
    root = dict(schema)
    defs: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        if isinstance(root.get(key), Mapping):
            defs.update({f"#/{key}/{name}": value for name, value in root[key].items()})
    out = _convert(root, defs, 0)
    return out if isinstance(out, dict) else {}


def _convert(node: Any, defs: Mapping[str, Any], depth: int) -> Any:
    if not isinstance(node, Mapping):
        return node
    if depth > MAX_DEPTH:
        return {}
    ref = node.get("$ref")
    if isinstance(ref, str):
        target = defs.get(ref)
        if target is None:
            return {}  # a reference the model could not follow anyway
        # Keywords next to the $ref (a description) win over the target's.
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs, depth + 1)
    out: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in node.items():
        if key in _BOUNDS:
            if key == "uniqueItems":
                if value is True:
                    notes.append(_BOUNDS[key])
            else:
                notes.append(_BOUNDS[key].format(_word(value)))
        elif key == "properties" and isinstance(value, Mapping):
            out[key] = {name: _convert(sub, defs, depth + 1) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
            out[key] = _convert(value, defs, depth + 1)
        elif key in _SUBSCHEMA_LISTS:
            if isinstance(value, list):  # anything else is no schema: dropped
                target = "anyOf" if key == "oneOf" else key
                before = out.get(target)
                out[target] = (before if isinstance(before, list) else []) + [
                    _convert(sub, defs, depth + 1) for sub in value]
        elif key in _KEEP:
            out[key] = value
    if notes:
        sentence = "(" + "; ".join(notes) + ")"
        text = out.get("description")
        out["description"] = f"{text} {sentence}" if isinstance(text, str) and text \
            else sentence
    return out


def _word(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
