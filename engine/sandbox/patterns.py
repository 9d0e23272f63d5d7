"""Regular expressions a funnel's author writes, run in linear time.

A funnel declares patterns (a schema's ``pattern`` and ``patternProperties`` in
stage output schemas and state fields, a scripted model's ``match``, a
scenario's ``reply_matches``), and customer or model text is matched against
them. Python's ``re`` backtracks: the common "letters and spaces" pattern
``^([a-zA-Z]+\\s?)+$`` takes seconds on a 28-character name, on the event loop.
So every such pattern is compiled and run by RE2 (PyPI ``google-re2``), whose
time is linear in the text; a pattern RE2 cannot run (a backreference, a
lookaround) is refused by ``funnel validate`` with the reason (:func:`problem`),
and by the load.

:func:`linear_validator` is a jsonschema Draft 2020-12 validator whose
``pattern``, ``patternProperties`` and ``additionalProperties`` match with RE2,
so that the explanation of a rejection (jsonschema re-runs the schema) is linear
too; the fast validator (jsonschema-rs) is told to use its linear engine.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

import jsonschema
import re2
from jsonschema import ValidationError

__all__ = ["PatternRefused", "compile_linear", "linear_validator", "problem",
           "schema_patterns"]

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # RE2 would print every refusal on stderr


class PatternRefused(ValueError):
    """A pattern RE2 cannot run (in linear time); the message says why."""


def _translate(pattern: str) -> str:
    """ECMA-262 / Python spellings RE2 reads otherwise: ``\\uXXXX`` is ``\\x{XXXX}``."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            hexdigits = pattern[i + 2:i + 6]
            if nxt == "u" and len(hexdigits) == 4 and all(
                    c in "0123456789abcdefABCDEF" for c in hexdigits):
                out.append("\\x{" + hexdigits + "}")
                i += 6
                continue
            out.append(pattern[i:i + 2])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


@lru_cache(maxsize=1024)
def compile_linear(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (``search``/``fullmatch`` as ``re``'s, linear time).

    Raises:
        PatternRefused: RE2 cannot run it (the message says why and what to write).
    """
    if not isinstance(pattern, str):
        raise PatternRefused(f"a pattern must be a string, not {type(pattern).__name__}")
    try:
        return re2.compile(_translate(pattern), _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) \
            else str(exc)
        raise PatternRefused(
            f"the pattern {pattern[:80]!r} cannot run in linear time ({reason}); "
            "backreferences and lookarounds are not supported: rewrite it without them "
            "(RE2 syntax, https://github.com/google/re2/wiki/Syntax)") from None


def problem(pattern: Any) -> str | None:
    """Why ``pattern`` is refused, or None when RE2 runs it."""
    try:
        compile_linear(pattern)
    except PatternRefused as exc:
        return str(exc)
    return None


_NOT_SCHEMAS = ("const", "enum", "default", "examples")


def schema_patterns(node: Any, keys: tuple[str | int, ...] = ()
                    ) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """Every pattern of a JSON Schema with where it is written: each ``pattern``
    value and each ``patternProperties`` key (``keys`` ends at it)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _NOT_SCHEMAS:
                continue
            if key == "pattern" and not isinstance(value, dict):
                yield (*keys, key), value
            elif key == "patternProperties" and isinstance(value, dict):
                for name, sub in value.items():
                    yield (*keys, key, name), name
                    yield from schema_patterns(sub, (*keys, key, name))
                continue
            yield from schema_patterns(value, (*keys, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from schema_patterns(value, (*keys, i))


def _search(pattern: str, text: str) -> bool:
    try:
        return compile_linear(pattern).search(text) is not None
    except PatternRefused:
        return False  # refused at validate and load: never reached by a loaded funnel


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any
             ) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any
                        ) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key,
                                             schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any,
                           schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = sorted({k for k in instance if k not in properties
                     and not any(_search(p, k) for p in patterns)}, key=str)
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            listed = ", ".join(map(repr, extras))
            yield ValidationError(f"{listed} {verb} not match any of the regexes: "
                                  + ", ".join(map(repr, sorted(patterns))))
        else:
            was = "was" if len(extras) == 1 else "were"
            yield ValidationError("Additional properties are not allowed "
                                  f"({', '.join(map(repr, extras))} {was} unexpected)")


LinearValidator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft202012Validator,
    {"pattern": _pattern, "patternProperties": _pattern_properties,
     "additionalProperties": _additional_properties})


def linear_validator(schema: Any) -> jsonschema.Draft202012Validator:
    """A Draft 2020-12 validator of ``schema`` whose patterns run on RE2."""
    return LinearValidator(schema)  # type: ignore[no-any-return]
