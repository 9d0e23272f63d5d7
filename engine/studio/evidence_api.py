"""The studio's routes for evidence: accepting a scenario, and the Simulate tab.

``POST /api/scenarios/accept`` ``{funnel, file}``: the diff re-recording would make
(engine.scenarios.rerecord) and the file's digest; with ``confirm`` (that digest), the
file re-recorded. ``GET /api/simulate/options``: the funnel's personas files and
scripted models; ``POST /api/simulate`` starts a run (409 while one runs), ``GET
/api/simulate`` its progress and table, ``POST /api/simulate/cancel`` stops it.
"""

from __future__ import annotations

import weakref

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .app import _body, _error, _guarded, _json, _opened, _q
from .bodies import _Body
from .playground import Studio
from .scenarios import accept as accept_scenario
from .simulation import Busy, Simulator, choices

__all__ = ["ROUTES"]

_SIMULATORS: weakref.WeakKeyDictionary[Studio, Simulator] = weakref.WeakKeyDictionary()


class AcceptBody(_Body):
    """Accept ``file`` (a scenario of the funnel's folder): without ``confirm``, the diff."""

    funnel: str = Field(min_length=1, max_length=200)
    file: str = Field(min_length=1, max_length=4000)
    confirm: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$")


class SimulateBody(_Body):
    """A simulation: the personas file, the model (``scripted:PATH`` or litellm's name;
    empty: the funnel's own), how many conversations, the seed."""

    funnel: str = Field(min_length=1, max_length=200)
    personas: str = Field(min_length=1, max_length=4000)
    model: str = Field(default="", max_length=4000)
    n: int = Field(default=8, ge=1, le=1000)
    seed: int = Field(default=1, ge=0, le=2**31)


class _FunnelBody(_Body):
    funnel: str = Field(min_length=1, max_length=200)


def _simulator(studio: Studio) -> Simulator:
    found = _SIMULATORS.get(studio)
    if found is None:
        found = _SIMULATORS[studio] = Simulator(getattr(studio.store, "url", None))
        studio.closing.append(found.close)
    return found


async def accept(request: Request) -> Response:
    body = await _body(request, AcceptBody)
    studio = await _opened(request)
    return _json(await accept_scenario(studio.engine(body.funnel).spec, studio.store,
                                       body.file, body.confirm))


async def options(request: Request) -> Response:
    studio = await _opened(request)
    return _json(choices(studio.engine(_q(request, "funnel") or "").spec))


async def start(request: Request) -> Response:
    body = await _body(request, SimulateBody)
    studio = await _opened(request)
    try:
        return _json(_simulator(studio).start(studio.funnel(body.funnel), personas=body.personas,
                                              model=body.model, n=body.n, seed=body.seed))
    except Busy as exc:
        return _error(409, "busy", str(exc))


async def status(request: Request) -> Response:
    return _json({"run": _simulator(await _opened(request)).status()})


async def cancel(request: Request) -> Response:
    await _body(request, _FunnelBody)
    return _json({"run": _simulator(await _opened(request)).cancel()})


ROUTES = [Route("/api/scenarios/accept", _guarded(accept), methods=["POST"]),
          Route("/api/simulate/options", _guarded(options)),
          Route("/api/simulate", _guarded(status), methods=["GET"]),
          Route("/api/simulate", _guarded(start), methods=["POST"]),
          Route("/api/simulate/cancel", _guarded(cancel), methods=["POST"])]
