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
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from .. import __version__
from ..studio import Studio, create_studio_app
from .config import LIFESPAN_SHUTDOWN_SECONDS, ServiceConfig
from .core import Service
from .handlers import OPERATIONS, service_of
from .inbound import REPLAY_HEADER
from .limits import error
from .openapi import document
from .retention import RetentionScheduler
from .routes import table_routes
from .telegram import TelegramChannel

log = logging.getLogger("funnel.service")
STATIC = Path(__file__).resolve().parent / "static"
# Of the shutdown's budget, what stopping the scheduled purge may take (a batch is one
# transaction: cut, it rolls back).
RETENTION_STOP_SECONDS = 2.0


async def openapi(request: Request) -> Response:
    doc: bytes | None = request.app.state.openapi
    if doc is None:  # built once, on first request: it is the same for the process's life
        doc = request.app.state.openapi = json.dumps(
            document(OPERATIONS, __version__), ensure_ascii=False).encode()
    return Response(doc, media_type="application/json")


def _static(name: str, media_type: str) -> Callable[[Request], Awaitable[Response]]:
    content = (STATIC / name).read_bytes()

    async def serve(request: Request) -> Response:
        return Response(content, media_type=media_type,
                        headers={"Cache-Control": "public, max-age=300"})

    return serve


async def demo(request: Request) -> Response:
    service = service_of(request)
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


def _studio_app(service: Service) -> Starlette:
    """Funnel Studio under /studio (docs/studio.md), for admin-scoped keys of every funnel
    only (the studio shows and plays them all: a key limited to funnels is refused); opened
    on its first request, on the service's store, with an engine of its own. An erasure
    (engine.service.privacy) makes it forget the session's prompts."""

    def admin(presented: str | None) -> bool:
        client = service.keys.check(presented)
        return client is not None and "admin" in client.scopes and client.funnels is None

    def manage(presented: str | None) -> str | None:
        # The manager API's rule (engine.service.manager): the `manage` scope; the key's
        # client name is the manager's unless the page names one.
        client = service.keys.check(presented)
        return client.name if client is not None and client.allows("manage") else None

    async def opened() -> Studio:
        await service.open_engines()
        studio = await Studio.open([f.spec.path for f in service.funnels.values()],
                                   store=service.store)
        service.forgetters.append(lambda funnel, session: studio.model.forget(session))
        return studio

    return create_studio_app(opened, authorize=admin, manage=manage)


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
            # The whole shutdown is bounded (LIFESPAN_SHUTDOWN_SECONDS; SIGTERM to exit:
            # engine.service.server.SHUTDOWN_BOUND_SECONDS), whatever a hook or a turn does.
            started = time.monotonic()
            try:
                await asyncio.wait_for(retention.stop(), RETENTION_STOP_SECONDS)
            except TimeoutError:
                log.error("shutdown: the retention purge did not stop within %g s; cut",
                          RETENTION_STOP_SECONDS)
            await service.close(LIFESPAN_SHUTDOWN_SECONDS - (time.monotonic() - started))

    # The API from its table (engine.service.handlers), the document and the pages beside it.
    routes: list[BaseRoute] = [*table_routes(OPERATIONS)]
    routes += [
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/widget.js", _static("widget.js", "text/javascript; charset=utf-8"),
              methods=["GET"]),
        Route("/widget.css", _static("widget.css", "text/css; charset=utf-8"), methods=["GET"]),
        Route("/demo/{funnel}", demo, methods=["GET"]),
    ]
    routes.append(Mount("/studio", app=_studio_app(service)))
    middleware = [Middleware(
        CORSMiddleware, allow_origins=config.cors_origins, allow_methods=["GET", "POST"],
        allow_headers=["Authorization", "Content-Type", "X-API-Key", "Idempotency-Key"],
        expose_headers=[REPLAY_HEADER], max_age=600)]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_error, Exception: _crash})
    app.state.service = service
    app.state.openapi = None
    return app
