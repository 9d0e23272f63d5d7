"""A turn's beginning: the :class:`~engine.turn.data.Turn` in flight, built from the
session's row as read (a new session gets the defaults), on the funnel it runs on; and
the folding of old messages into the summary it plans before the model is asked.

Moving a session to another version applies the declared migrations
(:meth:`engine.turn.routing.Routing.move`); the facts a channel gave are kept, never
overwritten; the customer's own words are what grounded facts must cite.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..funnel.actions import TurnScratch
from ..funnel.compiled import CompiledFunnel
from ..funnel.state import defaults
from ..memory.summary import RollingSummary
from ..records.messages import Message
from .advance import Mover, Position, record_current, start_position
from .data import Incoming, Turn
from .routing import Routing

__all__ = ["begin", "fold_summary"]


def begin(inbound: Incoming, now: datetime, row: dict[str, Any] | None,
          recent: list[Message], funnel: CompiledFunnel, routing: Routing) -> Turn:
    """The turn in flight on ``funnel``, from ``row`` as read (None: a new session)."""
    read, migration = row, None
    if row is not None:  # moving to another version: the declared migrations
        funnel, row, migration = routing.move(inbound.session_id, row, funnel)
    spec = funnel.spec
    if row is None:
        state, pos = defaults(spec), start_position(spec.initial, now)
        expected, last_seen = 0, None
    else:
        # The row arrives as JSON-friendly values (engine.funnel.state.plain).
        state = {name: row.get(name) for name in spec.state}
        pos = Position(stage=row["stage"], stage_iteration=row["stage_iteration"],
                       turns=row["turns"], stage_history=row["stage_history"],
                       notices=row["notices"])
        record_current(pos, str(row.get("updated_at") or row["last_message_at"]))
        expected, last_seen = int(row["row_version"]), \
            datetime.fromisoformat(row["last_message_at"])
    for fact, value in inbound.facts.items():  # kept, never overwritten
        if fact in spec.state and not state.get(fact):
            state[fact] = value
    # The customer's own words (never the replies): what grounded facts must cite.
    words = (*(m.content for m in recent if m.role == "user"), inbound.text)
    scratch = TurnScratch(inbound.session_id, pos["stage"], pos["stage_iteration"], now,
                          words=words)
    return Turn(inbound, now, read, recent, state, pos, expected, last_seen,
                stage_before=pos["stage"], mover=Mover(funnel, pos, now, scratch),
                funnel=funnel, migration=migration,
                funnel_hash=routing.digest_of(funnel))


async def fold_summary(turn: Turn, summary: RollingSummary, window: int) -> None:
    """Plan folding old messages into the summary: inline now, or after the reply."""
    # Messages outside the window not yet in the summary, once the reply is logged,
    # counted in what the turn read (three windows): when all of those are
    # unsummarized, there are at least that many, and the summary catches up.
    upto = int(turn.row.get("summary_upto") or 0) if turn.row else 0
    unsummarized = sum(1 for m in turn.recent if m.id > upto) + 1  # and the current one
    turn.backlog = max(0, unsummarized + 1 - window)
    planned = summary.plan(turn.state, turn.row, turn.recent, turn.backlog, turn.text)
    turn.folded = await summary.fold_now(planned) if planned else None
    if planned and turn.folded is None:
        turn.summary_job = planned  # folded in the background, after the reply
