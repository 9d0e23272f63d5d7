"""One customer's data on request: `funnel forget` erases every copy, `funnel export` reads it.

A data subject's requests (GDPR articles 15 and 17, docs/persistence.md) name one
session. :data:`SESSION_TABLES` lists every shared table that keeps rows of a
session; the retention purge (engine.store.retention) deletes from the same list
(but keeps the orders, :data:`KEPT_BY_PURGE`), so the two cannot disagree, and a
test checks that every table with a ``session_id`` column is on it. An erasure takes
the studio's branches of the session too (``funnel_playground``'s ``branched_from``,
engine.store.playground), which replay the customer's messages.

:func:`erase` takes the session's lease the way the purge does, but waits for it: a
turn in flight (or queued) finishes first, then the session goes in one
transaction (a turn that arrives meanwhile waits on the lease's row, and then
starts a new, empty session). A turn that lost its lease cannot bring the row back:
its save only updates a row it loaded (engine.store.statements). The receipt counts
the rows removed per table; the request itself is logged in ``funnel_control_events``
under the empty session id with who asked, when and the counts: nothing of the
customer.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from ..errors import SessionBusy, UnknownSession
from ..format.spec import FunnelSpec
from . import ddl
from .session import Connect

__all__ = ["ERASE_HOLDER", "KEPT_BY_PURGE", "SESSION_TABLES", "erase", "export"]

# Every shared table holding a session's rows, by (funnel, session_id), in the order
# an erasure deletes them (embeddings before the messages they copy).
SESSION_TABLES: tuple[str, ...] = (
    ddl.EMBEDDINGS, ddl.MESSAGES, ddl.TURNS, ddl.OUTBOX, ddl.INBOUND, ddl.CONTROL,
    ddl.CONTROL_EVENTS, ddl.CONVERSIONS, ddl.UNREACHABLE, ddl.PLAYGROUND, ddl.FOLLOW_UPS)
# What the retention purge leaves of a deleted session: its orders, which `funnel report`
# counts and which hold nothing the funnel declares personal. An erasure takes them too.
KEPT_BY_PURGE: tuple[str, ...] = (ddl.CONVERSIONS,)

ERASE_HOLDER = "erasure"
# The session id of the requests' own log lines: the customer's id is not kept.
AUDIT_SESSION = ""
_POLL = 0.05


async def erase(connect: Connect, funnel: FunnelSpec, session_id: str, *, by: str,
                wait: float = 60.0) -> dict[str, Any]:
    """Delete every row the engine keeps of ``session_id``; the receipt.

    The receipt: ``funnel``, ``session_id``, ``receipt`` (an id the audit event carries
    too), ``erased_at``, ``tables`` (each table: rows deleted, zeros included) and
    ``total``. ``by`` names who asked (``key#2``, ``cli``), for the audit event.

    Raises:
        UnknownSession: nothing of the session is stored (erased already, or never seen).
        SessionBusy: a turn held the session for ``wait`` seconds; nothing was erased.
    """
    deadline = time.monotonic() + wait
    while True:
        async with connect() as conn, conn.transaction():
            if await _take_lease(conn, funnel, session_id):
                ref = f"erase-{uuid.uuid4()}"
                try:
                    tables = await _delete(conn, funnel, session_id, by, ref)
                except psycopg.errors.UndefinedTable:
                    raise UnknownSession(f"no session {session_id!r} in funnel "
                                         f"'{funnel.name}': its table {funnel.table} does not "
                                         "exist here") from None
                total = sum(tables.values())
                if total == 0:
                    raise UnknownSession(
                        f"no session {session_id!r} in funnel '{funnel.name}': nothing of it "
                        "is stored (erased already, or never seen); check the id")
                return {"funnel": funnel.name, "session_id": session_id, "receipt": ref,
                        "erased_at": datetime.now(UTC).isoformat(), "tables": tables,
                        "total": total}
        if time.monotonic() >= deadline:
            raise SessionBusy(f"session {session_id!r} of funnel '{funnel.name}' has been in "
                              f"a turn for {wait:g} s; nothing was erased: ask again when its "
                              "conversation pauses")
        await asyncio.sleep(_POLL)


async def _table_exists(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec) -> bool:
    row = await (await conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                    (funnel.table,))).fetchone()
    return bool(row and row[0])


async def _take_lease(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                      session_id: str) -> bool:
    """The session's lease, held until the transaction ends, when no turn runs or waits
    for it (a queued turn's message was logged: it must be answered before the erasure,
    or its reply would start a session with no message of the customer's)."""
    row = await (await conn.execute(sql.SQL(
        "INSERT INTO {} AS l (lock_key, holder, expires_at) VALUES (%s, %s, NOW() + "
        "INTERVAL '1 hour') ON CONFLICT (lock_key) DO UPDATE SET holder = EXCLUDED.holder, "
        "expires_at = EXCLUDED.expires_at, next_holder = NULL, next_at = NULL "
        "WHERE (l.holder = '' OR l.expires_at < NOW()) AND (l.next_holder IS NULL "
        "OR l.next_at < NOW() - INTERVAL '1 second') RETURNING 1").format(
            sql.Identifier(ddl.LEASES)),
        (f"{funnel.name}/{session_id}", ERASE_HOLDER))).fetchone()
    return row is not None


async def _delete(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec, session_id: str,
                  by: str, ref: str) -> dict[str, int]:
    """One statement (one round trip): every table's rows of the session and of the
    studio's branches of it, the lease given back (its row deleted), and the audit event
    when anything was there; rows by table."""
    tables = [funnel.table, *SESSION_TABLES]
    ids = await _with_branches(conn, funnel, session_id)
    deletes = [sql.SQL("d0 AS (DELETE FROM {} WHERE session_id = ANY(%(ids)s) RETURNING 1)"
                       ).format(sql.Identifier(funnel.table))]
    deletes += [sql.SQL("{} AS (DELETE FROM {} WHERE funnel = %(f)s AND session_id = "
                        "ANY(%(ids)s) RETURNING 1)").format(sql.Identifier(f"d{i}"),
                                                            sql.Identifier(t))
                for i, t in enumerate(SESSION_TABLES, start=1)]
    counted = sql.SQL(", ").join(
        sql.SQL("(SELECT count(*) FROM {}) AS {}").format(sql.Identifier(f"d{i}"),
                                                          sql.Identifier(f"n{i}"))
        for i in range(len(tables)))
    rows = sql.SQL(", ").join(sql.SQL("{}, c.{}").format(sql.Literal(t), sql.Identifier(f"n{i}"))
                              for i, t in enumerate(tables))
    total = sql.SQL(" + ").join(sql.SQL("c.{}").format(sql.Identifier(f"n{i}"))
                                for i in range(len(tables)))
    row = await (await conn.execute(sql.SQL(
        "WITH {deletes}, c AS (SELECT {counted}), "
        "l AS (DELETE FROM {leases} WHERE lock_key = %(k)s AND holder = %(h)s), "
        "a AS (INSERT INTO {events} (funnel, session_id, event, detail) SELECT %(f)s, %(audit)s, "
        "'erased', jsonb_build_object('by', %(by)s::text, 'receipt', %(r)s::text, 'rows', "
        "jsonb_build_object({rows})) FROM c WHERE {total} > 0) SELECT * FROM c").format(
            deletes=sql.SQL(", ").join(deletes), counted=counted, rows=rows, total=total,
            leases=sql.Identifier(ddl.LEASES), events=sql.Identifier(ddl.CONTROL_EVENTS)),
        {"ids": ids, "f": funnel.name, "k": f"{funnel.name}/{session_id}",
         "h": ERASE_HOLDER, "audit": AUDIT_SESSION, "by": by, "r": ref})).fetchone()
    assert row is not None
    return dict(zip(tables, (int(n) for n in row), strict=True))


async def branches_of(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                      ids: list[str]) -> list[str]:
    """The studio's branches of the sessions ``ids``, and theirs (one of ``ids`` too, when
    it is a branch of another): what a purge of ``ids`` deletes, whether it deletes or
    anonymizes them (a branch is a copy of their messages)."""
    exists = await (await conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                       (ddl.PLAYGROUND,))).fetchone()
    if not ids or not (exists and exists[0]):
        return []
    row = await (await conn.execute(sql.SQL(
        "WITH RECURSIVE b(session_id) AS (SELECT p.session_id FROM {p} p WHERE p.funnel = "
        "%(f)s AND p.branched_from = ANY(%(s)s) UNION SELECT p.session_id FROM {p} p JOIN b "
        "ON p.branched_from = b.session_id WHERE p.funnel = %(f)s) "
        "SELECT array_agg(session_id) FROM b").format(
            p=sql.Identifier(ddl.PLAYGROUND)), {"s": ids, "f": funnel.name})).fetchone()
    return list(row[0]) if row and row[0] else []


async def _with_branches(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                         session_id: str) -> list[str]:
    """``session_id`` and the studio's branches of it, and theirs (engine.store.playground):
    a branch replays the customer's messages, so it is a copy of them."""
    exists = await (await conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                       (ddl.PLAYGROUND,))).fetchone()
    if not (exists and exists[0]):
        return [session_id]
    row = await (await conn.execute(sql.SQL(
        "WITH RECURSIVE b(session_id) AS (SELECT %(s)s::text UNION SELECT p.session_id "
        "FROM {} p JOIN b ON p.branched_from = b.session_id WHERE p.funnel = %(f)s) "
        "SELECT array_agg(session_id) FROM b").format(sql.Identifier(ddl.PLAYGROUND)),
        {"s": session_id, "f": funnel.name})).fetchone()
    return list(row[0]) if row and row[0] else [session_id]


async def _audit(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec, event: str, by: str,
                 receipt: str, counts: dict[str, int]) -> None:
    await conn.execute(sql.SQL(
        "INSERT INTO {} (funnel, session_id, event, manager, detail) VALUES (%s, %s, %s, "
        "NULL, %s)").format(sql.Identifier(ddl.CONTROL_EVENTS)),
        (funnel.name, AUDIT_SESSION, event, Jsonb({"by": by, "receipt": receipt,
                                                   "rows": counts})))


# What an export reads of each table, oldest first; embeddings are listed, not copied
# (a vector is the message's text in another form: the export has the text).
_EXPORTED: tuple[tuple[str, str, str], ...] = (
    ("messages", ddl.MESSAGES, "id"),
    ("turns", ddl.TURNS, "id"),
    ("conversions", ddl.CONVERSIONS, "recorded_at"),
    ("outbox", ddl.OUTBOX, "id"),
    ("control", ddl.CONTROL, "since"),
    ("control_events", ddl.CONTROL_EVENTS, "id"),
    ("deliveries", ddl.INBOUND, "created_at"),
    ("unreachable", ddl.UNREACHABLE, "since"),
)


async def export(connect: Connect, funnel: FunnelSpec, session_id: str, *,
                 by: str) -> dict[str, Any]:
    """Everything the engine holds of ``session_id``, as one JSON-ready document: the
    state row, then each table's rows as stored (timestamps in ISO 8601), and the
    embeddings' count and models. Logged as an ``exported`` event (who, when, counts).

    Raises:
        UnknownSession: nothing of the session is stored.
    """
    async with connect() as conn, conn.transaction():
        # One snapshot: the row and every table as of the same moment.
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        if not await _table_exists(conn, funnel):
            raise UnknownSession(f"no session {session_id!r} in funnel '{funnel.name}': "
                                 f"its table {funnel.table} does not exist here")
        row = await (await conn.execute(sql.SQL(
            "SELECT to_jsonb(s) FROM {} s WHERE s.session_id = %s").format(
                sql.Identifier(funnel.table)), (session_id,))).fetchone()
        out: dict[str, Any] = {"funnel": funnel.name, "session_id": session_id,
                               "receipt": f"export-{uuid.uuid4()}",
                               "exported_at": datetime.now(UTC).isoformat(),
                               "state": row[0] if row else None}
        for name, table, order in _EXPORTED:
            found = await (await conn.execute(sql.SQL(
                "SELECT COALESCE(jsonb_agg(to_jsonb(x) ORDER BY x.{}), '[]') FROM {} x "
                "WHERE x.funnel = %s AND x.session_id = %s").format(
                    sql.Identifier(order), sql.Identifier(table)),
                (funnel.name, session_id))).fetchone()
            out[name] = found[0] if found else []
        emb = await (await conn.execute(sql.SQL(
            "SELECT count(*), COALESCE(jsonb_agg(DISTINCT model), '[]') FROM {} "
            "WHERE funnel = %s AND session_id = %s").format(sql.Identifier(ddl.EMBEDDINGS)),
            (funnel.name, session_id))).fetchone()
        out["embeddings"] = {"count": emb[0] if emb else 0, "models": emb[1] if emb else []}
    counts = {name: len(out[name]) for name, _, _ in _EXPORTED}
    counts["state"] = int(out["state"] is not None)
    counts["embeddings"] = out["embeddings"]["count"]
    if not any(counts.values()):
        raise UnknownSession(f"no session {session_id!r} in funnel '{funnel.name}': nothing "
                             "of it is stored (erased already, or never seen); check the id")
    async with connect() as conn:
        await _audit(conn, funnel, "exported", by, out["receipt"], counts)
    return out
