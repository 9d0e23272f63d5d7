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
import json
import logging
import re
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .actions import ActionOutcome, TurnScratch
from .errors import ConcurrentUpdate, FunnelError, ModelError, PromptTooLarge, StoreUnavailable
from .funnel import CompiledFunnel, CompiledStage, load_funnel
from .machine import Firing
from .memory import ExtractiveSummarizer, ModelSummarizer, Summarizer, fit_prompt
from .models import Completion, Model, ModelRequest, make_model
from .notify import Notifier, dispatch, make_notifier
from .prompts import Message, build_context, full_view, render
from .state import defaults, plain
from .store import OutboxItem, SessionAccess, Store, TurnWrite, open_store

log = logging.getLogger("funnel.engine")

# (summary so far, summary_upto, messages to fold); (None, 0, None): read them from the log.
SummaryJob = tuple[str | None, int, list[Message] | None]

MAX_SESSION_ID = 200
MAX_MESSAGE_CHARS = 8000
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


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
    backlog: int = 0  # messages that left the window and wait for the summary


@dataclass
class _Answer:
    envelope: dict[str, Any]
    completions: list[Completion]
    failures: int = 0
    fallback: bool = False
    error: str | None = None


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
        self._summary_impl: Summarizer | None = None

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
        engine._summary_impl = summarizer
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
            await self.dispatch(session_id)
        if job:
            self._background(self.summarize(session_id, *job[0]))
        return result

    def _background(self, job: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for background work (summaries) to finish."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def summarize(self, session_id: str, summary: str | None = None, upto: int = 0,
                        backlog: list[Message] | None = None) -> bool:
        """Fold messages that left the window into the session's summary.

        Runs after the reply (in the background); never raises: a failure is
        logged and the next turn's job starts again from ``summary_upto``.
        Returns whether a new summary was stored.
        """
        memory = self.spec.memory
        try:
            if summary is None or not backlog:
                # Catching up (the turn did not have every message at hand): read the log.
                summary, upto, rows = await self.store.summary_backlog(
                    self.spec, session_id, self._window)
                backlog = [Message(m.role, m.content, i) for i, m in rows]
            if not backlog:
                return False
            new = await self._summarizer().summarize(summary, backlog, memory.summary_budget)
            return await self.store.save_summary(self.spec, session_id, new, upto,
                                                 backlog[-1].id)
        except Exception as exc:  # the customer's turn already succeeded
            log.warning("summary of session %r failed (%s: %s); it will catch up on the "
                        "next turn", session_id, type(exc).__name__, exc)
            return False

    def _summarizer(self) -> Summarizer:
        if self._summary_impl is None:
            name = self.spec.memory.summarizer_model
            self._summary_impl = ModelSummarizer(make_model(name)) if name else \
                ExtractiveSummarizer()
        return self._summary_impl

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
            state = {name: plain(row.get(name)) for name in spec.state}
            eng = {k: plain(row[k]) for k in ("stage", "stage_iteration", "turns",
                                              "stage_history", "notices")}
            expected, last_seen = int(row["row_version"]), row["last_message_at"]
        # Messages outside the window not yet in the summary, once the reply is logged.
        backlog = max(0, int((row or {}).get("message_backlog") or 1) + 1 - self._window)
        planned = self._plan_summary(state, row, recent, backlog)
        folded: tuple[str, int] | None = None
        summarizer = self._summarizer() if planned is not None else None
        if planned is not None and planned[2] and getattr(summarizer, "inline", False):
            assert summarizer is not None and planned[0] is not None
            new = await summarizer.summarize(planned[0], planned[2],
                                             spec.memory.summary_budget)
            folded = (new, planned[2][-1].id)
        elif planned is not None:
            job.append(planned)
        stage_before = eng["stage"]
        if stage_before not in funnel.stages and stage_before in spec.removed_stages:
            self._enter(eng, spec.removed_stages[stage_before], now)
        firings: list[Firing] = []
        idle = (now - last_seen).total_seconds() if last_seen else None
        gap = funnel.stage(eng["stage"]).spec.memory.idle_return_after
        returning = bool(idle is not None and gap is not None and idle >= gap)
        if returning and spec.memory.idle_return_stage:
            firings += self._fire(eng, "idle_return", {}, now)

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
            answer = _Answer({"reply": stage.spec.fallback}, [], fallback=True, error=str(exc))
        else:
            answer = await self._ask(stage, fitted.messages, session_id, eng["turns"] + 1, text)

        scratch = TurnScratch(session_id, eng["stage"], eng["stage_iteration"], now)
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
        moved = False
        for _ in range(len(spec.stages)):
            if funnel.stage(eng["stage"]).spec.final:
                break
            ctx = self._cond_ctx(state, eng, accepted, scratch, returning)
            fired = self._fire(eng, "advance", ctx, now, scratch)
            if not fired:
                break
            firings += fired
            moved = True
            before = dict(state)
            self._on_enter(fired[-1], state, eng, scratch, now)
            if state != before:  # entering the stage changed facts: derive again
                funnel.rules.recompute(state, self._cond_ctx(state, eng, accepted, scratch,
                                                             returning), now.isoformat())
            if eng["stage"] in visited:
                break
            visited.add(eng["stage"])
        if not moved and not firings:
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
                "cost": sum(costs) if costs else None,
                "model": getattr(self.model, "name", None), "error": answer.error,
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

    def _plan_summary(self, state: Mapping[str, Any], row: Mapping[str, Any] | None,
                      recent: list[Message], backlog: int) -> SummaryJob | None:
        """Decide whether this turn folds old messages into the summary (after the reply).

        The turn read up to three windows of messages; once a window's worth has left
        the window unsummarized, the job gets them directly, with no extra query.
        """
        field = self.spec.memory.summary
        if not field or row is None or backlog < max(2, self._window):
            return None
        upto = int(row.get("summary_upto") or 0)
        complete = len(recent) < 3 * self._window or (recent and recent[0].id <= upto)
        if not complete:
            return (None, 0, None)  # too far behind (a summarizer was down): read the log
        older = [m for m in recent[:-self._window] if m.id > upto] if self._window else []
        return (str(state.get(field) or ""), upto, older) if older else None

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
        public = {k: v for k, v in state.items()
                  if k not in ("conversation_summary",)}
        return {"event": "handoff", "funnel": self.spec.name, "session_id": session_id,
                "channel": channel, "state": public}

    async def _ask(self, stage: CompiledStage, messages: list[dict[str, str]], session_id: str,
                   turn: int, text: str) -> _Answer:
        request = ModelRequest(messages=messages, schema=stage.schema, stage=stage.spec.name,
                               settings=stage.spec.model, session_id=session_id, turn=turn,
                               user_text=text)
        fallback = {"reply": stage.spec.fallback}
        completions: list[Completion] = []
        try:
            first = await self.model.complete(request)
        except ModelError as exc:
            return _Answer(fallback, completions, fallback=True, error=str(exc))
        completions.append(first)
        envelope, problem = parse_output(stage, first.text)
        if envelope is not None:
            return _Answer(envelope, completions)
        repair = ModelRequest(
            messages=[*messages, {"role": "assistant", "content": first.text[:4000]},
                      {"role": "user", "content": (
                          f"Your last answer was rejected: {problem}. Answer again with one "
                          "JSON object that satisfies the output schema; keep the same meaning.")}],
            schema=stage.schema, stage=stage.spec.name, settings=stage.spec.model,
            session_id=session_id, turn=turn, user_text=text, attempt=1)
        try:
            second = await self.model.complete(repair)
        except ModelError as exc:
            return _Answer(fallback, completions, failures=1, fallback=True,
                           error=f"{problem}; repair call failed: {exc}")
        completions.append(second)
        envelope, problem2 = parse_output(stage, second.text)
        if envelope is not None:
            return _Answer(envelope, completions, failures=1)
        return _Answer(fallback, completions, failures=2, fallback=True,
                       error=f"{problem}; after repair: {problem2}")


def parse_output(stage: CompiledStage, text: str) -> tuple[dict[str, Any] | None, str]:
    """Parse and validate a model output; return (envelope, "") or (None, the problem).

    The problem names the JSON path and message of the most relevant
    validation error (``jsonschema.exceptions.best_match``), for the repair call.
    """
    from jsonschema.exceptions import best_match

    fenced = _FENCE.match(text)
    raw = fenced.group(1) if fenced else text.strip()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if not isinstance(data, dict):
        return None, "the output must be a JSON object with `reply`"
    error = best_match(stage.validator.iter_errors(data))
    if error is not None:
        return None, f"at {error.json_path}: {error.message}"
    # The envelope's shape is checked here too: a schema that passes `funnel validate`
    # need not type `updates` or `actions` items, and the turn must not crash on them.
    if not isinstance(data.get("updates") or {}, dict):
        return None, "at $.updates: must be an object of state fields"
    actions = data.get("actions") or []
    if not isinstance(actions, list) or not all(isinstance(a, dict) for a in actions):
        return None, "at $.actions: must be a list of objects, each with a `type`"
    return data, ""


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


class SyncEngine:
    """A blocking wrapper for scripts and the CLI: one private event loop, same engine."""

    def __init__(self, funnel: str | Path | CompiledFunnel, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self.engine: Engine = self._loop.run_until_complete(Engine.open(funnel, **options))

    def handle(self, session_id: str, text: str, *, channel: str = "api") -> TurnResult:
        return self._loop.run_until_complete(self.engine.handle(session_id, text,
                                                                channel=channel))

    def state(self, session_id: str) -> dict[str, Any] | None:
        return self._loop.run_until_complete(self.engine.state(session_id))

    def close(self) -> None:
        try:
            self._loop.run_until_complete(self.engine.close())
        finally:
            self._loop.close()

    def __enter__(self) -> SyncEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
