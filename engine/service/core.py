"""The service core: the funnels, their engines on one shared store, and a turn with its
limits. The HTTP layer (``app``) and the Telegram webhook call :meth:`Service.converse`.

The database is opened at start-up and, while it is down, again on later
requests; after a connection failure turns are refused (503 + Retry-After)
for ``FUNNEL_RETRY_AFTER`` seconds instead of each waiting for the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

from ..errors import (
    ConcurrentUpdate,
    ConfigError,
    DuplicateDelivery,
    FunnelError,
    InvalidInput,
    SchemaOutdated,
    StoreUnavailable,
)
from ..funnel.compiled import CompiledFunnel
from ..llm.models import Model, make_model
from ..store import Store, open_store
from ..turn import follow_up, follow_up_webhook, manager
from ..turn.engine import Engine, TurnResult
from ..turn.notify import Notifier, make_notifier
from ..turn.stream import Listener
from .auth import ApiKeys, Client, WidgetSession, WidgetTokens, presented_key
from .config import LIFESPAN_SHUTDOWN_SECONDS, ServiceConfig, check_key_funnels
from .limits import RateLimiter, RequestRefused, SessionQueue
from .metrics import Metrics, follow_up_stages
from .preloaded import compiled_funnel
from .reload import Reloader

log = logging.getLogger("funnel.service")


class Channel(Protocol):
    """What the service's life cycle needs of a channel that delivers its own replies."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def queued(self) -> int: ...

    async def webhook(self, request: Request, funnel: str) -> Response: ...

    async def sweep(self, funnel: str) -> int: ...

    async def deliver_due(self, funnel: str, session_id: str | None = None) -> int: ...


class _NoChannel:
    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def queued(self) -> int:
        return 0

    async def webhook(self, request: Request, funnel: str) -> Response:
        raise RequestRefused(404, "not_found", f"funnel '{funnel}' has no Telegram bot")

    async def sweep(self, funnel: str) -> int:
        return 0

    async def deliver_due(self, funnel: str, session_id: str | None = None) -> int:
        return 0


# Of the shutdown's budget, what closing the database pool and the model clients may take.
RELEASE_SECONDS = 2.0


class Service:
    """The funnels, their engines on one shared store, and the request limits."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.funnels: dict[str, CompiledFunnel] = {}
        for item in config.funnels:
            compiled = item if isinstance(item, CompiledFunnel) else compiled_funnel(item)
            if compiled.name in self.funnels:
                raise ConfigError(f"two funnels are named '{compiled.name}'; names must differ")
            self.funnels[compiled.name] = compiled
        check_key_funnels(config, self.funnels)
        self.keys = ApiKeys(config.api_keys, config.key_funnels)
        # What else holds a session's data in memory, forgotten when it is erased
        # (engine.service.privacy): the mounted studio's prompts (engine.service.app).
        self.forgetters: list[Callable[[str, str], int]] = []
        self.tokens = WidgetTokens(config.secret, config.token_ttl)
        self.limiter = RateLimiter(*config.rate_limit)
        self.queue = SessionQueue(config.session_queue)
        self.metrics = Metrics(config.metrics_dir)
        # The Telegram channel needs the service, so app.py builds it and attaches it
        # (attach_telegram); until then, a channel that does nothing.
        self.telegram: Channel = _NoChannel()
        for name, compiled in self.funnels.items():
            self.metrics.declare(name, compiled.spec.stages,
                                 telegram=config.telegram_bot(name) is not None,
                                 follow_ups=follow_up_stages(compiled.spec))
        self.models: dict[str, Model] = {}
        for name, compiled in self.funnels.items():
            model = config.model or compiled.spec.model.name
            self.models[name] = model if not isinstance(model, str) else make_model(
                model, api_base=config.api_base, structured_output=config.structured_output)
        self.store: Store | None = None
        self.engines: dict[str, Engine] = {}
        self.problems: dict[str, str] = {}  # funnel -> why it has no engine (schema outdated)
        self.notifiers: dict[str, Notifier] = {
            name: make_notifier(compiled.spec, webhook=config.webhook(name),
                                link=self._link if config.public_url else None)
            for name, compiled in self.funnels.items()}
        # Claims this process makes on messages a dead worker left (engine.store.idempotency).
        self.holder = f"svc-{uuid.uuid4().hex[:16]}"
        self._open_lock = asyncio.Lock()
        self._down_until = 0.0
        self._dispatcher: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._metrics_writer: asyncio.Task[None] | None = None
        # Hot reload (engine.service.reload): watches the funnels' files, takes SIGHUP.
        self.reloader = Reloader(self, config.reload_interval, watch=config.reload)

    def attach_telegram(self, channel: Channel) -> None:
        """The service's Telegram channel (built in app.py: it needs the service)."""
        self.telegram = channel
        self.metrics.queued = channel.queued

    # -- life cycle --------------------------------------------------------------------
    async def start(self) -> None:
        await self.telegram.start()
        try:
            await self.open_engines()
        except StoreUnavailable as exc:
            log.warning("starting without the database (will retry): %s", exc)
        await self.reloader.start()
        loop = asyncio.get_running_loop()
        self._dispatcher = loop.create_task(self._dispatch_loop())
        if self.metrics.directory is not None:
            self._metrics_writer = loop.create_task(self._write_metrics())

    async def close(self, budget: float = LIFESPAN_SHUTDOWN_SECONDS) -> None:
        """Stop everything this service started, within ``budget`` seconds in all.

        In order: the reloader, the outbox dispatcher (the delivery it is in may finish), the
        metrics writer, the Telegram channel (its accepted turns finish), the engines'
        background work; the last :data:`RELEASE_SECONDS` of the budget are kept for the
        database pool and the model clients. What is still running when the budget is spent
        is cancelled, and the log says what: a message accepted and not answered is
        answered by the next worker (engine.store.idempotency), an outbox row not marked
        delivered is delivered again (at least once, with its idempotency key).
        """
        # The dispatcher finishes the delivery it is in (a reply sent but not yet marked
        # would be sent again by the next process): stop it between rounds.
        self._stopping.set()
        step = ["the reloader"]
        wind_down = max(0.0, budget - RELEASE_SECONDS)
        try:
            await asyncio.wait_for(self._wind_down(step, time.monotonic() + wind_down),
                                   wind_down)
        except TimeoutError:
            log.error("shutdown: %s still running after %g s; cut (accepted messages are "
                      "answered by the next worker, undelivered outbox rows delivered by it)",
                      step[0], wind_down)
        self.metrics.flush()
        self.metrics.close()
        try:
            await asyncio.wait_for(self._release(), RELEASE_SECONDS)
        except TimeoutError:
            log.error("shutdown: the database pool or a model client did not close within "
                      "%g s; exiting without them", RELEASE_SECONDS)

    async def _wind_down(self, step: list[str], end: float) -> None:
        await self.reloader.close()
        step[0] = "the outbox dispatcher"
        if self._dispatcher is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._dispatcher),
                                       timeout=max(0.0, min(15.0, end - time.monotonic())))
        for task in (self._dispatcher, self._metrics_writer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        step[0] = "the Telegram channel's accepted turns"
        await self.telegram.close()
        step[0] = "the engines' background work"
        for engine in self.engines.values():
            await engine.close()  # waits for background work; the store is ours to close

    async def _release(self) -> None:
        if self.store is not None:
            await self.store.close()
        for model in self.models.values():  # litellm's HTTP clients belong to this loop
            close = getattr(model, "aclose", None)
            if close is not None:
                await close()

    async def _write_metrics(self) -> None:
        """Write the gauges read from a callable once a second, for the other workers'
        scrapes (counts are shared as they happen: engine.service.metrics)."""
        while True:
            await asyncio.sleep(1.0)
            self.metrics.flush()

    async def _dispatch_loop(self) -> None:
        """Every ``dispatch_interval`` seconds, deliver the outbox rows that are due (alerts
        and replies whose delivery failed, after their backoff, or that a crashed process
        left), answer the Telegram messages a dead worker accepted, apply the
        ``on_timeout`` of approvals past their deadline, and send the follow-ups due. Every worker runs
        one; a claimed row is invisible to the others."""
        while not self._stopping.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.config.dispatch_interval)
            if self._stopping.is_set():
                return
            for name in list(self.engines):
                try:
                    engine = self.engines.get(name)
                    if engine is not None and any(
                            s.approval for s in engine.spec.stages.values()):
                        # Approvals past their deadline get their on_timeout now, not
                        # only at the customer's next message (engine.turn.approval).
                        await manager.sweep(engine)
                    if engine is not None and engine.spec.has_follow_ups:
                        # Due follow-ups, written to the outbox that the delivery next
                        # sends; of several workers one sends each (engine.turn.follow_up).
                        self.metrics.follow_ups(name, await follow_up.run_due(engine))
                        await follow_up_webhook.deliver(engine.store, name)
                    await self.telegram.sweep(name)
                    await self.telegram.deliver_due(name)
                    await self._measure_outbox()
                except StoreUnavailable as exc:
                    log.warning("outbox of %s: %s", name, exc)
                except Exception:
                    log.exception("outbox of %s: the dispatch failed", name)

    async def _measure_outbox(self) -> None:
        if self.store is None:
            return
        backlog = await self.store.outbox_backlog()
        for name in self.funnels:
            count, age = backlog.get(name, (0, 0.0))
            self.metrics.gauge("funnel_outbox_backlog", count, funnel=name)
            self.metrics.gauge("funnel_outbox_oldest_due_seconds", age, funnel=name)

    def _link(self, payload: Mapping[str, Any]) -> str:
        session = urllib.parse.quote(str(payload.get("session_id", "")), safe="@:")
        base = (self.config.public_url or "").rstrip("/")
        return f"{base}/v1/funnels/{payload.get('funnel')}/sessions/{session}"

    def trip(self) -> RequestRefused:
        """Note that the database is down; the refusal to answer with meanwhile."""
        self._down_until = time.monotonic() + self.config.retry_after
        return self._down()

    def recovered(self) -> None:
        self._down_until = 0.0

    def _down(self) -> RequestRefused:
        wait = max(1, math.ceil(self._down_until - time.monotonic()))
        return RequestRefused(503, "unavailable", "the database is unreachable; nothing was lost "
                              "that the service accepted: send again later", retry_after=wait)

    async def open_engines(self) -> None:
        """Open the store and an engine per funnel (each checks its table)."""
        if len(self.engines) == len(self.funnels):
            return
        if time.monotonic() < self._down_until:
            raise StoreUnavailable("the database was unreachable moments ago")
        async with self._open_lock:
            try:
                if self.store is None:
                    c = self.config
                    self.store = await open_store(c.db, max_connections=c.db_pool,
                                                  max_turns=c.turn_pool, timeout=c.db_timeout)
                for name, compiled in self.funnels.items():
                    if name not in self.engines:
                        try:
                            self.engines[name] = await Engine.open(
                                compiled, store=self.store, model=self.models[name],
                                notifier=self.notifiers[name], api_base=self.config.api_base,
                                deploy=True)
                            self.problems.pop(name, None)
                        except SchemaOutdated as exc:
                            self.problems[name] = str(exc)
            except StoreUnavailable:
                self.trip()
                raise

    async def engine(self, funnel: str) -> Engine:
        engine = self.engines.get(funnel)
        if engine is None:
            try:
                await self.open_engines()
            except StoreUnavailable:
                raise self._down() from None
            engine = self.engines.get(funnel)
            if engine is None:
                log.error("funnel %s: %s", funnel, self.problems.get(funnel))
                raise RequestRefused(503, "schema_outdated", "the funnel's table is behind its "
                                     "declaration; run `funnel migrate`", retry_after=60)
        return engine

    # -- a turn ------------------------------------------------------------------------
    async def converse(self, funnel: str, session_id: str, text: str, *, channel: str,
                       key: str | None = None, reply_to: Mapping[str, Any] | None = None,
                       message_id: int | None = None, facts: Mapping[str, Any] | None = None,
                       stream: Listener | None = None) -> TurnResult:
        """Run one turn, within the per-session queue; refusals are :class:`RequestRefused`.

        ``key`` is the message's delivery key; a second delivery raises
        :class:`DuplicateDelivery` (engine.service.inbound replays it). ``stream`` gets
        the reply as the model writes it (engine.turn.stream). See
        :meth:`engine.turn.engine.Engine.handle` for the other arguments.
        """
        if time.monotonic() < self._down_until:
            raise self._down()
        engine = await self.engine(funnel)
        queue_key = f"{funnel}/{session_id}"
        self.queue.enter(queue_key)
        started = time.perf_counter()
        self.metrics.in_flight(+1)
        try:
            result = await engine.handle(session_id, text, channel=channel, key=key,
                                         reply_to=reply_to, message_id=message_id, facts=facts,
                                         stream=stream)
        except DuplicateDelivery:
            raise
        except StoreUnavailable as exc:
            log.warning("funnel %s: %s", funnel, exc)
            raise self.trip() from None
        except ConcurrentUpdate:
            raise RequestRefused(503, "busy", "the session changed under this turn; send the "
                                 "message again", retry_after=1) from None
        except InvalidInput as exc:
            raise RequestRefused(400, "bad_request", str(exc)) from None
        except FunnelError:
            log.exception("funnel %s: the turn failed", funnel)
            raise RequestRefused(500, "internal", "the turn failed; see the service log") from None
        finally:
            self.queue.leave(queue_key)
            self.metrics.in_flight(-1)
        self.metrics.turn(funnel, result, time.perf_counter() - started)
        for kind, name in result.refused_claims:  # declared fields and actions: bounded labels
            self.metrics.count("funnel_facts_refused_total", funnel=funnel, kind=kind, claim=name)
        for claim in result.reply_claims:  # kinds are built in or declared: bounded labels
            self.metrics.count("funnel_reply_claims_refused_total", funnel=funnel,
                               stage=result.stage_before, kind=claim["kind"])
        declared = engine.funnel.spec.actions
        for outcome in result.actions:
            if not outcome.accepted:  # a name the model made up is one label, not one each
                self.metrics.count("funnel_actions_refused_total", funnel=funnel,
                                   stage=result.stage_before, action=outcome.type
                                   if outcome.type in declared else "undeclared")
        return result

    # -- request checks ----------------------------------------------------------------
    def check_funnel(self, funnel: str, request: Request | None = None) -> CompiledFunnel:
        """The funnel served under ``funnel``; with ``request``, also one its API key (if it
        presents one) may reach: another is the same 404, before any other check, so
        neither a status nor a message tells a limited key which funnels exist."""
        compiled = self.funnels.get(funnel)
        if compiled is None:
            raise RequestRefused(404, "not_found", f"no funnel named {funnel[:80]!r}")
        if request is not None:
            client = self.keys.check(presented_key(request))
            if client is not None and not client.covers(funnel):
                raise RequestRefused(404, "not_found", f"no funnel named {funnel[:80]!r}")
        return compiled

    def client(self, request: Request, scope: str) -> Client:
        """The request's API key's client, if it has ``scope`` and reaches the path's
        funnel: a funnel it may not reach answers the 404 of a funnel that is not served."""
        client = self.keys.check(presented_key(request))
        if client is None:
            raise RequestRefused(401, "unauthorized", "a valid API key is required "
                                 "(Authorization: Bearer KEY or X-API-Key)")
        funnel = request.path_params.get("funnel")
        if funnel is not None and not client.covers(str(funnel)):
            raise RequestRefused(404, "not_found", f"no funnel named {str(funnel)[:80]!r}")
        if not client.allows(scope):
            raise RequestRefused(403, "forbidden", f"the API key lacks the '{scope}' scope")
        return client

    def widget(self, request: Request, funnel: str) -> WidgetSession:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        session = self.tokens.verify(token.strip(), funnel) if scheme.lower() == "bearer" else None
        if session is None:
            raise RequestRefused(401, "unauthorized", "a valid widget session token is required; "
                                 "get one from POST .../widget/session")
        return session

    def check_origin(self, request: Request) -> None:
        origin = request.headers.get("origin")
        if origin is None or "*" in self.config.cors_origins:
            return
        own = f"{request.url.scheme}://{request.url.netloc}"
        if origin.rstrip("/") not in (*self.config.cors_origins, own):
            raise RequestRefused(403, "forbidden", "this origin may not open widget sessions")
