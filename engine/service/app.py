"""The ASGI app: every funnel given, under its name, on one PostgreSQL.

``create_app()`` (no arguments) reads :class:`ServiceConfig` from the
environment, which is how ``funnel serve --workers N`` starts each uvicorn
worker (``uvicorn --factory engine.service.app:create_app`` does the same).
Funnels load when the app is built (a bad funnel stops the start); the
database is opened by :class:`engine.service.core.Service` at start-up and,
while it is down, again on later requests, so the process starts, answers
``/healthz`` and reports not ready on ``/readyz`` until PostgreSQL answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import html
import json
import logging
import os
import re
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from .. import __version__
from ..errors import StoreUnavailable
from . import inbound, orders
from .auth import WidgetSession
from .config import ServiceConfig
from .core import Service
from .inbound import REPLAY_HEADER, delivery_key
from .limits import RequestRefused, error, message_text, read_json
from .openapi import SESSION_PATTERN, document
from .readiness import readiness
from .retention import RetentionScheduler
from .telegram import TelegramChannel

log = logging.getLogger("funnel.service")
STATIC = Path(__file__).resolve().parent / "static"
_SESSION = re.compile(SESSION_PATTERN)


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


def _json(data: Any, status: int = 200) -> Response:
    body = json.dumps(data, ensure_ascii=False, default=str, separators=(",", ":"))
    return Response(body, status_code=status, media_type="application/json")


def _turn(turn: dict[str, Any]) -> Response:
    response = _json(turn)
    if turn.get("replayed"):
        response.headers[REPLAY_HEADER] = "true"
    return response


def _session_param(request: Request) -> str:
    session = str(request.path_params["session"])
    if not _SESSION.fullmatch(session):  # `$` alone would let a trailing newline through
        raise RequestRefused(400, "bad_request", f"a session id matches {SESSION_PATTERN}")
    return session


Handler = Callable[[Request, Service, str], Awaitable[Response]]


def _endpoint(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Resolve the funnel, turn refusals into error responses and count them."""

    async def endpoint(request: Request) -> Response:
        service = _service(request)
        funnel = str(request.path_params.get("funnel", ""))
        try:
            service.check_funnel(funnel)
            return await handler(request, service, funnel)
        except RequestRefused as exc:
            if exc.status != 404:
                service.metrics.refused(funnel, exc.code)
            return exc.response()

    return endpoint


async def post_message(request: Request, service: Service, funnel: str) -> Response:
    client = service.client(request, "converse")
    service.limiter.check(client.name)
    session = _session_param(request)
    data = await read_json(request)
    text = message_text(data)
    key = delivery_key(request, data)
    # Keys are the client's: scoped by a digest of its API key (never its place in the
    # list) and the session, so nobody replays another client's answers.
    scoped = f"{client.identity}/{session}/{key}" if key else None
    return _turn(await inbound.turn(service, funnel, session, text, channel="api", key=scoped))


async def post_conversion(request: Request, service: Service, funnel: str) -> Response:
    client = service.client(request, "conversions")
    service.limiter.check(client.name)
    session = _session_param(request)
    status, body = await orders.record(service, funnel, session,
                                       await read_json(request, orders.MAX_ORDER_BYTES))
    return _json(body, status)


async def get_session(request: Request, service: Service, funnel: str) -> Response:
    client = service.client(request, "read_state")
    service.limiter.check(client.name)
    session = _session_param(request)
    engine = await service.engine(funnel)
    try:
        state = await engine.state(session)
        if state is not None and request.query_params.get("explain") in ("1", "true"):
            # Why the last turn moved or stayed (engine.turn.explain), from its turn record.
            last = await engine.store.turn_records(engine.spec, session, 1)
            state["explain"] = last[-1]["explain"] if last else None
    except StoreUnavailable:
        raise service.trip() from None
    if state is None:
        raise RequestRefused(404, "not_found", f"no session {session!r} in funnel '{funnel}'")
    return _json(state)


async def widget_session(request: Request, service: Service, funnel: str) -> Response:
    service.check_origin(request)
    service.limiter.check(f"ip:{request.client.host if request.client else '?'}")
    try:
        current: WidgetSession | None = service.widget(request, funnel)
    except RequestRefused:
        current = None  # no token, or one that is expired or not ours: a new session
    token, session = service.tokens.issue(funnel, current.session_id if current else None)
    return _json({"token": token, "expires_at": session.expires_at})


async def widget_message(request: Request, service: Service, funnel: str) -> Response:
    session = service.widget(request, funnel)
    service.limiter.check(f"widget:{session.session_id}")
    data = await read_json(request)
    text = message_text(data)
    key = delivery_key(request, data)
    scoped = f"{session.session_id}/{key}" if key else None
    return _turn(await inbound.turn(service, funnel, session.session_id, text, channel="web",
                                    key=scoped))


async def widget_messages(request: Request, service: Service, funnel: str) -> Response:
    if request.method == "POST":
        return await widget_message(request, service, funnel)
    session = service.widget(request, funnel)
    service.limiter.check(f"widget:{session.session_id}")
    engine = await service.engine(funnel)
    try:
        rows = await engine.store.history(engine.spec, session.session_id, 50)
    except StoreUnavailable:
        raise service.trip() from None
    return _json({"messages": [
        {"role": r["role"], "content": r["content"],
         "created_at": r["created_at"].isoformat() if r.get("created_at") else None}
        for r in rows if r["role"] in ("user", "assistant")]})


async def telegram(request: Request, service: Service, funnel: str) -> Response:
    return await service.telegram.webhook(request, funnel)


async def healthz(request: Request) -> Response:
    return _json({"status": "ok"})


async def readyz(request: Request) -> Response:
    service = _service(request)
    ready, body = await readiness(service)
    if ready:
        return _json(body)
    response = _json(body, 503)
    response.headers["Retry-After"] = str(service.config.retry_after)
    return response


async def metrics(request: Request) -> Response:
    service = _service(request)
    if not service.config.metrics_public:
        try:
            service.client(request, "metrics")
        except RequestRefused as exc:
            return exc.response()
    await service.reloader.versions()  # refreshes the version gauges (cached counts)
    return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")


async def openapi(request: Request) -> Response:
    return _json(document(list(_service(request).funnels), __version__))


def _static(name: str, media_type: str) -> Callable[[Request], Awaitable[Response]]:
    content = (STATIC / name).read_bytes()

    async def serve(request: Request) -> Response:
        return Response(content, media_type=media_type,
                        headers={"Cache-Control": "public, max-age=300"})

    return serve


async def demo(request: Request) -> Response:
    service = _service(request)
    funnel = str(request.path_params["funnel"])
    if funnel not in service.funnels:
        return error(404, "not_found", f"no funnel named {funnel[:80]!r}")
    page = (STATIC / "demo.html").read_text("utf-8")
    title = funnel.replace("_", " ").replace("-", " ").title()
    # The funnel's own content: its description, and its products (else its stages).
    compiled = service.funnels[funnel]
    items = [p.name for p in compiled.catalog.products[:3]] if compiled.catalog else [
        s.description for s in compiled.spec.stages.values() if s.description][:3]
    cards = "".join(f'<div class="card"><i></i>{html.escape(str(t))}</div>' for t in items)
    page = page.replace("{{DESCRIPTION}}", html.escape(compiled.spec.description))
    page = page.replace("{{CARDS}}", cards).replace("{{TITLE}}", html.escape(title))
    return HTMLResponse(page.replace("{{FUNNEL}}", html.escape(funnel)))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    response = error(exc.status_code, code, str(exc.detail))
    for name, value in (exc.headers or {}).items():
        response.headers[name] = value
    return response


async def _crash(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s %s: %s", request.method, request.url.path,
              type(exc).__name__, exc_info=exc)
    return error(500, "internal", "internal error; see the service log")


def _log_to_stderr(level: str) -> None:
    """uvicorn configures its own loggers only: without a handler, the engine's lines
    (a reload, a refused edit) would reach stderr only from WARNING up, and bare."""
    logger = logging.getLogger("funnel")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level.upper() if level.upper() in logging.getLevelNamesMapping() else "INFO")


def _hold_sighup() -> None:
    """Ignore SIGHUP until the app's handler is set (and after it is removed): by default
    the signal ends the process, and a reload asked for during start-up must not."""
    if hasattr(signal, "SIGHUP") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _on_sighup(service: Service) -> bool:
    """SIGHUP reloads the funnels (engine.service.reload); False where no handler can be set
    (a server run in a thread, as tests do, or a platform without SIGHUP)."""
    if not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread():
        return False
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, service.reloader.on_signal)
    return True


def create_app(config: ServiceConfig | None = None) -> Starlette:
    """Build the app (from the environment when ``config`` is None)."""
    if config is None:  # `funnel serve` (a uvicorn worker): the engine's own log lines too
        _log_to_stderr(os.environ.get("FUNNEL_LOG_LEVEL", "info"))
        _hold_sighup()
    config = config or ServiceConfig.from_env()
    if config.secret_generated:
        log.warning("FUNNEL_SECRET is not set: widget tokens are signed with a random key and "
                    "stop working when this process restarts")
    service = Service(config)
    service.attach_telegram(TelegramChannel(service, config.telegram_api))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await service.start()
        hup = _on_sighup(service)
        retention = app.state.retention = RetentionScheduler(service).start()
        # What startup built (imports, funnels, templates, validators, machines) lives
        # as long as the process: move it out of the collector's reach, or every full
        # collection walks all of it and stalls the worker's turns for tens of ms.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            if hup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
                _hold_sighup()  # a reload asked for while stopping must not kill the process
            await retention.stop()
            await service.close()

    f = "/v1/funnels/{funnel}"
    routes = [
        Route(f"{f}/sessions/{{session}}/messages", _endpoint(post_message), methods=["POST"]),
        Route(f"{f}/sessions/{{session}}/conversions", _endpoint(post_conversion),
              methods=["POST"]),
        Route(f"{f}/sessions/{{session}}", _endpoint(get_session), methods=["GET"]),
        Route(f"{f}/widget/session", _endpoint(widget_session), methods=["POST"]),
        Route(f"{f}/widget/messages", _endpoint(widget_messages), methods=["GET", "POST"]),
        Route(f"{f}/telegram", _endpoint(telegram), methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/widget.js", _static("widget.js", "text/javascript; charset=utf-8"),
              methods=["GET"]),
        Route("/widget.css", _static("widget.css", "text/css; charset=utf-8"), methods=["GET"]),
        Route("/demo/{funnel}", demo, methods=["GET"]),
    ]
    middleware = [Middleware(
        CORSMiddleware, allow_origins=config.cors_origins, allow_methods=["GET", "POST"],
        allow_headers=["Authorization", "Content-Type", "X-API-Key", "Idempotency-Key"],
        expose_headers=[REPLAY_HEADER], max_age=600)]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_error, Exception: _crash})
    app.state.service = service
    return app
