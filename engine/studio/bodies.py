"""The bodies the studio's page posts, as pydantic v2 models (strict, bounded).

Parsed after :func:`engine.boundary.sanitize.loads_bounded` has bounded the JSON's
size and depth; a body that does not fit is refused with its field and the reason.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RewindBody", "ScenarioBody", "TurnBody"]

_SESSION = r"^[A-Za-z0-9_.:@-]{1,128}$"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TurnBody(_Body):
    """One playground turn: the customer's message and, for "I am the model", the answer
    (a JSON object, or a string to try a raw output); ``force`` sends an answer that
    fails the schema on, to see the repair and the fallback."""

    funnel: str = Field(min_length=1, max_length=200)
    session: str = Field(pattern=_SESSION)
    text: str = Field(min_length=1, max_length=20_000)
    model: str | None = Field(default=None, max_length=300)
    answer: dict[str, Any] | str | None = None
    force: bool = False


class RewindBody(_Body):
    """Go back to turn ``turn`` of ``session`` in a new session; with ``answer`` (and
    ``text``), play that turn anew; ``replay_after`` then replays the later turns."""

    funnel: str = Field(min_length=1, max_length=200)
    session: str = Field(pattern=_SESSION)
    turn: int = Field(ge=1, le=100_000)
    answer: dict[str, Any] | str | None = None
    text: str | None = Field(default=None, min_length=1, max_length=20_000)
    replay_after: bool = False


class ScenarioBody(_Body):
    """Save ``session`` as a scenario file named ``name`` (the session id if none);
    an existing file only with ``overwrite`` (else 409, and the page asks)."""

    funnel: str = Field(min_length=1, max_length=200)
    session: str | None = Field(default=None, pattern=_SESSION)
    name: str | None = Field(default=None, min_length=1, max_length=100)
    overwrite: bool = False
