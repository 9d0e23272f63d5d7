"""Reading every turn record of a funnel in a period, for `funnel report --coverage`:
what each turn did (stages, exits as explained, actions, fallback), never its messages."""

from __future__ import annotations

from typing import Any

from psycopg import sql
from psycopg.rows import dict_row

from . import ddl
from .analytics_sql import report_snapshot
from .playground import real_session
from .turns import with_exits

_COLUMNS = ("session_id", "stage_before", "stage_after", "transitions", "actions", "refused",
            "fallback", "explain")


async def scan_turns(url: str | None, funnel: str, since: float, *,
                     include_playground: bool = False, timeout: float = 60.0
                     ) -> list[dict[str, Any]]:
    """The turn records of ``funnel`` made in the last ``since`` seconds, oldest first,
    explanations expanded; the studio's playground sessions left out unless
    ``include_playground``. Read in one read-only snapshot; no table yet: no records."""
    async with report_snapshot(url, timeout) as conn:
        row = await (await conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
            (sql.Identifier(ddl.TURNS).as_string(conn),
             sql.Identifier(ddl.PLAYGROUND).as_string(conn)))).fetchone()
        if row is None or not row[0]:
            return []
        real = sql.SQL("TRUE") if include_playground or not row[1] else real_session(
            sql.Placeholder("funnel"), sql.SQL("t.session_id"))
        query = sql.SQL("SELECT {cols} FROM {t} t WHERE t.funnel = %(funnel)s AND "
                        "t.created_at > NOW() - make_interval(secs => %(since)s) AND {real} "
                        "ORDER BY t.id").format(
            cols=sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(c)) for c in _COLUMNS),
            t=sql.Identifier(ddl.TURNS), real=real)
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(query, {"funnel": funnel, "since": since})
        return await with_exits(cur, await cur.fetchall())
