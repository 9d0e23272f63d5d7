"""The studio's ASGI app: the page, its assets, and the JSON the page reads and posts.

``/report`` is the funnel's HTML report (``engine.report``) with its numbers linked to
the sessions list filtered to the sessions behind them.

``create_studio_app(studio)`` serves one :class:`~engine.studio.playground.Studio`;
``funnel studio`` runs it alone (its lifespan opens the studio), ``funnel serve`` mounts
it under ``/studio`` with an ``authorize`` that admits admin-scoped keys only.

Who may use it: ``authorize`` when given; else, with ``key`` set, a request that
presents it (``Authorization: Bearer``, ``X-Studio-Key``, or the cookie that
``/?key=...`` sets); else anyone who reaches the loopback address it is bound to. A
page of another site cannot drive it: a POST must be ``application/json`` from the
studio's own origin, and the ``Host`` must be the studio's.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..boundary.sanitize import Rejected, loads_bounded
from ..errors import FunnelError, InvalidInput, StoreUnavailable
from ..format.settings import parse_duration
from ..report import build_report, render_html
from . import desk, sql
from .bodies import RewindBody, ScenarioBody, TurnBody
from .desk import Manage
from .editor_api import routes as editor_routes
from .evidence_api import ROUTES as EVIDENCE
from .evidence_api import Handler as PluggedHandler
from .follow_up import fast_forward
from .playground import Studio
from .scenarios import ScenarioExists

__all__ = ["STATIC", "create_studio_app"]

log = logging.getLogger("funnel.studio")
STATIC = Path(__file__).resolve().parent / "static"
ASSETS = {"dom.js": "text/javascript", "studio.js": "text/javascript", "studio.css": "text/css",
          "form.js": "text/javascript",
          "whatif.js": "text/javascript", "editor.js": "text/javascript",
          "scenarios.js": "text/javascript", "simulate.js": "text/javascript",
          "desk.js": "text/javascript", "followup.js": "text/javascript"}
# The editor's library (CodeMirror 5, MIT: static/vendor/codemirror/LICENSE, README.md).
ASSETS |= {f"vendor/codemirror/{n}": "text/" + ("css" if n.endswith(".css") else "javascript")
           for n in ("codemirror.js", "codemirror.css", "yaml.js", "jinja2.js", "markdown.js",
                     "show-hint.js", "show-hint.css", "lint.js", "lint.css")}
MAX_BODY = 512 * 1024
COOKIE = "funnel_studio"
B = TypeVar("B", bound=BaseModel)
Authorize = Callable[[str | None], bool]  # the credential presented -> allowed


def _json(data: Any, status: int = 200) -> Response:
    body = json.dumps(data, ensure_ascii=False, default=str, separators=(",", ":"))
    return Response(body, status_code=status, media_type="application/json",
                    headers={"cache-control": "no-store"})


def _error(status: int, code: str, message: str) -> Response:
    return _json({"error": {"code": code, "message": message}}, status)


class _TooLarge(InvalidInput):
    """A body over :data:`MAX_BODY` (413)."""


async def _read(request: Request) -> bytes:
    """The body, read no further than :data:`MAX_BODY`: refused as soon as it passes it
    (a declared length first), never held whole."""
    declared = request.headers.get("content-length", "")
    too_large = f"the body is over {MAX_BODY} bytes, the most the studio takes"
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise _TooLarge(too_large)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise _TooLarge(too_large)
    return bytes(raw)


async def _body(request: Request, model: type[B]) -> B:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise InvalidInput("the studio takes JSON bodies (Content-Type: application/json)")
    raw = await _read(request)
    try:
        return model.model_validate(loads_bounded(raw))
    except Rejected as exc:
        raise InvalidInput(f"the body is refused: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the body"
        raise InvalidInput(f"{where}: {first['msg']}") from None


async def _opened(request: Request) -> Studio:
    """The studio; a mounted one (no lifespan of its own) is opened on first use."""
    state = request.app.state
    studio: Studio | None = getattr(state, "studio", None)
    if studio is None:
        async with state.opening:
            studio = getattr(state, "studio", None)
            if studio is None:
                studio = state.studio = await state.opener()
    return studio


Handler = Callable[[Request], Awaitable[Response]]


def _guarded(handler: Handler) -> Handler:
    """Every failure a caller can cause ends in a JSON message, never a traceback."""

    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except StoreUnavailable as exc:
            return _error(503, "store_unavailable", str(exc))
        except _TooLarge as exc:
            return _error(413, "too_large", str(exc))
        except FunnelError as exc:
            return _error(400 if isinstance(exc, InvalidInput) else 422,
                          type(exc).__name__, str(exc))
        except Exception:  # a bug: logged with its traceback, the page gets a sentence
            log.exception("studio: %s %s failed", request.method, request.url.path)
            return _error(500, "bug", "the studio failed on this request (a bug: see its log)")
    return run


def _q(request: Request, name: str) -> str | None:
    value = request.query_params.get(name)
    return value if value not in (None, "") else None


def _int(request: Request, name: str, default: int = 0) -> int:
    try:
        return int(_q(request, name) or default)
    except ValueError:
        raise InvalidInput(f"`{name}` is a whole number") from None


def _flag(request: Request, name: str) -> bool | None:
    value = _q(request, name)
    return None if value is None else value.lower() in ("1", "true", "yes")


async def page(request: Request) -> Response:
    key = request.query_params.get("key")
    if key is not None:  # the key once in the address, then a cookie (and a clean address)
        # Relative: the page's own address, whatever the Host header claimed.
        rest = request.url.remove_query_params("key").query
        response = RedirectResponse("./" + (f"?{rest}" if rest else ""), 303)
        response.set_cookie(COOKIE, key, httponly=True, samesite="strict")
        return response
    return HTMLResponse((STATIC / "studio.html").read_text("utf-8"),
                        headers={"cache-control": "no-store"})


async def asset(request: Request) -> Response:
    name = str(request.path_params["name"])
    if name not in ASSETS:  # only the names listed: no path from the request reaches the disk
        return _error(404, "not_found", f"no asset {name!r}")
    return FileResponse(STATIC / name, media_type=ASSETS[name])


async def funnels(request: Request) -> Response:
    studio = await _opened(request)
    return _json({"funnels": studio.funnels(), "home": str(studio.home or "")})


async def status(request: Request) -> Response:
    studio = (await _opened(request))
    return _json(studio.statuses())


async def session(request: Request) -> Response:
    name, sid = _q(request, "funnel") or "", _q(request, "session") or ""
    return _json(await (await _opened(request)).view(name, sid))


async def follow_up(request: Request) -> Response:
    """Fast-forward: the follow-ups the session would get if its customer went quiet."""
    return _json(await fast_forward(await _opened(request), _q(request, "funnel") or "",
                                    _q(request, "session") or ""))


async def transcript(request: Request) -> Response:
    studio = (await _opened(request))
    spec = studio.engine(_q(request, "funnel") or "").spec
    return _json(await sql.transcript(studio.store, spec, _q(request, "session") or "",
                                      _int(request, "offset"), _int(request, "limit", sql.PAGE)))


def _period(request: Request, name: str) -> float | None:
    value = _q(request, name)
    try:
        return parse_duration(value) if value else None
    except (ValueError, FunnelError) as exc:
        raise InvalidInput(f"`{name}` is a period such as 7d or 12h, at most ten years: "
                           f"{exc}") from None


async def sessions(request: Request) -> Response:
    studio = (await _opened(request))
    spec = studio.engine(_q(request, "funnel") or "").spec
    f = sql.SessionFilter(stage=_q(request, "stage"), handoff=_flag(request, "handoff"),
                          since_seconds=_period(request, "since"), variant=_q(request, "variant"),
                          fallback=_flag(request, "fallback"), search=_q(request, "q"),
                          offset=_int(request, "offset"), started=_period(request, "started"),
                          reached=_q(request, "reached"), stopped=_q(request, "stopped"),
                          bought=_flag(request, "bought"),
                          fell_back=_period(request, "fell_back"),
                          fallback_stage=_q(request, "fallback_stage"),
                          playground=bool(_flag(request, "playground")))
    return _json(await sql.sessions(studio.store, spec, f))


# The sessions list's filters a report link may set (the page reads them from its address).
DRILL = ("started", "reached", "stopped", "stage", "bought", "fell_back", "fallback_stage")


async def report(request: Request) -> Response:
    """The funnel's HTML report (`engine.report`), its numbers linked to the sessions list."""
    studio = (await _opened(request))
    name = _q(request, "funnel") or next(iter(studio.engines), "")
    compiled = studio.funnel(name)
    since = _period(request, "since") or 7 * 86400
    # Customers' sessions, as `funnel report` counts; `&playground=true`: the studio's too.
    everyone = bool(_flag(request, "playground"))
    data = await build_report(compiled, db=getattr(studio.store, "url", None), since=since,
                              include_playground=everyone)

    def link(params: Mapping[str, str]) -> str:
        return "./?" + urlencode({"funnel": name, "tab": "sessions",
                                  **({"playground": "true"} if everyone else {}),
                                  **{k: v for k, v in params.items() if k in DRILL}})

    return HTMLResponse(render_html(data, link=link), headers={"cache-control": "no-store"})


async def turn(request: Request) -> Response:
    body = await _body(request, TurnBody)
    view = await (await _opened(request)).turn(body.funnel, body.session, body.text, model=body.model,
                                       answer=body.answer, force=body.force)
    return _json(view)  # a refused answer is an answer too: `rejected`, and no turn ran


async def rewind(request: Request) -> Response:
    body = await _body(request, RewindBody)
    return _json(await (await _opened(request)).rewind(body.funnel, body.session, body.turn,
                                               answer=body.answer, text=body.text,
                                               replay_after=body.replay_after))


async def scenario(request: Request) -> Response:
    body = await _body(request, ScenarioBody)
    if not body.session:
        raise InvalidInput("`session`: the playground session to save")
    try:
        return _json(await (await _opened(request)).save_scenario(
            body.funnel, body.session, body.name, overwrite=body.overwrite))
    except ScenarioExists as exc:  # the page asks before overwriting
        return _json({"error": {"code": "exists", "message": str(exc)},
                      "file": str(exc.file)}, 409)


async def run_scenarios(request: Request) -> Response:
    body = await _body(request, ScenarioBody)
    return _json(await (await _opened(request)).run_scenarios(body.funnel))


async def what_if(request: Request) -> Response:
    """The latest save's what-if (engine.studio.whatif) and the ones it cancelled."""
    studio = (await _opened(request))
    name = _q(request, "funnel") or next(iter(studio.engines), "")
    if name not in studio.broken:  # a broken one has had no clean save: no what-if yet
        studio.engine(name)  # an unknown funnel is named in the error
    return _json(studio.whatif.status(name))


def _plugged(model: type[BaseModel] | None, fn: PluggedHandler) -> Handler:
    """A route of another module (engine.studio.evidence_api): its body checked (a GET
    gets the query's parameters), its answer sent as JSON with its status."""

    async def run(request: Request) -> Response:
        given: Any = dict(request.query_params) if model is None else await _body(request, model)
        code, data = await fn(await _opened(request), given)
        return _json(data, code)
    return _guarded(run)


def _presented(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return (request.headers.get("x-studio-key") or request.headers.get("x-api-key")
            or request.cookies.get(COOKIE) or request.query_params.get("key") or None)


def _allowed(request: Request, key: str | None, authorize: Authorize | None) -> bool:
    if authorize is not None:
        return authorize(_presented(request))
    if key is None:
        return True
    return hmac.compare_digest((_presented(request) or "").encode(), key.encode())


# What engine.studio.desk's handlers use of this module.
_HELPERS = desk.Helpers(presented=lambda r: _presented(r), json=_json, error=_error,
                        opened=_opened, body=_body, q=_q)


class _Gate:
    """Who may use the studio (the module docstring): the host, the origin, the key."""

    def __init__(self, app: ASGIApp, *, key: str | None, authorize: Authorize | None,
                 hosts: frozenset[str] | None) -> None:
        self.app, self.key, self.authorize, self.hosts = app, key, authorize, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refused = self.refusal(request)
        if refused is not None:
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, request: Request) -> Response | None:
        host = (request.headers.get("host") or "").rsplit(":", 1)[0].strip("[]")
        if self.hosts is not None and host not in self.hosts:
            return _error(421, "wrong_host", f"the studio does not answer for host {host!r}")
        if request.method == "POST":
            origin = request.headers.get("origin")
            if origin and origin.split("://", 1)[-1] != request.headers.get("host"):
                return _error(403, "cross_origin",
                              "the studio takes requests from its own page only")
        if not _allowed(request, self.key, self.authorize):
            return _error(401, "unauthorized", "the studio needs its key: open it as "
                          "/?key=KEY once, or send Authorization: Bearer KEY")
        return None


def create_studio_app(studio: Studio | Callable[[], Awaitable[Studio]], *,
                      key: str | None = None, authorize: Authorize | None = None,
                      hosts: frozenset[str] | None = None,
                      manage: Manage | None = None) -> Starlette:
    """The studio's app for ``studio``, or for the studio a coroutine opens at start-up.

    Args:
        key: required of every request when set (``funnel studio`` on a non-loopback host).
        authorize: decides instead of ``key``, given the credential presented (the
            service's admin keys, when mounted; a mounted app has no lifespan, so the
            studio is opened by its first request).
        hosts: the ``Host`` names accepted (``None``: any); a loopback studio accepts only
            loopback names, so that a rebinding DNS name cannot reach it.
        manage: who may take a customer's session over, write to them and release it
            (engine.studio.desk): the credential presented -> the manager's name, or
            None; default: whoever may use the studio, as ``studio``.
    """
    routes = [Route("/", page), Route("/static/{name:path}", asset),
              Route("/report", _guarded(report)),
              *(Route(f"/api/{path}", _guarded(fn)) for path, fn in (
                  ("funnels", funnels), ("status", status), ("session", session),
                  ("transcript", transcript), ("sessions", sessions), ("whatif", what_if),
                  ("follow-up", follow_up))),
              *(Route(f"/api/{path}", _guarded(fn), methods=["POST"]) for path, fn in (
                  ("turn", turn), ("rewind", rewind), ("scenario", scenario),
                  ("scenarios/run", run_scenarios))),
              *editor_routes(_guarded, _body, _opened, _json)]
    routes += [Route(f"/api/{path}", _plugged(model, fn), methods=[method])
               for path, method, model, fn in EVIDENCE]
    routes += [Route(f"/api/{path}", _guarded(fn), methods=[method])
               for path, fn, method in desk.routes(_HELPERS)]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        opened = await _opened_in(app)
        try:
            yield
        finally:
            if not isinstance(studio, Studio):
                await opened.close()

    async def _opened_in(app: Starlette) -> Studio:
        if getattr(app.state, "studio", None) is None:
            app.state.studio = await app.state.opener()
        found: Studio = app.state.studio
        return found

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.opening = asyncio.Lock()
    app.state.manage = manage or (lambda presented: "studio")
    if isinstance(studio, Studio):
        app.state.studio = studio
    else:
        app.state.opener = studio

    app.add_middleware(_Gate, key=key, authorize=authorize, hosts=hosts)
    return app
