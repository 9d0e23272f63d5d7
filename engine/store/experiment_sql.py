"""The SQL of `funnel report --by variant`: per variant of an experiment, sessions, the
stages they reached, the goal's conversions, the cart and the cost.

Three aggregating queries in one read-only snapshot; Python sees a few rows per
variant. Names go through ``psycopg.sql.Identifier``, values are parameters.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from psycopg import sql
from psycopg.rows import dict_row

from ..errors import ConfigError
from ..format.spec import FunnelSpec
from . import ddl
from .analytics_sql import report_snapshot
from .playground import real_session

GoalKind = Literal["handoff", "purchase", "cart_at_least"]


def _col(name: str) -> sql.Composed:
    return sql.SQL("t.{}").format(sql.Identifier(name))


def goal_condition(spec: FunnelSpec, kind: GoalKind, amount: float | None,
                   params: dict[str, Any]) -> sql.Composable:
    """A condition on ``t`` (a session row) that holds when the session converted.

    Raises:
        ConfigError: the funnel lacks what the goal reads (a hand-off, a cart total).
    """
    if kind == "handoff":
        h = spec.handoff
        if h is None:
            raise ConfigError(f"funnel '{spec.name}' declares no `handoff`: the goal `handoff` "
                              "cannot be measured; choose `purchase` or `cart_at_least`",
                              file=str(spec.path))
        if h.triggered_at:  # the handoff field set
            return sql.SQL("{} IS NOT NULL").format(_col(h.triggered_at))
        params["handoff_stage"] = json.dumps([{"stage": h.stage}])
        return sql.SQL("t.stage_history @> %(handoff_stage)s::jsonb")
    if kind == "cart_at_least":
        if spec.cart is None or spec.cart.total is None:
            raise ConfigError(f"funnel '{spec.name}' has no cart total field: the goal "
                              "`cart_at_least` cannot be measured", file=str(spec.path))
        params["cart_goal"] = amount
        return sql.SQL("COALESCE({}, 0) >= %(cart_goal)s::numeric").format(
            _col(spec.cart.total))
    return sql.SQL("EXISTS (SELECT 1 FROM {} c WHERE c.funnel = %(funnel)s "
                   "AND c.session_id = t.session_id)").format(sql.Identifier(ddl.CONVERSIONS))


def variant_queries(spec: FunnelSpec, kind: GoalKind, amount: float | None, since: float,
                    *, include_playground: bool = False
                    ) -> tuple[dict[str, sql.Composed], dict[str, Any]]:
    """(name -> query, the parameters they share): ``summary``, ``stages``, ``costs``; the
    studio's playground sessions left out unless ``include_playground``."""
    params: dict[str, Any] = {"funnel": spec.name, "since": float(since),
                              "stages": list(spec.stages)}
    goal = goal_condition(spec, kind, amount, params)
    t = sql.Identifier(spec.table)
    window = sql.SQL("t.variant IS NOT NULL AND t.created_at > NOW() - "
                     "make_interval(secs => %(since)s::float8) AND {}").format(
                         sql.SQL("TRUE") if include_playground else real_session(
                             sql.Placeholder("funnel"), sql.SQL("t.session_id")))
    cart = (sql.SQL("round(avg(COALESCE({}, 0)), 2)").format(_col(spec.cart.total))
            if spec.cart is not None and spec.cart.total else sql.SQL("NULL::numeric"))
    summary = sql.SQL(
        "SELECT t.variant, count(*) AS sessions, count(*) FILTER (WHERE {goal}) AS conversions, "
        "{cart} AS avg_cart FROM {t} t WHERE {window} GROUP BY t.variant"
    ).format(goal=goal, cart=cart, t=t, window=window)
    # Per session, the declared stages it reached (their positions); counted per
    # (variant, positions): a handful of groups, then spread over the stages.
    stages = sql.SQL(
        "WITH st AS (SELECT s.stage, s.pos::int AS pos FROM unnest(%(stages)s::text[]) "
        "WITH ORDINALITY AS s(stage, pos)), "
        "s AS (SELECT t.variant, r.reached, count(*) AS n FROM {t} t CROSS JOIN LATERAL "
        "(SELECT array_agg(DISTINCT array_position(%(stages)s::text[], h->>'stage')) AS reached "
        "FROM jsonb_array_elements(t.stage_history) h) r WHERE {window} GROUP BY 1, 2) "
        "SELECT s.variant, st.pos, st.stage, "
        "COALESCE(sum(s.n) FILTER (WHERE st.pos = ANY(s.reached)), 0)::bigint AS sessions "
        "FROM st CROSS JOIN s GROUP BY s.variant, st.pos, st.stage ORDER BY s.variant, st.pos"
    ).format(t=t, window=window)
    # The cost of the turns of the sessions counted above, by the session's variant.
    costs = sql.SQL(
        "SELECT t.variant, count(tr.*) AS turns, sum(tr.cost) AS cost, "
        "count(tr.*) FILTER (WHERE tr.cost IS NULL) AS turns_without_cost "
        "FROM {t} t JOIN {turns} tr ON tr.funnel = %(funnel)s AND tr.session_id = t.session_id "
        "WHERE {window} GROUP BY t.variant"
    ).format(t=t, turns=sql.Identifier(ddl.TURNS), window=window)
    return {"summary": summary, "stages": stages, "costs": costs}, params


async def fetch_variants(url: str | None, spec: FunnelSpec, kind: GoalKind,
                         amount: float | None, since: float, *, timeout: float = 10.0,
                         include_playground: bool = False) -> dict[str, Any]:
    """Run the queries in one read-only snapshot: ``{"now", "table", name: [row, ...]}``
    (the studio's playground sessions left out unless ``include_playground``).

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    variant_queries(spec, kind, amount, since)  # a goal the funnel cannot measure: say so first
    async with report_snapshot(url, timeout) as conn:
        row = await (await conn.execute(
            "SELECT NOW(), to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL, "
            "EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = "
            "current_schema() AND table_name = %s AND column_name = 'variant'), "
            "to_regclass(%s) IS NOT NULL",
            (sql.Identifier(spec.table).as_string(conn),
             sql.Identifier(ddl.TURNS).as_string(conn), spec.table,
             sql.Identifier(ddl.PLAYGROUND).as_string(conn)))).fetchone()
        assert row is not None
        now, have_table, have_turns, have_variant, have_playground = row
        # A database from before the playground's table has no playground sessions.
        queries, params = variant_queries(spec, kind, amount, since, include_playground=(
            include_playground or not have_playground))
        out: dict[str, Any] = {name: [] for name in queries}
        out["now"] = now
        out["table"] = bool(have_table and have_variant)
        if out["table"]:
            for name, query in queries.items():
                if name == "costs" and not have_turns:
                    continue
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(query, params)
                out[name] = await cur.fetchall()
    return out
