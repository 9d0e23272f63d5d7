"""What a caller may hand the engine for one turn: a session id and a message.

The bounds live here, in one place, so that the engine, the HTTP service and
the channels refuse the same things with the same words.
"""

from __future__ import annotations

from typing import Any

from .errors import InvalidInput

MAX_SESSION_ID = 200
MAX_MESSAGE_CHARS = 8000


def check_input(session_id: Any, text: Any) -> None:
    """Refuse a session id or message the engine cannot take.

    Raises:
        InvalidInput: the session id is not 1 to ``MAX_SESSION_ID`` characters without
            NUL, or the message is not text without NUL of at most ``MAX_MESSAGE_CHARS``.
    """
    if not isinstance(session_id, str) or not 1 <= len(session_id) <= MAX_SESSION_ID \
            or "\x00" in session_id:
        raise InvalidInput(f"session id must be a string of 1 to {MAX_SESSION_ID} characters "
                           f"without NUL; got {session_id!r:.60}")
    if not isinstance(text, str) or "\x00" in text:
        raise InvalidInput(f"session {session_id!r}: the message must be text without NUL bytes")
    if len(text) > MAX_MESSAGE_CHARS:
        raise InvalidInput(f"session {session_id!r}: the message has {len(text)} characters, "
                           f"over the limit of {MAX_MESSAGE_CHARS}; split it")
