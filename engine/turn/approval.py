"""Approval gates: a move into a stage that waits for a manager's approval.

A stage declares ``approval: {when, timeout, on_timeout, holding_reply}``. When a turn's
exits would move the session into it and ``when`` holds on the state after the turn
(or there is no ``when``), the move is not made (engine.turn.advance keeps it in
``Mover.held``): the turn saves its updates, the session stays where it was, and the
save writes a control row ``mode = 'approval'`` holding the move, with its deadline, in
the same statement. The managers are alerted through the outbox (a ``handoff`` row
whose payload's ``event`` is ``approval``: the hand-off alert's targets, the Telegram
managers' chat with *Approve* / *Reject*). The customer gets ``holding_reply``.

While the approval waits, each customer message is logged, held and answered with the
holding reply (engine.turn.held): the stage never moves. Then, under the session's
lease, one of:

- ``approve``: the held move is made, exactly it, re-validated first (the session is
  still in the stage it was held in, the stage it leads to still exists); the stage's
  ``on_enter`` actions run then;
- ``reject``: the move is dropped, and a notice tells the next turn's prompt;
- the deadline passes (the next customer message or the service's sweep, whichever
  comes first): ``on_timeout`` applies (``proceed`` approves, ``reject`` rejects,
  ``handoff`` moves to the funnel's hand-off stage, a stage's name moves there).

Each is one transaction that deletes the control row (only an approval's) and writes
the row: a second decision finds nothing to decide (:class:`NotAwaitingApproval`), and
a customer message waiting for the lease is answered by the bot once, after it.
Every step is an event in ``funnel_control_events`` (``approval``, then ``approved``,
``rejected`` or ``timeout`` with the seconds waited), which `funnel report` reads.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ..errors import ApprovalRefused, NotAwaitingApproval
from ..format.spec import Localized, TransitionSpec
from ..funnel.machine import Firing
from ..funnel.state import plain
from ..store import Control, OutboxItem, Store
from .advance import enter, handoff_payload
from .budget import bound_notices
from .data import Turn
from .steps import handoff_time

DECISIONS = ("approved", "rejected", "timeout")


def gate(turn: Turn) -> tuple[dict[str, Any], OutboxItem] | None:
    """The control row and the managers' alert of a move the turn held, or None."""
    held = turn.mover.held
    if held is None:
        return None
    spec = turn.spec
    approval = spec.stages[held["to"]].approval
    assert approval is not None  # only a stage with `approval:` holds a move
    deadline = turn.now + timedelta(seconds=approval.timeout)
    detail = {**held, "deadline": deadline.isoformat(), "on_timeout": approval.on_timeout,
              "reason": held.get("reason") or approval.reason}
    payload = {**handoff_payload(turn.funnel, turn.session_id, turn.state, turn.channel),
               "event": "approval", "reason": detail["reason"], "stage": held["from"],
               "to": held["to"], "deadline": detail["deadline"],
               "on_timeout": approval.on_timeout}
    alert = OutboxItem(key=f"{spec.name}:{turn.session_id}:approval:{turn.inbound.message_id}",
                       kind="handoff", payload=payload)
    return {"held": detail, "deadline": deadline}, alert


def holding_reply(turn: Turn, control: Control) -> Localized | None:
    """What a customer message gets while the approval waits (None: nothing), by language."""
    held = control.held or {}
    stage = turn.funnel.stages.get(str(held.get("to")))
    approval = stage.spec.approval if stage is not None else None
    return approval.holding_reply if approval is not None else None


def due(control: Control | None, now: datetime) -> bool:
    """Whether ``control`` is an approval past its deadline at ``now``."""
    return control is not None and control.mode == "approval" and \
        control.deadline is not None and control.deadline <= now


async def resolve(store: Store, turn: Turn, control: Control, decision: str,
                  manager: str | None, note: str | None = None) -> dict[str, Any]:
    """Decide the approval ``control`` holds on the session ``turn`` read (under its
    lease): ``approved``, ``rejected`` or ``timeout``; the outcome (``alerted``: a hand-off
    alert is in the outbox, to dispatch).

    Raises:
        ApprovalRefused: ``approved``, but the move no longer applies.
        NotAwaitingApproval: the approval was decided meanwhile.
        ConcurrentUpdate: the row changed since ``turn`` read it; nothing written.
    """
    session_id, now = turn.session_id, turn.now
    funnel, state, pos = turn.funnel, turn.state, turn.pos
    held = dict(control.held or {})
    gated = str(held.get("to"))
    approval = funnel.stages[gated].spec.approval if gated in funnel.stages else None
    choice = None
    target: str | None = gated if decision == "approved" else None
    problems = []
    if pos["stage"] != held.get("from"):
        problems.append(f"the session is in stage '{pos['stage']}', not in "
                        f"'{held.get('from')}' where the move was held")
    if gated not in funnel.stages:
        problems.append(f"funnel '{funnel.name}' has no stage '{gated}' any more")
    if decision == "timeout":
        choice = approval.on_timeout if approval is not None else "reject"
        handoff = funnel.spec.handoff.stage if funnel.spec.handoff else None
        target = {"proceed": gated, "reject": None, "handoff": handoff}.get(choice, choice)
        if target is not None and (problems or target not in funnel.stages):
            target = None  # a timeout never fails: what cannot apply is rejected
    elif decision == "approved" and problems:
        raise ApprovalRefused(session_id, problems)
    handoff_before = handoff_time(funnel.spec, state)
    scratch = turn.mover.scratch
    if target is not None:
        firing = Firing(source=pos["stage"], dest=target, trigger=str(held.get("trigger")),
                        spec=TransitionSpec(to=target, when=held.get("when"),
                                            reason=held.get("reason")))
        enter(pos, target, now)
        scratch.stage, scratch.stage_iteration = target, 0
        turn.mover.on_enter(firing, state)
        funnel.rules.recompute(state, turn.mover.context(state), now.isoformat())
    notice = _notice(decision, gated, target, note, choice)
    pos["notices"] = bound_notices([*(pos["notices"] or []), *scratch.notices, notice])
    outbox = []
    if handoff_before is None and handoff_time(funnel.spec, state) is not None:
        outbox.append(OutboxItem(key=f"{funnel.spec.name}:{session_id}:handoff",
                                 kind="handoff",
                                 payload=handoff_payload(funnel, session_id, state, "manager")))
    waited = max(0.0, (now - control.since).total_seconds())
    detail = {"from": held.get("from"), "to": gated, "entered": target, "waited": waited,
              "on_timeout": choice, "note": note}
    values = {**state, **pos, "session_id": session_id}
    done = await store.resolve_approval(funnel.spec, session_id, decision, manager,
                                        values, turn.expected, detail, now, outbox)
    if done is None:
        raise NotAwaitingApproval(session_id)
    return {"session_id": session_id, "decision": decision, "manager": manager,
            "stage": pos["stage"], "entered": target, "waited_seconds": round(waited, 3),
            "state": plain({**state, **pos}), "alerted": bool(outbox)}


def _notice(decision: str, gated: str, target: str | None, note: str | None,
            choice: str | None) -> str:
    why = f": {note}" if note else ""
    if decision == "approved":
        return f"(engine) a manager approved moving to stage '{gated}'{why}"
    if decision == "rejected":
        return (f"(engine) a manager rejected moving to stage '{gated}'{why}; the session "
                "stays here: tell the customer and offer another way")
    if target is None:
        return (f"(engine) no manager approved moving to stage '{gated}' in time; the "
                "session stays here: tell the customer and offer another way")
    return f"(engine) no manager answered in time; the session moved to stage '{target}' " \
        f"(on_timeout: {choice})"
