"""Inbound idempotency: a customer message's delivery key, kept in PostgreSQL.

Every inbound message may carry a key, unique per funnel and channel (Telegram:
the bot and ``update_id``; HTTP: the ``Idempotency-Key`` header or the body's
``client_message_id``; the widget: a key it makes per message and reuses on
retry). The key is recorded in ``funnel_inbound`` in the same commit as the
message: by the turn function (engine.store.functions) for a turn that runs at
once, or by :func:`accept` for a message acknowledged first and answered in the
background (Telegram). The turn's save stores its answer on the key's row.

A second delivery of a key runs no turn, whichever worker it reaches and
whenever: during the first turn it waits for that turn's answer, after it the
answer is replayed. A row whose answer never came (the worker died, the database
went away mid-turn) is an orphan once its claim (``alive_until``, renewed by the
heartbeat of the turn working on it) runs out: one worker claims it
(:func:`claim`, :func:`claim_orphans`) and runs the message's turn. Keys are
deleted with their sessions, and after the retention period, by ``funnel purge``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from ..format.spec import FunnelSpec
from . import ddl
from .heartbeat import LEASE_SECONDS

_I = sql.Identifier(ddl.INBOUND)
MAX_CLAIMS = 5  # a message whose turn failed this often is left alone (see `funnel_inbound`)


@dataclass(frozen=True)
class Pending:
    """A key's row: the message, and the answer once its turn is saved."""

    session_id: str
    message_id: int | None
    response: dict[str, Any] | None
    orphan: bool  # unanswered and nobody works on it
    meta: dict[str, Any] | None = None
    text: str | None = None


def _accept(spec: FunnelSpec) -> sql.Composed:
    return sql.SQL(
        "WITH i AS (INSERT INTO {i} (funnel, channel, key, session_id, message_id, holder, "
        "alive_until, meta) VALUES (%(f)s, %(c)s, %(k)s, %(s)s, "
        "nextval(pg_get_serial_sequence(%(m)s, 'id')), %(h)s, "
        "NOW() + %(ttl)s * INTERVAL '1 second', %(meta)s) "
        "ON CONFLICT (funnel, channel, key) DO NOTHING RETURNING message_id), "
        "m AS (INSERT INTO {m} (id, funnel, session_id, role, content, stage) "
        "SELECT i.message_id, %(f)s, %(s)s, 'user', %(t)s, COALESCE((SELECT stage FROM {t} "
        "WHERE session_id = %(s)s), %(initial)s) FROM i) SELECT message_id FROM i"
    ).format(i=_I, m=sql.Identifier(ddl.MESSAGES), t=sql.Identifier(spec.table))


async def accept(conn: psycopg.AsyncConnection[Any], spec: FunnelSpec, session_id: str,
                 text: str, channel: str, key: str, holder: str,
                 meta: dict[str, Any] | None = None) -> int | None:
    """Log the message with its key in one commit; its id, or None if the key was seen
    before (nothing logged). ``holder`` claims it for its turn for a few seconds."""
    row = await (await conn.execute(_accept(spec), {
        "f": spec.name, "c": channel, "k": key, "s": session_id, "m": ddl.MESSAGES,
        "h": holder, "ttl": LEASE_SECONDS, "meta": Jsonb(meta) if meta else None, "t": text,
        "initial": spec.initial})).fetchone()
    return int(row[0]) if row else None


# With the first delivery's text: a key reused with another message is refused by the
# caller (engine.service.inbound), never answered with the first message's reply.
_PENDING = sql.SQL(
    "SELECT i.session_id, i.message_id, i.response, "
    "i.response IS NULL AND i.alive_until < NOW(), i.meta, "
    "(SELECT content FROM {m} WHERE id = i.message_id) "
    "FROM {i} i WHERE i.funnel = %s AND i.channel = %s AND i.key = %s"
).format(i=_I, m=sql.Identifier(ddl.MESSAGES))


async def pending(conn: psycopg.AsyncConnection[Any], funnel: str, channel: str, key: str
                  ) -> Pending | None:
    row = await (await conn.execute(_PENDING, (funnel, channel, key))).fetchone()
    if row is None:
        return None
    return Pending(row[0], row[1], row[2], bool(row[3]), row[4], row[5])


_CLAIM = sql.SQL(
    "UPDATE {i} i SET holder = %(h)s, attempts = attempts + 1, "
    "alive_until = NOW() + %(ttl)s * INTERVAL '1 second' FROM (SELECT funnel, channel, key "
    "FROM {i} WHERE funnel = %(f)s AND channel = %(c)s AND (%(k)s::text IS NULL OR key = %(k)s) "
    "AND response IS NULL AND alive_until < NOW() AND message_id IS NOT NULL "
    "AND attempts < %(max)s ORDER BY message_id LIMIT %(n)s FOR UPDATE SKIP LOCKED) x "
    "WHERE i.funnel = x.funnel AND i.channel = x.channel AND i.key = x.key "
    "RETURNING i.key, i.session_id, i.message_id, i.meta, "
    "(SELECT content FROM {m} WHERE id = i.message_id)"
).format(i=_I, m=sql.Identifier(ddl.MESSAGES))


async def claim_orphans(conn: psycopg.AsyncConnection[Any], funnel: str, channel: str,
                        holder: str, *, key: str | None = None, limit: int = 20
                        ) -> list[tuple[str, Pending]]:
    """Claim unanswered messages nobody works on (of one ``key``, or up to ``limit``):
    (key, the message) for each; the caller runs their turns."""
    rows = await (await conn.execute(_CLAIM, {
        "h": holder, "ttl": LEASE_SECONDS, "f": funnel, "c": channel, "k": key,
        "max": MAX_CLAIMS, "n": 1 if key else limit})).fetchall()
    return [(r[0], Pending(r[1], r[2], None, False, r[3], r[4])) for r in rows]


async def claim(conn: psycopg.AsyncConnection[Any], funnel: str, channel: str, key: str,
                holder: str) -> Pending | None:
    """Claim one orphan by its key; None if it is answered, alive, or claimed by another."""
    found = await claim_orphans(conn, funnel, channel, holder, key=key)
    return found[0][1] if found else None


_EXPIRE = sql.SQL("DELETE FROM {} WHERE funnel = %s AND created_at < NOW() - %s * "
                  "INTERVAL '1 s'").format(_I)


async def expire(conn: psycopg.AsyncConnection[Any], funnel: str, older_than: float) -> int:
    """Forget the keys older than the retention period; how many."""
    return (await conn.execute(_EXPIRE, (funnel, older_than))).rowcount


_DELIVERY = sql.SQL("UPDATE {} SET delivery = %s WHERE funnel = %s AND channel = %s AND key = %s"
                    ).format(_I)
_UNREACHABLE = sql.SQL(
    "INSERT INTO {} (funnel, session_id, channel, reason) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (funnel, session_id, channel) DO UPDATE SET reason = EXCLUDED.reason, "
    "since = NOW()").format(sql.Identifier(ddl.UNREACHABLE))
_REACHED = sql.SQL("DELETE FROM {} WHERE funnel = %s AND session_id = %s AND channel = %s"
                   ).format(sql.Identifier(ddl.UNREACHABLE))


async def record_delivery(conn: psycopg.AsyncConnection[Any], funnel: str, channel: str,
                          session_id: str, key: str | None, delivery: str,
                          unreachable: str | None = None) -> None:
    """Record how the reply to a message went (``delivered``, ``failed: ...``) on its key,
    and whether the channel can reach the session (``unreachable``: why not)."""
    async with conn.transaction():
        if key is not None:
            await conn.execute(_DELIVERY, (delivery[:500], funnel, channel, key))
        if unreachable is not None:
            await conn.execute(_UNREACHABLE, (funnel, session_id, channel, unreachable[:500]))
        elif delivery == "delivered":
            await conn.execute(_REACHED, (funnel, session_id, channel))
