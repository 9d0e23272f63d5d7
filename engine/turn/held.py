"""A customer's turn while a manager holds the session, or while an approval waits
(engine.turn.approval): logged, held, no model called.

See engine.turn.manager for the take-over and the release; this is the turn's side,
called by :meth:`engine.turn.engine.Engine.handle` under the session's lease.
"""

from __future__ import annotations

from ..store import Control, Held, OutboxItem, SessionAccess
from . import approval
from .data import Turn, TurnResult


async def hold(access: SessionAccess, turn: Turn, control: Control) -> TurnResult:
    """End a customer's turn without the bot: a manager holds the session."""
    spec, stage = turn.spec, turn.pos["stage"]
    message_id = turn.inbound.message_id or 0
    if control.mode == "approval":  # every message is answered while the approval waits
        text = approval.holding_reply(turn, control)
    else:
        text = spec.handoff.holding_reply if spec.handoff and not control.holding_sent \
            else None
    # No model runs, so no language is decided: the session's (or the default) is used.
    holding = turn.say(text) if text is not None else None
    outbox = []
    if holding is not None and turn.inbound.reply_to is not None:
        outbox.append(OutboxItem(key=f"{spec.name}:{turn.session_id}:holding:{message_id}",
                                 kind="reply", payload={**turn.inbound.reply_to,
                                                        "text": holding}))
    reply = holding or ""
    response = {"reply": reply, "stage": stage, "handoff": False, "fallback": False,
                "turn_id": message_id, "held": True}
    await access.hold(Held(message_id, stage, response, holding, outbox))
    return TurnResult(session_id=turn.session_id, reply=reply, stage_before=stage,
                      stage_after=stage, state={**turn.state, **turn.pos},
                      message_id=message_id, held=True)
