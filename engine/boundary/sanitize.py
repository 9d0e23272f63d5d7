"""The one boundary for text that comes from outside: model output and JSON request bodies.

Everything a model returns passes :func:`model_json` before any schema sees
it, and every JSON body the service reads passes :func:`loads_bounded`. Both
parse strictly and bound what they accept, so that nothing downstream (the
state merge, jsonb, the message log, the customer's screen) meets a value it
cannot hold:

- strict JSON only (orjson): no ``NaN``/``Infinity``, no lone surrogates,
  no numbers that overflow a double;
- bounded: total size, nesting depth, number of values;
- clean strings (keys too): no NUL, no control characters other than ``\\n``
  and ``\\t``, no bidirectional overrides (they make text read differently
  from what it is);
- an envelope's ``reply`` is non-blank and at most :data:`MAX_REPLY_CHARS`;
  ``actions`` at most :data:`MAX_ACTIONS`; ``language`` a short language tag.

A value that fails is reported as a :class:`Rejected` problem, never raised as
anything else: the caller turns it into a repair prompt or the fallback (model
output) or a 400 (request bodies). See docs/robustness.md.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

MAX_OUTPUT_CHARS = 64_000  # a model answer larger than this is not a chat turn
MAX_DEPTH = 32
MAX_VALUES = 5_000
MAX_REPLY_CHARS = 4_000
MAX_ACTIONS = 20
EXCERPT_CHARS = 40
# The most tokens one model call may be counted for: above any model's context and
# output. A provider's `usage` beyond it (3e9) would overflow the turn record's int4
# columns and throw a valid answer away; a negative count would make a counter go down.
MAX_CALL_TOKENS = 10_000_000

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)
# C0 and C1 controls except \t and \n, DEL, the bidi embeddings/overrides/isolates,
# and the line/paragraph separators (they break one-reply-per-line consumers).
_BAD_CHARS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# Either of the two: most texts hold neither, and one search tells that for half of two
# subs' or searches' work (printable and clean_text run a dozen times a turn; measured
# with callgrind, bench/turn_instructions.py).
_REFUSED = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029"
                      "\ud800-\udfff]")
_LANGUAGE = re.compile(r"[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8}){0,3}")


def token_count(value: Any) -> int:
    """A provider's token count as the engine records it: an integer in
    ``[0, MAX_CALL_TOKENS]``. Not a number (a string, NaN, a bool) counts 0, a negative
    count 0, a larger one :data:`MAX_CALL_TOKENS`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if value != value or value <= 0:  # NaN, negative
        return 0
    return MAX_CALL_TOKENS if value >= MAX_CALL_TOKENS else int(value)


class Rejected(ValueError):
    """A value crossed the boundary in a form the engine does not take; ``str()`` says why."""


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """A short, quoted, single-line excerpt of text from a model or a customer, for
    notices and error messages: never more than ``limit`` characters of it."""
    text = value if isinstance(value, str) else repr(value)
    text = _SURROGATE.sub("\ufffd", _BAD_CHARS.sub(" ", " ".join(text.split())))
    if len(text) > limit:
        text = text[:limit] + f"… ({len(text)} chars)"
    return f"'{text}'" if isinstance(value, str) else text


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with lone surrogates and refused characters replaced by U+FFFD, clipped to
    ``limit``: safe to log, to store in a text column and to send back to a model."""
    if _REFUSED.search(text) is not None:
        text = _BAD_CHARS.sub("\ufffd", _SURROGATE.sub("\ufffd", text))
    return text if limit is None or len(text) <= limit else text[:limit] + "…"


def clean_text(text: str, where: str) -> None:
    """Check one string: no lone surrogates, NUL or control characters but ``\\n``/``\\t``.

    Raises:
        Rejected: names ``where`` and the first offending character.
    """
    if _REFUSED.search(text) is None:
        return
    bad = _SURROGATE.search(text) or _BAD_CHARS.search(text)
    if bad is not None:
        raise Rejected(f"at {where}: the text holds the character U+{ord(bad.group()):04X} "
                       f"at position {bad.start()}; use plain text")


def check_tree(data: Any, *, max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES,
               clean: bool = True) -> None:
    """Walk a parsed JSON value (iteratively: no recursion to exhaust) and bound it.

    ``clean`` also checks every string and key with :func:`clean_text` (model output);
    without it only lone surrogates are refused (request bodies carry customer text,
    which may hold a control character the message log takes as it is).

    Raises:
        Rejected: too deep, too many values, a non-finite number, or a bad string.
    """
    stack: list[tuple[Any, str, int]] = [(data, "$", 0)]
    seen = 0
    while stack:
        value, path, depth = stack.pop()
        seen += 1
        if seen > max_values:
            raise Rejected(f"the value holds more than {max_values} items")
        if depth > max_depth:
            raise Rejected(f"at {path}: nested deeper than {max_depth} levels")
        if isinstance(value, str):
            if clean:
                clean_text(value, path)
            elif _SURROGATE.search(value):
                raise Rejected(f"at {path}: a lone surrogate is not valid Unicode")
        elif isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                raise Rejected(f"at {path}: {value} is not a finite number")
        elif isinstance(value, dict):
            for key, item in value.items():
                if clean:
                    clean_text(key, f"{path} (a key)")
                stack.append((item, f"{path}.{key[:EXCERPT_CHARS]}", depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))


def max_nesting(raw: bytes | str) -> int:
    """The deepest ``[``/``{`` nesting of JSON text, found without parsing it (strings are
    skipped), so that a body nested 20,000 deep is refused before any parser recurses."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _openers(raw: bytes | str) -> int:
    """How many ``[`` and ``{`` the text holds, in strings too: at least its nesting."""
    if isinstance(raw, str):
        return raw.count("[") + raw.count("{")
    return raw.count(b"[") + raw.count(b"{")


def loads_bounded(raw: bytes | str, *, max_depth: int = MAX_DEPTH,
                  max_values: int = MAX_VALUES, clean: bool = True) -> Any:
    """Parse JSON text strictly and bound it (see the module docstring).

    Raises:
        Rejected: not strict JSON, or outside the bounds; the message says which.
    """
    # Each level of nesting opens a bracket: a text with no more of them than max_depth
    # (nearly every answer and body) cannot be too deep, and is not walked byte by byte
    # in Python (a model's answer cost ~60,000 instructions there; callgrind,
    # bench/turn_instructions.py).
    if _openers(raw) > max_depth and max_nesting(raw) > max_depth:
        raise Rejected(f"the JSON is nested deeper than {max_depth} levels")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Rejected(f"not valid JSON ({exc})") from None
    check_tree(data, max_depth=max_depth, max_values=max_values, clean=clean)
    return data


def model_json(text: str) -> dict[str, Any]:
    """A model's answer as a bounded JSON object with a usable envelope, before the schema.

    A single fenced block (```json ... ```) is unwrapped; anything else around the
    object is not JSON and is refused.

    Raises:
        Rejected: the problem, worded for the repair prompt.
    """
    if len(text) > MAX_OUTPUT_CHARS:
        raise Rejected(f"the answer has {len(text)} characters; answer with one JSON object "
                       f"of at most {MAX_OUTPUT_CHARS}")
    if _SURROGATE.search(text):
        raise Rejected("the answer holds a lone surrogate; it is not valid Unicode")
    fenced = _FENCE.match(text)
    raw = fenced.group(1) if fenced else text.strip()
    data = loads_bounded(raw)
    if not isinstance(data, dict):
        raise Rejected("the output must be a JSON object with `reply`")
    check_envelope(data)
    return data


def check_envelope(data: dict[str, Any]) -> None:
    """The envelope's own shape, whatever the stage schema says.

    A schema that passes ``funnel validate`` need not type ``updates`` or the
    ``actions`` items, and the turn must not crash on them.

    Raises:
        Rejected: the first problem, with its JSON path.
    """
    reply = data.get("reply")
    if not isinstance(reply, str) or not reply.strip():
        raise Rejected("at $.reply: the reply must be non-blank text; write what the "
                       "customer reads")
    if len(reply) > MAX_REPLY_CHARS:
        raise Rejected(f"at $.reply: {len(reply)} characters; keep it under "
                       f"{MAX_REPLY_CHARS}")
    if not isinstance(data.get("updates") or {}, dict):
        raise Rejected("at $.updates: must be an object of state fields")
    actions = data.get("actions") or []
    if not isinstance(actions, list) or not all(isinstance(a, dict) for a in actions):
        raise Rejected("at $.actions: must be a list of objects, each with a `type`")
    if len(actions) > MAX_ACTIONS:
        raise Rejected(f"at $.actions: {len(actions)} actions; at most {MAX_ACTIONS} a turn")
    language = data.get("language")
    if language is not None and not (isinstance(language, str)
                                     and _LANGUAGE.fullmatch(language)):
        raise Rejected(f"at $.language: {excerpt(language)} is not a language tag such "
                       "as 'en' or 'uk'")
