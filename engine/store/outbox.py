"""The outbox's SQL: claiming due rows (replies in order per session), and recording
each delivery's outcome, per target.

A claim pushes ``next_attempt_at`` a minute forward, so two dispatchers never send
the same row at once and a crashed dispatcher's claim expires by itself. Rows of
kind ``reply`` (a channel's answer to the customer) are claimed in order: none while
an earlier reply of the same session is still undelivered, so a chat never sees the
answers out of order. A row given up on (the customer blocked the bot) waits at
``next_attempt_at = 'infinity'`` with its ``last_error``, and no longer holds back
the session's later rows.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from . import ddl
from .base import OutboxItem

_O = sql.Identifier(ddl.OUTBOX)

CLAIM = sql.SQL(
    "UPDATE {o} SET attempts = attempts + 1, next_attempt_at = NOW() + INTERVAL '60 s' "
    "WHERE id IN (SELECT id FROM {o} x WHERE delivered_at IS NULL "
    "AND next_attempt_at <= NOW() AND (%(f)s::text IS NULL OR funnel = %(f)s) "
    "AND (%(s)s::text IS NULL OR session_id = %(s)s) "
    "AND (%(k)s::text[] IS NULL OR kind = ANY(%(k)s)) "
    "AND (kind <> 'reply' OR NOT EXISTS (SELECT 1 FROM {o} e WHERE e.funnel = x.funnel "
    "AND e.session_id = x.session_id AND e.kind = 'reply' AND e.id < x.id "
    "AND e.delivered_at IS NULL AND e.next_attempt_at < 'infinity')) "
    "ORDER BY id LIMIT %(n)s FOR UPDATE SKIP LOCKED) RETURNING id, idempotency_key, funnel, "
    "session_id, kind, payload, attempts, done_targets"
).format(o=_O)

DELIVERED = sql.SQL("UPDATE {} SET delivered_at = NOW(), last_error = NULL WHERE id = %(id)s"
                    ).format(_O)
# Exponential backoff unless the receiver said when (Bot API 429 ``retry_after``).
FAILED = sql.SQL(
    "UPDATE {} SET last_error = %(e)s, next_attempt_at = NOW() + COALESCE(%(r)s::float8, "
    "LEAST(3600, 5 * POWER(2, attempts))) * INTERVAL '1 s' WHERE id = %(id)s").format(_O)
GIVEN_UP = sql.SQL("UPDATE {} SET last_error = %(e)s, next_attempt_at = 'infinity' "
                   "WHERE id = %(id)s").format(_O)
TARGET_DONE = sql.SQL("UPDATE {} SET done_targets = done_targets || to_jsonb(%(t)s::text) "
                      "WHERE id = %(id)s AND NOT done_targets ? %(t)s").format(_O)
BACKLOG = sql.SQL(
    "SELECT funnel, COUNT(*), COALESCE(EXTRACT(EPOCH FROM NOW() - MIN(next_attempt_at)), 0) "
    "FROM {} WHERE delivered_at IS NULL AND next_attempt_at < 'infinity' GROUP BY funnel"
).format(_O)


async def claim(conn: psycopg.AsyncConnection[Any], funnel: str | None, session_id: str | None,
                kinds: list[str] | None, limit: int) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(CLAIM, {"f": funnel, "s": session_id, "k": kinds, "n": limit})
    return await cur.fetchall()


async def finish(conn: psycopg.AsyncConnection[Any], item_id: int, error: str | None, *,
                 retry_in: float | None = None, give_up: bool = False) -> None:
    if error is None:
        await conn.execute(DELIVERED, {"id": item_id})
    elif give_up:
        await conn.execute(GIVEN_UP, {"id": item_id, "e": error[:1000]})
    else:
        await conn.execute(FAILED, {"id": item_id, "e": error[:1000], "r": retry_in})


async def backlog(conn: psycopg.AsyncConnection[Any]) -> dict[str, tuple[int, float]]:
    """Per funnel: undelivered rows still to try, and how long the oldest is overdue (s)."""
    rows = await (await conn.execute(BACKLOG)).fetchall()
    return {r[0]: (int(r[1]), max(0.0, float(r[2]))) for r in rows}


ADD = sql.SQL("INSERT INTO {} (idempotency_key, funnel, session_id, kind, payload) "
              "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (idempotency_key) DO NOTHING").format(_O)


async def add(conn: psycopg.AsyncConnection[Any], funnel: str, session_id: str,
              items: list[OutboxItem]) -> int:
    added = 0
    for item in items:
        cur = await conn.execute(ADD, (item.key, funnel, session_id, item.kind,
                                       Jsonb(item.payload)))
        added += cur.rowcount
    return added
