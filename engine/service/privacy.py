"""A customer's requests about their data (scope ``erase``): erasure and access.

- ``DELETE /v1/funnels/{funnel}/sessions/{id}``: every copy of the session goes
  (engine.store.erasure), after the turn it may be in; the receipt lists each table
  with the rows deleted, and what the mounted studio forgot from memory;
- ``GET /v1/funnels/{funnel}/sessions/{id}/export``: everything stored of it, as
  one JSON document.

Both need ``erase`` (or ``admin``): an export holds the whole conversation and the
model's raw output, more than ``read_state`` gives a CRM or a dashboard, so the key
that answers a data subject's requests is one key, kept by whoever answers them.
Both are logged as control events naming the API key's position and the counts,
never the customer (docs/persistence.md#a-customers-requests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from ..errors import SessionBusy, StoreUnavailable, UnknownSession
from .limits import RequestRefused
from .models import Erased, SessionExport
from .routes import json_response, session_param

if TYPE_CHECKING:
    from .core import Service

SCOPE = "erase"
# How long an erasure waits for the session's turn before answering 503.
ERASE_WAIT = 30.0


async def erase(request: Request, service: Service, funnel: str) -> Response:
    client = service.client(request, SCOPE)
    service.limiter.check(client.name)
    session = session_param(request)
    engine = await service.engine(funnel)
    try:
        receipt = await engine.store.erase_session(engine.spec, session, by=client.name,
                                                   wait=ERASE_WAIT)
    except UnknownSession as exc:
        raise RequestRefused(404, "not_found", str(exc)) from None
    except SessionBusy as exc:
        raise RequestRefused(503, "busy", str(exc), retry_after=5) from None
    except StoreUnavailable:
        raise service.trip() from None
    receipt["memory"] = {"studio_prompts": sum(f(funnel, session)
                                               for f in service.forgetters)}
    return json_response(Erased.model_validate(receipt))


async def export(request: Request, service: Service, funnel: str) -> Response:
    client = service.client(request, SCOPE)
    service.limiter.check(client.name)
    session = session_param(request)
    engine = await service.engine(funnel)
    try:
        document = await engine.store.export_session(engine.spec, session, by=client.name)
    except UnknownSession as exc:
        raise RequestRefused(404, "not_found", str(exc)) from None
    except StoreUnavailable:
        raise service.trip() from None
    return json_response(SessionExport.model_validate(document))
