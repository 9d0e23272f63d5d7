"""Retention: `funnel purge` deletes or anonymizes what idle sessions left behind.

Sessions are picked by their row's ``last_message_at``, ``batch`` per
transaction (``FOR UPDATE SKIP LOCKED``, so it runs beside live traffic).
Then the messages of sessions that never saved a turn (a turn that failed
before its save, a process that died mid-turn) are purged by their own
times: no state row says when those sessions went idle, and the customer's
words must not outlive the retention period because of it.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from ..format.spec import FunnelSpec
from . import ddl, idempotency
from .session import Connect
from .statements import default_literal

ANONYMIZED = "[anonymized]"


async def purge(connect: Connect, funnel: FunnelSpec, older_than: float, *,
                anonymize: bool = False, batch: int = 1000) -> dict[str, int]:
    """Delete (or anonymize) sessions idle for more than ``older_than`` seconds, with
    their messages, turn records, outbox rows and delivery keys; return what was done,
    counted."""
    counts = {"sessions": 0, "messages": 0, "turns": 0}
    while True:
        async with connect() as conn, conn.transaction():
            done = await (_anonymize_sessions if anonymize else _delete_sessions)(
                conn, funnel, older_than, batch, counts)
        if not done:
            break
        counts["sessions"] += done
    while True:
        async with connect() as conn, conn.transaction():
            done = await _orphan_messages(conn, funnel, older_than, batch, anonymize)
        if not done:
            break
        counts["messages"] += done
    async with connect() as conn:  # delivery keys expire with the retention period
        await idempotency.expire(conn, funnel.name, older_than)
    return counts


def _pick(funnel: FunnelSpec, extra: sql.Composable | None = None) -> sql.Composed:
    return sql.SQL(
        "SELECT session_id FROM {t} WHERE last_message_at < NOW() - %s * INTERVAL '1 s' "
        "{extra} ORDER BY session_id LIMIT %s FOR UPDATE SKIP LOCKED"
    ).format(t=sql.Identifier(funnel.table), extra=extra or sql.SQL(""))


async def _delete_sessions(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                           older_than: float, batch: int, counts: dict[str, int]) -> int:
    ids = [r[0] for r in await (await conn.execute(_pick(funnel), (older_than, batch))
                                ).fetchall()]
    if not ids:
        return 0
    for table, key in ((ddl.MESSAGES, "messages"), (ddl.TURNS, "turns"), (ddl.OUTBOX, None),
                       (ddl.INBOUND, None), (ddl.CONTROL, None), (ddl.CONTROL_EVENTS, None)):
        cur = await conn.execute(sql.SQL(
            "DELETE FROM {} WHERE funnel = %s AND session_id = ANY(%s)").format(
                sql.Identifier(table)), (funnel.name, ids))
        if key:
            counts[key] += cur.rowcount
    await conn.execute(sql.SQL("DELETE FROM {} WHERE session_id = ANY(%s)")
                       .format(sql.Identifier(funnel.table)), (ids,))
    await _free_leases(conn, funnel, ids)
    return len(ids)


async def _free_leases(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                       ids: list[str]) -> None:
    # Only a session's free lease row is left once it is purged.
    await conn.execute(
        sql.SQL("DELETE FROM {} WHERE lock_key = ANY(%s) AND holder = ''")
        .format(sql.Identifier(ddl.LEASES)), ([f"{funnel.name}/{i}" for i in ids],))


async def _anonymize_sessions(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                              older_than: float, batch: int, counts: dict[str, int]) -> int:
    extra = sql.SQL("AND NOT (notices @> '[\"anonymized\"]')")
    ids = [r[0] for r in await (await conn.execute(_pick(funnel, extra), (older_than, batch))
                                ).fetchall()]
    if not ids:
        return 0
    personal = [f for f in funnel.state.values() if f.personal]
    sets: list[sql.Composable] = [
        sql.SQL("{} = {}").format(sql.Identifier(f.name), default_literal(f)) for f in personal]
    # The rolling summary retells the messages whose text is cleared below.
    summary = funnel.state.get(funnel.memory.summary or "")
    if summary is not None and not summary.personal:
        sets.append(sql.SQL("{} = {}").format(sql.Identifier(summary.name),
                                              default_literal(summary)))
    sets.append(sql.SQL("notices = '[\"anonymized\"]'::jsonb"))
    await conn.execute(sql.SQL("UPDATE {} SET {} WHERE session_id = ANY(%s)").format(
        sql.Identifier(funnel.table), sql.SQL(", ").join(sets)), (ids,))
    # Outbox payloads (the handoff alert) carry a copy of the state.
    payload: sql.Composable = sql.SQL("payload")
    for f in personal:
        payload = sql.SQL("({} #- ARRAY['state', {}]) - {}").format(
            payload, sql.Literal(f.name), sql.Literal(f.name))
    if personal:
        await conn.execute(sql.SQL(
            "UPDATE {} SET payload = {} WHERE funnel = %s AND session_id = ANY(%s)").format(
                sql.Identifier(ddl.OUTBOX), payload), (funnel.name, ids))
    cur = await conn.execute(sql.SQL(
        "UPDATE {} SET content = %s WHERE funnel = %s AND session_id = ANY(%s)").format(
            sql.Identifier(ddl.MESSAGES)), (ANONYMIZED, funnel.name, ids))
    counts["messages"] += cur.rowcount
    # Delivery keys keep the answer they replay.
    await conn.execute(sql.SQL("DELETE FROM {} WHERE funnel = %s AND session_id = ANY(%s)")
                       .format(sql.Identifier(ddl.INBOUND)), (funnel.name, ids))
    # A turn's error and raw output may quote the model's output, and so the customer;
    # its explanation, the values of the fields its conditions read.
    await conn.execute(sql.SQL(
        "UPDATE {} SET error = CASE WHEN error IS NULL THEN NULL ELSE %s END, "
        "explain = NULL, raw_output = NULL WHERE funnel = %s AND session_id = ANY(%s)"
    ).format(sql.Identifier(ddl.TURNS)), (ANONYMIZED, funnel.name, ids))
    return len(ids)


async def _orphan_messages(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                           older_than: float, batch: int, anonymize: bool) -> int:
    """One batch of messages of sessions with no state row, whose last message is older
    than ``older_than`` seconds: deleted, or their text anonymized."""
    orphans = sql.SQL(
        "SELECT m.session_id FROM {m} m WHERE m.funnel = %(f)s AND NOT EXISTS "
        "(SELECT 1 FROM {t} s WHERE s.session_id = m.session_id) GROUP BY m.session_id "
        "HAVING max(m.created_at) < NOW() - %(s)s * INTERVAL '1 s' {left} LIMIT %(n)s"
    ).format(m=sql.Identifier(ddl.MESSAGES), t=sql.Identifier(funnel.table),
             left=sql.SQL("AND bool_or(m.content <> %(a)s)") if anonymize else sql.SQL(""))
    if anonymize:
        change = sql.SQL("UPDATE {m} SET content = %(a)s WHERE funnel = %(f)s AND "
                         "content <> %(a)s AND session_id IN ({orphans}) RETURNING session_id")
    else:
        change = sql.SQL("DELETE FROM {m} WHERE funnel = %(f)s AND session_id IN ({orphans}) "
                         "RETURNING session_id")
    rows = await (await conn.execute(
        change.format(m=sql.Identifier(ddl.MESSAGES), orphans=orphans),
        {"f": funnel.name, "s": older_than, "n": batch, "a": ANONYMIZED})).fetchall()
    if rows and not anonymize:
        await _free_leases(conn, funnel, sorted({r[0] for r in rows}))
    return len(rows)


async def preview(connect: Connect, funnel: FunnelSpec, older_than: float, *,
                  anonymize: bool = False) -> dict[str, int] | None:
    """What :func:`purge` would touch now, counted; ``None`` when the funnel has no table yet.

    Sessions idle for more than ``older_than`` seconds, their messages and turn
    records, and the messages of sessions that never saved a turn.
    """
    async with connect() as conn:
        exists = await (await conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                           (funnel.table,))).fetchone()
        if not exists or not exists[0]:
            return None
        done = sql.SQL("AND NOT (notices @> '[\"anonymized\"]')" if anonymize else "")
        idle = sql.SQL("SELECT session_id FROM {t} WHERE last_message_at < NOW() - "
                       "%(s)s * INTERVAL '1 s' {done}").format(t=sql.Identifier(funnel.table),
                                                             done=done)
        row = await (await conn.execute(sql.SQL(
            "SELECT (SELECT count(*) FROM ({idle}) i), "
            "(SELECT count(*) FROM {m} WHERE funnel = %(f)s AND session_id IN ({idle})), "
            "(SELECT count(*) FROM {tr} WHERE funnel = %(f)s AND session_id IN ({idle})), "
            "(SELECT count(*) FROM {m} m WHERE m.funnel = %(f)s AND NOT EXISTS (SELECT 1 FROM "
            "{t} s WHERE s.session_id = m.session_id) {left} AND m.session_id IN (SELECT session_id "
            "FROM {m} WHERE funnel = %(f)s GROUP BY session_id HAVING max(created_at) < NOW() - "
            "%(s)s * INTERVAL '1 s'))"
        ).format(idle=idle, m=sql.Identifier(ddl.MESSAGES), tr=sql.Identifier(ddl.TURNS),
                 t=sql.Identifier(funnel.table),
                 left=sql.SQL("AND m.content <> %(a)s" if anonymize else "")),
            {"s": older_than, "f": funnel.name, "a": ANONYMIZED})
        ).fetchone()
    assert row is not None
    return {"sessions": row[0], "messages": row[1] + row[3], "turns": row[2]}
