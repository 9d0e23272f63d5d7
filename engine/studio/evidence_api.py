"""The studio's routes for evidence: accepting a scenario, and the Simulate tab.

``POST /api/scenarios/accept`` ``{funnel, file}``: the diff re-recording would make
(engine.scenarios.rerecord) and the file's digest; with ``confirm`` (that digest), the
file re-recorded. ``GET /api/simulate/options``: the funnel's personas files and
scripted models; ``POST /api/simulate`` starts a run (409 while one runs), ``GET
/api/simulate`` its progress and table, ``POST /api/simulate/cancel`` stops it.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel, Field

from .bodies import _Body
from .playground import Studio
from .scenarios import accept as accept_scenario
from .simulation import Busy, Simulator, choices

__all__ = ["ROUTES", "Handler"]

# A route's work: the studio and the body (a GET: the query's parameters) -> (status, JSON).
Handler = Callable[[Studio, Any], Awaitable[tuple[int, Any]]]
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


class FunnelBody(_Body):
    funnel: str = Field(min_length=1, max_length=200)


def _simulator(studio: Studio) -> Simulator:
    found = _SIMULATORS.get(studio)
    if found is None:
        found = _SIMULATORS[studio] = Simulator(getattr(studio.store, "url", None),
                                                api_base=studio.model.api_base)
        studio.closing.append(found.close)
    return found


async def accept(studio: Studio, body: AcceptBody) -> tuple[int, Any]:
    return 200, await accept_scenario(studio.engine(body.funnel).spec, studio.store,
                                      body.file, body.confirm)


async def options(studio: Studio, query: Mapping[str, str]) -> tuple[int, Any]:
    return 200, choices(studio.engine(query.get("funnel", "")).spec)


async def start(studio: Studio, body: SimulateBody) -> tuple[int, Any]:
    try:
        return 200, _simulator(studio).start(studio.funnel(body.funnel), personas=body.personas,
                                             model=body.model, n=body.n, seed=body.seed)
    except Busy as exc:
        return 409, {"error": {"code": "busy", "message": str(exc)}}


async def status(studio: Studio, query: Mapping[str, str]) -> tuple[int, Any]:
    return 200, {"run": _simulator(studio).status()}


async def cancel(studio: Studio, body: FunnelBody) -> tuple[int, Any]:
    return 200, {"run": _simulator(studio).cancel()}


# (path under /api/, method, the body's model or None for a GET, the handler)
ROUTES: list[tuple[str, str, type[BaseModel] | None, Handler]] = [
    ("scenarios/accept", "POST", AcceptBody, accept),
    ("simulate/options", "GET", None, options),
    ("simulate", "GET", None, status),
    ("simulate", "POST", SimulateBody, start),
    ("simulate/cancel", "POST", FunnelBody, cancel)]
