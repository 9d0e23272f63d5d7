"""Reading a session's turn records back: what `funnel state --explain` and `funnel record` show."""

from __future__ import annotations

from typing import Any

from psycopg import sql
from psycopg.rows import dict_row

from ..records.explanation import expand
from . import ddl
from .session import Connect

# A turn record's customer message and reply, read beside the record ``t``: the last
# ``user`` and ``assistant`` messages logged before it (the studio's transcript too).
TURN_MESSAGES = sql.SQL(
    "(SELECT m.content FROM {m} m WHERE m.funnel = t.funnel AND m.session_id = t.session_id "
    " AND m.role = 'user' AND m.created_at <= t.created_at ORDER BY m.id DESC LIMIT 1) "
    " AS customer, "
    "(SELECT m.content FROM {m} m WHERE m.funnel = t.funnel AND m.session_id = t.session_id "
    " AND m.role = 'assistant' AND m.created_at <= t.created_at ORDER BY m.id DESC LIMIT 1) "
    " AS reply").format(m=sql.Identifier(ddl.MESSAGES))

_COLUMNS = ("id", "stage_before", "stage_after", "transitions", "actions", "refused",
            "fallback", "error", "explain", "raw_output", "claims", "created_at")


async def turn_records(connect: Connect, funnel: str, session_id: str, limit: int = 1000
                       ) -> list[dict[str, Any]]:
    """A session's last ``limit`` turn records, oldest first, each with the messages of its turn.

    A turn's customer message is the last ``user`` message logged before its
    record; its reply, the first ``assistant`` message after that.
    """
    q = sql.SQL(
        "SELECT {cols}, "
        "{turn_messages} "
        "FROM (SELECT * FROM {t} WHERE funnel = %s AND session_id = %s "
        # A follow-up's record (engine.turn.follow_up) answers no customer message: not
        # a turn `funnel record` or `state --explain` reads (through the row: an older
        # database without the column reads the same).
        "AND (to_jsonb({t}) ->> 'follow_up') IS NULL ORDER BY id DESC "
        "LIMIT %s) t ORDER BY t.id"
    ).format(cols=sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(c))
                                     for c in _COLUMNS),
             turn_messages=TURN_MESSAGES, t=sql.Identifier(ddl.TURNS))
    async with connect() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(q, (funnel, session_id, limit))
        return await with_exits(cur, await cur.fetchall())


async def with_exits(cur: Any, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` with their explanations whole: they cite their exit lists by digest
    (engine.turn.explain.compact), read here in one query on ``cur`` (a dict-row cursor)."""
    cited = {step["exits"] for r in records for step in r["explain"] or ()
             if isinstance(step, dict) and "exits" in step}
    exits: dict[str, Any] = {}
    if cited:
        await cur.execute(sql.SQL("SELECT digest, exits FROM {} WHERE digest = ANY(%s)")
                          .format(sql.Identifier(ddl.EXITS)), (sorted(cited),))
        exits = {r["digest"]: r["exits"] for r in await cur.fetchall()}
    for r in records:
        r["explain"] = expand(r["explain"], exits)
    return records
