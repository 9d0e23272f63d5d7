"""The report's sections that read the shared tables as well as the funnel's own:
purchases, revenue and presented-vs-bought (``funnel_conversions``), the approval gates
(``funnel_control_events``) and the daily trends. Built like the others
(engine.store.analytics_sql), with :class:`~engine.store.analytics_base.Binder`.
"""

from __future__ import annotations

from psycopg import sql

from ..format.spec import FunnelSpec
from . import ddl
from .analytics_base import Binder, col, real, recent


# -- (7) purchases, (8) revenue, (9) presented vs bought, from funnel_conversions --------
# Orders (engine.records.orders) of the sessions started in the window, whenever placed:
# the same sessions as the funnel above, so the rates are of those sessions.
def _orders(spec: FunnelSpec, b: Binder) -> sql.Composed:
    """``s(session_id)``: the window's sessions; ``o``: their orders."""
    return sql.SQL(
        "s AS (SELECT t.session_id FROM {t} t WHERE {recent}), "
        "o AS (SELECT c.session_id, c.amount, c.currency, c.lines FROM {c} c "
        "JOIN s ON s.session_id = c.session_id WHERE c.funnel = {funnel})"
    ).format(t=sql.Identifier(spec.table), recent=recent(b),
             c=sql.Identifier(ddl.CONVERSIONS), funnel=b("funnel", spec.name, "text"))


def purchases(spec: FunnelSpec, b: Binder) -> sql.Composed:
    return sql.SQL(
        "WITH {orders} SELECT (SELECT count(*) FROM s) AS sessions, "
        "(SELECT count(*) FROM o) AS orders, "
        "(SELECT count(DISTINCT session_id) FROM o) AS buyers, "
        "round(100.0 * (SELECT count(DISTINCT session_id) FROM o) / "
        "NULLIF((SELECT count(*) FROM s), 0), 1) AS purchase_pct"
    ).format(orders=_orders(spec, b))


def revenue(spec: FunnelSpec, b: Binder) -> sql.Composed:
    # Per currency: amounts in different currencies are never added up.
    return sql.SQL(
        "WITH {orders} SELECT o.currency, count(*) AS orders, "
        "count(DISTINCT o.session_id) AS buyers, sum(o.amount) AS revenue, "
        "round(avg(o.amount), 2) AS avg_order, "
        "round(sum(o.amount) / NULLIF((SELECT count(*) FROM s), 0), 2) AS revenue_per_session "
        "FROM o GROUP BY o.currency ORDER BY revenue DESC, o.currency"
    ).format(orders=_orders(spec, b))


def presented_vs_bought(spec: FunnelSpec, b: Binder) -> sql.Composed | None:
    if not spec.presented_field:
        return None
    p = col(spec.presented_field)
    limit = sql.SQL(" LIMIT {}").format(b("limit", b.limit, "int")) if b.limit else sql.SQL("")
    return sql.SQL(
        "WITH {orders}, "
        "pr AS (SELECT DISTINCT t.session_id, COALESCE(x->>'sku', x #>> '{{}}') AS sku "
        "FROM {t} t CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof({p}) = "
        "'array' THEN {p} ELSE '[]'::jsonb END) x WHERE {recent}), "
        "bo AS (SELECT o.session_id, l->>'sku' AS sku, sum((l->>'qty')::numeric) AS units "
        "FROM o CROSS JOIN LATERAL jsonb_array_elements(o.lines) l GROUP BY 1, 2) "
        "SELECT COALESCE(pr.sku, bo.sku) AS sku, count(pr.session_id) AS presented, "
        "count(bo.session_id) FILTER (WHERE pr.session_id IS NOT NULL) AS bought_when_presented, "
        "count(bo.session_id) AS bought, COALESCE(sum(bo.units), 0) AS units, "
        "round(100.0 * count(bo.session_id) FILTER (WHERE pr.session_id IS NOT NULL) / "
        "NULLIF(count(pr.session_id), 0), 1) AS bought_pct "
        "FROM pr FULL JOIN bo ON bo.session_id = pr.session_id AND bo.sku = pr.sku "
        "GROUP BY 1 ORDER BY presented DESC, bought DESC, sku{limit}"
    ).format(orders=_orders(spec, b), t=sql.Identifier(spec.table), p=p, recent=recent(b),
             limit=limit)


# -- (9) approval gates, from funnel_control_events -------------------------------------
def approvals(spec: FunnelSpec, b: Binder) -> sql.Composed | None:
    """Per gated stage: moves asked, approved, rejected, timed out (and of those, entered
    anyway), ended by a manager's take-over, still waiting, and the wait until a decision
    (median, p90), in seconds."""
    if not any(s.approval for s in spec.stages.values()):
        return None
    # A take-over that ended an approval carries it as `ended_approval` (engine.turn.manager).
    ended = sql.SQL("e.event = 'takeover' AND e.detail ? 'ended_approval'")
    decided = sql.SQL("(e.event IN ('approved', 'rejected', 'timeout') OR {})").format(ended)
    wait = sql.SQL("COALESCE(e.detail->>'waited', e.detail->'ended_approval'->>'waited')"
                   "::float8")
    return sql.SQL(
        "SELECT a.*, (SELECT count(*) FROM {c} c WHERE c.funnel = {funnel} AND c.mode = "
        "'approval' AND c.held->>'to' = a.stage) AS waiting FROM ("
        "SELECT COALESCE(e.detail->>'to', e.detail->'ended_approval'->>'to') AS stage, "
        "count(*) FILTER (WHERE e.event = 'approval') AS asked, "
        "count(*) FILTER (WHERE e.event = 'approved') AS approved, "
        "count(*) FILTER (WHERE e.event = 'rejected') AS rejected, "
        "count(*) FILTER (WHERE e.event = 'timeout') AS timeouts, "
        "count(*) FILTER (WHERE e.event = 'timeout' AND e.detail->>'entered' IS NOT NULL) "
        "AS timeouts_entered, "
        "count(*) FILTER (WHERE {ended}) AS taken_over, "
        "round((percentile_cont(0.5) WITHIN GROUP (ORDER BY {wait}) FILTER (WHERE {decided}))"
        "::numeric, 1) AS median_wait_seconds, "
        "round((percentile_cont(0.9) WITHIN GROUP (ORDER BY {wait}) FILTER (WHERE {decided}))"
        "::numeric, 1) AS p90_wait_seconds "
        "FROM {events} e WHERE e.funnel = {funnel} AND (e.event IN ('approval', 'approved', "
        "'rejected', 'timeout') OR {ended}) AND e.created_at > NOW() - {since} AND {real} "
        "GROUP BY 1) a ORDER BY 1"
    ).format(wait=wait, decided=decided, ended=ended, c=sql.Identifier(ddl.CONTROL),
             events=sql.Identifier(ddl.CONTROL_EVENTS), funnel=b("funnel", spec.name, "text"),
             since=b.since(), real=real(b, "e"))


# -- (10) trends: sessions and conversions a day, this period against the previous one --
# Days are calendar days in UTC, clipped to the window: the first and the last are
# partial, and the days add up to the period's totals. A conversion is an order placed
# (``ordered_at``) that day, whichever session it came from.
def _orders_in(spec: FunnelSpec, b: Binder) -> sql.Composed:
    return sql.SQL("c.funnel = {}").format(b("funnel", spec.name, "text"))


def trend_days(spec: FunnelSpec, b: Binder) -> sql.Composed:
    return sql.SQL(
        "WITH d AS (SELECT g AS day FROM generate_series(date_trunc('day', NOW() - {since}, "
        "'UTC'), date_trunc('day', NOW(), 'UTC'), INTERVAL '1 day') g), "
        "s AS (SELECT date_trunc('day', t.created_at, 'UTC') AS day, count(*) AS n FROM {t} t "
        "WHERE {recent} GROUP BY 1), "
        "o AS (SELECT date_trunc('day', c.ordered_at, 'UTC') AS day, count(*) AS n FROM {c} c "
        "WHERE {orders} AND c.ordered_at > NOW() - {since} GROUP BY 1) "
        "SELECT (d.day AT TIME ZONE 'UTC')::date AS day, COALESCE(s.n, 0) AS sessions, "
        "COALESCE(o.n, 0) AS conversions FROM d LEFT JOIN s ON s.day = d.day "
        "LEFT JOIN o ON o.day = d.day ORDER BY d.day"
    ).format(since=b.since(), t=sql.Identifier(spec.table), recent=recent(b),
             c=sql.Identifier(ddl.CONVERSIONS), orders=_orders_in(spec, b))


def trend_totals(spec: FunnelSpec, b: Binder) -> sql.Composed:
    since = b.since()
    return sql.SQL(
        "SELECT x.*, round(100.0 * (x.sessions - x.previous_sessions) / "
        "NULLIF(x.previous_sessions, 0), 1) AS sessions_change_pct, "
        "round(100.0 * (x.conversions - x.previous_conversions) / "
        "NULLIF(x.previous_conversions, 0), 1) AS conversions_change_pct FROM (SELECT "
        "(SELECT count(*) FROM {t} t WHERE t.created_at > NOW() - {since} AND {real}) "
        "AS sessions, "
        "(SELECT count(*) FROM {t} t WHERE t.created_at > NOW() - 2 * {since} "
        "AND t.created_at <= NOW() - {since} AND {real}) AS previous_sessions, "
        "(SELECT count(*) FROM {c} c WHERE {orders} AND c.ordered_at > NOW() - {since}) "
        "AS conversions, "
        "(SELECT count(*) FROM {c} c WHERE {orders} AND c.ordered_at > NOW() - 2 * {since} "
        "AND c.ordered_at <= NOW() - {since}) AS previous_conversions) x"
    ).format(t=sql.Identifier(spec.table), since=since, c=sql.Identifier(ddl.CONVERSIONS),
             orders=_orders_in(spec, b), real=real(b))
