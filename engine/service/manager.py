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
from .limits import MAX_MESSAGE_CHARS, RequestRefused, message_text, read_json
from .openapi import SESSION_PATTERN, TEXT_PATTERN

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


async def _body(request: Request, fields: tuple[str, ...]) -> dict[str, Any]:
    """The JSON object of the request, of ``fields`` only; an empty body is ``{}``."""
    declared = request.headers.get("content-length")
    if declared == "0" or (declared is None and "transfer-encoding" not in request.headers):
        return {}
    data = await read_json(request, MAX_BODY)
    if not isinstance(data, dict):
        raise RequestRefused(400, "bad_request", "the body must be a JSON object")
    unknown = set(data) - set(fields)
    if unknown:
        raise RequestRefused(400, "bad_request", f"unknown field(s) {sorted(unknown)[:5]}; "
                             f"this request takes {', '.join(f'`{f}`' for f in fields)}")
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
    who = _who(request, service, await _body(request, ("manager",)))
    return await _call(service, funnel, lambda e: manager.take_over(e, session, who))


async def manager_message(request: Request, service: Service, funnel: str) -> Response:
    session = _session(request)
    data = await _body(request, ("manager", "text"))
    who = _who(request, service, data)
    text = message_text(data)
    response = await _call(service, funnel, lambda e: manager.send(e, session, who, text))
    # Deliver now rather than at the next dispatch round (a failure is retried there).
    await service.telegram.deliver_due(funnel, session)
    return response


async def release(request: Request, service: Service, funnel: str) -> Response:
    session = _session(request)
    data = await _body(request, ("manager", "stage", "updates"))
    who = _who(request, service, data)
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
    """The manager API's part of the OpenAPI document (its schemas: :data:`SCHEMAS`)."""
    name = {"manager": {"type": "string", "minLength": 1, "maxLength": manager.MAX_MANAGER_NAME,
                        "pattern": manager.NAME_PATTERN,
                        "description": "Who acts (logged); default: the API key's client."}}
    operations = (
        ("takeover", "takeOver", "Take the session over: the bot stops answering it.",
         {"properties": name}, "Control", (400, 401, 403, 404, 413, 429, 503)),
        ("manager-messages", "managerMessage",
         "Send a manager's message to the session's customer (through its channel).",
         {"required": ["text"], "properties": {**name, "text": {
             "type": "string", "minLength": 1, "maxLength": MAX_MESSAGE_CHARS,
             "pattern": TEXT_PATTERN}}}, "ManagerMessage",
         (400, 401, 403, 404, 409, 413, 429, 503)),
        ("release", "release",
         "Hand the session back to the bot, at a stage, with field updates (validated as "
         "any update: 422 and nothing written when one is refused).",
         {"properties": {**name, "stage": {"type": "string", "minLength": 1, "nullable": True,
                                           "description": "None: where it is."},
                         "updates": {"type": "object", "additionalProperties": True,
                                     "nullable": True}}},
         "Released", (400, 401, 403, 404, 409, 413, 422, 429, 503)))
    out: dict[str, Any] = {}
    for route, operation, summary, schema, answer, codes in operations:
        out[f"/v1/funnels/{{funnel}}/sessions/{{session}}/{route}"] = {"post": {
            "operationId": operation, "summary": summary,
            "description": f"Needs the `{SCOPE}` scope.",
            "parameters": [funnel, session], "security": security,
            "requestBody": {"required": route == "manager-messages", "content": {
                "application/json": {"schema": {
                    "type": "object", "additionalProperties": False, **schema}}}},
            "responses": {"200": {"description": "Done.", "content": {
                "application/json": {"schema": ref(answer)}}}, **error(*codes)}}}
    out["/v1/funnels/{funnel}/sessions/{session}/control"] = {"get": {
        "operationId": "getControl", "summary": "Who answers the session: bot or manager.",
        "description": f"Needs the `{SCOPE}` scope.", "parameters": [funnel, session],
        "security": security, "responses": {"200": {"description": "Who answers.", "content": {
            "application/json": {"schema": ref("Control")}}},
            **error(400, 401, 403, 404, 429, 503)}}}
    return out


_NULLABLE = {"type": "string", "nullable": True}
SCHEMAS: dict[str, Any] = {
    "Control": {"type": "object", "required": ["session_id", "control", "manager", "since"],
                "properties": {"session_id": {"type": "string"},
                               "control": {"type": "string", "enum": ["bot", "manager"]},
                               "manager": _NULLABLE, "since": _NULLABLE,
                               "stage": {"type": "string"}}},
    "ManagerMessage": {"type": "object", "required": ["session_id", "message_id", "manager",
                                                      "delivery"],
                       "properties": {"session_id": {"type": "string"},
                                      "message_id": {"type": "integer"},
                                      "manager": {"type": "string"},
                                      "delivery": {"type": "string", "description":
                                                   "`telegram`: sent through the outbox; "
                                                   "`messages`: the client reads the log."}}},
    "Released": {"type": "object", "required": ["session_id", "control", "stage", "updated",
                                                "state"],
                 "properties": {"session_id": {"type": "string"},
                                "control": {"type": "string", "enum": ["bot"]},
                                "stage": {"type": "string"},
                                "updated": {"type": "array", "items": {"type": "string"}},
                                "state": {"type": "object", "additionalProperties": True}}},
}
