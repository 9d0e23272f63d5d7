"""The manager API (scope ``manage``): take a session over, write to its customer, hand
it back to the bot. The work is in engine.turn.manager; each handler here only reads
the request, calls it and maps its errors to statuses (docs/service.md#a-manager-in-the-session).

- ``POST .../sessions/{id}/takeover`` ``{"manager": "Olena"}``: the bot stops answering;
- ``POST .../sessions/{id}/manager-messages`` ``{"manager": "Olena", "text": "..."}``:
  the text goes to the customer through the session's channel (Telegram: the outbox);
  with an ``Idempotency-Key`` header, once (a retry replays the first answer);
- ``POST .../sessions/{id}/release`` ``{"manager": "Olena", "stage": "...", "updates":
  {...}}``: back to the bot, at the stage named, with the updates validated;
- ``GET .../sessions/{id}/control``: who answers the session now;
- ``POST .../sessions/{id}/approve`` ``{"manager": "Olena"}`` and ``.../reject``
  ``{"manager": "Olena", "note": "..."}``: decide the move an approval gate holds
  (engine.turn.approval); 409 when none waits (decided already, timed out).

``manager`` is optional: without it the API key's client name is logged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from ..errors import (
    ApprovalRefused,
    ConcurrentUpdate,
    DuplicateDelivery,
    InvalidInput,
    NotAwaitingApproval,
    NotTakenOver,
    ReleaseRejected,
    StoreUnavailable,
    UnknownSession,
)
from ..store.control import MANAGER_CHANNEL
from ..turn import manager
from .inbound import REPLAY_HEADER, delivery_key
from .limits import RequestRefused, read_json
from .models import (
    Control,
    Decided,
    ManagerMessage,
    ManagerMessageIn,
    RejectIn,
    Released,
    ReleaseIn,
    TakeoverIn,
    parse,
)
from .routes import json_response, session_param

if TYPE_CHECKING:
    from .core import Service

SCOPE = "manage"
MAX_BODY = 64 * 1024


async def _body(request: Request, model: type[TakeoverIn]) -> Any:
    """The request's JSON object as ``model``; an empty body is ``{}``."""
    declared = request.headers.get("content-length")
    if declared == "0" or (declared is None and "transfer-encoding" not in request.headers):
        return parse(model, {})
    return parse(model, await read_json(request, MAX_BODY))


async def _call(service: Service, funnel: str, answer: type[BaseModel],
                work: Callable[[Any], Awaitable[dict[str, Any]]]) -> Response:
    """Run ``work(engine)``, answer its result as ``answer``, map the engine's refusals."""
    engine = await service.engine(funnel)
    try:
        return json_response(answer.model_validate(await work(engine)))
    except UnknownSession as exc:
        raise RequestRefused(404, "not_found", str(exc)) from None
    except NotTakenOver as exc:
        raise RequestRefused(409, "not_taken_over", str(exc)) from None
    except NotAwaitingApproval as exc:
        raise RequestRefused(409, "not_awaiting_approval", str(exc)) from None
    except (ReleaseRejected, ApprovalRefused) as exc:
        raise RequestRefused(422, "rejected", str(exc)) from None
    except InvalidInput as exc:
        raise RequestRefused(400, "bad_request", str(exc)) from None
    except ConcurrentUpdate:
        raise RequestRefused(503, "busy", "the session changed meanwhile; send it again",
                             retry_after=1) from None
    except StoreUnavailable:
        raise service.trip() from None


def _who(request: Request, service: Service, name: str | None) -> str:
    client = service.client(request, SCOPE)
    service.limiter.check(client.name)
    try:
        return manager.manager_name(name if name is not None else client.name)
    except InvalidInput as exc:
        raise RequestRefused(400, "bad_request", str(exc)) from None


async def takeover(request: Request, service: Service, funnel: str) -> Response:
    session = session_param(request)
    data = await _body(request, TakeoverIn)
    who = _who(request, service, data.manager)
    return await _call(service, funnel, Control, lambda e: manager.take_over(e, session, who))


async def manager_message(request: Request, service: Service, funnel: str) -> Response:
    session = session_param(request)
    data = await _body(request, ManagerMessageIn)
    who = _who(request, service, data.manager)
    key = delivery_key(request, None)
    # Scoped as the messages API's keys are (engine.service.inbound): by the API key's
    # digest and the session, so no client replays another's answer.
    scoped = f"{service.client(request, SCOPE).identity}/{session}/{key}" if key else None
    if scoped is not None:  # a retry, the first send done: its answer, nothing sent again
        replay = await _replay(service, funnel, scoped, data.text)
        if replay is not None:
            return replay
    try:
        response = await _call(service, funnel, ManagerMessage, lambda e: manager.send(
            e, session, who, data.text, key=scoped))
    except DuplicateDelivery:  # the first send committed meanwhile
        assert scoped is not None
        replay = await _replay(service, funnel, scoped, data.text)
        if replay is None:
            raise RequestRefused(503, "in_progress", "the first send with this "
                                 "Idempotency-Key is not done; send it again with the same "
                                 "key", retry_after=1) from None
        return replay
    # Deliver now rather than at the next dispatch round (a failure is retried there).
    await service.telegram.deliver_due(funnel, session)
    return response


async def _replay(service: Service, funnel: str, key: str, text: str) -> Response | None:
    """The answer of the key's first send, or None if there was none.

    Raises:
        RequestRefused: 422 when the key's first send carried another text.
    """
    store = (await service.engine(funnel)).store
    try:
        first = await store.inbound_pending(funnel, MANAGER_CHANNEL, key)
    except StoreUnavailable:
        raise service.trip() from None
    if first is None or first.response is None:
        return None
    if first.text is not None and first.text != text:
        raise RequestRefused(422, "idempotency_key_reused", f"the Idempotency-Key "
                             f"{key.rsplit('/', 1)[-1]!r} was used before with another "
                             "message; a retry must send the same text, and a new message "
                             "needs a new key")
    response = json_response(ManagerMessage.model_validate(first.response))
    response.headers[REPLAY_HEADER] = "true"
    return response


async def release(request: Request, service: Service, funnel: str) -> Response:
    session = session_param(request)
    data = await _body(request, ReleaseIn)
    who = _who(request, service, data.manager)
    return await _call(service, funnel, Released, lambda e: manager.release(
        e, session, who, stage=data.stage, updates=data.updates))


async def control(request: Request, service: Service, funnel: str) -> Response:
    session = session_param(request)
    client = service.client(request, SCOPE)
    service.limiter.check(client.name)
    return await _call(service, funnel, Control, lambda e: manager.status(e, session))


async def approve(request: Request, service: Service, funnel: str) -> Response:
    session = session_param(request)
    data = await _body(request, TakeoverIn)
    who = _who(request, service, data.manager)
    return await _call(service, funnel, Decided, lambda e: manager.approve(e, session, who))


async def reject(request: Request, service: Service, funnel: str) -> Response:
    session = session_param(request)
    data = await _body(request, RejectIn)
    who = _who(request, service, data.manager)
    return await _call(service, funnel, Decided,
                       lambda e: manager.reject(e, session, who, data.note))
