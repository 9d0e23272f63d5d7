"""The SQL of `funnel report` and of the analysts' views, built from a funnel's declaration.

The views themselves (their names, and what ``funnel migrate`` changes) are in
:mod:`engine.store.analytics_views`.

Every section is one query that aggregates on the server: Python only ever
sees the aggregated rows. The same builders make the report's queries (the
time window and the stage list bound as parameters) and the views that
``funnel migrate`` creates (the same values inlined as literals, the window
read from the ``funnel.since`` setting). Identifiers always go through
``psycopg.sql.Identifier``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from ..errors import StoreUnavailable, first_line
from ..format.main_path import stage_paths
from ..format.spec import FunnelSpec
from . import ddl
from .analytics_base import (
    ACTIVE_WINDOW,
    Binder,
    Section,
    col,
    handed_off,
    handoff_time,
    real,
    recent,
    stage_list,
)
from .analytics_shared import (
    approvals,
    presented_vs_bought,
    purchases,
    revenue,
    trend_days,
    trend_totals,
)
from .connect import safe_url
from .embedded import embedded_url

# For the report's transaction: JIT compilation costs more than it saves on these
# aggregates; hashing or sorting a few hundred thousand rows wants more than 4 MB;
# and the planner takes every jsonb_array_elements / jsonb_to_recordset over
# stage_history for 100 rows (a session has a handful), which makes handing rows
# from parallel workers look some 30 times dearer than it is: without the lower
# parallel_tuple_cost, the time-in-stage section parses its timestamps on one core.
REPORT_SETTINGS = {"jit": "off", "work_mem": "64MB", "parallel_tuple_cost": "0.001"}

# -- (1) active sessions by stage ------------------------------------------------------
def active_by_stage(spec: FunnelSpec, b: Binder) -> sql.Composed:
    h = spec.handoff
    not_handed: sql.Composable = sql.SQL("")
    if h is not None and h.triggered_at:
        not_handed = sql.SQL(" AND {} IS NULL").format(col(h.triggered_at))
    elif h is not None:
        not_handed = sql.SQL(" AND t.stage <> {}").format(b("handoff_stage", h.stage, "text"))
    return sql.SQL(
        "WITH {st} SELECT t.stage, st.pos, count(*) AS sessions FROM {t} t "
        "LEFT JOIN st ON st.stage = t.stage "
        "WHERE t.last_message_at > NOW() - INTERVAL {window}{not_handed} AND {real} "
        "GROUP BY t.stage, st.pos ORDER BY sessions DESC, st.pos NULLS LAST, t.stage"
    ).format(st=stage_list(spec, b), t=sql.Identifier(spec.table),
             window=sql.Literal(ACTIVE_WINDOW), not_handed=not_handed, real=real(b))


# -- (2) the funnel: sessions that reached each stage ----------------------------------
def _path_stages(spec: FunnelSpec, b: Binder) -> sql.Composed:
    """The stages in the funnel chart's order, the main path first then the side
    branches (``engine.format.main_path``): ``st(stage, final, pos, branch, branch_from)``."""
    paths = stage_paths(spec)
    order = [*paths.main, *paths.branches]
    return sql.SQL(
        "st AS (SELECT s.stage, s.final, s.pos::int AS pos, s.pos > {n} AS branch, s.src "
        "AS branch_from FROM unnest({}, {}, {}) WITH ORDINALITY AS s(stage, final, src, pos))"
    ).format(b("path_stages", order, "text[]"),
             b("path_finals", [spec.stages[n].final for n in order], "boolean[]"),
             b("path_from", [None] * len(paths.main) + list(paths.branches.values()), "text[]"),
             n=b("path_main", len(paths.main), "int"))


def furthest_main_stage(main: list[str], history: sql.Composable,
                        value: sql.Composable) -> sql.Composed:
    """The position (1-based) on the main path ``main`` of the furthest main stage in
    ``history`` (a session's ``stage_history``): where the session "went no further".
    ``value`` is where the main path goes in (a placeholder or a literal); the studio's
    sessions list filters with this same expression."""
    return sql.SQL("(SELECT max(array_position({}::text[], h->>'stage')) FROM "
                   "jsonb_array_elements({}) h)").format(value, history)


def stage_funnel(spec: FunnelSpec, b: Binder) -> sql.Composed:
    # Per session, one small aggregate over its history: the stages it reached (a bit
    # mask of their positions in the chart's order), the furthest main-path stage and
    # the stage it is in now. Sessions are then counted per (mask, furthest, now), a
    # handful of groups, so no sort of all sessions and nothing per session leaves the
    # scan. A session "stopped" at the furthest main-path stage it reached: a side
    # branch (objection handling) is not a step further; a branch counts the sessions
    # that are in it now ("ended_here").
    paths = stage_paths(spec)
    main = list(paths.main)
    order = b("path_stages", [*paths.main, *paths.branches], "text[]")
    if len(spec.stages) <= 62:
        mask = sql.SQL("bit_or(1::bigint << (x.p - 1))")
        has = sql.SQL("s.mask & (1::bigint << (st.pos - 1)) <> 0")
    else:  # too many stages for a bigint mask: an array of positions
        mask = sql.SQL("array_agg(DISTINCT x.p)")
        has = sql.SQL("st.pos = ANY(s.mask)")
    # One pass over the history: the main path is the start of ``order``, so the furthest
    # main stage is the largest position within it (what furthest_main_stage computes
    # for the studio's list, on the main path alone).
    per_session = sql.SQL(
        "SELECT {mask} AS mask, max(x.p) FILTER (WHERE x.p <= {n}) AS furthest FROM ("
        "SELECT array_position({order}, h->>'stage') AS p "
        "FROM jsonb_array_elements(t.stage_history) h) x").format(
            mask=mask, order=order, n=b("path_main", len(main), "int"))
    return sql.SQL(
        "WITH {st}, s AS (SELECT r.mask, r.furthest, array_position({order}, t.stage) AS cur, "
        "count(*) AS n FROM {t} t "
        "CROSS JOIN LATERAL ({per_session}) r WHERE {recent} GROUP BY 1, 2, 3), "
        "c AS (SELECT st.pos, sum(s.n) FILTER (WHERE {has}) AS reached, "
        "sum(s.n) FILTER (WHERE s.furthest = st.pos AND NOT st.branch) AS stopped, "
        "sum(s.n) FILTER (WHERE s.cur = st.pos) AS ended FROM st CROSS JOIN s "
        "GROUP BY st.pos) "
        "SELECT st.pos, st.stage, st.final, COALESCE(c.reached, 0)::bigint AS sessions, "
        "round(100.0 * COALESCE(c.reached, 0) / NULLIF(first_value(COALESCE(c.reached, 0)) "
        "OVER (ORDER BY st.pos), 0), 1) AS pct_of_first, "
        "COALESCE(c.stopped, 0)::bigint AS stopped_here, "
        "(SELECT COALESCE(sum(n), 0) FROM s)::bigint AS total_sessions, "
        # New columns go last: the analysts' views are replaced in place.
        "st.branch, st.branch_from, COALESCE(c.ended, 0)::bigint AS ended_here "
        "FROM st LEFT JOIN c ON c.pos = st.pos ORDER BY st.pos"
    ).format(st=_path_stages(spec, b), order=order, t=sql.Identifier(spec.table),
             per_session=per_session, recent=recent(b), has=has)


# -- (3) time in each stage ------------------------------------------------------------
def stage_time(spec: FunnelSpec, b: Binder) -> sql.Composed:
    # Completed visits only (a visit without exited_at is still going on). Each
    # history item is parsed once, with typed columns; grouping is by the
    # stage's integer position, which sorts much faster than its name.
    return sql.SQL(
        "WITH {st}, a AS (SELECT array_position({stages}, h.stage) AS pos, count(*) AS samples, "
        "avg(d.secs) AS avg_secs, percentile_cont(0.5) WITHIN GROUP (ORDER BY d.secs) AS median "
        "FROM {t} t CROSS JOIN LATERAL jsonb_to_recordset(t.stage_history) "
        "AS h(stage text, entered_at timestamptz, exited_at timestamptz) "
        "CROSS JOIN LATERAL (SELECT extract(epoch FROM h.exited_at - h.entered_at)::float8 "
        "AS secs) d WHERE {recent} AND h.exited_at IS NOT NULL AND h.entered_at IS NOT NULL "
        "GROUP BY 1) "
        "SELECT st.pos, st.stage, COALESCE(a.samples, 0) AS samples, "
        "round(a.avg_secs::numeric, 1) AS avg_seconds, round(a.median::numeric, 1) "
        "AS median_seconds FROM st LEFT JOIN a ON a.pos = st.pos ORDER BY st.pos"
    ).format(st=stage_list(spec, b), stages=b("stages", list(spec.stages), "text[]"),
             t=sql.Identifier(spec.table), recent=recent(b))


# -- (4) most presented products -------------------------------------------------------
def products(spec: FunnelSpec, b: Binder) -> sql.Composed | None:
    if not spec.presented_field:
        return None
    handed = handed_off(spec, b)
    converted = (sql.SQL("count(*) FILTER (WHERE {})").format(handed) if handed is not None
                 else sql.SQL("NULL::bigint"))
    p = col(spec.presented_field)
    limit = sql.SQL(" LIMIT {}").format(b("limit", b.limit, "int")) if b.limit else sql.SQL("")
    return sql.SQL(
        "SELECT COALESCE(p->>'sku', p #>> '{{}}') AS sku, count(*) AS presented, "
        "{converted} AS converted, round(100.0 * {converted} / count(*), 1) AS conversion_pct "
        "FROM {t} t CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof({p}) = 'array' "
        "THEN {p} ELSE '[]'::jsonb END) p WHERE {recent} "
        "GROUP BY 1 ORDER BY presented DESC, sku{limit}"
    ).format(converted=converted, t=sql.Identifier(spec.table), p=p, recent=recent(b),
             limit=limit)


# -- (5) hand-off reasons --------------------------------------------------------------
def handoff_reasons(spec: FunnelSpec, b: Binder) -> sql.Composed | None:
    h = spec.handoff
    if h is None:
        return None
    reason = col(h.reason) if h.reason else sql.SQL("NULL::text")
    cart = (col(spec.cart.total) if spec.cart and spec.cart.total else sql.SQL("NULL::numeric"))
    at = handoff_time(spec, b)
    if h.triggered_at:  # the partial index on the hand-off time serves this
        where = sql.SQL("{at} IS NOT NULL AND {at} > NOW() - {since} AND {real}").format(
            at=at, since=b.since(), real=real(b))
    else:
        where = sql.SQL("{} AND {}").format(recent(b), handed_off(spec, b))
    return sql.SQL(
        "SELECT {reason} AS reason, count(*) AS handoffs, round(avg({cart}), 2) AS avg_cart_total, "
        "round(avg(extract(epoch FROM {at} - t.created_at)), 1) AS avg_seconds_to_handoff "
        "FROM {t} t WHERE {where} GROUP BY 1 ORDER BY handoffs DESC, reason"
    ).format(reason=reason, cart=cart, at=at, t=sql.Identifier(spec.table), where=where)


# -- (6) cost, tokens and quality, from funnel_turns ------------------------------------
def _turns_where(spec: FunnelSpec, b: Binder) -> sql.Composed:
    return sql.SQL("tr.funnel = {} AND tr.created_at > NOW() - {} AND {}").format(
        b("funnel", spec.name, "text"), b.since(), real(b, "tr"))


# A follow-up's record (engine.turn.follow_up) is no customer turn: it counts in the
# spend (a `prompt:` step's model tokens and cost), never in the turns, the
# conversations or the turns without a price (those name the customer turns' model).
_CUSTOMER = "tr.follow_up IS NULL"


def conversation_costs(spec: FunnelSpec, b: Binder) -> sql.Composed:
    # The conversations: sessions with a customer turn in the window; the totals are
    # the window's spend, a follow-up's to a session otherwise silent in it included.
    return sql.SQL(
        "SELECT count(*) FILTER (WHERE c.turns > 0) AS conversations, "
        "COALESCE(sum(c.turns), 0) AS turns, "
        "COALESCE(sum(c.prompt_tokens), 0) AS prompt_tokens, "
        "COALESCE(sum(c.completion_tokens), 0) AS completion_tokens, sum(c.cost) AS cost, "
        "round(avg(c.turns) FILTER (WHERE c.turns > 0), 2) AS avg_turns, "
        "round(avg(c.prompt_tokens + c.completion_tokens) FILTER (WHERE c.turns > 0), 1) "
        "AS avg_tokens, round(avg(c.cost) FILTER (WHERE c.turns > 0), 6) AS avg_cost, "
        "round((percentile_cont(0.5) WITHIN GROUP (ORDER BY c.cost) FILTER (WHERE c.turns > 0)"
        ")::numeric, 6) AS median_cost, "
        # Turns whose model has no price in litellm's map: their cost is unknown, not 0.
        "COALESCE(sum(c.uncosted), 0) AS turns_without_cost, "
        # Of the prompt tokens, those the provider read from its prompt cache (new columns
        # go last: the analysts' views are replaced in place).
        "COALESCE(sum(c.cached_prompt_tokens), 0) AS cached_prompt_tokens, "
        "round(100.0 * sum(c.cached_prompt_tokens) / NULLIF(sum(c.prompt_tokens), 0), 1) "
        "AS cached_prompt_pct, "
        # Of the prompt tokens, those written to the prompt cache (billed above the input).
        "COALESCE(sum(c.cache_write_tokens), 0) AS cache_write_tokens, "
        "round(100.0 * sum(c.cache_write_tokens) / NULLIF(sum(c.prompt_tokens), 0), 1) "
        "AS cache_write_pct, "
        # The conversations with at least one turn that fell back.
        "count(*) FILTER (WHERE c.fallbacks > 0) AS fallback_sessions "
        "FROM (SELECT tr.session_id, count(*) FILTER (WHERE " + _CUSTOMER + ") AS turns, "
        "sum(tr.prompt_tokens) AS prompt_tokens, "
        "sum(tr.completion_tokens) AS completion_tokens, sum(tr.cost) AS cost, "
        "count(*) FILTER (WHERE tr.cost IS NULL AND " + _CUSTOMER + ") AS uncosted, "
        "sum(tr.cached_prompt_tokens) AS cached_prompt_tokens, "
        "sum(tr.cache_write_tokens) AS cache_write_tokens, "
        "count(*) FILTER (WHERE tr.fallback) AS fallbacks "
        "FROM {turns} tr WHERE {where} GROUP BY tr.session_id) c"
    ).format(turns=sql.Identifier(ddl.TURNS), where=_turns_where(spec, b))


def stage_costs(spec: FunnelSpec, b: Binder) -> sql.Composed:
    # The sums per stage aggregate in parallel; the distinct sessions per stage
    # come from a hash of (stage, session): no sort of every turn by session id.
    where = _turns_where(spec, b)
    return sql.SQL(
        "WITH {st}, a AS (SELECT tr.stage_before AS stage, "
        "count(*) FILTER (WHERE " + _CUSTOMER + ") AS turns, "
        "sum(tr.prompt_tokens) AS prompt_tokens, sum(tr.completion_tokens) AS completion_tokens, "
        "sum(tr.cost) AS cost, count(*) FILTER (WHERE tr.validation_failures > 0) AS failed, "
        "count(*) FILTER (WHERE tr.fallback) AS fallbacks, avg(tr.llm_ms) AS llm_ms, "
        "sum(tr.cached_prompt_tokens) AS cached_prompt_tokens, "
        "sum(tr.cache_write_tokens) AS cache_write_tokens "
        "FROM {turns} tr WHERE {where} GROUP BY 1), "
        "s AS (SELECT x.stage, count(*) FILTER (WHERE x.customer) AS sessions, "
        "count(*) FILTER (WHERE x.fell_back) "
        "AS fallback_sessions FROM (SELECT tr.stage_before AS stage, tr.session_id, "
        "bool_or(tr.fallback) AS fell_back, bool_or(" + _CUSTOMER + ") AS customer "
        "FROM {turns} tr WHERE {where} GROUP BY 1, 2) x "
        "GROUP BY 1) "
        "SELECT a.stage, st.pos, a.turns, s.sessions, a.prompt_tokens, a.completion_tokens, "
        "a.cost, round(a.cost / NULLIF(s.sessions, 0), 6) AS cost_per_conversation, "
        "round((a.prompt_tokens + a.completion_tokens)::numeric / NULLIF(a.turns, 0), 1) "
        "AS avg_tokens_per_turn, a.failed AS validation_failed_turns, "
        "round(100.0 * a.failed / NULLIF(a.turns, 0), 1) AS validation_failure_pct, "
        "a.fallbacks AS fallback_turns, "
        "round(100.0 * a.fallbacks / NULLIF(a.turns, 0), 1) AS fallback_pct, "
        "round(a.llm_ms) AS avg_llm_ms, a.cached_prompt_tokens, "
        "round(100.0 * a.cached_prompt_tokens / NULLIF(a.prompt_tokens, 0), 1) "
        "AS cached_prompt_pct, a.cache_write_tokens, "
        "round(100.0 * a.cache_write_tokens / NULLIF(a.prompt_tokens, 0), 1) "
        "AS cache_write_pct, s.fallback_sessions "
        "FROM a JOIN s ON s.stage = a.stage LEFT JOIN st ON st.stage = a.stage "
        "ORDER BY st.pos NULLS LAST, a.stage"
    ).format(st=stage_list(spec, b), turns=sql.Identifier(ddl.TURNS), where=where)


def reply_claims(spec: FunnelSpec, b: Binder) -> sql.Composed:
    """The claims of the replies that the catalog and the state did not back (engine.claims),
    per stage and kind: how many, in how many turns, how many of those fell back."""
    return sql.SQL(
        "WITH {st}, c AS (SELECT tr.stage_before AS stage, x->>'kind' AS kind, "
        "count(*) AS refused, count(DISTINCT tr.id) AS turns, "
        "count(DISTINCT tr.id) FILTER (WHERE tr.fallback) AS fallback_turns, "
        "count(DISTINCT tr.session_id) AS sessions "
        "FROM {turns} tr, jsonb_array_elements(tr.claims) x WHERE {where} "
        "AND tr.claims <> '[]'::jsonb GROUP BY 1, 2) "
        "SELECT c.stage, c.kind, c.refused, c.turns, c.fallback_turns, c.sessions FROM c "
        "LEFT JOIN st ON st.stage = c.stage ORDER BY st.pos NULLS LAST, c.stage, "
        "c.refused DESC, c.kind"
    ).format(st=stage_list(spec, b), turns=sql.Identifier(ddl.TURNS),
             where=_turns_where(spec, b))


# The sections that read funnel_conversions too (none before it exists).
CONVERSION_SECTIONS = frozenset({"purchases", "revenue", "presented_vs_bought", "trend_days",
                                 "trend_totals"})

# name -> (builder, reads funnel_turns)
SECTIONS: dict[str, tuple[Section, bool]] = {
    "active_by_stage": (active_by_stage, False),
    "stage_funnel": (stage_funnel, False),
    "stage_time": (stage_time, False),
    "products": (products, False),
    "handoff_reasons": (handoff_reasons, False),
    "conversation_costs": (conversation_costs, True),
    "stage_costs": (stage_costs, True),
    "reply_claims": (reply_claims, True),
    "purchases": (purchases, False),
    "revenue": (revenue, False),
    "presented_vs_bought": (presented_vs_bought, False),
    "approvals": (approvals, False),
    "trend_days": (trend_days, False),
    "trend_totals": (trend_totals, False),
}


def section_queries(spec: FunnelSpec, since: float, *, limit: int = 20,
                    include_playground: bool = False
                    ) -> dict[str, tuple[sql.Composed, dict[str, Any], bool]]:
    """The report's queries that apply to the funnel: name -> (query, parameters, uses turns).
    The studio's playground sessions are left out unless ``include_playground``."""
    out = {}
    for name, (build, turns) in SECTIONS.items():
        b = Binder(inline=False, since=since, limit=limit, funnel=spec.name,
                   include_playground=include_playground)
        query = build(spec, b)
        if query is not None:
            out[name] = (query, b.params, turns)
    return out


def inline_queries(spec: FunnelSpec) -> dict[str, sql.Composed]:
    """The sections that apply to the funnel with every value inlined as a literal (the
    window read from the ``funnel.since`` setting): the bodies of the analysts' views."""
    out = {}
    for section, (build, _) in SECTIONS.items():
        query = build(spec, Binder(inline=True, funnel=spec.name))
        if query is not None:
            out[section] = query
    return out


# -- running the report ----------------------------------------------------------------
@contextlib.asynccontextmanager
async def report_snapshot(url: str | None, timeout: float
                          ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A read-only REPEATABLE READ transaction with the report's settings (every report's
    queries see one snapshot, and none can run away).

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    url = url or embedded_url()
    try:
        conn = await psycopg.AsyncConnection.connect(url, connect_timeout=max(1, int(timeout)))
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL at {safe_url(url)}: "
                               f"{first_line(exc)}") from None
    async with conn:
        await conn.set_read_only(True)
        await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        async with conn.transaction():
            for name, value in REPORT_SETTINGS.items():
                await conn.execute("SELECT set_config(%s, %s, true)", (name, value))
            yield conn


async def fetch_report(url: str | None, spec: FunnelSpec, since: float, *, limit: int = 20,
                       timeout: float = 10.0, include_playground: bool = False
                       ) -> dict[str, Any]:
    """Run every section in one read-only snapshot; return the aggregated rows.

    Returns ``{"now", "sessions_table", "turns_table", "sections": {name: [row, ...]}}``;
    a section whose table does not exist yet has no rows. Nothing is written. The
    studio's playground sessions are left out unless ``include_playground``.
    """
    async with report_snapshot(url, timeout) as conn:
        row = await (await conn.execute(
            "SELECT NOW(), to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL, "
            "to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
            (sql.Identifier(spec.table).as_string(conn),
             sql.Identifier(ddl.TURNS).as_string(conn),
             sql.Identifier(ddl.CONVERSIONS).as_string(conn),
             sql.Identifier(ddl.PLAYGROUND).as_string(conn)))).fetchone()
        assert row is not None
        now, have_sessions, have_turns, have_orders, have_playground = row
        # A database from before the playground's table has no playground sessions.
        everyone = include_playground or not have_playground
        sections: dict[str, list[dict[str, Any]]] = {}
        for name, (query, params, turns) in section_queries(
                spec, since, limit=limit, include_playground=everyone).items():
            if not (have_turns if turns else have_sessions) or (
                    name in CONVERSION_SECTIONS and not have_orders):
                sections[name] = []
                continue
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(query, params)
            sections[name] = await cur.fetchall()
    return {"now": now, "sessions_table": bool(have_sessions), "turns_table": bool(have_turns),
            "sections": sections}


__all__ = ["CONVERSION_SECTIONS", "REPORT_SETTINGS", "SECTIONS", "fetch_report",
           "furthest_main_stage", "inline_queries", "report_snapshot", "section_queries"]
