"""The manager API (scope ``manage``): take a session over, write to its customer, hand
it back to the bot. The work is in engine.turn.manager; each handler here only reads
the request, calls it and maps its errors to statuses (docs/service.md#a-manager-in-the-session).

- ``POST .../sessions/{id}/takeover`` ``{"manager": "Olena"}``: the bot stops answering;
- ``POST .../sessions/{id}/manager-messages`` ``{"manager": "Olena", "text": "..."}``:
  the text goes to the customer through the session's channel (Telegram: the outbox);
- ``POST .../sessions/{id}/release`` ``{"manager": "Olena", "stage": "...", "updates":
  {...}}``: back to the bot, at the stage named, with the updates validated;
- ``GET .../sessions/{id}/control``: who answers the session now.

``manager`` is optional: without it the API key's client name is logged.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import (
    ConcurrentUpdate,
    InvalidInput,
    NotTakenOver,
    ReleaseRejected,
    StoreUnavailable,
    UnknownSession,
)
from ..turn import manager
from .limits import RequestRefused, message_text, read_json
from .openapi import SESSION_PATTERN

if TYPE_CHECKING:
    from .core import Service

SCOPE = "manage"
_SESSION = re.compile(SESSION_PATTERN)
MAX_BODY = 64 * 1024


def _session(request: Request) -> str:
    session = str(request.path_params["session"])
    if not _SESSION.fullmatch(session):
        raise RequestRefused(400, "bad_request", f"a session id matches {SESSION_PATTERN}")
    return session


async def _body(request: Request) -> dict[str, Any]:
    """The JSON object of the request; an empty body is ``{}``."""
    if request.headers.get("content-length") == "0":
        return {}
    data = await read_json(request, MAX_BODY)
    if not isinstance(data, dict):
        raise RequestRefused(400, "bad_request", "the body must be a JSON object")
    return data


async def _call(service: Service, funnel: str, work: Callable[[Any], Awaitable[Any]]
                ) -> Response:
    """Run ``work(engine)`` and map the engine's refusals to HTTP."""
    engine = await service.engine(funnel)
    try:
        return JSONResponse(await work(engine))
    except UnknownSession as exc:
        raise RequestRefused(404, "not_found", str(exc)) from None
    except NotTakenOver as exc:
        raise RequestRefused(409, "not_taken_over", str(exc)) from None
    except ReleaseRejected as exc:
        raise RequestRefused(422, "rejected", str(exc)) from None
    except InvalidInput as exc:
        raise RequestRefused(400, "bad_request", str(exc)) from None
    except ConcurrentUpdate:
        raise RequestRefused(503, "busy", "the session changed meanwhile; send it again",
                             retry_after=1) from None
    except StoreUnavailable:
        raise service.trip() from None


def _who(request: Request, service: Service, data: dict[str, Any]) -> str:
    client = service.client(request, SCOPE)
    service.limiter.check(client.name)
    try:
        return manager.manager_name(data.get("manager", client.name))
    except InvalidInput as exc:
        raise RequestRefused(400, "bad_request", str(exc)) from None


async def takeover(request: Request, service: Service, funnel: str) -> Response:
    session = _session(request)
    who = _who(request, service, await _body(request))
    return await _call(service, funnel, lambda e: manager.take_over(e, session, who))


async def manager_message(request: Request, service: Service, funnel: str) -> Response:
    session = _session(request)
    data = await _body(request)
    who = _who(request, service, data)
    text = message_text(data)
    response = await _call(service, funnel, lambda e: manager.send(e, session, who, text))
    # Deliver now rather than at the next dispatch round (a failure is retried there).
    await service.telegram.deliver_due(funnel, session)
    return response


async def release(request: Request, service: Service, funnel: str) -> Response:
    session = _session(request)
    data = await _body(request)
    who = _who(request, service, data)
    unknown = set(data) - {"manager", "stage", "updates"}
    if unknown:
        raise RequestRefused(400, "bad_request", f"unknown field(s) {sorted(unknown)}; a "
                             "release takes `manager`, `stage` and `updates`")
    return await _call(service, funnel, lambda e: manager.release(
        e, session, who, stage=data.get("stage"), updates=data.get("updates")))


async def control(request: Request, service: Service, funnel: str) -> Response:
    session = _session(request)
    client = service.client(request, SCOPE)
    service.limiter.check(client.name)
    return await _call(service, funnel, lambda e: manager.status(e, session))


ROUTES: tuple[tuple[str, str, Callable[..., Awaitable[Response]]], ...] = (
    ("takeover", "POST", takeover),
    ("manager-messages", "POST", manager_message),
    ("release", "POST", release),
    ("control", "GET", control),
)


def paths(funnel: dict[str, Any], session: dict[str, Any], error: Callable[..., Any],
          ref: Callable[[str], Any], security: list[dict[str, list[str]]]
          ) -> dict[str, Any]:
    """The manager API's part of the OpenAPI document."""
    def body(schema: dict[str, Any]) -> dict[str, Any]:
        return {"required": False, "content": {"application/json": {"schema": schema}}}

    name = {"manager": {"type": "string", "minLength": 1, "maxLength": manager.MAX_MANAGER_NAME,
                        "description": "Who acts (logged); default: the API key's client."}}
    ok = {"description": "Done.", "content": {"application/json": {"schema": ref("Control")}}}
    out: dict[str, Any] = {}
    for route, summary, schema, codes in (
            ("takeover", "Take the session over: the bot stops answering it.",
             {"type": "object", "properties": name}, (400, 401, 403, 404, 429, 503)),
            ("manager-messages", "Send a manager's message to the session's customer.",
             {"type": "object", "required": ["text"], "properties": {
                 **name, "text": {"type": "string", "minLength": 1}}},
             (400, 401, 403, 404, 409, 413, 429, 503)),
            ("release", "Hand the session back to the bot, at a stage, with field updates.",
             {"type": "object", "additionalProperties": False, "properties": {
                 **name, "stage": {"type": "string"},
                 "updates": {"type": "object", "additionalProperties": True}}},
             (400, 401, 403, 404, 409, 422, 429, 503))):
        out[f"/v1/funnels/{{funnel}}/sessions/{{session}}/{route}"] = {"post": {
            "operationId": {"takeover": "takeOver", "manager-messages": "managerMessage",
                            "release": "release"}[route],
            "summary": summary, "description": f"Needs the `{SCOPE}` scope.",
            "parameters": [funnel, session], "security": security,
            "requestBody": body(schema), "responses": {"200": ok, **error(*codes)}}}
    out["/v1/funnels/{funnel}/sessions/{session}/control"] = {"get": {
        "operationId": "getControl", "summary": "Who answers the session: bot or manager.",
        "description": f"Needs the `{SCOPE}` scope.", "parameters": [funnel, session],
        "security": security, "responses": {"200": ok, **error(400, 401, 403, 429, 503)}}}
    return out


CONTROL_SCHEMA = {"type": "object", "required": ["session_id", "control"], "properties": {
    "session_id": {"type": "string"}, "control": {"type": "string", "enum": ["bot", "manager"]},
    "manager": {"type": "string", "nullable": True},
    "since": {"type": "string", "nullable": True}, "stage": {"type": "string"},
    "message_id": {"type": "integer"}, "delivery": {"type": "string"},
    "updated": {"type": "array", "items": {"type": "string"}},
    "state": {"type": "object", "additionalProperties": True}}}
