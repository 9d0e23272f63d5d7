"""The studio's fast-forward of follow-ups (docs/follow-ups.md): which follow-up a
session would get, and when, if its customer said nothing more. Read-only: a
playground session never gets a real follow-up (the studio's engine plans none), and
this sends nothing, to no one."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..errors import UnknownSession
from ..turn.follow_up import preview
from .playground import Studio

__all__ = ["fast_forward"]


async def fast_forward(studio: Studio, funnel: str, session_id: str) -> dict[str, Any]:
    """The follow-ups of the session's stage, counted from the customer's last message.

    Raises:
        InvalidInput: the studio has no such funnel.
        UnknownSession: the funnel has no such session.
    """
    engine = studio.engine(funnel)
    state = await studio.store.load(engine.spec, session_id)
    if state is None:
        raise UnknownSession(f"no session {session_id!r} in funnel '{funnel}'")
    recent = await studio.store.history(engine.spec, session_id, 50)
    said = [m["created_at"] for m in recent if m["role"] == "user"]
    anchor = said[-1] if said else datetime.now(UTC)
    return preview(engine, state, session_id, anchor)
