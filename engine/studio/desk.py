"""The studio's manager desk: a customer's session as a manager sees it and works it.

``GET /api/desk?funnel&session``: who answers the session (the bot, a manager, an
approval), the manager's messages, the customer's messages the bot held, the take-over,
release and approval marks, each placed after the turn it followed (``after_turn``), and
the turn that handed the session off. ``POST /api/takeover``, ``/api/manager-message``,
``/api/release`` (and ``/api/approve``, ``/api/reject`` for an approval gate's move): the
manager API's acts (docs/service.md#a-manager-in-the-session),
through the same functions the REST API calls (:mod:`engine.turn.manager`), so the same
rules hold: a message or a release needs a take-over first, a release's stage and
updates are validated as any update is, a take-over waits for a turn in flight.

These act on the real session: that is a manager's job, unlike the playground's turns.
Who may: ``manage`` (given to :func:`engine.studio.create_studio_app`) maps the
credential presented to the manager's name, or None for one who may not. Mounted in
`funnel serve` it is the API key's client name when the key has the ``manage`` scope
(an ``admin`` key has it); standalone, the studio's user is its administrator (the one
on loopback, or the holder of its key) and is ``studio`` unless the page names someone.

Beside them, for "I am the model": ``GET /api/stage-prompt?funnel&session`` (the stage
prompt as the model would read it, engine.studio.plain) and ``GET /api/form?funnel&stage``
(a stage's form, for changing the answer of a past turn).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from psycopg.rows import dict_row
from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from ..errors import (
    ApprovalRefused,
    ConcurrentUpdate,
    FunnelError,
    InvalidInput,
    NotAwaitingApproval,
    NotTakenOver,
    ReleaseRejected,
    UnknownSession,
)
from ..format.names import CONTROL_EVENTS, MESSAGES, TURNS
from ..format.spec import FunnelSpec
from ..store.base import Store
from ..turn import manager
from . import sql as studio_sql
from . import views
from .bodies import _SESSION, _Body
from .plain import stage_prompt
from .playground import Studio

__all__ = ["Helpers", "Manage", "routes", "timeline"]

Manage = Callable[[str | None], str | None]  # the credential presented -> a manager, or None
MARKS = ("takeover", "release", "approval", "approved", "rejected", "timeout")
_LIMIT = 500  # timeline items read at most (the newest)


class _Act(_Body):
    funnel: str = Field(min_length=1, max_length=200)
    session: str = Field(pattern=_SESSION)
    manager: str | None = Field(default=None, max_length=200)


class MessageBody(_Act):
    """A manager's message to the session's customer."""

    text: str = Field(min_length=1, max_length=4096)


class RejectBody(_Act):
    """Drop the move an approval gate holds; ``note`` reaches the next prompt."""

    note: str | None = Field(default=None, max_length=2000)


class ReleaseBody(_Act):
    """Back to the bot, at ``stage`` (else where it is), with ``updates`` to its fields."""

    stage: str | None = Field(default=None, max_length=200)
    updates: dict[str, Any] | None = None


async def timeline(store: Store, spec: FunnelSpec, session: str) -> dict[str, Any]:
    """What a manager sees besides the turns: the manager's messages and the customer's
    held ones (with the holding reply), the control marks; each with ``after_turn``, the
    number of turns recorded before it (0: before the first). ``handoff_turn``: the
    number of the turn that entered the hand-off stage first (None: none did)."""
    handoff = spec.handoff.stage if spec.handoff else None
    before = sql.SQL("(SELECT count(*) FROM {t} t WHERE t.funnel = %(f)s AND t.session_id = "
                     "%(s)s AND t.created_at <= x.created_at)").format(t=sql.Identifier(TURNS))
    q = sql.SQL(
        "SELECT x.*, {before} AS after_turn FROM ("
        " SELECT 'message' AS kind, id, role, content, author AS manager, held, NULL::text "
        "  AS event, NULL::jsonb AS detail, created_at FROM {m} WHERE funnel = %(f)s AND "
        "  session_id = %(s)s AND (role = 'manager' OR held)"
        " UNION ALL"
        " SELECT 'mark', id, NULL, NULL, manager, FALSE, event, detail, created_at FROM {e} "
        "  WHERE funnel = %(f)s AND session_id = %(s)s AND event = ANY(%(marks)s)"
        ") x ORDER BY x.created_at DESC, x.kind, x.id DESC LIMIT %(n)s"
    ).format(before=before, m=sql.Identifier(MESSAGES), e=sql.Identifier(CONTROL_EVENTS))
    first = sql.SQL("SELECT count(*) FROM {t} a WHERE a.funnel = %(f)s AND a.session_id = %(s)s "
                    "AND a.id <= (SELECT min(id) FROM {t} WHERE funnel = %(f)s AND session_id "
                    "= %(s)s AND stage_after = %(h)s AND stage_before <> %(h)s)"
                    ).format(t=sql.Identifier(TURNS))
    args = {"f": spec.name, "s": session, "marks": list(MARKS), "n": _LIMIT, "h": handoff}
    async with studio_sql._connect(store) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(q, args)
        items = list(reversed(await cur.fetchall()))
        turn = None
        if handoff is not None:
            await cur.execute(first, args)
            found = await cur.fetchone()
            turn = int(found["count"]) if found and found["count"] else None
    for item in items:
        item["created_at"] = item["created_at"].isoformat()
    return {"items": items, "handoff_turn": turn}


def _refused(exc: FunnelError) -> tuple[int, str]:
    """The REST API's status for each refusal (engine.service.manager)."""
    for kind, status, code in ((UnknownSession, 404, "not_found"),
                               (NotTakenOver, 409, "not_taken_over"),
                               (NotAwaitingApproval, 409, "not_awaiting_approval"),
                               (ReleaseRejected, 422, "rejected"),
                               (ApprovalRefused, 422, "rejected"),
                               (InvalidInput, 400, "bad_request"),
                               (ConcurrentUpdate, 503, "busy")):
        if isinstance(exc, kind):
            return status, code
    return 422, type(exc).__name__


@dataclass(frozen=True)
class Helpers:
    """What the handlers use of ``engine.studio.app`` (which imports this module)."""

    presented: Callable[[Request], str | None]  # the credential a request presents
    json: Callable[[Any], Response]
    error: Callable[[int, str, str], Response]
    opened: Callable[[Request], Awaitable[Studio]]
    body: Callable[[Request, type[Any]], Awaitable[Any]]
    q: Callable[[Request, str], str | None]


Handler = Callable[[Request], Awaitable[Response]]


def routes(h: Helpers) -> list[tuple[str, Handler, str]]:
    """The desk's routes as (path, handler, method), built on the app's helpers."""

    def who(request: Request, named: str | None) -> str:
        found = request.app.state.manage(h.presented(request))
        if found is None:
            raise _Forbidden("this key may not act as a manager: it needs the `manage` scope")
        return manager.manager_name(named if named is not None else found)

    async def act(request: Request, work: Callable[[Any], Awaitable[dict[str, Any]]],
                  name: str) -> Response:
        try:
            return h.json(await work((await h.opened(request)).engine(name)))
        except _Forbidden as exc:
            return h.error(403, "forbidden", str(exc))
        except (FunnelError, ConcurrentUpdate) as exc:
            status, code = _refused(exc)
            return h.error(status, code, str(exc))

    async def desk(request: Request) -> Response:
        studio = await h.opened(request)
        name, session = h.q(request, "funnel") or "", h.q(request, "session") or ""
        engine = studio.engine(name)
        found = request.app.state.manage(h.presented(request))
        return h.json({"control": await manager.status(engine, session),
                       "may_manage": found is not None, "manager": found,
                       **await timeline(studio.store, engine.spec, session)})

    async def takeover(request: Request) -> Response:
        body = await h.body(request, _Act)
        return await act(request, lambda e: manager.take_over(
            e, body.session, who(request, body.manager)), body.funnel)

    async def message(request: Request) -> Response:
        body = await h.body(request, MessageBody)
        return await act(request, lambda e: manager.send(
            e, body.session, who(request, body.manager), body.text), body.funnel)

    async def release(request: Request) -> Response:
        body = await h.body(request, ReleaseBody)
        return await act(request, lambda e: manager.release(
            e, body.session, who(request, body.manager), stage=body.stage,
            updates=body.updates), body.funnel)

    async def approve(request: Request) -> Response:
        body = await h.body(request, _Act)
        return await act(request, lambda e: manager.approve(
            e, body.session, who(request, body.manager)), body.funnel)

    async def reject(request: Request) -> Response:
        body = await h.body(request, RejectBody)
        return await act(request, lambda e: manager.reject(
            e, body.session, who(request, body.manager), body.note), body.funnel)

    async def prompt(request: Request) -> Response:
        """The current stage's prompt for the session, as the model would read it."""
        engine = (await h.opened(request)).engine(h.q(request, "funnel") or "")
        row = await engine.state(h.q(request, "session") or "") or views.fresh(engine.funnel)
        stage = str(row.get("stage") or engine.spec.initial)
        if stage not in engine.funnel.stages:
            raise InvalidInput(f"the session is in stage {stage!r}, which the funnel no "
                               "longer has")
        return h.json(stage_prompt(engine.funnel, row, stage, engine.clock()))

    async def form(request: Request) -> Response:
        """The "I am the model" form of a stage (change-answer asks for a past turn's)."""
        funnel = (await h.opened(request)).funnel(h.q(request, "funnel") or "")
        stage = h.q(request, "stage") or ""
        if stage not in funnel.stages:
            raise InvalidInput(f"funnel '{funnel.name}' has no stage {stage!r}")
        return h.json({"stage": stage, "description": funnel.spec.stages[stage].description,
                       "form": views.form_schema(funnel, stage)})

    return [("stage-prompt", prompt, "GET"), ("form", form, "GET"),
            ("desk", desk, "GET"), ("takeover", takeover, "POST"),
            ("manager-message", message, "POST"), ("release", release, "POST"),
            ("approve", approve, "POST"), ("reject", reject, "POST")]


class _Forbidden(Exception):
    """The credential may not act as a manager (403)."""
