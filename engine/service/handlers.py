"""The API's handlers and their table (:data:`OPERATIONS`): each parses its request
through the models of engine.service.models and answers with one.

The app (engine.service.app) builds its routes from :data:`OPERATIONS`, and
``/openapi.json`` is generated from it (engine.service.openapi).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from ..errors import StoreUnavailable
from . import inbound, manager, orders, privacy, sse
from .auth import WidgetSession as Token
from .core import Service
from .inbound import REPLAY_HEADER, delivery_key
from .limits import RequestRefused, read_json
from .models import (
    KEY_PATTERN,
    Control,
    Conversion,
    Decided,
    Erased,
    Health,
    History,
    HistoryMessage,
    ManagerMessage,
    ManagerMessageIn,
    MessageIn,
    OrderIn,
    Ready,
    RejectIn,
    Released,
    ReleaseIn,
    SessionExport,
    SessionState,
    TakeoverIn,
    TelegramAck,
    TelegramUpdate,
    Turn,
    WidgetSession,
    parse,
)
from .readiness import readiness
from .routes import Operation, Param, json_response, session_param

__all__ = ["OPERATIONS", "service_of"]


def service_of(request: Request) -> Service:
    """The app's :class:`Service`."""
    service: Service = request.app.state.service
    return service


def _turn(turn: Turn) -> Response:
    response = json_response(turn)
    if turn.replayed:
        response.headers[REPLAY_HEADER] = "true"
    return response


Handler = Callable[[Request, Service, str], Awaitable[Response]]


def _endpoint(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Resolve the funnel, turn refusals into error responses and count them."""

    async def endpoint(request: Request) -> Response:
        service = service_of(request)
        funnel = str(request.path_params.get("funnel", ""))
        try:
            service.check_funnel(funnel, request)
            return await handler(request, service, funnel)
        except RequestRefused as exc:
            if exc.status != 404:
                service.metrics.refused(funnel, exc.code)
            return exc.response()

    endpoint.__name__ = handler.__name__
    return endpoint


async def post_message(request: Request, service: Service, funnel: str) -> Response:
    client = service.client(request, "converse")
    service.limiter.check(client.name)
    session = session_param(request)
    data = await read_json(request)
    message = parse(MessageIn, data)
    key = delivery_key(request, data)
    # Keys are the client's: scoped by a digest of its API key (never its place in the
    # list) and the session, so nobody replays another client's answers.
    scoped = f"{client.identity}/{session}/{key}" if key else None
    if sse.wanted(request):  # the reply as the model writes it (engine.service.sse)
        return await sse.respond(lambda listener: inbound.turn(
            service, funnel, session, message.text, channel="api", key=scoped, stream=listener))
    return _turn(Turn.model_validate(
        await inbound.turn(service, funnel, session, message.text, channel="api", key=scoped)))


async def post_conversion(request: Request, service: Service, funnel: str) -> Response:
    client = service.client(request, "conversions")
    service.limiter.check(client.name)
    session = session_param(request)
    data = await read_json(request, orders.MAX_ORDER_BYTES)
    # The shape here (400); the bounds in engine.records.orders, shared with the Python API
    # (422). The raw body goes on: `ordered_at` is parsed there, with its offset.
    parse(OrderIn, data)
    status, body = await orders.record(service, funnel, session, data)
    return json_response(Conversion.model_validate(body), status)


async def get_session(request: Request, service: Service, funnel: str) -> Response:
    client = service.client(request, "read_state")
    service.limiter.check(client.name)
    session = session_param(request)
    engine = await service.engine(funnel)
    try:
        state = await engine.state(session)
        if state is not None and request.query_params.get("explain") in ("1", "true"):
            # Why the last turn moved or stayed (engine.turn.explain), from its turn record.
            last = await engine.store.turn_records(engine.spec, session, 1)
            state["explain"] = last[-1]["explain"] if last else None
    except StoreUnavailable:
        raise service.trip() from None
    if state is None:
        raise RequestRefused(404, "not_found", f"no session {session!r} in funnel '{funnel}'")
    return json_response(SessionState.model_validate(state))


async def widget_session(request: Request, service: Service, funnel: str) -> Response:
    service.check_origin(request)
    service.limiter.check(f"ip:{request.client.host if request.client else '?'}")
    try:
        current: Token | None = service.widget(request, funnel)
    except RequestRefused:
        current = None  # no token, or one that is expired or not ours: a new session
    token, session = service.tokens.issue(funnel, current.session_id if current else None)
    return json_response(WidgetSession(token=token, expires_at=session.expires_at))


async def widget_message(request: Request, service: Service, funnel: str) -> Response:
    session = service.widget(request, funnel)
    service.limiter.check(f"widget:{session.session_id}")
    data = await read_json(request)
    message = parse(MessageIn, data)
    key = delivery_key(request, data)
    scoped = f"{session.session_id}/{key}" if key else None
    if sse.wanted(request):
        return await sse.respond(lambda listener: inbound.turn(
            service, funnel, session.session_id, message.text, channel="web", key=scoped,
            stream=listener))
    return _turn(Turn.model_validate(await inbound.turn(
        service, funnel, session.session_id, message.text, channel="web", key=scoped)))


async def widget_history(request: Request, service: Service, funnel: str) -> Response:
    session = service.widget(request, funnel)
    service.limiter.check(f"widget:{session.session_id}")
    engine = await service.engine(funnel)
    try:
        rows = await engine.store.history(engine.spec, session.session_id, 50)
    except StoreUnavailable:
        raise service.trip() from None
    return json_response(History(messages=[
        HistoryMessage(role=r["role"], content=r["content"],
                       created_at=r["created_at"].isoformat() if r.get("created_at") else None)
        for r in rows if r["role"] in ("user", "assistant", "manager")]))


async def telegram(request: Request, service: Service, funnel: str) -> Response:
    # The update is parsed at the Telegram boundary (engine.service.telegram), which
    # answers Telegram itself: its model is in the table for the document.
    return await service.telegram.webhook(request, funnel)


async def healthz(request: Request) -> Response:
    return json_response(Health(status="ok"))


async def readyz(request: Request) -> Response:
    service = service_of(request)
    ready, body = await readiness(service)
    response = json_response(Ready.model_validate(body), 200 if ready else 503)
    if not ready:
        response.headers["Retry-After"] = str(service.config.retry_after)
    return response


async def metrics(request: Request) -> Response:
    service = service_of(request)
    funnels = None
    if not service.config.metrics_public:
        try:
            # A key limited to funnels sees their series (and the process's) only.
            funnels = service.client(request, "metrics").funnels
        except RequestRefused as exc:
            return exc.response()
    await service.reloader.versions()  # refreshes the version gauges (cached counts)
    return Response(service.metrics.render(funnels), media_type="text/plain; version=0.0.4")


_F = "/v1/funnels/{funnel}"
_S = f"{_F}/sessions/{{session}}"
_API_KEY = ("apiKey", "apiKeyHeader")
_IDEMPOTENCY = Param("Idempotency-Key", "header", "The message's key (a UUID): a retry with the "
                     "same key runs no second turn and gets the first turn's answer "
                     "(`replayed`).", {"type": "string", "minLength": 1, "maxLength": 200,
                                       "pattern": KEY_PATTERN})
_MANAGER_KEY = Param("Idempotency-Key", "header", "The message's key (a UUID): a retry with "
                     "the same key sends nothing again and gets the first answer.",
                     {"type": "string", "minLength": 1, "maxLength": 200,
                      "pattern": KEY_PATTERN})
_EXPLAIN = Param("explain", "query", "`true` (or `1`): add `explain`, why the last turn moved "
                 "or stayed.", {"type": "boolean"})

OPERATIONS: list[Operation] = [
    Operation("POST", f"{_S}/messages", "sendMessage", "Answer one customer message (a turn).",
              _endpoint(post_message), {200: (Turn, "The reply and where the session is.")},
              body=MessageIn, errors=(400, 401, 403, 404, 409, 413, 422, 429, 503),
              params=(_IDEMPOTENCY,), security=_API_KEY, streams=True,
              description="Needs the `converse` scope."),
    Operation("POST", f"{_S}/conversions", "recordConversion",
              "Record an order the session's customer placed.", _endpoint(post_conversion),
              {201: (Conversion, "Recorded."), 200: (Conversion, "Recorded before (a retry).")},
              body=OrderIn, errors=(400, 401, 403, 404, 409, 413, 422, 429, 503),
              security=_API_KEY,
              description="Needs the `conversions` scope. Idempotent on `order_id`: the same "
              "order again answers 200 with `replayed`; the same id with other content "
              "answers 409 and the first order stands."),
    Operation("GET", _S, "getSession", "The session's state row.", _endpoint(get_session),
              {200: (SessionState, "The state row.")}, errors=(400, 401, 403, 404, 429, 503),
              params=(_EXPLAIN,), security=_API_KEY,
              description="Needs the `read_state` scope."),
    # A customer's requests about their data (engine.service.privacy), scope `erase`.
    Operation("DELETE", _S, "eraseSession",
              "Erase every copy of the session (a data subject's erasure request).",
              _endpoint(privacy.erase), {200: (Erased, "Erased: the receipt, rows per table.")},
              errors=(400, 401, 403, 404, 429, 503), security=_API_KEY,
              description="Needs the `erase` scope. A turn in flight finishes first; the "
              "session, its messages, embeddings, turn records, outbox rows, delivery keys, "
              "control rows and events, conversions, and the mounted studio's prompts go. "
              "404 when nothing of the session is stored (erased already). Logged as an "
              "`erased` control event without the customer's id."),
    Operation("GET", f"{_S}/export", "exportSession",
              "Everything stored of the session (a data subject's access request).",
              _endpoint(privacy.export), {200: (SessionExport, "The session's data.")},
              errors=(400, 401, 403, 404, 429, 503), security=_API_KEY,
              description="Needs the `erase` scope (the whole conversation and the model's "
              "raw output: more than `read_state` reads). Logged as an `exported` control "
              "event without the customer's id."),
    # The manager API (engine.service.manager), scope `manage`.
    Operation("POST", f"{_S}/takeover", "takeOver",
              "Take the session over: the bot stops answering it.", _endpoint(manager.takeover),
              {200: (Control, "Taken over.")}, body=TakeoverIn,
              errors=(400, 401, 403, 404, 413, 429, 503), security=_API_KEY,
              description="Needs the `manage` scope."),
    Operation("POST", f"{_S}/manager-messages", "managerMessage",
              "Send a manager's message to the session's customer (through its channel).",
              _endpoint(manager.manager_message), {200: (ManagerMessage, "Sent.")},
              body=ManagerMessageIn, errors=(400, 401, 403, 404, 409, 413, 422, 429, 503),
              params=(_MANAGER_KEY,), security=_API_KEY,
              description="Needs the `manage` scope. With an `Idempotency-Key` the message "
              "is logged and sent once: a retry gets the first answer "
              "(`Idempotent-Replayed: true`); the key with another text answers 422."),
    Operation("POST", f"{_S}/release", "release",
              "Hand the session back to the bot, at a stage, with field updates.",
              _endpoint(manager.release), {200: (Released, "Back to the bot.")}, body=ReleaseIn,
              errors=(400, 401, 403, 404, 409, 413, 422, 429, 503), security=_API_KEY,
              description="Needs the `manage` scope. The updates are validated as any update "
              "is: a refusal answers 422 and nothing is written."),
    Operation("POST", f"{_S}/approve", "approve",
              "Approve the move the session's approval gate holds.",
              _endpoint(manager.approve), {200: (Decided, "Approved: the move is made.")},
              body=TakeoverIn, errors=(400, 401, 403, 404, 409, 413, 422, 429, 503),
              security=_API_KEY,
              description="Needs the `manage` scope. The move is re-validated: 422 when it no "
              "longer applies (nothing written); 409 when no approval waits."),
    Operation("POST", f"{_S}/reject", "reject",
              "Reject the move the session's approval gate holds.",
              _endpoint(manager.reject), {200: (Decided, "Rejected: the session stays.")},
              body=RejectIn, errors=(400, 401, 403, 404, 409, 413, 429, 503),
              security=_API_KEY,
              description="Needs the `manage` scope. The note reaches the next turn's prompt; "
              "409 when no approval waits."),
    Operation("GET", f"{_S}/control", "getControl",
              "Who answers the session: the bot, a manager, or an approval that waits.",
              _endpoint(manager.control), {200: (Control, "Who answers.")},
              errors=(400, 401, 403, 404, 429, 503), security=_API_KEY,
              description="Needs the `manage` scope."),
    Operation("POST", f"{_F}/widget/session", "widgetSession",
              "Issue a widget session token (or renew the one presented).",
              _endpoint(widget_session), {200: (WidgetSession, "A signed session token.")},
              errors=(403, 404, 429), security=("widgetToken", None),
              description="Browsers call this; the service chooses the session id."),
    Operation("POST", f"{_F}/widget/messages", "widgetMessage", "Send a message as the widget.",
              _endpoint(widget_message), {200: (Turn, "The reply.")}, body=MessageIn,
              errors=(400, 401, 404, 409, 413, 422, 429, 503), params=(_IDEMPOTENCY,),
              security=("widgetToken",), streams=True),
    Operation("GET", f"{_F}/widget/messages", "widgetHistory",
              "The last messages of the widget's own session.", _endpoint(widget_history),
              {200: (History, "Oldest first.")}, errors=(401, 404, 429, 503),
              security=("widgetToken",)),
    Operation("POST", f"{_F}/telegram", "telegramWebhook", "The Telegram bot webhook.",
              _endpoint(telegram), {200: (TelegramAck, "Handled.")}, body=TelegramUpdate,
              errors=(400, 401, 404, 413, 503), security=("telegramSecret",)),
    Operation("GET", "/healthz", "healthz", "The process is up.", healthz,
              {200: (Health, "Up.")}, security=(None,)),
    Operation("GET", "/readyz", "readyz", "The database answers and tables are current.",
              readyz, {200: (Ready, "Ready."), 503: (Ready, "Not ready.")}, security=(None,)),
    Operation("GET", "/metrics", "metrics", "Prometheus metrics (text format 0.0.4).", metrics,
              {200: (None, "Metrics.")}, errors=(401, 403), security=(*_API_KEY, None),
              description="Needs the `metrics` scope unless FUNNEL_METRICS_PUBLIC=1.",
              media_type="text/plain"),
]
