"""The reply of an envelope that is still arriving: a partial-JSON read, for streaming.

A streamed model answer is the envelope's JSON text, a piece at a time. What may
be shown of it before it is whole is the ``reply`` string as far as it has
arrived, and nothing else. :class:`PartialReply` reads the pieces as they come, each
character once: a small scanner of the top-level object (an opening code fence
skipped) finds the ``reply`` key, then decodes its string as far as it has arrived
(an escape cut in two, or a high surrogate whose low half has not come, waits for
the next piece), through the same character rules as a whole answer
(:func:`engine.boundary.sanitize.printable`), clipped to
:data:`~engine.boundary.sanitize.MAX_REPLY_CHARS`. Its cost is linear in the answer:
the pieces are never joined and re-read (a 60,000-character answer sent a character a
chunk costs what it costs whole, bench/stream_chunks.py). Once the reply string has
ended, or the text cannot hold one (not an object, a ``reply`` that is not a string,
more than :data:`~engine.boundary.sanitize.MAX_OUTPUT_CHARS`), the rest is not read.

Nothing read here is applied: the whole answer crosses
:func:`~engine.boundary.sanitize.model_json` and the stage schema before it changes
anything.
"""

from __future__ import annotations

import json
import re

from .sanitize import MAX_OUTPUT_CHARS, MAX_REPLY_CHARS, printable

__all__ = ["PartialReply", "partial_reply"]

_FENCE = "```json"
_MAX_HEAD = 64  # characters before the object's "{" (whitespace, a fence): past it, none
_MAX_KEY = 64  # a longer key is not "reply": its characters are skipped, not kept
# A run of string characters that needs no decoding, and a complete escape.
_PLAIN = re.compile(r'[^"\\]+')
_ESCAPE = re.compile(r'\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})')
_HIGH = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")
# What a skipped value may hold between the places the scanner looks at.
_SKIP = re.compile(r'[^"{}\[\],]+')
_STRING_END = re.compile(r'["\\]')
_CUT = re.compile(r"\\(?:u[0-9a-fA-F]{0,3})?")
_SPACE = " \t\r\n"
_HEAD_OK = re.compile(r"\s*(?:```(?:json)?\s*)?")

# Scanner states.
_HEAD, _KEY_OR_END, _KEY, _COLON, _VALUE, _SKIP_STRING, _SKIP_NESTED, _SKIP_SCALAR, \
    _AFTER_VALUE, _REPLY, _DONE = range(11)


class PartialReply:
    """The ``reply`` of an envelope fed a piece at a time (:meth:`feed`).

    ``text`` is the reply so far (printable, clipped); ``started`` says whether the
    reply string has begun; ``ended`` whether nothing more will be read.
    """

    def __init__(self) -> None:
        self.text = ""
        self.started = False
        self.ended = False
        self._state = _HEAD
        self._head = ""
        self._key: list[str] = []
        self._key_len = 0
        self._is_reply = False
        self._escape = False  # in a skipped string, the last character was a backslash
        self._depth = 0  # of a skipped object or array
        self._in_string = False  # in a skipped object or array, inside a string
        self._after_key = False  # the skipped string is a key (too long, or escaped)
        self._tail = ""  # of the reply string: an escape cut in two, waiting
        self._seen = 0

    def feed(self, piece: str) -> str:
        """Read the next ``piece`` of the answer; returns what it added to the reply."""
        if self.ended or not piece:
            return ""
        self._seen += len(piece)
        if self._seen > MAX_OUTPUT_CHARS:
            self.ended = True  # no answer the engine takes is this long
            return ""
        before = len(self.text)
        self._scan(piece)
        return self.text[before:] if len(self.text) > before else ""

    def _scan(self, s: str) -> None:
        i, n = 0, len(s)
        while i < n and not self.ended:
            state = self._state
            if state == _REPLY:
                i = self._reply(s, i)
            elif state == _HEAD:
                i = self._opening(s, i)
            elif state == _SKIP_STRING:
                i = self._skip_string(s, i)
            elif state == _SKIP_NESTED:
                i = self._skip_nested(s, i)
            elif state == _KEY:
                i = self._read_key(s, i)
            else:
                c = s[i]
                i += 1
                if c in _SPACE:
                    continue
                if state == _KEY_OR_END:
                    if c == '"':
                        self._key, self._key_len, self._state = [], 0, _KEY
                    elif c != "}":
                        self.ended = c != ","  # a stray comma is the whole answer's problem
                    else:
                        self.ended = True
                elif state == _COLON:
                    if c == ":":
                        self._state = _VALUE
                    else:
                        self.ended = True
                elif state == _VALUE:
                    self._value(c)
                elif state == _SKIP_SCALAR:
                    if c in ",}":
                        self._after_value(c)
                elif state == _AFTER_VALUE:
                    self._after_value(c)

    def _opening(self, s: str, i: int) -> int:
        """Before the object: whitespace and an opening fence (```json) are skipped."""
        brace = s.find("{", i)
        self._head += s[i:] if brace < 0 else s[i:brace]
        ok = _HEAD_OK.fullmatch(self._head) is not None or (
            brace < 0 and _FENCE.startswith(self._head.lstrip()))
        if not ok or len(self._head) > _MAX_HEAD:
            self.ended = True
            return len(s)
        if brace < 0:
            return len(s)
        self._state = _KEY_OR_END
        return brace + 1

    def _read_key(self, s: str, i: int) -> int:
        m = _STRING_END.search(s, i)
        end = m.start() if m else len(s)
        if self._key_len <= _MAX_KEY:
            self._key.append(s[i:end])
        self._key_len += end - i
        if m is None:
            return end
        if s[end] == "\\":  # "reply" has no escape: this key is another one
            self._key_len = _MAX_KEY + 1
            self._state, self._escape = _SKIP_STRING, False
            self._is_reply = False
            self._after_key = True
            return end
        self._is_reply = self._key_len == 5 and "".join(self._key) == "reply"
        self._state = _COLON
        return end + 1

    def _value(self, c: str) -> None:
        if self._is_reply:
            if c == '"':
                self._state, self.started = _REPLY, True
            else:
                self.ended = True  # a reply that is not a string shows nothing
        elif c == '"':
            self._state, self._escape, self._after_key = _SKIP_STRING, False, False
        elif c in "{[":
            self._state, self._depth, self._in_string, self._escape = _SKIP_NESTED, 1, \
                False, False
        else:
            self._state = _SKIP_SCALAR

    def _after_value(self, c: str) -> None:
        if c == ",":
            self._state = _KEY_OR_END
        else:
            self.ended = True  # "}" ends the object without a reply; anything else is wrong

    def _skip_string(self, s: str, i: int) -> int:
        n = len(s)
        while i < n:
            if self._escape:
                self._escape = False
                i += 1
                continue
            m = _STRING_END.search(s, i)
            if m is None:
                return n
            i = m.start()
            if s[i] == "\\":
                self._escape = True
                i += 1
                continue
            # The string ended: a value's, or a key's too long (or escaped) to be "reply".
            if self._after_key:
                self._after_key = False
                self._is_reply = False
                self._state = _COLON
            else:
                self._state = _AFTER_VALUE
            return i + 1
        return n

    def _skip_nested(self, s: str, i: int) -> int:
        n = len(s)
        while i < n:
            if self._in_string:
                if self._escape:
                    self._escape = False
                    i += 1
                    continue
                m = _STRING_END.search(s, i)
                if m is None:
                    return n
                i = m.start() + 1
                if s[i - 1] == "\\":
                    self._escape = True
                else:
                    self._in_string = False
                continue
            m = _SKIP.match(s, i)
            if m is not None:
                i = m.end()
                continue
            c = s[i]
            i += 1
            if c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._state = _AFTER_VALUE
                    return i
        return n

    def _reply(self, s: str, i: int) -> int:
        """Decode the reply string from ``s[i:]`` as far as it is whole."""
        if self._tail:
            s, i = self._tail + s[i:], 0
            self._tail = ""
        n = len(s)
        parts: list[str] = []
        closed = False
        while i < n:
            m = _PLAIN.match(s, i)
            if m is not None:
                parts.append(m.group())
                i = m.end()
                continue
            if s[i] == '"':
                closed = True
                i += 1
                break
            m = _ESCAPE.match(s, i)
            if m is None:
                if _could_be_escape(s[i:]):
                    self._tail = s[i:]  # cut in two: the next piece finishes it
                    i = n
                else:
                    closed = True  # not JSON: the whole answer is rejected anyway
                    i = n
                break
            escape = m.group()
            if _HIGH.fullmatch(escape):
                low = _ESCAPE.match(s, m.end())
                if m.end() == n or (low is None and _could_be_escape(s[m.end():])):
                    self._tail = s[i:]  # the low half has not come yet
                    i = n
                    break
                if low is not None and not _HIGH.fullmatch(low.group()):
                    escape += low.group()
                    m = low
            parts.append(json.loads(f'"{escape}"'))
            i = m.end()
        if parts:
            room = MAX_REPLY_CHARS - len(self.text)
            added = printable("".join(parts))
            self.text += added[:room] if len(added) > room else added
            if len(added) >= room:
                closed = True
        if closed:
            self._state, self.ended = _DONE, True
        return i


def _could_be_escape(rest: str) -> bool:
    """Whether ``rest`` (from a backslash) is the start of an escape cut in two."""
    return len(rest) < 6 and _CUT.fullmatch(rest) is not None


def partial_reply(text: str) -> str | None:
    """The ``reply`` of the envelope ``text`` begins, as far as it has arrived.

    Returns None while the text holds no reply string yet (or is not the start of
    a JSON object, or is larger than any answer the engine takes).
    """
    if len(text) > MAX_OUTPUT_CHARS:
        return None
    reader = PartialReply()
    reader.feed(text)
    return reader.text if reader.started else None
