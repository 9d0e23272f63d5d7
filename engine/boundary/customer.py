"""What a caller may hand the engine for one turn: a session id and a message.

The bounds live here, in one place, so that the engine, the HTTP service and
the channels refuse the same things with the same words.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import InvalidInput

# The bidirectional controls (marks, embeddings, overrides, isolates): in a name or an
# id they make it read as another ("Olena" shown for "anelO"), in a log and on a screen.
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
# Any control character (a trailing newline too), a bidi control, and lone surrogates
# (not text at all).
_ID_BAD = re.compile(f"[\x00-\x1f\x7f-\x9f{BIDI_CONTROLS}\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")

MAX_SESSION_ID = 200
MAX_MESSAGE_CHARS = 8000


def check_input(session_id: Any, text: Any) -> None:
    """Refuse a session id or message the engine cannot take.

    Raises:
        InvalidInput: the session id is not 1 to ``MAX_SESSION_ID`` characters without
            control characters or bidi controls, or the message is not text (no NUL, no
            lone surrogate) of at most ``MAX_MESSAGE_CHARS``.
    """
    if not isinstance(session_id, str) or not 1 <= len(session_id) <= MAX_SESSION_ID \
            or _ID_BAD.search(session_id):
        raise InvalidInput(f"session id must be a string of 1 to {MAX_SESSION_ID} characters "
                           "without control characters (a trailing newline is one) or bidi "
                           "controls (U+202E...); got "
                           f"{session_id.encode('utf-8', 'backslashreplace')!r:.60}"
                           if isinstance(session_id, str) else
                           f"session id must be a string; got {type(session_id).__name__}")
    if not isinstance(text, str) or "\x00" in text:
        raise InvalidInput(f"session {session_id!r}: the message must be text without NUL bytes")
    if _SURROGATE.search(text):
        raise InvalidInput(f"session {session_id!r}: the message holds a lone surrogate "
                           "(not valid Unicode); send it as UTF-8 text")
    if len(text) > MAX_MESSAGE_CHARS:
        raise InvalidInput(f"session {session_id!r}: the message has {len(text)} characters, "
                           f"over the limit of {MAX_MESSAGE_CHARS}; split it")
