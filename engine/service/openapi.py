"""The OpenAPI 3.0 document of the service, written by hand (served at ``/openapi.json``)."""

from __future__ import annotations

from typing import Any

from ..records.orders import (
    AMOUNT_PATTERN,
    CURRENCIES,
    MAX_LINES,
    MAX_QTY,
    ORDER_ID_PATTERN,
    SKU_PATTERN,
)
from .limits import MAX_MESSAGE_CHARS, MAX_SESSION_ID

SESSION_PATTERN = f"^[A-Za-z0-9_.:@-]{{1,{MAX_SESSION_ID}}}$"
# Non-blank text without NUL characters (PostgreSQL text cannot hold NUL).
TEXT_PATTERN = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "The request is malformed (not JSON, a missing or blank `text`, a bad session id).",
        401: "No valid credential (API key, widget token or webhook secret).",
        403: "The API key lacks the scope, or the browser origin is not allowed.",
        404: "No such funnel or session.",
        409: "The Idempotency-Key's message is gone (purged by retention): use a new key.",
        413: f"The message is over {MAX_MESSAGE_CHARS} characters (or the body too large).",
        422: "A field of the order is out of bounds (amount, currency, a line, the time), "
             "or an Idempotency-Key was used before with another message.",
        429: "Too many requests from this client; retry after `Retry-After` seconds.",
        503: "The database is unreachable, the table is behind the funnel, or this session "
             "has too many messages in flight; retry after `Retry-After` seconds. A message "
             "the service accepted is never lost.",
    }
    out: dict[str, Any] = {}
    for code in codes:
        out[str(code)] = _json(_ref("Error"), text[code])
        if code in (429, 503):
            out[str(code)]["headers"] = {"Retry-After": {
                "description": "Seconds to wait.", "schema": {"type": "integer", "minimum": 1}}}
    return out


def document(funnels: list[str], version: str) -> dict[str, Any]:
    """The document for a service that serves ``funnels``."""
    funnel = {"name": "funnel", "in": "path", "required": True,
              "schema": {"type": "string", "enum": sorted(funnels)}}
    session = {"name": "session", "in": "path", "required": True,
               "description": "Your id for the conversation (one customer, one session).",
               "schema": {"type": "string", "pattern": SESSION_PATTERN}}
    message_body = {"required": True, "content": {"application/json": {"schema": _ref("Message")}}}
    idempotency = {"name": "Idempotency-Key", "in": "header", "required": False,
                   "description": "The message's key (a UUID): a retry with the same key runs no "
                   "second turn and gets the first turn's answer (`replayed`).",
                   "schema": {"type": "string", "minLength": 1, "maxLength": 200,
                              "pattern": "^[!-~]+$"}}
    api_key: list[dict[str, list[str]]] = [{"apiKey": []}, {"apiKeyHeader": []}]
    return {
        "openapi": "3.0.3",
        "info": {"title": "funnel", "version": version, "description": (
            "Run LLM sales conversations as finite-state machines. Server-to-server clients "
            "use an API key (scopes: converse, read_state, conversions, metrics, admin); the "
            "web widget "
            "uses a signed session token that the service issues.")},
        "paths": {
            "/v1/funnels/{funnel}/sessions/{session}/messages": {"post": {
                "operationId": "sendMessage", "summary": "Answer one customer message (a turn).",
                "description": "Needs the `converse` scope.",
                "parameters": [funnel, session, idempotency], "requestBody": message_body,
                "security": api_key,
                "responses": {"200": _json(_ref("Turn"), "The reply and where the session is."),
                              **_errors(400, 401, 403, 404, 409, 413, 422, 429, 503)}}},
            "/v1/funnels/{funnel}/sessions/{session}/conversions": {"post": {
                "operationId": "recordConversion",
                "summary": "Record an order the session's customer placed.",
                "description": "Needs the `conversions` scope. Idempotent on `order_id`: the "
                "same order again answers 200 with `replayed`; the same id with other "
                "content answers 409 and the first order stands.",
                "parameters": [funnel, session], "security": api_key,
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": _ref("Order")}}},
                "responses": {"201": _json(_ref("Conversion"), "Recorded."),
                              "200": _json(_ref("Conversion"), "Recorded before (a retry)."),
                              "409": _json(_ref("Error"), "The order id was recorded with "
                                           "other content."),
                              **_errors(400, 401, 403, 404, 413, 422, 429, 503)}}},
            "/v1/funnels/{funnel}/sessions/{session}": {"get": {
                "operationId": "getSession", "summary": "The session's state row.",
                "description": "Needs the `read_state` scope.",
                "parameters": [funnel, session], "security": api_key,
                "responses": {"200": _json({"type": "object", "additionalProperties": True},
                                           "The state row as JSON."),
                              **_errors(400, 401, 403, 404, 429, 503)}}},
            "/v1/funnels/{funnel}/widget/session": {"post": {
                "operationId": "widgetSession",
                "summary": "Issue a widget session token (or renew the one presented).",
                "description": "Browsers call this; the service chooses the session id.",
                "parameters": [funnel], "security": [{"widgetToken": []}, {}],
                "responses": {"200": _json(_ref("WidgetSession"), "A signed session token."),
                              **_errors(403, 404, 429)}}},
            "/v1/funnels/{funnel}/widget/messages": {
                "post": {
                    "operationId": "widgetMessage", "summary": "Send a message as the widget.",
                    "parameters": [funnel, idempotency], "requestBody": message_body,
                    "security": [{"widgetToken": []}],
                    "responses": {"200": _json(_ref("Turn"), "The reply."),
                                  **_errors(400, 401, 404, 409, 413, 422, 429, 503)}},
                "get": {
                    "operationId": "widgetHistory",
                    "summary": "The last messages of the widget's own session.",
                    "parameters": [funnel], "security": [{"widgetToken": []}],
                    "responses": {"200": _json(_ref("History"), "Oldest first."),
                                  **_errors(401, 404, 429, 503)}}},
            "/v1/funnels/{funnel}/telegram": {"post": {
                "operationId": "telegramWebhook", "summary": "The Telegram bot webhook.",
                "parameters": [funnel], "security": [{"telegramSecret": []}],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": _ref("TelegramUpdate")}}},
                "responses": {"200": _json({"type": "object", "properties": {
                    "ok": {"type": "boolean"}}, "required": ["ok"]}, "Handled."),
                    **_errors(400, 401, 404, 413, 503)}}},
            "/healthz": {"get": {
                "operationId": "healthz", "summary": "The process is up.", "security": [],
                "responses": {"200": _json(_ref("Health"), "Up.")}}},
            "/readyz": {"get": {
                "operationId": "readyz", "summary": "The database answers and tables are current.",
                "security": [],
                "responses": {"200": _json(_ref("Ready"), "Ready."),
                              "503": {**_json(_ref("Ready"), "Not ready."), "headers": {
                                  "Retry-After": {"schema": {"type": "integer"}}}}}}},
            "/metrics": {"get": {
                "operationId": "metrics", "summary": "Prometheus metrics (text format 0.0.4).",
                "description": "Needs the `metrics` scope unless FUNNEL_METRICS_PUBLIC=1.",
                "security": [*api_key, {}],
                "responses": {"200": {"description": "Metrics.", "content": {
                    "text/plain": {"schema": {"type": "string"}}}},
                    **_errors(401, 403)}}},
        },
        "components": {
            "securitySchemes": {
                "apiKey": {"type": "http", "scheme": "bearer", "description": "An API key."},
                "apiKeyHeader": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
                "widgetToken": {"type": "http", "scheme": "bearer", "bearerFormat": "widget",
                                "description": "A token from POST .../widget/session."},
                "telegramSecret": {"type": "apiKey", "in": "header",
                                   "name": "X-Telegram-Bot-Api-Secret-Token"},
            },
            "schemas": {
                "Message": {"type": "object", "required": ["text"], "properties": {
                    "text": {"type": "string", "minLength": 1, "maxLength": MAX_MESSAGE_CHARS,
                             "pattern": TEXT_PATTERN},
                    "client_message_id": {"type": "string", "minLength": 1, "maxLength": 200,
                                          "pattern": "^[!-~]+$"}}},
                "Turn": {"type": "object", "required": ["reply", "stage", "handoff", "fallback",
                                                        "replayed", "turn_id"],
                         "properties": {"reply": {"type": "string"}, "stage": {"type": "string"},
                                        "handoff": {"type": "boolean"},
                                        "fallback": {"type": "boolean"},
                                        "replayed": {"type": "boolean"},
                                        "turn_id": {"type": "integer"}}},
                "Order": {"type": "object", "additionalProperties": False,
                          "required": ["order_id", "amount", "currency"], "properties": {
                    "order_id": {"type": "string", "pattern": ORDER_ID_PATTERN},
                    "amount": {"type": "string", "pattern": AMOUNT_PATTERN,
                               "description": "The total, a decimal string (two decimals)."},
                    "currency": {"type": "string", "enum": sorted(CURRENCIES),
                                 "description": "ISO 4217."},
                    "lines": {"type": "array", "maxItems": MAX_LINES, "items": _ref("OrderLine")},
                    "ordered_at": {"type": "string", "format": "date-time",
                                   "description": "With its offset; not in the future. "
                                   "Omitted: now."}}},
                "OrderLine": {"type": "object", "additionalProperties": False,
                              "required": ["sku", "qty", "price"], "properties": {
                    "sku": {"type": "string", "pattern": SKU_PATTERN},
                    "qty": {"type": "integer", "minimum": 1, "maximum": MAX_QTY},
                    "price": {"type": "string", "pattern": AMOUNT_PATTERN}}},
                "Conversion": {"type": "object", "required": [
                    "order_id", "session_id", "amount", "currency", "lines", "ordered_at",
                    "recorded_at", "replayed"], "properties": {
                    "order_id": {"type": "string"}, "session_id": {"type": "string"},
                    "amount": {"type": "string"}, "currency": {"type": "string"},
                    "lines": {"type": "array", "items": _ref("OrderLine")},
                    "ordered_at": {"type": "string", "format": "date-time"},
                    "recorded_at": {"type": "string", "format": "date-time"},
                    "replayed": {"type": "boolean"}}},
                "Error": {"type": "object", "required": ["error", "message"], "properties": {
                    "error": {"type": "string"}, "message": {"type": "string"}}},
                "WidgetSession": {"type": "object", "required": ["token", "expires_at"],
                                  "properties": {"token": {"type": "string"},
                                                 "expires_at": {"type": "integer"}}},
                "History": {"type": "object", "required": ["messages"], "properties": {
                    "messages": {"type": "array", "items": {
                        "type": "object", "required": ["role", "content"], "properties": {
                            "role": {"type": "string", "enum": ["user", "assistant"]},
                            "content": {"type": "string"},
                            "created_at": {"type": "string", "nullable": True}}}}}},
                "TelegramUpdate": {"type": "object", "required": ["update_id"],
                                   "properties": {"update_id": {"type": "integer"},
                                                  "message": {"type": "object"},
                                                  "edited_message": {"type": "object"},
                                                  "callback_query": {"type": "object"},
                                                  "my_chat_member": {"type": "object"}}},
                "Health": {"type": "object", "required": ["status"],
                           "properties": {"status": {"type": "string"}}},
                "Ready": {"type": "object", "required": ["ready"], "properties": {
                    "ready": {"type": "boolean"}, "database": {"type": "string"},
                    "funnels": {"type": "object",
                                "additionalProperties": {"type": "string"}},
                    "notes": {"type": "object",
                              "additionalProperties": {"type": "string"}}}},
            },
        },
    }
