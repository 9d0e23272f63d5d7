"""The HTTP API's bodies as typed models: what the handlers parse and answer with, and
what ``/openapi.json`` is generated from (engine.service.openapi), so the two cannot drift.

Requests are read first by the bounded JSON reader (engine.service.limits: size,
depth, no lone surrogates, no NaN), then validated here, strictly (no coercion:
``"1"`` is not an integer). A refusal is a :class:`~engine.service.limits.RequestRefused`
naming the field (:func:`parse`). Bounds that the Python API shares (an order's
amounts, currency, times: engine.records.orders) stay in that one place; the models
publish them in the document from the same constants and check the shape.

Responses are built as models and serialized by pydantic's core (:func:`dump`).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from ..boundary.customer import MAX_MESSAGE_CHARS, MAX_SESSION_ID
from ..records.orders import (
    AMOUNT_PATTERN,
    CURRENCIES,
    MAX_LINES,
    MAX_QTY,
    ORDER_ID_PATTERN,
    SKU_PATTERN,
)
from .limits import RequestRefused

__all__ = ["SESSION_PATTERN", "Conversion", "ErrorBody", "ExplainExit", "ExplainStep",
           "Health", "History", "HistoryMessage", "MessageIn", "OrderIn", "OrderLine", "Ready",
           "SessionState", "TelegramAck", "TelegramUpdate", "Turn", "VersionsOf",
           "WidgetSession", "dump", "parse"]

SESSION_PATTERN = f"^[A-Za-z0-9_.:@-]{{1,{MAX_SESSION_ID}}}$"
# Non-blank text without NUL characters (PostgreSQL text cannot hold NUL).
TEXT_PATTERN = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"
KEY_PATTERN = "^[!-~]+$"  # printable ASCII without spaces (engine.service.inbound)

_M = TypeVar("_M", bound=BaseModel)


class _In(BaseModel):
    """A request body: strict types, unknown fields ignored unless a model forbids them."""

    model_config = ConfigDict(strict=True, extra="ignore")


class _Out(BaseModel):
    """A response body."""

    model_config = ConfigDict(extra="forbid")


# -- requests ----------------------------------------------------------------------------


def checked_text(text: str) -> str:
    """The checks of engine.boundary's customer text, with their statuses: too long is 413
    (split it), blank or NUL is 400. Python's str.strip decides "blank", as everywhere
    else in the engine (not a regex engine's idea of \\s)."""
    if len(text) > MAX_MESSAGE_CHARS:
        raise PydanticCustomError("too_large", "the message has {n} characters, over the "
                                  "limit of {limit}; split it",
                                  {"n": len(text), "limit": MAX_MESSAGE_CHARS})
    if not text.strip() or "\x00" in text:
        raise PydanticCustomError("blank", "the message must be non-blank text without "
                                  "NUL characters")
    return text


class MessageIn(_In):
    """One customer message."""

    text: str = Field(json_schema_extra={"minLength": 1, "maxLength": MAX_MESSAGE_CHARS,
                                         "pattern": TEXT_PATTERN})
    client_message_id: str | None = Field(
        None, description="The message's key, as the Idempotency-Key header (the header wins).",
        json_schema_extra={"minLength": 1, "maxLength": 200, "pattern": KEY_PATTERN})

    @field_validator("text")
    @classmethod
    def _text(cls, text: str) -> str:
        return checked_text(text)


_MONEY: dict[str, JsonValue] = {"pattern": AMOUNT_PATTERN}
_CURRENCIES: list[JsonValue] = list(sorted(CURRENCIES))


class OrderLine(_In):
    """One product bought."""

    model_config = ConfigDict(strict=True, extra="forbid")
    sku: str = Field(json_schema_extra={"pattern": SKU_PATTERN})
    qty: int = Field(json_schema_extra={"minimum": 1, "maximum": MAX_QTY})
    price: str = Field(json_schema_extra=_MONEY)


class OrderIn(_In):
    """An order the session's customer placed (bounds: engine.records.orders)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    order_id: str = Field(json_schema_extra={"pattern": ORDER_ID_PATTERN})
    amount: str = Field(description="The total, a decimal string (two decimals).",
                        json_schema_extra=_MONEY)
    currency: str = Field(description="ISO 4217.",
                          json_schema_extra={"enum": _CURRENCIES})
    lines: list[OrderLine] = Field(default_factory=list,
                                   json_schema_extra={"maxItems": MAX_LINES})
    ordered_at: str | None = Field(None, description="With its offset; not in the future. "
                                   "Omitted: now.", json_schema_extra={"format": "date-time"})


class TelegramUpdate(BaseModel):
    """A Bot API update (engine.service.telegram parses the parts it uses)."""

    model_config = ConfigDict(extra="allow")
    update_id: int
    message: dict[str, Any] | None = None
    edited_message: dict[str, Any] | None = None
    callback_query: dict[str, Any] | None = None
    my_chat_member: dict[str, Any] | None = None


# -- responses ---------------------------------------------------------------------------


class ErrorBody(_Out):
    """Every refusal: a stable code and a sentence that says what to do."""

    error: str = Field(description="A stable code: bad_request, unauthorized, forbidden, "
                       "not_found, conflict, too_large, invalid_order, rate_limited, "
                       "unavailable, busy, session_busy, in_progress, schema_outdated, internal.")
    message: str


class Turn(_Out):
    """The reply to one message and where the session is."""

    reply: str
    stage: str = Field(description="The stage after the turn.")
    handoff: bool
    fallback: bool = Field(description="The reply is the stage's fallback (the model failed).")
    replayed: bool = Field(description="A retry with the same key: the first turn's answer.")
    turn_id: int | None = Field(description="The customer message's id.")
    held: bool | None = Field(None, description="A manager holds the session: the bot did "
                              "not answer (`reply` is the holding reply or empty).")


class ExplainExit(BaseModel):
    """One exit of a stage and what its condition read (engine.turn.explain)."""

    model_config = ConfigDict(extra="allow")
    to: str
    when: str | None = None
    held: bool | None = Field(None, description="null: the condition raised an error.")
    values: dict[str, Any] | None = None
    derived: dict[str, Any] | None = None
    error: str | None = None
    global_: bool | None = Field(None, alias="global")


class ExplainStep(BaseModel):
    """One stage the turn evaluated."""

    model_config = ConfigDict(extra="allow")
    stage: str
    fired: str | None = Field(description="The exit taken, or null: the session stayed.")
    transitions: list[ExplainExit]
    iterations: dict[str, Any] | None = None


class SessionState(BaseModel):
    """The session's state row. The engine's columns are typed here; the funnel's own
    state fields (declared in its YAML) are further properties."""

    model_config = ConfigDict(extra="allow")
    session_id: str
    stage: str
    stage_iteration: int
    stage_history: list[Any]
    turns: int
    funnel_version: int
    notices: list[Any]
    variant: str | None = Field(None, description="The experiment's variant, if any.")
    created_at: str | None = Field(None, json_schema_extra={"format": "date-time"})
    updated_at: str | None = Field(None, json_schema_extra={"format": "date-time"})
    last_message_at: str | None = Field(None, json_schema_extra={"format": "date-time"})
    explain: list[ExplainStep] | None = Field(
        None, description="With ?explain=1: why the last turn moved or stayed (null before "
        "the first turn).")


class Conversion(_Out):
    """An order as recorded."""

    order_id: str
    session_id: str
    amount: str
    currency: str
    lines: list[OrderLine]
    ordered_at: str = Field(json_schema_extra={"format": "date-time"})
    recorded_at: str = Field(json_schema_extra={"format": "date-time"})
    replayed: bool


class WidgetSession(_Out):
    """A signed widget session token."""

    token: str
    expires_at: int = Field(description="Unix time.")


class HistoryMessage(_Out):
    role: Literal["user", "assistant", "manager"]
    content: str
    created_at: str | None


class History(_Out):
    """The widget's own session, oldest first."""

    messages: list[HistoryMessage]


class TelegramAck(_Out):
    ok: bool


class Health(_Out):
    status: str


class VersionsOf(_Out):
    """One funnel's versions in this process (engine.service.reload)."""

    running: int = Field(description="The version new turns run on.")
    loaded: list[int]
    open_sessions: dict[str, int] = Field(description="Open sessions by version.")
    reloaded_at: str | None = None
    refused: str | None = Field(None, description="An edit was refused; the log says why.")


class Ready(_Out):
    """Readiness: the database, each funnel's table, the versions."""

    ready: bool
    database: str
    funnels: dict[str, str]
    versions: dict[str, VersionsOf]
    notes: dict[str, str] | None = None


# -- the manager API (engine.service.manager) --------------------------------------------

_MANAGER_NAME: dict[str, JsonValue] = {"minLength": 1, "maxLength": 80}


class TakeoverIn(_In):
    """Who takes the session over (logged); default: the API key's client."""

    model_config = ConfigDict(strict=True, extra="forbid")
    manager: str | None = Field(None, json_schema_extra=_MANAGER_NAME)


class ManagerMessageIn(TakeoverIn):
    """A manager's message to the session's customer."""

    text: str = Field(json_schema_extra={"minLength": 1, "maxLength": MAX_MESSAGE_CHARS,
                                         "pattern": TEXT_PATTERN})

    @field_validator("text")
    @classmethod
    def _text(cls, text: str) -> str:
        return checked_text(text)


class ReleaseIn(TakeoverIn):
    """Back to the bot: at a stage (None: where it is), with field updates validated as any
    update (422 and nothing written when one is refused)."""

    stage: str | None = Field(None, json_schema_extra={"minLength": 1})
    updates: dict[str, Any] | None = None


class RejectIn(TakeoverIn):
    """Who rejects (logged) and why: the note reaches the next turn's prompt."""

    # Bounded by pydantic itself (the schema's maxLength was documented, not enforced).
    note: str | None = Field(None, min_length=1, max_length=500,
                             json_schema_extra={"pattern": TEXT_PATTERN})

    @field_validator("note")
    @classmethod
    def _note(cls, note: str | None) -> str | None:
        return checked_text(note) if note is not None else None


class Approval(_Out):
    """The move an approval holds: from ``stage`` into ``to``, until ``deadline``."""

    stage: str | None
    to: str | None
    reason: str | None
    on_timeout: str | None
    deadline: str | None


class Control(_Out):
    """Who answers the session now: the bot, a manager, or an approval that waits."""

    session_id: str
    control: Literal["bot", "manager", "approval"]
    manager: str | None
    since: str | None
    stage: str | None = None
    approval: Approval | None = None


class Decided(_Out):
    """An approval decided: the session's stage after, and the stage entered (None: the
    move was dropped)."""

    session_id: str
    decision: Literal["approved", "rejected", "timeout"]
    manager: str | None
    stage: str
    entered: str | None
    waited_seconds: float
    state: dict[str, Any]


class ManagerMessage(_Out):
    session_id: str
    message_id: int
    manager: str
    delivery: str = Field(description="`telegram`: sent through the outbox; `messages`: the "
                          "client reads the message log.")


class Released(_Out):
    session_id: str
    control: Literal["bot"]
    stage: str
    updated: list[str]
    state: dict[str, Any]


class Erased(_Out):
    """The receipt of an erasure: every table the engine keeps a session's rows in, with
    the rows deleted (zeros included), and what was forgotten from memory."""

    funnel: str
    session_id: str
    receipt: str = Field(description="The id the audit event (`erased`, in "
                         "funnel_control_events) carries too; it names no customer.")
    erased_at: str = Field(json_schema_extra={"format": "date-time"})
    tables: dict[str, int] = Field(description="Rows deleted, by table: the funnel's state "
                                   "table, messages, embeddings, turn records, outbox, "
                                   "delivery keys, control rows and events, conversions, "
                                   "unreachable marks.")
    total: int
    memory: dict[str, int] = Field(default_factory=dict, description="Copies held in "
                                   "memory and forgotten: `studio_prompts`, the mounted "
                                   "studio's prompts of the session.")


class Embeddings(_Out):
    count: int
    models: list[str]


class SessionExport(_Out):
    """Everything the engine holds of one session (an access request): each table's
    rows as stored, timestamps in ISO 8601; embeddings counted, not copied."""

    funnel: str
    session_id: str
    receipt: str
    exported_at: str = Field(json_schema_extra={"format": "date-time"})
    state: dict[str, Any] | None = Field(description="The state row; null if the session "
                                         "never saved a turn.")
    messages: list[dict[str, Any]]
    turns: list[dict[str, Any]] = Field(description="Turn records, with the model's raw "
                                        "output and the explanation.")
    conversions: list[dict[str, Any]]
    outbox: list[dict[str, Any]] = Field(description="Alerts and channel replies.")
    control: list[dict[str, Any]]
    control_events: list[dict[str, Any]]
    deliveries: list[dict[str, Any]] = Field(description="Delivery keys (idempotency "
                                             "records) with the answers they replay.")
    unreachable: list[dict[str, Any]]
    embeddings: Embeddings


# -- parsing and answering -------------------------------------------------------------------

# Error types that are a size, not a shape: 413 as before.
_TOO_LARGE = frozenset({"too_large"})


def parse(model: type[_M], data: Any) -> _M:
    """``data`` (already read by :func:`engine.service.limits.read_json`) as ``model``.

    Raises:
        RequestRefused: 413 for a message over the limit, else 400 naming the field.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(body)"
        if first["type"] in _TOO_LARGE:
            raise RequestRefused(413, "too_large", first["msg"]) from None
        if first["type"] == "blank" or first["type"] == "model_type" and not first["loc"]:
            message = first["msg"] if first["type"] == "blank" else \
                f"the body must be a JSON object ({model.__name__} in /openapi.json)"
            raise RequestRefused(400, "bad_request", message) from None
        raise RequestRefused(400, "bad_request", f"`{where}`: {first['msg']}") from None


def dump(body: BaseModel) -> bytes:
    """The model as compact JSON; optional fields that were never set are left out (the
    document does not list them as required)."""
    return body.model_dump_json(by_alias=True, exclude_unset=True).encode()
