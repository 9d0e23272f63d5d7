"""The turn: LOAD -> PROCESS -> SAVE, one customer message at a time.

The LLM proposes; code decides. :meth:`Engine.handle` runs one turn as a short
sequence of named steps over a :class:`Turn` (the turn in flight):

1. ``_load``: the message is logged in its own commit (durable even if all else
   fails) and the session's row read under its lease (new sessions get defaults);
2. ``steps.route``: a removed stage is mapped, a return after the idle gap detected
   (it may move the session), a new session's initial ``on_enter`` run;
3. ``steps.decide_language``: the customer's language detected and the reply's decided by the
   funnel's policy (`engine.turn.language`);
   ``steps.ask_model``: the stage's knowledge chunks retrieved (`engine.knowledge`), the stage
   prompt rendered from compact state and recent messages within its budget; the
   model called; its output validated against the stage schema (and the reply's
   language), with one repair call and then the stage's fallback reply;
4. ``steps.apply``: allowed updates and declared actions applied, derived fields
   recomputed;
5. advance (`engine.turn.advance`): exit transitions evaluated on the new state;
6. ``save.record``: state, reply, turn record and outbox saved in one transaction
   (checked against the row version).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from .. import knowledge
from ..boundary.customer import check_input
from ..errors import (
    ConcurrentUpdate,
    ConfigError,
    FunnelError,
    StoreUnavailable,
)
from ..experiments.router import Variants
from ..funnel.compiled import CompiledFunnel, load_funnel
from ..funnel.state import plain
from ..llm.embed import Embedder
from ..llm.models import LiteLLMModel, Model, make_model
from ..memory.recall import Recall, make_embedder
from ..memory.summary import RollingSummary, Summarizer
from ..records.messages import Message
from ..records.orders import Conversion, make_order
from ..store import Inbound, SessionAccess, Store, open_store
from . import approval, follow_up, held, language, save, steps, truth
from .begin import begin, fold_summary
from .data import Incoming, Turn, TurnResult
from .notify import Notifier, dispatch, make_notifier
from .playground import Withholding
from .routing import Routing
from .save import TECHNICAL_REPLY
from .stream import Listener, ReplyStream

__all__ = ["TECHNICAL_REPLY", "Engine", "TurnResult"]

log = logging.getLogger("funnel.engine")



class Engine:
    """Runs conversations of one funnel. Build with :meth:`open`; share across sessions.

    Example::

        engine = await Engine.open("funnels/puramur.yaml", model="gpt-4o-mini")
        result = await engine.handle("tg-1227845053", "I have a Yorkie", channel="telegram")
        print(result.reply, result.stage_after)
    """

    def __init__(self, funnel: CompiledFunnel, store: Store, model: Model, *,
                 notifier: Notifier | None = None,
                 clock: Callable[[], datetime] | None = None,
                 playground: bool = False, deploy: bool = False) -> None:
        self.funnel = funnel
        # The studio's: its turns queue nothing that leaves the process
        # (engine.turn.playground); they say what they would have sent instead.
        self.playground = playground
        self.spec = funnel.spec
        self.store = store
        self.model = model
        self.notifier = notifier or make_notifier(funnel.spec)
        self._own_notifier = notifier is None  # made from the funnel: a deploy remakes it
        self.clock = clock or (lambda: datetime.now(UTC))
        self._owns_store = False
        # The window is read with the row, before the stage is known: read the widest.
        self._window = max(s.spec.memory.window for s in funnel.stages.values())
        self._tasks: set[asyncio.Task[Any]] = set()
        self.summary = RollingSummary(funnel.spec, store, self._window, model=model,
                                      clock=self.clock)
        # Versions and variants (engine.turn.routing). Only a deploying engine (`funnel
        # serve`'s) makes its versions the copies pinned sessions load; any other engine's
        # (the studio's live edits, `funnel chat`'s, a test's) are stored as trials.
        self.deploy_mode = deploy and not playground
        self.routing = Routing(funnel, store, deploy=self.deploy_mode)
        self.recall: Recall | None = None  # semantic recall, when the funnel sets it

    @classmethod
    async def open(cls, funnel: str | Path | CompiledFunnel, *, db: str | None = None,
                   model: str | Model | None = None, api_base: str | None = None,
                   notifier: Notifier | None = None, store: Store | None = None,
                   clock: Callable[[], datetime] | None = None,
                   summarizer: Summarizer | None = None,
                   embedder: Embedder | None = None, playground: bool = False,
                   deploy: bool = False) -> Engine:
        """Load the funnel, open the store (embedded PostgreSQL without ``db``), check the table.

        Raises:
            FunnelInvalid: the funnel has errors.
            StoreUnavailable: the database cannot be reached.
            SchemaOutdated: the table is behind the funnel (run ``funnel migrate``).

        ``model`` defaults to the funnel's ``model.name``; ``summarizer`` to observational
        memory written by ``memory.summarizer_model`` when set, else by ``model`` when it
        is a real (litellm) model, at its ``api_base``; with the scripted model, to the
        offline extractive summary (docs/memory.md). ``playground``: the studio's engine,
        whose turns queue no hand-off alert, reply or approval (engine.turn.playground),
        whose versions are not written to the version store, and which replaces no
        knowledge index (it indexes a funnel that has none).
        ``deploy``: this engine serves production (`funnel serve` sets it): the version it
        opens on, and each one :meth:`deploy` gives it, become the copies that sessions
        pinned to their version load. Without it the engine runs a **trial**: its copies
        are stored by content hash (so that `funnel replay` can play its turns again) and
        never loaded for another session (docs/versions.md).
        With ``memory.recall`` set, the
        store is readied for semantic recall (pgvector, else the ``real[]`` fallback, with
        a warning saying so) and ``embedder`` defaults to ``memory.recall.embedder``.
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
            await knowledge.ensure_index(store, compiled.spec, replace=not playground)
            # Off the event loop and side by side, before the first customer: the language
            # models load in ~0.8 s once per process, litellm builds its types in ~1 s.
            warm_ups = [asyncio.to_thread(model.warm)] if isinstance(model, LiteLLMModel) else []
            if compiled.spec.language_policy.mode != "model":
                warm_ups.append(asyncio.to_thread(language.warm,
                                                  compiled.spec.language_policy.candidates))
            await asyncio.gather(*warm_ups)
            engine = cls(compiled, store, model, notifier=notifier, clock=clock,
                         playground=playground, deploy=deploy)
            settings = compiled.spec.memory.recall
            if settings is not None:
                engine.recall = Recall(compiled.spec, store, embedder or make_embedder(
                    settings, api_base or compiled.spec.model.api_base), settings)
                await engine.recall.start()
            await engine.routing.versions.store_newest(compiled, strict=False)  # for when it is old
        except BaseException:
            if owns:
                await store.close()
            raise
        engine._owns_store = owns
        engine.summary = RollingSummary(compiled.spec, store, engine._window, summarizer,
                                        api_base=api_base, model=model, clock=engine.clock)
        return engine

    async def deploy(self, funnel: CompiledFunnel) -> None:
        """Make ``funnel`` the newest version: new sessions start on it, and it is stored in
        the version store (when new): deployed when the engine was opened with ``deploy``,
        else as a trial. Turns in flight keep the version they run on;
        sessions pinned to an older one stay on it until they end (docs/versions.md).

        Raises:
            ConfigError: ``funnel`` is another funnel (its name differs).
            SchemaOutdated: its table lacks columns (run ``funnel migrate`` first);
                the engine keeps running the version it had.
        """
        if funnel.name != self.funnel.name:
            raise ConfigError(f"cannot deploy funnel '{funnel.name}' on the engine of funnel "
                              f"'{self.funnel.name}'; open an Engine for it")
        await self.store.ensure_schema(funnel.spec)
        await self.routing.deploy(funnel)
        self.funnel, self.spec = funnel, funnel.spec
        # Wide enough for every version loaded (the window is read before the version
        # is known).
        self._window = max(self._window, *(s.spec.memory.window
                                           for s in funnel.stages.values()))
        self.summary.spec, self.summary.window = funnel.spec, self._window
        if self.recall is not None and funnel.spec.memory.recall is not None:
            self.recall.spec, self.recall.settings = funnel.spec, funnel.spec.memory.recall
        if self._own_notifier:
            self.notifier = make_notifier(funnel.spec)

    def loaded_versions(self) -> dict[int, str]:
        """The versions compiled in this engine, ``{version: content hash}``: the newest
        (new sessions start on it) and the old ones that pinned sessions came back to."""
        return self.routing.loaded()

    @property
    def variants(self) -> Variants:
        """The newest version's experiment variants (``force`` one for QA)."""
        return self.routing.variants

    async def close(self) -> None:
        await self.drain()
        self.routing.close()
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

    async def record_conversion(self, session_id: str, order_id: str, amount: Decimal | str | int,
                                currency: str, lines: Sequence[Mapping[str, Any]] = (),
                                ordered_at: datetime | str | None = None) -> Conversion:
        """Record an order the session's customer placed: what was actually bought.

        Idempotent on ``order_id`` (per funnel): the same order again returns the
        stored one with ``replayed`` set. `funnel report` counts purchases and
        revenue from these; bounds are in :mod:`engine.records.orders`.

        Args:
            session_id: The session the order came from; it must exist.
            order_id: The shop's order id (1-128 of ``A-Za-z0-9_.:#/-``).
            amount: The order total, ``Decimal("697.00")`` or ``"697.00"`` (two decimals).
            currency: An ISO 4217 code such as ``"UAH"``.
            lines: ``{"sku", "qty", "price"}`` per product bought.
            ordered_at: When it was ordered (timezone-aware); None: now.

        Returns:
            The conversion as stored.

        Raises:
            OrderRejected: a field is missing or out of bounds; nothing was written.
            UnknownSession: the funnel has no such session.
            OrderConflict: ``order_id`` was recorded before with other content.
        """
        check_input(session_id, "order")  # the session id's bounds (the text is a stand-in)
        order = make_order(session_id, order_id, amount, currency, lines, ordered_at)
        return await self.store.record_conversion(self.spec, order)

    async def dispatch(self, session_id: str | None = None) -> int:
        """Deliver due side effects (handoff alerts); return how many were delivered."""
        return await dispatch(self.store, {self.spec.name: self.notifier},
                              funnel=self.spec.name, session_id=session_id)

    async def handle(self, session_id: str, text: str, *, channel: str = "api",
                     key: str | None = None, reply_to: Mapping[str, Any] | None = None,
                     message_id: int | None = None, facts: Mapping[str, Any] | None = None,
                     stream: Listener | None = None) -> TurnResult:
        """Run one turn for a customer message and return what to answer.

        ``key`` is the message's delivery key (unique per funnel and channel): a
        second delivery with it runs no turn. ``reply_to``, when given, makes the
        reply an outbox row (kind ``reply``: these fields and ``text``) saved with
        the turn, for a channel that delivers it (Telegram). ``message_id`` runs the
        turn of a message logged before (accepted, not yet answered). ``facts`` are
        values the channel knows (a deep link's attribution), written to declared state
        fields that are still empty; the model never sees them as the customer's text.
        ``stream`` gets the reply as the model writes it, ``(kind, text)`` events
        (engine.turn.stream: ``delta`` adds, ``replace`` replaces what was shown); when
        the turn returns, what it was shown is exactly ``reply``. Nothing shown is
        applied before the whole answer validates; the turn is recorded as any other.

        Raises:
            InvalidInput: a bad session id or message (nothing is written).
            StoreUnavailable: the database is down (the message is logged if it got that far).
            DuplicateDelivery: ``key`` was received before (nothing is written).
        """
        check_input(session_id, text)
        inbound = Incoming(session_id, text, channel, time.perf_counter(),
                            message_id=message_id or None,
                            delivery=Inbound(channel, key) if key else None,
                            reply_to=reply_to, facts=facts or {},
                            stream=ReplyStream(stream) if stream is not None else None)
        for attempt in range(3):
            try:
                async with self.store.session(self.spec, session_id) as opened:
                    access = Withholding(opened) if self.playground else opened
                    turn = await self._load(access, inbound)
                    # Read with the row, under the lease: a take-over is either before
                    # this (the turn is held) or after it (the bot answers first).
                    control = access.control
                    if approval.due(control, turn.now):
                        # The approval's time is up: on_timeout applies, then the turn
                        # runs on the session as that left it (the message is logged).
                        assert control is not None
                        decided = await approval.resolve(self.store, turn, control,
                                                         "timeout", None)
                        if decided["alerted"]:
                            self._background(self._dispatch_quietly(session_id))
                        turn = await self._load(access, inbound)
                        control = access.control
                    if control is not None:
                        result = await held.hold(access, turn, control)
                        break
                    try:
                        result = await self._run(access, turn)
                    except (ConcurrentUpdate, StoreUnavailable):
                        raise
                    except Exception as exc:  # every failure after the log ends in a reply
                        result = await save.fail(access, turn, exc, self._model_name,
                                                 self._restart)
                break
            except ConcurrentUpdate as exc:
                # A session deleted under the turn (a retention purge took it after this
                # turn lost its lease) is not started again from here: its message went
                # with it, and a reply must not stand without it. The customer resends.
                if attempt == 2 or (exc.found is None and exc.expected > 0):
                    raise
            except StoreUnavailable:
                if inbound.message_id is None and inbound.delivery is None:
                    # No turn connection to be had: still try to keep the message (one
                    # with a delivery key comes again with it, and is logged then).
                    with contextlib.suppress(StoreUnavailable):
                        await self.store.log_message(self.spec, session_id, "user", text)
                raise
        if inbound.stream is not None:
            inbound.stream.finish(result.reply)
        if isinstance(access, Withholding):
            result.withheld = access.withheld
        elif result.handoff or result.approval:
            # Deliver after the reply, never before it: a slow manager webhook must not
            # delay the customer. A delivery that fails is retried by the next dispatch.
            self._background(self._dispatch_quietly(session_id))
        if self.spec.has_follow_ups and not self.playground:
            # The next follow-up counts from this message (engine.turn.follow_up); one
            # not planned now is planned by the next message.
            try:
                await follow_up.after_turn(self, session_id, text, result, turn.now)
            except StoreUnavailable as exc:
                log.warning("session %r: its follow-ups were not planned: %s", session_id, exc)
        if turn.summary_job is not None:
            self._background(self.summary.run(session_id, turn.summary_job))
        if self.recall is not None and not result.held:
            # Off the hot path: the message (with the vector its query computed) and the
            # reply embedded after the reply; what fails is left to the next turn's job.
            known = {inbound.message_id: turn.query_vector} \
                if inbound.message_id and turn.query_vector else {}
            self._background(self.recall.index(session_id, known))
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
    async def _run(self, access: SessionAccess, turn: Turn) -> TurnResult:
        """LOAD (done) -> route -> ask -> apply -> advance -> SAVE."""
        recall = self.recall if turn.spec.memory.recall is not None else None
        if recall is not None:
            # The query's embedding travels while the summary is planned and the stage
            # routed; the prompt waits for what is left of its deadline (steps.recalled).
            turn.recall_started = time.monotonic()
            turn.recall_task = asyncio.get_running_loop().create_task(
                recall.embed_query(turn.text))
        try:
            await fold_summary(turn, self.summary, self._window)
            # The steps that may run hooks run off the event loop when the funnel has any.
            await steps.off_loop(turn, steps.route, turn)
            steps.decide_language(turn)
            answer = await steps.ask_model(turn, self.summary, self.store, self.model,
                                           turn.inbound.stream, recall)
        finally:
            if turn.recall_task is not None and not turn.recall_task.done():
                turn.recall_task.cancel()
        stage = turn.pos["stage"]  # the stage the model answered in
        snapshot = truth.Snapshot.take(turn) \
            if not answer.fallback and turn.funnel.claims.active(stage) else None
        await steps.applied(turn, answer)
        if snapshot is not None:
            # What the reply claims, on the state the answer leaves (engine.turn.truth).
            answer = await truth.checked(
                turn, answer, snapshot, stage, self.model, steps.applied,
                turn.say(turn.funnel.stage(stage).spec.fallback), steps.reply_check(turn),
                turn.inbound.stream)
        return await save.record(access, turn, answer, self._model_name)

    async def _load(self, access: SessionAccess, inbound: Incoming) -> Turn:
        """Log the message (once, however often the turn is retried) and read the row."""
        if inbound.message_id is None:
            message_id, row, recent = await access.load(3 * self._window, text=inbound.text,
                                                        inbound=inbound.delivery)
            inbound.message_id = message_id
        else:
            _, row, recent = await access.load(3 * self._window, current_id=inbound.message_id,
                                               inbound=inbound.delivery)
        await self.routing.prepare(row)  # a pinned session's version, from the store
        return self._start(inbound, self.clock(), row, recent)

    def _funnel_for(self, session_id: str, row: Mapping[str, Any] | None,
                    now: datetime | None = None) -> CompiledFunnel:
        """The compiled funnel this session's turn runs on.

        The one seam where a session is matched to a funnel: the steps below read
        ``turn.funnel`` and ``turn.spec``, never ``self.funnel``, so that a session can
        run on another version or variant of the funnel than the newest one.
        """
        return self.routing.choose(session_id, row, now or self.clock())

    def _start(self, inbound: Incoming, now: datetime, row: dict[str, Any] | None,
               recent: list[Message], funnel: CompiledFunnel | None = None) -> Turn:
        """The turn in flight, from the row as read (a new session gets the defaults), on
        ``funnel`` when given (a failed turn's), else on the session's (``_funnel_for``)."""
        funnel = funnel or self._funnel_for(inbound.session_id, row, now)
        return begin(inbound, now, row, recent, funnel, self.routing)

    @property
    def _model_name(self) -> str | None:
        return getattr(self.model, "name", None)

    def _restart(self, turn: Turn) -> Turn:
        """The turn begun afresh from what ``turn`` read, on the funnel it ran on."""
        return self._start(turn.inbound, turn.now, turn.row, turn.recent, turn.funnel)
