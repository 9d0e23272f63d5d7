"""What the report's SQL builders share (engine.store.analytics_sql and
engine.store.analytics_shared): the window, the stage list and the values a query binds
(:class:`Binder`: parameters for the report, literals for the analysts' views), and the
conditions several sections read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from psycopg import sql

from ..format.spec import FunnelSpec
from .playground import real_session

# The window of the views: `SET funnel.since = '30 days'` changes it for a session.
SINCE_SETTING = "funnel.since"
VIEW_SINCE_DEFAULT = "7 days"
ACTIVE_WINDOW = "24 hours"
Section = Callable[[FunnelSpec, "Binder"], sql.Composed | None]


class Binder:
    """Values as parameters (the report) or as quoted literals (a view, which has no parameters).

    With ``funnel`` (its name), the sessions read leave out the studio's playground
    sessions (engine.store.playground) unless ``include_playground``.
    """

    def __init__(self, inline: bool, since: float = 0.0, limit: int | None = None, *,
                 funnel: str | None = None, include_playground: bool = False) -> None:
        self.inline = inline
        self.since_seconds = float(since)
        self.limit = limit
        self.funnel = funnel
        self.include_playground = include_playground
        self.params: dict[str, Any] = {}

    def __call__(self, name: str, value: Any, cast: str | None = None) -> sql.Composable:
        if self.inline:
            out: sql.Composable = sql.Literal(value)
        else:
            self.params[name] = value
            out = sql.Placeholder(name)
        return sql.SQL("{}::{}").format(out, sql.SQL(cast)) if cast else out

    def since(self) -> sql.Composable:
        if self.inline:
            return sql.SQL("COALESCE(NULLIF(current_setting({}, true), '')::interval, {}::interval)"
                           ).format(sql.Literal(SINCE_SETTING), sql.Literal(VIEW_SINCE_DEFAULT))
        return sql.SQL("make_interval(secs => {})").format(
            self("since", self.since_seconds, "float8"))


def stage_list(spec: FunnelSpec, b: Binder) -> sql.Composed:
    """The declared stages in order: ``st(stage, final, pos)``."""
    return sql.SQL(
        "st AS (SELECT s.stage, s.final, s.pos::int AS pos "
        "FROM unnest({}, {}) WITH ORDINALITY AS s(stage, final, pos))"
    ).format(b("stages", list(spec.stages), "text[]"),
             b("finals", [s.final for s in spec.stages.values()], "boolean[]"))


def col(name: str) -> sql.Composed:
    return sql.SQL("t.{}").format(sql.Identifier(name))


def handed_off(spec: FunnelSpec, b: Binder) -> sql.Composable | None:
    """A condition on ``t`` that holds for sessions handed to a human (None: no hand-off)."""
    h = spec.handoff
    if h is None:
        return None
    if h.triggered_at:
        return sql.SQL("{} IS NOT NULL").format(col(h.triggered_at))
    return sql.SQL("t.stage_history @> {}").format(
        b("handoff_stage_json", json.dumps([{"stage": h.stage}]), "jsonb"))


def handoff_time(spec: FunnelSpec, b: Binder) -> sql.Composable:
    h = spec.handoff
    assert h is not None
    if h.triggered_at:
        return col(h.triggered_at)
    return sql.SQL("(SELECT min((x->>'entered_at')::timestamptz) FROM "
                   "jsonb_array_elements(t.stage_history) x WHERE x->>'stage' = {})").format(
                       b("handoff_stage", h.stage, "text"))


def real(b: Binder, alias: str = "t") -> sql.Composable:
    """A condition on ``alias`` (a row with a ``session_id``): not a playground session
    (TRUE when the report includes them, or knows no funnel)."""
    if b.include_playground or b.funnel is None:
        return sql.SQL("TRUE")
    return real_session(b("funnel", b.funnel, "text"),
                        sql.SQL("{}.session_id").format(sql.Identifier(alias)))


def recent(b: Binder) -> sql.Composed:
    """The sessions ``t`` started in the window (and not in the playground)."""
    return sql.SQL("t.created_at > NOW() - {} AND {}").format(b.since(), real(b))
