"""The route table: one :class:`Operation` per method and path, from which the app builds
its routes (engine.service.app) and ``/openapi.json`` is generated (engine.service.openapi).

A new endpoint is a handler that parses its body with :func:`engine.service.models.parse`
and answers with a model (:func:`json_response`), plus one row in a table such as
:data:`engine.service.handlers.OPERATIONS`: its models, statuses and security. Path
parameters named ``funnel`` and ``session`` are documented (and checked) once, here.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .limits import RequestRefused
from .models import SESSION_PATTERN, dump

__all__ = ["ERRORS", "PATH_PARAMS", "Operation", "Param", "json_response", "session_param",
           "table_routes"]

Endpoint = Callable[[Request], Awaitable[Response]]
_SESSION = re.compile(SESSION_PATTERN)

# The path parameters every operation shares. The funnel is a plain string: a generated
# client keeps working when the service serves other funnels than when it was generated.
PATH_PARAMS: dict[str, dict[str, Any]] = {
    "funnel": {"description": "The funnel's name (its `name:`).",
               "schema": {"type": "string", "minLength": 1, "maxLength": 200}},
    "session": {"description": "Your id for the conversation (one customer, one session).",
                "schema": {"type": "string", "pattern": SESSION_PATTERN}},
}

# What each refusal status means, for the document.
ERRORS: dict[int, str] = {
    400: "The request is malformed (not JSON, a missing or blank `text`, a bad session id).",
    401: "No valid credential (API key, widget token or webhook secret).",
    403: "The API key lacks the scope, or the browser origin is not allowed.",
    404: "No such funnel or session.",
    409: "The Idempotency-Key's message is gone (purged by retention): use a new key; or, "
         "for the manager API, no manager holds the session (take it over first), or no "
         "approval waits (decided already, or timed out).",
    413: "The message is over its limit of characters (or the body too large).",
    422: "A field of the order is out of bounds (amount, currency, a line, the time), an "
         "Idempotency-Key was used before with another message, or a manager's release "
         "was refused, or an approved move no longer applies (nothing was written).",
    429: "Too many requests from this client; retry after `Retry-After` seconds.",
    503: "The database is unreachable, the table is behind the funnel, or this session "
         "has too many messages in flight; retry after `Retry-After` seconds. A message "
         "the service accepted is never lost.",
}


@dataclass(frozen=True)
class Param:
    """A query or header parameter (path parameters come from :data:`PATH_PARAMS`)."""

    name: str
    where: str  # "query" or "header"
    description: str
    schema: Mapping[str, Any]


@dataclass(frozen=True)
class Operation:
    """One method on one path: its handler and what the document says of it.

    ``answers`` maps each success (and any status with a body of its own) to its
    model (None: not JSON, see ``media_type``) and description; ``errors`` lists the
    refusal statuses, each answered with :class:`~engine.service.models.ErrorBody`.
    ``security`` names schemes of the document (any one of them suffices); ``None`` in
    it means the operation may also be called without a credential.
    """

    method: str
    path: str
    operation_id: str
    summary: str
    handler: Endpoint
    answers: Mapping[int, tuple[type[BaseModel] | None, str]]
    body: type[BaseModel] | None = None
    errors: tuple[int, ...] = ()
    params: tuple[Param, ...] = ()
    security: tuple[str | None, ...] = ()
    description: str = ""
    media_type: str = "application/json"
    tags: tuple[str, ...] = field(default=())
    # The 200 may also come as Server-Sent Events (``Accept: text/event-stream``,
    # engine.service.sse): the reply as the model writes it, then the same body.
    streams: bool = False


def json_response(body: BaseModel, status: int = 200) -> Response:
    """``body`` as the response (serialized by pydantic's core)."""
    return Response(dump(body), status_code=status, media_type="application/json")


def session_param(request: Request) -> str:
    """The ``{session}`` path parameter, checked against :data:`SESSION_PATTERN`."""
    session = str(request.path_params["session"])
    if not _SESSION.fullmatch(session):  # `$` alone would let a trailing newline through
        raise RequestRefused(400, "bad_request", f"a session id matches {SESSION_PATTERN}")
    return session


def table_routes(operations: Iterable[Operation]) -> list[Route]:
    """One Starlette route per path, dispatching on the method: a 405 then lists every
    method of the path in its ``Allow`` header, as the document does."""
    by_path: dict[str, dict[str, Endpoint]] = {}
    for op in operations:
        by_path.setdefault(op.path, {})[op.method] = op.handler
    routes = []
    for path, handlers in by_path.items():
        if len(handlers) == 1:
            (method, handler), = handlers.items()
            routes.append(Route(path, handler, methods=[method]))
            continue

        def dispatch(handlers: dict[str, Endpoint]) -> Endpoint:
            async def endpoint(request: Request) -> Response:
                method = "GET" if request.method == "HEAD" else request.method
                return await handlers[method](request)
            return endpoint

        routes.append(Route(path, dispatch(handlers), methods=list(handlers)))
    return routes
