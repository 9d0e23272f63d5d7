"""The OpenAPI 3.1 document of the service (``/openapi.json``), generated from the route
table (engine.service.handlers.OPERATIONS) and the models the handlers parse and answer
with (engine.service.models): a field, status or parameter cannot be served without
being documented.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .models import ErrorBody
from .routes import ERRORS, PATH_PARAMS, Operation

__all__ = ["document"]

_REF = "#/components/schemas/{model}"
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait.",
                                "schema": {"type": "integer", "minimum": 1}}}
SECURITY_SCHEMES: dict[str, Any] = {
    "apiKey": {"type": "http", "scheme": "bearer", "description": "An API key."},
    "apiKeyHeader": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
    "widgetToken": {"type": "http", "scheme": "bearer", "bearerFormat": "widget",
                    "description": "A token from POST .../widget/session."},
    "telegramSecret": {"type": "apiKey", "in": "header",
                       "name": "X-Telegram-Bot-Api-Secret-Token"},
}
DESCRIPTION = ("Run LLM sales conversations as finite-state machines. Server-to-server clients "
               "use an API key (scopes: converse, read_state, conversions, metrics, manage, "
               "erase, admin; a key may be limited to some funnels, and any other funnel is a "
               "404 to it); the web widget uses a signed session token that the service "
               "issues.")


def _content(model: type[BaseModel] | None, media_type: str) -> dict[str, Any]:
    schema = {"$ref": _REF.format(model=model.__name__)} if model else {"type": "string"}
    return {media_type: {"schema": schema}}


def _operation(op: Operation) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, **PATH_PARAMS[name]}
        for name in re.findall(r"{(\w+)}", op.path)]
    params += [{"name": p.name, "in": p.where, "required": False, "description": p.description,
                "schema": dict(p.schema)} for p in op.params]
    responses: dict[str, Any] = {}
    for status, (model, text) in sorted(op.answers.items()):
        responses[str(status)] = {"description": text,
                                  "content": _content(model, op.media_type)}
    if op.streams and "200" in responses:
        responses["200"]["content"]["text/event-stream"] = {"schema": {
            "type": "string", "description": (
                "With `Accept: text/event-stream`: events `delta` {text}, `replace` {text}, "
                "then `turn` (the JSON body above) or `error` {error, message}; each `data:` "
                "line is JSON (docs/service.md).")}}
    for status in op.errors:
        responses.setdefault(str(status), {"description": ERRORS[status],
                                           "content": _content(ErrorBody, "application/json")})
    for limited in ("429", "503"):
        if limited in responses:
            responses[limited]["headers"] = _RETRY_AFTER
    out: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary}
    if op.description:
        out["description"] = op.description
    if params:
        out["parameters"] = params
    if op.body is not None:
        out["requestBody"] = {"required": True, "content": _content(op.body, "application/json")}
    out["security"] = [{name: []} if name else {} for name in op.security]
    out["responses"] = responses
    return out


def _models(operations: Iterable[Operation]) -> list[type[BaseModel]]:
    seen: dict[str, type[BaseModel]] = {"ErrorBody": ErrorBody}
    for op in operations:
        for model in (op.body, *(m for m, _ in op.answers.values())):
            if model is not None:
                seen.setdefault(model.__name__, model)
    return list(seen.values())


def document(operations: Iterable[Operation], version: str) -> dict[str, Any]:
    """The document of ``operations`` (a route table), for the service at ``version``."""
    operations = list(operations)
    models = _models(operations)
    # Requests are described as pydantic validates them, responses as it serializes them;
    # a model used both ways (an order's line) has one schema here: they agree.
    modes: list[tuple[type[BaseModel], Any]] = [(m, "validation") for m in models]
    _, defs = models_json_schema(modes, ref_template=_REF, by_alias=True)
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {"title": "funnel", "version": version, "description": DESCRIPTION},
        "paths": paths,
        "components": {"securitySchemes": SECURITY_SCHEMES,
                       "schemas": defs.get("$defs", {})},
    }
