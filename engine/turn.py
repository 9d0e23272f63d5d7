"""The turn: LOAD -> PROCESS -> SAVE, one customer message at a time.

The LLM proposes; code decides. :meth:`Engine.handle` runs one turn as a short
sequence of named steps over a :class:`_Turn` (the turn in flight):

1. ``_load``: the message is logged in its own commit (durable even if all else
   fails) and the session's row read under its lease (new sessions get defaults);
2. ``_route``: a removed stage is mapped, a return after the idle gap detected
   (it may move the session), a new session's initial ``on_enter`` run;
3. ``_ask``: the stage prompt rendered from compact state and recent messages
   within its budget; the model called; its output validated against the stage
   schema, with one repair call and then the stage's fallback reply;
4. ``_apply``: allowed updates and declared actions applied, derived fields
   recomputed;
5. advance (`engine.advance`): exit transitions evaluated on the new state;
6. ``_record``: state, reply, turn record and outbox saved in one transaction
   (checked against the row version).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .actions import ActionOutcome, TurnScratch
from .advance import Mover, Position, enter, handoff_payload, start_position
from .chat import Message
from .customer import check_input
from .errors import ConcurrentUpdate, FunnelError, PromptTooLarge, StoreUnavailable
from .funnel import CompiledFunnel, load_funnel
from .machine import Firing
from .memory import RollingSummary, Summarizer, SummaryJob, fit_prompt
from .models import Model, make_model
from .notify import Notifier, dispatch, make_notifier
from .output import Answer, ask
from .prompts import build_context, render
from .state import defaults, plain
from .store import OutboxItem, SessionAccess, Store, TurnWrite, open_store

log = logging.getLogger("funnel.engine")


@dataclass
class TurnResult:
    """What one turn did. ``reply`` is what to send the customer."""

    session_id: str
    reply: str
    stage_before: str
    stage_after: str
    state: dict[str, Any]
    transitions: list[dict[str, Any]] = field(default_factory=list)
    actions: list[ActionOutcome] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    validation_failures: int = 0
    repaired: bool = False
    fallback: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    handoff: bool = False
    returning: bool = False
    error: str | None = None
    backlog: int = 0  # messages that left the window and wait for the summary (at least)
    explain: list[dict[str, Any]] = field(default_factory=list)  # engine.explain, per stage


class Engine:
    """Runs conversations of one funnel. Build with :meth:`open`; share across sessions.

    Example::

        engine = await Engine.open("funnels/puramur.yaml", model="gpt-4o-mini")
        result = await engine.handle("tg-1227845053", "I have a Yorkie", channel="telegram")
        print(result.reply, result.stage_after)
    """

    def __init__(self, funnel: CompiledFunnel, store: Store, model: Model, *,
                 notifier: Notifier | None = None,
                 clock: Callable[[], datetime] | None = None) -> None:
        self.funnel = funnel
        self.spec = funnel.spec
        self.store = store
        self.model = model
        self.notifier = notifier or make_notifier(funnel.spec)
        self.clock = clock or (lambda: datetime.now(UTC))
        self._owns_store = False
        # The window is read with the row, before the stage is known: read the widest.
        self._window = max(s.spec.memory.window for s in funnel.stages.values())
        self._tasks: set[asyncio.Task[Any]] = set()
        self.summary = RollingSummary(funnel.spec, store, self._window)

    @classmethod
    async def open(cls, funnel: str | Path | CompiledFunnel, *, db: str | None = None,
                   model: str | Model | None = None, api_base: str | None = None,
                   notifier: Notifier | None = None, store: Store | None = None,
                   clock: Callable[[], datetime] | None = None,
                   summarizer: Summarizer | None = None) -> Engine:
        """Load the funnel, open the store (embedded PostgreSQL without ``db``), check the table.

        Raises:
            FunnelInvalid: the funnel has errors.
            StoreUnavailable: the database cannot be reached.
            SchemaOutdated: the table is behind the funnel (run ``funnel migrate``).

        ``model`` defaults to the funnel's ``model.name``; ``summarizer`` to a model
        summarizer when ``memory.summarizer_model`` is set, else the offline one.
        """
        compiled = funnel if isinstance(funnel, CompiledFunnel) else load_funnel(funnel)
        if model is None:
            model = compiled.spec.model.name
        if isinstance(model, str):
            model = make_model(model, api_base=api_base)
        owns = store is None
        if store is None:
            store = await open_store(db)
        try:
            await store.ensure_schema(compiled.spec)
        except BaseException:
            if owns:
                await store.close()
            raise
        engine = cls(compiled, store, model, notifier=notifier, clock=clock)
        engine._owns_store = owns
        engine.summary = RollingSummary(compiled.spec, store, engine._window, summarizer)
        return engine

    async def close(self) -> None:
        await self.drain()
        if self._owns_store:
            await self.store.close()

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def state(self, session_id: str) -> dict[str, Any] | None:
        """The session's row as JSON-friendly values, or ``None``."""
        row = await self.store.load(self.spec, session_id)
        return plain(dict(row)) if row else None

    async def dispatch(self, session_id: str | None = None) -> int:
        """Deliver due side effects (handoff alerts); return how many were delivered."""
        return await dispatch(self.store, {self.spec.name: self.notifier},
                              funnel=self.spec.name, session_id=session_id)

    async def handle(self, session_id: str, text: str, *, channel: str = "api") -> TurnResult:
        """Run one turn for a customer message and return what to answer.

        Raises:
            InvalidInput: a bad session id or message (nothing is written).
            StoreUnavailable: the database is down (the message is logged if it got that far).
        """
        check_input(session_id, text)
        inbound = _Inbound(session_id, text, channel, time.perf_counter())
        for attempt in range(3):
            try:
                async with self.store.session(self.spec, session_id) as access:
                    turn = await self._load(access, inbound)
                    result = await self._run(access, turn)
                break
            except ConcurrentUpdate:
                if attempt == 2:
                    raise
            except StoreUnavailable:
                if inbound.message_id is None:
                    # No turn connection to be had: still try to keep the message.
                    with contextlib.suppress(StoreUnavailable):
                        await self.store.log_message(self.spec, session_id, "user", text)
                raise
        if result.handoff:
            # Deliver after the reply, never before it: a slow manager webhook must not
            # delay the customer. A delivery that fails is retried by the next dispatch.
            self._background(self._dispatch_quietly(session_id))
        if turn.summary_job is not None:
            self._background(self.summary.run(session_id, turn.summary_job))
        return result

    async def _dispatch_quietly(self, session_id: str) -> None:
        try:
            await self.dispatch(session_id)
        except FunnelError as exc:  # the row stays due; the next dispatch delivers it
            log.warning("handoff alert of session %r not delivered yet: %s", session_id, exc)

    def _background(self, job: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for background work (summaries) to finish."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def summarize(self, session_id: str) -> bool:
        """Fold the session's messages that left the window into its summary, now."""
        return await self.summary.run(session_id)

    # -- the turn, step by step ----------------------------------------------------------
    async def _run(self, access: SessionAccess, turn: _Turn) -> TurnResult:
        """LOAD (done) -> route -> ask -> apply -> advance -> SAVE."""
        await self._fold_summary(turn)
        self._route(turn)
        answer = await self._ask(turn)
        self._apply(turn, answer)
        turn.firings += turn.mover.advance(turn.state)
        return await self._record(access, turn, answer)

    async def _load(self, access: SessionAccess, inbound: _Inbound) -> _Turn:
        """Log the message (once, however often the turn is retried) and read the row."""
        spec, now = self.spec, self.clock()
        if inbound.message_id is None:
            message_id, row, recent = await access.load(3 * self._window, text=inbound.text)
            inbound.message_id = message_id
        else:
            _, row, recent = await access.load(3 * self._window, current_id=inbound.message_id)
        if row is None:
            state, pos = defaults(spec), start_position(spec.initial, now)
            expected, last_seen = 0, None
        else:
            # The row arrives as JSON-friendly values (engine.state.plain).
            state = {name: row.get(name) for name in spec.state}
            pos = Position(stage=row["stage"], stage_iteration=row["stage_iteration"],
                           turns=row["turns"], stage_history=row["stage_history"],
                           notices=row["notices"])
            expected, last_seen = int(row["row_version"]), \
                datetime.fromisoformat(row["last_message_at"])
        scratch = TurnScratch(inbound.session_id, pos["stage"], pos["stage_iteration"], now)
        return _Turn(inbound, now, row, recent, state, pos, expected, last_seen,
                     stage_before=pos["stage"], mover=Mover(self.funnel, pos, now, scratch))

    async def _fold_summary(self, turn: _Turn) -> None:
        """Plan folding old messages into the summary: inline now, or after the reply."""
        # Messages outside the window not yet in the summary, once the reply is logged,
        # counted in what the turn read (three windows): when all of those are
        # unsummarized, there are at least that many, and the summary catches up.
        upto = int(turn.row.get("summary_upto") or 0) if turn.row else 0
        unsummarized = sum(1 for m in turn.recent if m.id > upto) + 1  # and the current one
        turn.backlog = max(0, unsummarized + 1 - self._window)
        planned = self.summary.plan(turn.state, turn.row, turn.recent, turn.backlog)
        turn.folded = await self.summary.fold_now(planned) if planned else None
        if planned and turn.folded is None:
            turn.summary_job = planned  # folded in the background, after the reply

    def _route(self, turn: _Turn) -> None:
        """Where the turn runs: a removed stage mapped, a return after the idle gap."""
        spec, pos = self.spec, turn.pos
        if pos["stage"] not in self.funnel.stages and pos["stage"] in spec.removed_stages:
            enter(pos, spec.removed_stages[pos["stage"]], turn.now)
            turn.mover.scratch.stage, turn.mover.scratch.stage_iteration = pos["stage"], 0
        turn.idle = (turn.now - turn.last_seen).total_seconds() if turn.last_seen else None
        gap = self.funnel.stage(pos["stage"]).spec.memory.idle_return_after
        turn.mover.returning = bool(turn.idle is not None and gap is not None
                                    and turn.idle >= gap)
        if turn.mover.returning and spec.memory.idle_return_stage:
            turn.firings += turn.mover.fire("idle_return", {}, notify=False)
        if turn.row is None:  # a new session enters its initial stage: run its on_enter
            for call in self.funnel.stage(pos["stage"]).spec.on_enter:
                self.funnel.actions.run(call, turn.state, turn.mover.scratch)

    async def _ask(self, turn: _Turn) -> Answer:
        """Render the stage prompt within its budget and ask the model (validated, repaired
        once, else the stage's fallback)."""
        stage = self.funnel.stage(turn.pos["stage"])
        window = stage.spec.memory.window
        history = turn.recent[-window:] if window else []
        context = build_context(self.funnel, stage, turn.state, turn.pos,
                                customer_message=turn.text, messages=history,
                                returning=turn.mover.returning, idle_seconds=turn.idle,
                                now=turn.now.isoformat())
        try:
            fitted = fit_prompt(stage.spec.name,
                                lambda summary: render(stage, {**context, "summary": summary}),
                                context["summary"], history, turn.text,
                                stage.spec.memory.prompt_budget)
        except PromptTooLarge as exc:
            # The customer still gets an answer; the turn record keeps the sizes.
            return Answer({"reply": stage.spec.fallback}, [], fallback=True, error=str(exc))
        return await ask(self.model, stage, fitted.messages, turn.session_id,
                         turn.pos["turns"] + 1, turn.text)

    def _apply(self, turn: _Turn, answer: Answer) -> None:
        """Apply what the model proposed and the code allows; derive the computed fields."""
        funnel, spec, state = self.funnel, self.spec, turn.state
        scratch = turn.mover.scratch
        if not answer.fallback:
            env = answer.envelope
            stage = funnel.stage(turn.pos["stage"])
            turn.updated = funnel.rules.apply_updates(state, env.get("updates") or {},
                                                      stage.allowed_updates, scratch.notices)
            turn.outcomes = [funnel.actions.run(call, state, scratch)
                             for call in env.get("actions") or []]
            lang = env.get("language")
            if isinstance(lang, str):
                for name in (spec.language_detected, spec.language_response):
                    if name:
                        state[name] = lang
        turn.mover.accepted = [o.type for o in turn.outcomes if o.accepted]
        turn.pos["turns"] += 1
        turn.handoff_before = self._handoff_time(state)
        funnel.rules.recompute(state, turn.mover.context(state), turn.now.isoformat())

    async def _record(self, access: SessionAccess, turn: _Turn, answer: Answer) -> TurnResult:
        """SAVE: state, reply, turn record and outbox in one transaction."""
        spec, state, pos = self.spec, turn.state, turn.pos
        handoff = turn.handoff_before is None and self._handoff_time(state) is not None
        outbox = []
        if handoff and spec.handoff is not None:
            if spec.handoff.channel and not state.get(spec.handoff.channel):
                state[spec.handoff.channel] = turn.channel
            outbox.append(OutboxItem(
                key=f"{spec.name}:{turn.session_id}:handoff", kind="handoff",
                payload=handoff_payload(self.funnel, turn.session_id, state, turn.channel)))
        notices = turn.mover.scratch.notices
        # A fallback turn applied nothing, so last turn's notices still stand.
        pos["notices"] = list(pos["notices"] or []) + notices if answer.fallback else notices
        transitions = [{"from": f.source, "to": f.dest, "trigger": f.trigger,
                        "when": f.spec.when if f.spec else None} for f in turn.firings]
        reply = str(answer.envelope["reply"])
        values = {**state, **pos, "funnel_version": spec.version}
        record = _turn_record(turn, answer, transitions, getattr(self.model, "name", None))
        await access.save(TurnWrite(
            session_id=turn.session_id, values=values, expected_version=turn.expected,
            reply=reply, stage_after=pos["stage"], turn=record, outbox=outbox,
            message_time=turn.now, summary=turn.folded[0] if turn.folded else None,
            summary_upto=turn.folded[1] if turn.folded else None))
        return TurnResult(
            session_id=turn.session_id, reply=reply, stage_before=turn.stage_before,
            stage_after=pos["stage"], state=values, transitions=transitions,
            actions=turn.outcomes, updated=turn.updated, notices=list(notices),
            validation_failures=answer.failures, repaired=record["repaired"],
            fallback=answer.fallback, prompt_tokens=record["prompt_tokens"],
            completion_tokens=record["completion_tokens"], handoff=handoff,
            returning=turn.mover.returning, error=answer.error, backlog=turn.backlog,
            explain=turn.mover.explanation)

    def _handoff_time(self, state: Mapping[str, Any]) -> Any:
        h = self.spec.handoff
        return state.get(h.triggered_at) if h and h.triggered_at else None


@dataclass
class _Inbound:
    """The message a turn answers; ``message_id`` once it is durable (kept across retries)."""

    session_id: str
    text: str
    channel: str
    started: float
    message_id: int | None = None


@dataclass
class _Turn:
    """One turn in flight: what the steps read and write (one per attempt)."""

    inbound: _Inbound
    now: datetime
    row: dict[str, Any] | None
    recent: list[Message]
    state: dict[str, Any]
    pos: Position
    expected: int  # the row version the save is checked against
    last_seen: datetime | None
    stage_before: str
    mover: Mover
    idle: float | None = None
    firings: list[Firing] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    outcomes: list[ActionOutcome] = field(default_factory=list)
    handoff_before: Any = None
    backlog: int = 0
    folded: tuple[str, int] | None = None  # (summary, last id) folded inside the turn
    summary_job: SummaryJob | None = None  # folded after the reply

    @property
    def session_id(self) -> str:
        return self.inbound.session_id

    @property
    def text(self) -> str:
        return self.inbound.text

    @property
    def channel(self) -> str:
        return self.inbound.channel


def _turn_record(turn: _Turn, answer: Answer, transitions: list[dict[str, Any]],
                 model: str | None) -> dict[str, Any]:
    """The turn record's columns (``funnel_turns``)."""
    costs = [c.cost for c in answer.completions if c.cost is not None]
    return {
        "stage_before": turn.stage_before, "stage_after": turn.pos["stage"],
        "transitions": transitions,
        "actions": [o.type for o in turn.outcomes if o.accepted],
        "refused": [{"type": o.type, "reason": o.reason} for o in turn.outcomes
                    if not o.accepted],
        "validation_failures": answer.failures,
        "repaired": answer.failures > 0 and not answer.fallback,
        "fallback": answer.fallback,
        "llm_ms": round(sum(c.latency_ms for c in answer.completions)),
        "turn_ms": round((time.perf_counter() - turn.inbound.started) * 1000),
        "prompt_tokens": sum(c.prompt_tokens for c in answer.completions),
        "completion_tokens": sum(c.completion_tokens for c in answer.completions),
        "cost": sum(costs) if costs else None,
        "model": model, "error": answer.error,
        "explain": turn.mover.explanation,
        "raw_output": [c.text for c in answer.completions],
    }
