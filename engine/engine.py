"""The turn: LOAD -> route -> prompt -> LLM -> validate -> apply -> SAVE.

The LLM proposes; code decides. One customer message is one turn:

1. the message is logged in its own commit (durable even if all else fails);
2. the session's row is loaded under a per-session lock (new sessions get defaults);
3. a return after the idle gap is detected (and may move the session);
4. the stage prompt is rendered from compact state and a few recent messages;
5. the model is called; 6. its output is validated against the stage schema,
   with one repair call and then the stage's fallback reply;
7. allowed updates and declared actions are applied; 8. derived fields recomputed;
9. exit transitions evaluated; 10. state, reply, turn record and outbox are
   saved in one transaction (one UPSERT, checked against the row version).
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
from .errors import ConcurrentUpdate, FunnelError, PromptTooLarge, StoreUnavailable
from .funnel import CompiledFunnel, load_funnel
from .machine import Firing
from .memory import RollingSummary, Summarizer, SummaryJob, fit_prompt
from .models import Model, make_model
from .notify import Notifier, dispatch, make_notifier
from .output import Answer, ask
from .prompts import build_context, full_view, render
from .state import defaults, plain
from .store import OutboxItem, SessionAccess, Store, TurnWrite, open_store

log = logging.getLogger("funnel.engine")


MAX_SESSION_ID = 200
MAX_MESSAGE_CHARS = 8000


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
        engine.summary = RollingSummary(compiled.spec, store, engine._window, summarizer,
                                        api_base=api_base)
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
            FunnelError: a bad session id or message (nothing is written).
            StoreUnavailable: the database is down (the message is logged if it got that far).
        """
        _check_input(session_id, text)
        started = time.perf_counter()
        logged: list[int] = []  # the message id, once the message is durable
        job: list[SummaryJob] = []  # a summary to fold after the reply, if the turn plans one
        for attempt in range(3):
            try:
                async with self.store.session(self.spec, session_id) as access:
                    job.clear()
                    result = await self._turn(access, session_id, text, logged, job, channel,
                                              started)
                break
            except ConcurrentUpdate:
                if attempt == 2:
                    raise
            except StoreUnavailable:
                if not logged:
                    # No turn connection to be had: still try to keep the message.
                    with contextlib.suppress(StoreUnavailable):
                        await self.store.log_message(self.spec, session_id, "user", text)
                raise
        if result.handoff:
            # Deliver after the reply, never before it: a slow manager webhook must not
            # delay the customer. A delivery that fails is retried by the next dispatch.
            self._background(self._dispatch_quietly(session_id))
        if job:
            self._background(self.summary.run(session_id, job[0]))
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

    # -- the turn ----------------------------------------------------------------------
    async def _turn(self, access: SessionAccess, session_id: str, text: str, logged: list[int],
                    job: list[SummaryJob], channel: str, started: float) -> TurnResult:
        spec, funnel = self.spec, self.funnel
        now = self.clock()
        if logged:
            _, row, recent = await access.load(3 * self._window, current_id=logged[0])
        else:
            message_id, row, recent = await access.load(3 * self._window, text=text)
            logged.append(message_id)
        if row is None:
            state = defaults(spec)
            eng: dict[str, Any] = {"stage": spec.initial, "stage_iteration": 0, "turns": 0,
                                   "stage_history": [{"stage": spec.initial,
                                                      "entered_at": now.isoformat()}],
                                   "notices": []}
            expected, last_seen = 0, None
        else:
            # The row arrives as JSON-friendly values (engine.state.plain).
            state = {name: row.get(name) for name in spec.state}
            eng = {k: row[k] for k in ("stage", "stage_iteration", "turns", "stage_history",
                                       "notices")}
            expected = int(row["row_version"])
            last_seen = datetime.fromisoformat(row["last_message_at"])
        # Messages outside the window not yet in the summary, once the reply is logged,
        # counted in what the turn read (three windows): when all of those are
        # unsummarized, there are at least that many, and the summary catches up.
        upto = int(row.get("summary_upto") or 0) if row else 0
        unsummarized = sum(1 for m in recent if m.id > upto) + 1  # and the current one
        backlog = max(0, unsummarized + 1 - self._window)
        planned = self.summary.plan(state, row, recent, backlog)
        folded = await self.summary.fold_now(planned) if planned else None
        if planned and folded is None:
            job.append(planned)  # folded in the background, after the reply
        stage_before = eng["stage"]
        if stage_before not in funnel.stages and stage_before in spec.removed_stages:
            self._enter(eng, spec.removed_stages[stage_before], now)
        firings: list[Firing] = []
        idle = (now - last_seen).total_seconds() if last_seen else None
        gap = funnel.stage(eng["stage"]).spec.memory.idle_return_after
        returning = bool(idle is not None and gap is not None and idle >= gap)
        if returning and spec.memory.idle_return_stage:
            firings += self._fire(eng, "idle_return", {}, now)

        scratch = TurnScratch(session_id, eng["stage"], eng["stage_iteration"], now)
        if row is None:  # a new session enters its initial stage: run that stage's on_enter
            for call in funnel.stage(eng["stage"]).spec.on_enter:
                funnel.actions.run(call, state, scratch)
        stage = funnel.stage(eng["stage"])
        window = stage.spec.memory.window
        history = recent[-window:] if window else []
        context = build_context(funnel, stage, state, eng, customer_message=text,
                                messages=history, returning=returning, idle_seconds=idle,
                                now=now.isoformat())
        try:
            fitted = fit_prompt(stage.spec.name,
                                lambda summary: render(stage, {**context, "summary": summary}),
                                context["summary"], history, text,
                                stage.spec.memory.prompt_budget)
        except PromptTooLarge as exc:
            # The customer still gets an answer; the turn record keeps the sizes.
            answer = Answer({"reply": stage.spec.fallback}, [], fallback=True, error=str(exc))
        else:
            answer = await ask(self.model, stage, fitted.messages, session_id,
                               eng["turns"] + 1, text)

        updated: list[str] = []
        outcomes: list[ActionOutcome] = []
        if not answer.fallback:
            env = answer.envelope
            updated = funnel.rules.apply_updates(state, env.get("updates") or {},
                                                 stage.allowed_updates, scratch.notices)
            outcomes = [funnel.actions.run(call, state, scratch)
                        for call in env.get("actions") or []]
            lang = env.get("language")
            if isinstance(lang, str):
                for name in (spec.language_detected, spec.language_response):
                    if name:
                        state[name] = lang
        accepted = [o.type for o in outcomes if o.accepted]
        eng["turns"] += 1
        handoff_before = self._handoff_time(state)
        funnel.rules.recompute(state, self._cond_ctx(state, eng, accepted, scratch, returning),
                               now.isoformat())

        # Transitions: evaluated after the updates, chained while they fire
        # (each stage at most once per turn), on the state as it now is.
        visited = {eng["stage"]}
        for _ in range(len(spec.stages)):
            if funnel.stage(eng["stage"]).spec.final:
                break
            ctx = self._cond_ctx(state, eng, accepted, scratch, returning)
            fired = self._fire(eng, "advance", ctx, now, scratch)
            if not fired:
                break
            firings += fired
            before = dict(state)
            self._on_enter(fired[-1], state, eng, scratch, now)
            if state != before:  # entering the stage changed facts: derive again
                funnel.rules.recompute(state, self._cond_ctx(state, eng, accepted, scratch,
                                                             returning), now.isoformat())
            if eng["stage"] in visited:
                break
            visited.add(eng["stage"])
        if not firings:  # the session stayed where it was: one more turn in the stage
            eng["stage_iteration"] += 1
            mi = funnel.stage(eng["stage"]).spec.max_iterations
            if mi and mi.to and eng["stage_iteration"] >= mi.limit:
                limit_fired = self._fire(eng, "iteration_limit", {}, now, scratch)
                firings += limit_fired
                if limit_fired:
                    self._on_enter(limit_fired[-1], state, eng, scratch, now)

        handoff = handoff_before is None and self._handoff_time(state) is not None
        outbox = []
        if handoff and spec.handoff is not None:
            if spec.handoff.channel and not state.get(spec.handoff.channel):
                state[spec.handoff.channel] = channel
            outbox.append(OutboxItem(
                key=f"{spec.name}:{session_id}:handoff", kind="handoff",
                payload=self._handoff_payload(session_id, state, channel)))
        # A fallback turn applied nothing, so last turn's notices still stand.
        eng["notices"] = (list(eng.get("notices") or []) + scratch.notices) if answer.fallback \
            else scratch.notices
        prompt_tokens = sum(c.prompt_tokens for c in answer.completions)
        completion_tokens = sum(c.completion_tokens for c in answer.completions)
        costs = [c.cost for c in answer.completions if c.cost is not None]
        transitions = [{"from": f.source, "to": f.dest, "trigger": f.trigger,
                        "when": f.spec.when if f.spec else None} for f in firings]
        reply = str(answer.envelope["reply"])
        values = {**state, **eng, "funnel_version": spec.version}
        write = TurnWrite(
            session_id=session_id, values=values, expected_version=expected, reply=reply,
            stage_after=eng["stage"],
            turn={
                "stage_before": stage_before, "stage_after": eng["stage"],
                "transitions": transitions,
                "actions": [o.type for o in outcomes if o.accepted],
                "refused": [{"type": o.type, "reason": o.reason} for o in outcomes
                            if not o.accepted],
                "validation_failures": answer.failures,
                "repaired": answer.failures > 0 and not answer.fallback,
                "fallback": answer.fallback,
                "llm_ms": round(sum(c.latency_ms for c in answer.completions)),
                "turn_ms": round((time.perf_counter() - started) * 1000),
                "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                # One completion of unknown cost makes the turn's cost unknown.
                "cost": sum(costs) if costs and len(costs) == len(answer.completions)
                else None,
                "model": answer.model or getattr(self.model, "name", None),
                "attempts": answer.attempts, "error": answer.error,
            },
            outbox=outbox, message_time=now,
            summary=folded[0] if folded else None, summary_upto=folded[1] if folded else None,
        )
        await access.save(write)
        return TurnResult(
            session_id=session_id, reply=reply, stage_before=stage_before,
            stage_after=eng["stage"], state=values, transitions=transitions, actions=outcomes,
            updated=updated, notices=list(scratch.notices),
            validation_failures=answer.failures,
            repaired=answer.failures > 0 and not answer.fallback, fallback=answer.fallback,
            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, handoff=handoff,
            returning=returning, error=answer.error, backlog=backlog,
        )

    def _cond_ctx(self, state: Mapping[str, Any], eng: Mapping[str, Any], accepted: list[str],
                  scratch: TurnScratch, returning: bool) -> dict[str, Any]:
        ctx = full_view(self.funnel, state)
        ctx.update(stage=eng["stage"], stage_iteration=eng["stage_iteration"], actions=accepted,
                   handoff_requested=scratch.handoff_requested, returning=returning,
                   turns=eng["turns"], stage_history=eng["stage_history"])
        return ctx

    def _fire(self, eng: dict[str, Any], trigger: str, ctx: Mapping[str, Any], now: datetime,
              scratch: TurnScratch | None = None) -> list[Firing]:
        session = self.funnel.machine.fire(eng["stage"], trigger, ctx)
        if scratch is not None:
            scratch.notices.extend(f"(engine) {e}" for e in session.errors)
        if session.fired and session.state != eng["stage"]:
            self._enter(eng, session.state, now)
            if scratch is not None:
                scratch.stage = session.state
                scratch.stage_iteration = 0
        return session.fired

    @staticmethod
    def _enter(eng: dict[str, Any], stage: str, now: datetime) -> None:
        history = [dict(h) for h in eng["stage_history"]]
        if history and "exited_at" not in history[-1]:
            history[-1]["exited_at"] = now.isoformat()
        history.append({"stage": stage, "entered_at": now.isoformat()})
        eng["stage_history"] = history
        eng["stage"] = stage
        eng["stage_iteration"] = 0

    def _on_enter(self, firing: Firing, state: dict[str, Any], eng: dict[str, Any],
                  scratch: TurnScratch, now: datetime) -> None:
        spec = self.spec
        stage = self.funnel.stage(eng["stage"]).spec
        if spec.handoff and stage.name == spec.handoff.stage:
            h = spec.handoff
            if h.triggered_at and not state.get(h.triggered_at):
                state[h.triggered_at] = now.isoformat()
            if h.reason and not state.get(h.reason):
                reason = (firing.spec.reason if firing.spec else None) or \
                    scratch.handoff_requested or "unspecified"
                state[h.reason] = reason
        for call in stage.on_enter:
            self.funnel.actions.run(call, state, scratch)

    def _handoff_time(self, state: Mapping[str, Any]) -> Any:
        h = self.spec.handoff
        return state.get(h.triggered_at) if h and h.triggered_at else None

    def _handoff_payload(self, session_id: str, state: Mapping[str, Any], channel: str
                         ) -> dict[str, Any]:
        spec = self.spec
        public = {k: v for k, v in state.items()
                  if k not in ("conversation_summary",)}
        # The customer: the fields kept as personal data (Puramur's `customer`), the
        # value itself when there is one such field.
        personal = {k: state.get(k) for k, f in spec.state.items() if f.personal}
        customer = next(iter(personal.values())) if len(personal) == 1 else personal or None
        cart = {"lines": state.get(spec.cart.field) or [],
                "total": state.get(spec.cart.total) if spec.cart.total else None
                } if spec.cart else None
        reason = state.get(spec.handoff.reason) if spec.handoff and spec.handoff.reason else None
        return {"event": "handoff", "funnel": spec.name, "session_id": session_id,
                "channel": channel, "reason": reason, "customer": customer, "cart": cart,
                "state": public}


def _check_input(session_id: str, text: str) -> None:
    if not isinstance(session_id, str) or not 1 <= len(session_id) <= MAX_SESSION_ID \
            or "\x00" in session_id:
        raise FunnelError(f"session id must be a string of 1 to {MAX_SESSION_ID} characters "
                          f"without NUL; got {session_id!r:.60}")
    if not isinstance(text, str) or "\x00" in text:
        raise FunnelError(f"session {session_id!r}: the message must be text without NUL bytes")
    if len(text) > MAX_MESSAGE_CHARS:
        raise FunnelError(f"session {session_id!r}: the message has {len(text)} characters, "
                          f"over the limit of {MAX_MESSAGE_CHARS}; split it")
