"""`funnel report`'s follow-up section, on the database: per stage, the follow-ups sent
in the period, and of them how many customers wrote back and how many went on to
another stage within the window after it (docs/follow-ups.md). Playground sessions
are left out (they never get follow-ups, but a branch copies turn records)."""

from __future__ import annotations

from typing import Any

from psycopg import sql
from psycopg.rows import dict_row

from ..format.spec import FunnelSpec
from . import ddl
from .analytics_sql import report_snapshot
from .playground import real_session

__all__ = ["WINDOW_SECONDS", "fetch_follow_ups"]

# How long after a follow-up a reply or a move counts as its effect.
WINDOW_SECONDS = 72 * 3600

_QUERY = sql.SQL(
    "WITH f AS (SELECT t.id, t.session_id, t.stage_after AS stage, t.created_at AS at "
    "FROM {t} t WHERE t.funnel = %(f)s AND t.follow_up IS NOT NULL "
    "AND t.created_at >= NOW() - %(since)s * INTERVAL '1 s' AND {real}) "
    "SELECT f.stage, COUNT(*) AS sent, "
    "COUNT(*) FILTER (WHERE EXISTS (SELECT 1 FROM {t} n WHERE n.funnel = %(f)s "
    " AND n.session_id = f.session_id AND n.id > f.id AND n.follow_up IS NULL "
    " AND n.created_at <= f.at + %(w)s * INTERVAL '1 s')) AS replied, "
    "COUNT(*) FILTER (WHERE EXISTS (SELECT 1 FROM {t} n WHERE n.funnel = %(f)s "
    " AND n.session_id = f.session_id AND n.id > f.id AND n.follow_up IS NULL "
    " AND n.stage_after <> f.stage AND n.created_at <= f.at + %(w)s * INTERVAL '1 s')) "
    " AS moved_on "
    "FROM f GROUP BY f.stage ORDER BY f.stage"
).format(t=sql.Identifier(ddl.TURNS),
         real=real_session(sql.SQL("t.funnel"), sql.SQL("t.session_id")))


async def fetch_follow_ups(url: str | None, spec: FunnelSpec, since: float, *,
                           window: float = WINDOW_SECONDS, timeout: float = 10.0
                           ) -> list[dict[str, Any]]:
    """Per stage: ``sent``, ``replied`` and ``moved_on`` (within ``window`` seconds)."""
    async with report_snapshot(url, timeout) as conn:
        found = await (await conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL",
            (sql.Identifier(ddl.FOLLOW_UPS).as_string(conn),
             sql.Identifier(ddl.PLAYGROUND).as_string(conn)))).fetchone()
        if not found or not found[0]:
            return []
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(_QUERY, {"f": spec.name, "since": since, "w": window})
        return await cur.fetchall()
