"""The reply of an envelope that is still arriving: a partial-JSON read, for streaming.

A streamed model answer is the envelope's JSON text, a piece at a time. What may
be shown of it before it is whole is the ``reply`` string as far as it has
arrived, and nothing else: :func:`partial_reply` reads it with ``jiter``'s partial
mode (an unfinished string counts as far as it goes), through the same character
rules as a whole answer (:func:`engine.boundary.sanitize.printable`), clipped to
:data:`~engine.boundary.sanitize.MAX_REPLY_CHARS`. Nothing read here is applied:
the whole answer crosses :func:`~engine.boundary.sanitize.model_json` and the
stage schema before it changes anything.
"""

from __future__ import annotations

import re

import jiter

from .sanitize import MAX_OUTPUT_CHARS, MAX_REPLY_CHARS, printable

__all__ = ["partial_reply"]

# An opening fence (```json) before the object: model_json unwraps it when whole.
_OPEN_FENCE = re.compile(r"^\s*```(?:json)?\s*")
# A trailing backslash (an escape cut in two) or a lone high surrogate escape: wait.
_CUT_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{0,3})?$|\\u[dD][89abAB][0-9a-fA-F]{2}$")


def partial_reply(text: str) -> str | None:
    """The ``reply`` of the envelope ``text`` begins, as far as it has arrived.

    Returns None while the text holds no reply string yet (or is not the start of
    a JSON object, or is larger than any answer the engine takes).
    """
    if len(text) > MAX_OUTPUT_CHARS:
        return None
    raw = _OPEN_FENCE.sub("", text, count=1)
    if not raw.startswith("{"):
        return None
    raw = _CUT_ESCAPE.sub("", raw)
    try:
        data = jiter.from_json(raw.encode("utf-8", "surrogatepass"),
                               partial_mode="trailing-strings")
    except ValueError:
        return None
    reply = data.get("reply") if isinstance(data, dict) else None
    if not isinstance(reply, str):
        return None
    return printable(reply)[:MAX_REPLY_CHARS]
