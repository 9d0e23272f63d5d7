"""What a studio turn answers the page: the turn's result, and what a playground turn did
not send (engine.turn.playground withholds it), each with a sentence saying what would
have been sent, to whom."""

from __future__ import annotations

from typing import Any

from ..turn.data import TurnResult
from ..turn.engine import Engine

__all__ = ["turn_result", "would_send"]


def _targets(engine: Engine) -> str:
    """The hand-off alert's targets as the funnel declares them (``handoff.notify``)."""
    handoff = engine.spec.handoff
    notify = handoff.notify if handoff else {"log": True}
    out = [f"webhook {notify['webhook']}"] if notify.get("webhook") else []
    out += [f"hook {notify['hook']}"] if notify.get("hook") else []
    if notify.get("log", not out):
        out.append("the log")
    return ", ".join(out)


def would_send(engine: Engine, withheld: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a playground turn did not send (engine.turn.playground), each with a sentence
    saying what would have been sent, to whom."""
    out = []
    for item in withheld:
        kind, p = item["kind"], item["payload"]
        reason = f" (reason: {p['reason']})" if p.get("reason") else ""
        if kind == "handoff" and p.get("event") == "approval":
            text = (f"would ask the managers ({_targets(engine)}) to approve the move "
                    f"{p.get('stage')} → {p.get('to')}{reason}; on timeout: "
                    f"{p.get('on_timeout')}")
        elif kind == "handoff":
            cart = p.get("cart") or {}
            total = f", cart total {cart['total']}" if cart.get("total") is not None else ""
            text = (f"would notify the manager ({_targets(engine)}): hand-off of session "
                    f"{p.get('session_id')}{reason}{total}")
        elif kind == "approval":
            text = (f"would hold the move {p.get('from')} → {p.get('to')} for a manager's "
                    f"approval until {p.get('deadline')}")
        elif kind == "reply":
            text = f"would send the customer: {p.get('text')}"
        else:
            text = f"would queue a {kind} side effect"
        out.append({"kind": kind, "text": text, "payload": p})
    return out


def turn_result(result: TurnResult) -> dict[str, Any]:
    """A turn's result as the page reads it (``/api/turn``)."""
    return {"reply": result.reply, "stage_before": result.stage_before,
            "stage_after": result.stage_after, "transitions": result.transitions,
            "actions": [{"type": a.type, "accepted": a.accepted, "reason": a.reason}
                        for a in result.actions],
            "updated": result.updated, "notices": result.notices,
            "validation_failures": result.validation_failures, "repaired": result.repaired,
            "fallback": result.fallback, "error": result.error,
            "prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "model_seconds": result.model_seconds, "returning": result.returning,
            "handoff": result.handoff, "claims": result.reply_claims}

