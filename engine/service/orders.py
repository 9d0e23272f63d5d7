"""``POST /v1/funnels/{funnel}/sessions/{session}/conversions``: an order the session's
customer placed (engine.records.orders), sent by the shop with the ``conversions`` scope.

201 when recorded, 200 when the same order was recorded before (a retry), 409
when its id was recorded with other content, 404 for a session the funnel never
saw, 400 for a body that is not an order, 422 for a field out of bounds.
"""

from __future__ import annotations

from typing import Any

from ..errors import OrderConflict, OrderRejected, SchemaOutdated, StoreUnavailable, UnknownSession
from ..records.orders import order_from_body
from .core import Service
from .limits import RequestRefused

# 500 lines of ~150 bytes, with room.
MAX_ORDER_BYTES = 128 * 1024


async def record(service: Service, funnel: str, session: str, body: Any
                 ) -> tuple[int, dict[str, Any]]:
    """(status, body) of the answer; refusals are :class:`RequestRefused`."""
    engine = await service.engine(funnel)
    try:
        # The session first: an order for nobody is a 404 whatever its fields hold.
        if await engine.state(session) is None:
            raise UnknownSession(f"no session {session!r} in funnel '{funnel}'")
        conversion = await engine.store.record_conversion(engine.spec,
                                                          order_from_body(session, body))
    except OrderRejected as exc:
        if exc.kind == "shape":
            raise RequestRefused(400, "bad_request", str(exc)) from None
        raise RequestRefused(422, "invalid_order", str(exc)) from None
    except UnknownSession as exc:
        raise RequestRefused(404, "not_found", str(exc)) from None
    except OrderConflict as exc:
        raise RequestRefused(409, "conflict", str(exc)) from None
    except StoreUnavailable:
        raise service.trip() from None
    except SchemaOutdated:
        raise RequestRefused(503, "schema_outdated", "the funnel's tables are behind this "
                             "version; run `funnel migrate`", retry_after=60) from None
    if not conversion.replayed:
        service.metrics.count("funnel_conversions_total", funnel=funnel)
    return (200 if conversion.replayed else 201), conversion.plain()
