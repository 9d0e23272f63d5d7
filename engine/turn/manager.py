"""A manager in the session: take over, write to the customer, hand back to the bot.

While a manager holds a session (its control row, ``engine.store.control``) the
bot answers nothing: each customer message is still logged, marked ``held``, and
no model is called; the customer gets nothing automatic except the funnel's
``handoff.holding_reply``, once per take-over. The manager's messages go to the
customer through the session's channel (a Telegram chat, via the outbox) and are
logged with the role ``manager`` and the manager's name. A release gives the
session back to the bot, at a stage the manager names and with field updates,
validated as any update is: declared fields the engine does not own, each value
against its schema; any refusal refuses the whole release.

Take-over and release run under the session's lease (engine.store.session), as a
turn does: a customer message that arrives meanwhile waits for the lease, then
finds who holds the session. So it is answered by the bot (its turn held the lease
first) or by nobody automatic (the take-over did), never both.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from ..boundary.customer import check_input
from ..boundary.sanitize import Rejected, check_tree
from ..errors import (
    ConcurrentUpdate,
    FunnelError,
    InvalidInput,
    NotAwaitingApproval,
    NotTakenOver,
    ReleaseRejected,
    UnknownSession,
)
from ..funnel.state import plain
from ..store import Control, OutboxItem
from . import approval
from .advance import enter
from .data import Incoming
from .engine import Engine

log = logging.getLogger("funnel.manager")

MAX_MANAGER_NAME = 80
# The channels whose customer a manager's message reaches through the outbox; the
# others (the API, the widget) read it from the session's messages.
DELIVERING_CHANNELS = ("telegram",)


# 1 to 80 characters, not blank, no control character, no bidi control (as session ids,
# engine.boundary.customer; what the API's schema says too).
_REFUSED = "\\u0000-\\u001f\\u007f\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069"
NAME_PATTERN = f"^[^{_REFUSED}]*[^\\s{_REFUSED}][^{_REFUSED}]*$"
_NAME = re.compile(NAME_PATTERN)


def manager_name(name: Any) -> str:
    """A manager's name as logged: 1 to 80 characters, not blank, no control character
    nor bidi control; trimmed.

    Raises:
        InvalidInput: anything else.
    """
    if not isinstance(name, str) or len(name) > MAX_MANAGER_NAME or not _NAME.fullmatch(name):
        raise InvalidInput(f"a manager's name is 1 to {MAX_MANAGER_NAME} characters, not "
                           "blank, without control characters or bidi controls (U+202E...); "
                           f"got {name.encode('utf-8', 'backslashreplace')!r:.60}"
                           if isinstance(name, str) else
                           f"a manager's name is a string; got {type(name).__name__}")
    return name.strip()


async def take_over(engine: Engine, session_id: str, manager: str) -> dict[str, Any]:
    """Hand the session to ``manager``: the bot stops answering it.

    Waits for a turn in flight to end (the session's lease). Taking over a session
    a manager holds already hands it to ``manager`` and keeps its start.

    Raises:
        UnknownSession: the funnel has no such session.
    """
    check_input(session_id, "takeover")
    store, spec = engine.store, engine.spec
    async with store.session(spec, session_id) as access:
        _, row, _ = await access.load(0)
        if row is None:
            raise UnknownSession(f"no session {session_id!r} in funnel '{spec.name}'")
        detail: dict[str, Any] = {"stage": row["stage"]}
        before = await store.control(spec.name, session_id)
        if before is not None and before.mode == "approval":
            # The take-over ends the approval (the manager decides now, the held move is
            # dropped): the event says so, and `funnel report` counts it as decided.
            detail["ended_approval"] = {
                "to": (before.held or {}).get("to"),
                "waited": max(0.0, (engine.clock() - before.since).total_seconds())}
        control = await store.take_over(spec.name, session_id, manager, detail=detail)
        if spec.has_follow_ups:  # the manager talks to the customer now, not the bot
            await store.follow_up_cancel(spec.name, session_id)
    return _body(session_id, control, row["stage"])


async def send(engine: Engine, session_id: str, manager: str, text: str, *,
               key: str | None = None) -> dict[str, Any]:
    """Send ``text`` from ``manager`` to the session's customer (the session must be held).

    With a delivery ``key`` the message is logged and sent once: a second call with the
    key raises DuplicateDelivery with the first call's answer.

    Raises:
        InvalidInput: the text is empty or too long.
        UnknownSession: the funnel has no such session.
        NotTakenOver: no manager holds the session.
        DuplicateDelivery: ``key`` was used before.
    """
    check_input(session_id, text)
    store, spec = engine.store, engine.spec
    control = await store.control(spec.name, session_id)
    row = await store.load(spec, session_id)
    if row is None:
        raise UnknownSession(f"no session {session_id!r} in funnel '{spec.name}'")
    if control is None or control.mode != "manager":
        raise NotTakenOver(session_id)
    delivery, via = None, "messages"
    for channel in DELIVERING_CHANNELS:
        target = await store.reply_target(spec.name, session_id, channel)
        if target is not None:
            delivery = OutboxItem(key=f"{spec.name}:{session_id}:manager", kind="reply",
                                  payload={**target, "text": text})
            via = channel
            break
    answer = {"session_id": session_id, "manager": manager, "delivery": via}
    message_id = await store.manager_message(spec, session_id, manager, text,
                                             str(row["stage"]), delivery, key=key,
                                             answer=answer)
    return {**answer, "message_id": message_id}


def _checked(session_id: str, stage: Any, updates: Any) -> tuple[str | None, dict[str, Any]]:
    problems = []
    if stage is not None and not isinstance(stage, str):
        problems.append("`stage` must be a stage's name")
    if updates is not None and not isinstance(updates, Mapping):
        problems.append("`updates` must be an object of field: value")
    elif updates is not None:
        # Clean text only, as a model's updates are (engine.boundary.sanitize): a NUL
        # cannot be stored in jsonb, a bidi override makes a value read as it is not.
        try:
            check_tree(dict(updates), clean=True)
        except Rejected as exc:
            problems.append(f"`updates` {str(exc).replace('at $.', 'at ', 1)}")
    if problems:
        raise ReleaseRejected(session_id, problems)
    return stage, dict(updates or {})


async def release(engine: Engine, session_id: str, manager: str, *, stage: Any = None,
                  updates: Any = None) -> dict[str, Any]:
    """Give the session back to the bot, at ``stage`` (else where it is) and with
    ``updates`` to its fields; the session's state after.

    No on_enter action runs on the stage named: the manager moved the session, not
    the customer. Derived fields are recomputed.

    Raises:
        ReleaseRejected: the stage is not declared, or an update is refused.
        UnknownSession: the funnel has no such session.
        NotTakenOver: no manager holds the session.
    """
    check_input(session_id, "release")
    stage, updates = _checked(session_id, stage, updates)
    store, spec = engine.store, engine.spec
    async with store.session(spec, session_id) as access:
        _, row, _ = await access.load(0)
        if row is None:
            raise UnknownSession(f"no session {session_id!r} in funnel '{spec.name}'")
        await engine.routing.prepare(row)  # the session's own version
        turn = engine._start(Incoming(session_id, "", "manager", time.perf_counter()),
                             engine.clock(), row, [])
        funnel, state, pos = turn.funnel, turn.state, turn.pos
        problems: list[str] = []
        if stage is not None and stage not in funnel.stages:
            problems.append(f"no stage {stage!r} in funnel '{funnel.name}' (its stages: "
                            f"{', '.join(funnel.stages)})")
        allowed = frozenset(funnel.spec.state) - funnel.spec.engine_owned
        changed = funnel.rules.apply_updates(state, updates, allowed, problems)
        if problems:
            raise ReleaseRejected(session_id, problems)
        values = None
        if changed or (stage is not None and stage != pos["stage"]):
            if stage is not None and stage != pos["stage"]:
                enter(pos, stage, turn.now)
            funnel.rules.recompute(state, turn.mover.context(state), turn.now.isoformat())
            values = {**state, **pos, "session_id": session_id}
        control = await store.release_control(
            funnel.spec, session_id, manager, values, turn.expected,
            detail={"stage": pos["stage"], "updated": changed})
        if control is None:
            raise NotTakenOver(session_id)
    return {"session_id": session_id, "control": "bot", "stage": pos["stage"],
            "updated": changed, "state": plain({**state, **pos})}


async def status(engine: Engine, session_id: str) -> dict[str, Any]:
    """Who answers the session now: ``bot``, ``manager`` (with the manager and since) or
    ``approval`` (with the move it holds and its deadline)."""
    control = await engine.store.control(engine.spec.name, session_id)
    return _body(session_id, control, None)


def _body(session_id: str, control: Control | None, stage: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"session_id": session_id,
                           "control": control.mode if control else "bot",
                           "manager": control.manager if control else None,
                           "since": control.since.isoformat() if control else None}
    if control is not None and control.mode == "approval":
        held = control.held or {}
        out["approval"] = {"stage": held.get("from"), "to": held.get("to"),
                           "reason": held.get("reason"),
                           "on_timeout": held.get("on_timeout"),
                           "deadline": control.deadline.isoformat() if control.deadline
                           else None}
    if stage is not None:
        out["stage"] = stage
    return out


async def approve(engine: Engine, session_id: str, manager: str) -> dict[str, Any]:
    """Make the move the session's approval holds.

    Raises:
        UnknownSession: the funnel has no such session.
        NotAwaitingApproval: no approval waits (decided already, timed out, never asked).
        ApprovalRefused: the move no longer applies (nothing written; reject it).
    """
    return await _decide(engine, session_id, "approved", manager)


async def reject(engine: Engine, session_id: str, manager: str, note: str | None = None
                 ) -> dict[str, Any]:
    """Drop the move the session's approval holds; ``note`` reaches the next prompt.

    Raises:
        UnknownSession: the funnel has no such session.
        NotAwaitingApproval: no approval waits.
    """
    return await _decide(engine, session_id, "rejected", manager, note)


async def sweep(engine: Engine, limit: int = 100) -> int:
    """Apply ``on_timeout`` to every approval of the funnel past its deadline; how many.

    Safe to run on every worker at once: each session's decision is taken under its
    lease, and a decided one is skipped.
    """
    done = 0
    for session_id in await engine.store.due_approvals(engine.spec.name, engine.clock(), limit):
        try:
            await _decide(engine, session_id, "timeout", None)
        except (NotAwaitingApproval, UnknownSession, ConcurrentUpdate):
            continue  # decided meanwhile, or purged: nothing to do
        except FunnelError as exc:  # the database away: the next sweep tries again
            log.warning("approval timeout of session %r not applied yet: %s", session_id, exc)
            continue
        done += 1
    return done


async def _decide(engine: Engine, session_id: str, decision: str, manager: str | None,
                  note: str | None = None) -> dict[str, Any]:
    """Decide the session's approval under its lease (engine.turn.approval.resolve)."""
    check_input(session_id, decision)
    store, spec = engine.store, engine.spec
    async with store.session(spec, session_id) as access:
        _, row, _ = await access.load(0)
        if row is None:
            raise UnknownSession(f"no session {session_id!r} in funnel '{spec.name}'")
        control = access.control
        if control is None or control.mode != "approval":
            raise NotAwaitingApproval(session_id)
        await engine.routing.prepare(row)  # the session's own version
        turn = engine._start(Incoming(session_id, "", "manager", time.perf_counter()),
                             engine.clock(), row, [])
        if decision == "timeout" and not approval.due(control, turn.now):
            raise NotAwaitingApproval(session_id)  # decided, and asked again, meanwhile
        outcome = await approval.resolve(store, turn, control, decision, manager, note)
    if outcome.pop("alerted"):
        engine._background(engine._dispatch_quietly(session_id))
    return outcome


