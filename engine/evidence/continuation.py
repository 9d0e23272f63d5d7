"""`funnel replay --model M`: the turns the recording cannot answer, played by a model.

A session the edit puts where the recording has no model output (another stage, a
changed prompt or output schema) is marked "needs the model from turn N"
(:mod:`engine.evidence.play`). With a model, :func:`continue_sessions` plays the rest of
it: the session as the edit left it before turn N (its state, stage and history, played
again in memory) is written to a temporary PostgreSQL schema with the messages the
recording had until then, and the recorded customer messages from turn N on go through
the real engine (:class:`~engine.turn.engine.Engine`: the prompt, the model, the output
check and repair, the actions, the exits), each at its recorded time. The schema is
dropped afterwards; the hand-offs notify no one.

The customer's later messages were written to the replies the recording gave, not to the
model's new ones: the outcome is an estimate that rests on new model outputs, and the
report keeps such sessions (status ``continued``) apart from the ones the recording
decides.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from ..errors import FunnelError
from ..funnel.compiled import CompiledFunnel
from ..llm.models import Model
from ..memory.summary import ExtractiveSummarizer
from ..store import open_store
from ..store.base import Store, TurnWrite
from ..store.connect import temporary_schema
from ..turn.engine import Engine
from .compare import Continued, Outcome, SessionDiff, outcome
from .play import CHANNEL, play
from .records import Session
from .replay import Replay, revenue_after

__all__ = ["continue_sessions"]

SIDE_BY_SIDE = 4  # sessions continued at once: a model's latency, not the CPU, is the limit


class _Quiet:
    """The engine's notifier here: a replayed hand-off reaches no manager."""

    async def __call__(self, payload: Mapping[str, Any]) -> None:
        return None


# Each continued turn runs at its recorded time (idle returns as they happened): the
# engine's clock reads the time of the turn the running task plays.
_AT: contextvars.ContextVar[datetime] = contextvars.ContextVar("replay_turn_time")


def continue_sessions(result: Replay, edited: CompiledFunnel, sessions: Sequence[Session],
                      model: Model, *, label: str, db: str | None) -> None:
    """Play the sessions of ``result`` that need the model on with ``model``, in place:
    each becomes ``continued`` with the outcome the model's turns led to, or stays
    ``needs_model`` with the reason the continuation failed.

    Args:
        result: The replay (:func:`engine.evidence.replay.replay`) on ``edited``.
        edited: The edited funnel.
        sessions: The population replayed (their recorded turns).
        model: The model that plays the turns the recording cannot answer.
        label: The model as the report names it (``--model``'s value).
        db: The PostgreSQL server; the turns run on a temporary schema of it.

    Raises:
        StoreUnavailable: the database cannot be reached.
        StoreError: the temporary schema cannot be created.
    """
    result.model = label
    by_id = {s.session_id: s for s in sessions}
    todo = [(d, by_id[d.session_id]) for d in result.of("needs_model")
            if d.needs_model is not None and d.session_id in by_id]
    if not todo:
        return
    with temporary_schema(db, prefix="funnel_tmp_replay") as url:
        asyncio.run(_run(url, edited, model, label, todo))


async def _run(url: str, edited: CompiledFunnel, model: Model, label: str,
               todo: list[tuple[SessionDiff, Session]]) -> None:
    store = await open_store(url)
    _AT.set(datetime.now(UTC))  # what opening the engine reads; each turn sets its own
    try:
        engine = await Engine.open(edited, store=store, model=model, notifier=_Quiet(),
                                   clock=_AT.get, summarizer=ExtractiveSummarizer())
        try:
            limit = asyncio.Semaphore(SIDE_BY_SIDE)

            async def one(diff: SessionDiff, session: Session) -> None:
                async with limit:  # each task its own context: its own clock
                    try:
                        await _continue(engine, store, diff, session, label)
                    except FunnelError as exc:
                        diff.reason = (f"{diff.reason}; the continuation with {label} "
                                       f"failed: {exc}")

            await asyncio.gather(*(one(d, s) for d, s in todo))
            await engine.drain()
        finally:
            await engine.close()
    finally:
        await store.close()


async def _continue(engine: Engine, store: Store, diff: SessionDiff, session: Session,
                    label: str) -> None:
    funnel, spec, sid = engine.funnel, engine.spec, session.session_id
    number = diff.needs_model
    assert number is not None
    records = session.turns
    # The edit's own play up to the turn before: the recording answers all of them.
    before = play(funnel, records[:number - 1], sid)
    if number > 1:
        assert before.pos is not None
        await _seed(store, engine, sid, before.state, dict(before.pos), records, number,
                    records[number - 2].at)
    done = Continued(label, number)
    first = outcome(before, None, None, None).first_turn if before.turns else {}
    for n, rec in enumerate(records[number - 1:], number):
        _AT.set(rec.at)
        turn = await engine.handle(sid, rec.customer, channel=CHANNEL)
        done.turns += 1
        done.fallbacks += int(turn.fallback)
        done.repairs += int(turn.repaired)
        done.tokens += turn.prompt_tokens + turn.completion_tokens
        first.setdefault(turn.stage_before, n)
        for t in turn.transitions:
            first.setdefault(str(t.get("to")), n)
        if funnel.stage(turn.stage_after).spec.final:
            if n < len(records):
                done.ended = (f"it reached the final stage {turn.stage_after} at turn {n}; "
                              "the later recorded messages are not played")
            break
    row = await engine.state(sid) or {}
    h = spec.handoff
    reached = list(dict.fromkeys(x["stage"] for x in row.get("stage_history") or []))
    diff.after = Outcome(str(row.get("stage", spec.initial)), reached,
                         row.get(spec.cart.total) if spec.cart and spec.cart.total else None,
                         bool(h and h.stage in reached),
                         row.get(h.reason) if h and h.reason else None, first)
    diff.status, diff.continued = "continued", done
    if diff.before is not None:
        diff.revenue_after = revenue_after(diff, diff.before, diff.after)


async def _seed(store: Store, engine: Engine, sid: str, state: dict[str, Any],
                pos: dict[str, Any], records: Sequence[Any], number: int, at: datetime
                ) -> None:
    """The session as the edit left it before turn ``number``: its row, and the messages
    the recording had until then (the window and the summary read them)."""
    spec = engine.spec
    values = {**copy.deepcopy(state), "stage": pos["stage"],
              "stage_iteration": pos["stage_iteration"], "turns": pos["turns"],
              "stage_history": pos["stage_history"], "notices": list(pos["notices"] or []),
              "funnel_version": spec.version}
    await store.save_turn(spec, TurnWrite(
        session_id=sid, values=values, expected_version=0, reply=None,
        stage_after=pos["stage"],
        turn={"stage_before": pos["stage"], "transitions": [], "actions": [], "refused": [],
              "validation_failures": 0, "repaired": False, "fallback": False,
              "prompt_tokens": 0, "completion_tokens": 0, "model": "replay:recording"},
        message_time=at))
    rec = records[number - 1]
    if rec.index >= 0 and rec.messages:
        earlier = list(rec.messages[:rec.index])
    else:  # no message log (a recording made by hand): the customer's side only
        earlier = [("user", r.customer) for r in records[:number - 1]]
    for role, text in earlier:
        await store.log_message(spec, sid, role, text)
