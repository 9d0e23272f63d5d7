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
from .anonymize import ANONYMIZED, anonymize_sessions, forget_embeddings
from .erasure import KEPT_BY_PURGE, SESSION_TABLES, branches_of
from .session import Connect

__all__ = ["ANONYMIZED", "anonymize_sessions", "delete_sessions", "give_back", "preview",
           "purge", "purge_trials", "take_leases"]


async def purge(connect: Connect, funnel: FunnelSpec, older_than: float, *,
                anonymize: bool = False, batch: int = 1000) -> dict[str, int]:
    """Delete (or anonymize) sessions idle for more than ``older_than`` seconds, with
    their messages, turn records, outbox rows and delivery keys; return what was done,
    counted.

    A session whose turn is in flight is not idle: it is left alone (and not counted).
    Each batch holds its sessions' leases until it commits, so a turn that arrives
    meanwhile waits and then reads what the purge left (docs/persistence.md).
    """
    counts = {"sessions": 0, "messages": 0, "turns": 0}
    skipped: list[str] = []  # taken by a turn between the pick and the lease
    act = anonymize_sessions if anonymize else delete_sessions
    while True:
        async with connect() as conn, conn.transaction():
            ids = await _pick(conn, funnel, older_than, batch, anonymize, skipped)
            if not ids:
                break
            held = await take_leases(conn, funnel, ids)
            skipped += [i for i in ids if i not in held]
            # Still idle once leased (a turn may have saved in between), and locked.
            locked = await _lock(conn, funnel, older_than, held)
            skipped += [i for i in held if i not in locked]
            if locked:
                # The studio's branches of these sessions replay their customers'
                # messages: deleted, whether the sessions are deleted or anonymized.
                copies = await branches_of(conn, funnel, locked)
                if copies:
                    await delete_sessions(conn, funnel, copies, {"messages": 0, "turns": 0})
                rest = [i for i in locked if i not in copies]
                if rest:
                    counts["sessions"] += await act(conn, funnel, rest, counts)
            await give_back(conn, funnel, held)
    while True:
        async with connect() as conn, conn.transaction():
            done, picked = await _orphan_messages(conn, funnel, older_than, batch,
                                                  anonymize, skipped)
        counts["messages"] += done
        if not picked:
            break
    async with connect() as conn:  # delivery keys expire with the retention period
        await idempotency.expire(conn, funnel.name, older_than)
        trials = await purge_trials(conn, funnel, older_than)
    if trials:
        counts["trials"] = trials
    return counts


async def purge_trials(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                       older_than: float) -> int:
    """Delete the funnel's trials (docs/versions.md: copies stored by the studio, `funnel
    chat`, ... for replay) last tried more than ``older_than`` seconds ago that no turn
    record names any more; how many. A deployed copy is never deleted here."""
    exists = await (await conn.execute(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = %s AND column_name = 'trial'", (ddl.VERSIONS,))).fetchone()
    if exists is None:
        return 0
    cur = await conn.execute(sql.SQL(
        "DELETE FROM {v} v WHERE v.funnel = %(f)s AND v.trial AND v.deployed_at < NOW() - "
        "%(s)s * INTERVAL '1 s' AND NOT EXISTS (SELECT 1 FROM {t} t WHERE t.funnel = "
        "v.funnel AND t.funnel_hash = v.hash)").format(
            v=sql.Identifier(ddl.VERSIONS), t=sql.Identifier(ddl.TURNS)),
        {"f": funnel.name, "s": older_than})
    return cur.rowcount


# Who holds a session's lease while a purge works on it (inside the purge's
# transaction only: it commits with the lease given back, or the session deleted).
PURGE_HOLDER = "retention purge"
_IN_FLIGHT = sql.SQL(
    "EXISTS (SELECT 1 FROM {l} l WHERE l.lock_key = %(f)s || '/' || {sid} "
    "AND l.holder <> '' AND l.expires_at > NOW())")


async def _pick(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec, older_than: float,
                batch: int, anonymize: bool, skipped: list[str]) -> list[str]:
    """The next batch of idle sessions, leaving out those a turn holds now."""
    done = sql.SQL("AND NOT (notices @> '[\"anonymized\"]')" if anonymize else "")
    query = sql.SQL(
        "SELECT session_id FROM {t} s WHERE last_message_at < NOW() - %(s)s * INTERVAL '1 s' "
        "{done} AND session_id <> ALL(%(skip)s) AND NOT {flight} ORDER BY session_id "
        "LIMIT %(n)s"
    ).format(t=sql.Identifier(funnel.table), done=done,
             flight=_IN_FLIGHT.format(l=sql.Identifier(ddl.LEASES),
                                      sid=sql.SQL("s.session_id")))
    rows = await (await conn.execute(query, {"s": older_than, "skip": skipped, "n": batch,
                                             "f": funnel.name})).fetchall()
    return [r[0] for r in rows]


async def take_leases(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                      ids: list[str]) -> list[str]:
    """Take the leases of the sessions ``ids`` that no turn holds, inside the caller's
    transaction; the sessions taken. A turn that asks for one meanwhile waits on the
    lease's row until the transaction ends."""
    rows = await (await conn.execute(sql.SQL(
        "INSERT INTO {l} AS l (lock_key, holder, expires_at) "
        "SELECT %(f)s || '/' || s, %(h)s, NOW() + INTERVAL '1 hour' FROM unnest(%(ids)s::text[]) s "
        "ON CONFLICT (lock_key) DO UPDATE SET holder = EXCLUDED.holder, "
        "expires_at = EXCLUDED.expires_at WHERE l.holder = '' OR l.expires_at < NOW() "
        "RETURNING lock_key").format(l=sql.Identifier(ddl.LEASES)),
        {"f": funnel.name, "h": PURGE_HOLDER, "ids": ids})).fetchall()
    prefix = len(funnel.name) + 1
    taken = {r[0][prefix:] for r in rows}
    return [i for i in ids if i in taken]


async def give_back(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                    ids: list[str]) -> None:
    """Free the leases :func:`take_leases` took (a deleted session's row goes)."""
    await conn.execute(sql.SQL(
        "UPDATE {} SET holder = '', expires_at = '-infinity' WHERE lock_key = ANY(%s) "
        "AND holder = %s").format(sql.Identifier(ddl.LEASES)),
        ([f"{funnel.name}/{i}" for i in ids], PURGE_HOLDER))


async def _lock(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec, older_than: float,
                ids: list[str]) -> list[str]:
    if not ids:
        return []
    rows = await (await conn.execute(sql.SQL(
        "SELECT session_id FROM {} WHERE session_id = ANY(%s) AND last_message_at < NOW() - "
        "%s * INTERVAL '1 s' ORDER BY session_id FOR UPDATE SKIP LOCKED").format(
            sql.Identifier(funnel.table)), (ids, older_than))).fetchall()
    return [r[0] for r in rows]


async def delete_sessions(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                          ids: list[str], counts: dict[str, int]) -> int:
    """Delete the sessions ``ids`` (leased and locked by the caller) with every row
    they left; how many."""
    # The tables an erasure deletes from (engine.store.erasure), less the orders.
    counted = {ddl.MESSAGES: "messages", ddl.TURNS: "turns"}
    for table in SESSION_TABLES:
        if table in KEPT_BY_PURGE:
            continue
        cur = await conn.execute(sql.SQL(
            "DELETE FROM {} WHERE funnel = %s AND session_id = ANY(%s)").format(
                sql.Identifier(table)), (funnel.name, ids))
        if table in counted:
            counts[counted[table]] += cur.rowcount
    await conn.execute(sql.SQL("DELETE FROM {} WHERE session_id = ANY(%s)")
                       .format(sql.Identifier(funnel.table)), (ids,))
    await _free_leases(conn, funnel, ids)
    return len(ids)


async def _free_leases(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                       ids: list[str]) -> None:
    # Only a purged session's free lease row (or the purge's own) is left once it is purged.
    await conn.execute(
        sql.SQL("DELETE FROM {} WHERE lock_key = ANY(%s) AND holder IN ('', %s)")
        .format(sql.Identifier(ddl.LEASES)), ([f"{funnel.name}/{i}" for i in ids],
                                              PURGE_HOLDER))


async def _orphan_messages(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                           older_than: float, batch: int, anonymize: bool,
                           skipped: list[str]) -> tuple[int, bool]:
    """One batch of messages of sessions with no state row, whose last message is older
    than ``older_than`` seconds: deleted, or their text anonymized; sessions a turn
    holds (a first turn in flight) are left alone, as in :func:`purge`. (Messages
    changed, whether the batch picked any session.)"""
    orphans = sql.SQL(
        "SELECT m.session_id FROM {m} m WHERE m.funnel = %(f)s AND NOT EXISTS "
        "(SELECT 1 FROM {t} s WHERE s.session_id = m.session_id) AND m.session_id <> "
        "ALL(%(skip)s) AND NOT {flight} GROUP BY m.session_id "
        "HAVING max(m.created_at) < NOW() - %(s)s * INTERVAL '1 s' {left} LIMIT %(n)s"
    ).format(m=sql.Identifier(ddl.MESSAGES), t=sql.Identifier(funnel.table),
             flight=_IN_FLIGHT.format(l=sql.Identifier(ddl.LEASES),
                                      sid=sql.SQL("m.session_id")),
             left=sql.SQL("AND bool_or(m.content <> %(a)s)") if anonymize else sql.SQL(""))
    params = {"f": funnel.name, "s": older_than, "n": batch, "a": ANONYMIZED,
              "skip": skipped}
    ids = [r[0] for r in await (await conn.execute(orphans, params)).fetchall()]
    if not ids:
        return 0, False
    held = await take_leases(conn, funnel, ids)
    skipped += [i for i in ids if i not in held]
    if anonymize:
        change = sql.SQL("UPDATE {m} SET content = %(a)s WHERE funnel = %(f)s AND "
                         "content <> %(a)s AND session_id = ANY(%(ids)s) RETURNING session_id")
    else:
        change = sql.SQL("DELETE FROM {m} WHERE funnel = %(f)s AND session_id = ANY(%(ids)s) "
                         "RETURNING session_id")
    rows = await (await conn.execute(change.format(m=sql.Identifier(ddl.MESSAGES)),
                                     {**params, "ids": held})).fetchall()
    if anonymize:
        await forget_embeddings(conn, funnel, held)
        await give_back(conn, funnel, held)
    else:
        await _free_leases(conn, funnel, held)
    return len(rows), True


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
