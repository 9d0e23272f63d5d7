"""The store's side of follow-ups (docs/follow-ups.md): ``funnel_follow_ups``' SQL.

One row per session of a funnel that declares follow-ups: the next one due
(``due_at``, NULL when none is), written after each customer turn and after each
follow-up sent. The scheduler finds the due rows with one range scan of the partial
index ``(funnel, due_at) WHERE due_at IS NOT NULL`` (:data:`DUE`), then claims each
row with ``FOR UPDATE SKIP LOCKED`` and re-checks it is still due: of several workers
one sends it, and in the transaction that moves ``due_at`` on. The outbox row's key
names (session, stage, step, due time), so even a second transaction on the same due
time adds nothing.

A mixin of :class:`engine.store.postgres.PostgresStore`, like ``engine.store.delivery``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from . import ddl, outbox
from .base import FollowUpClaim, OutboxItem

__all__ = ["DUE", "FollowUpMixin", "LockedFollowUp"]

_F = sql.Identifier(ddl.FOLLOW_UPS)
_M = sql.Identifier(ddl.MESSAGES)
_T = sql.Identifier(ddl.TURNS)
_COLUMNS = "session_id, stage, step, anchor_at, anchor_id, due_at, sent, opted_out"

# The scheduler's one query: due sessions, oldest due first (an index range scan).
DUE = sql.SQL("SELECT session_id FROM {} WHERE funnel = %s AND due_at <= %s "
              "ORDER BY due_at LIMIT %s").format(_F)
READ = sql.SQL("SELECT " + _COLUMNS + " FROM {} WHERE funnel = %s AND session_id = %s"
               ).format(_F)
CLAIM = sql.SQL("SELECT " + _COLUMNS + " FROM {} WHERE funnel = %s AND session_id = %s "
                "AND due_at <= %s FOR UPDATE SKIP LOCKED").format(_F)
# The first step (1-based) still under its max for the session in the stage: the row's
# `sent` counts `stage:step` with 0-based steps.
_NEXT = ("(SELECT min(i) FROM generate_subscripts(%(maxes)s::int[], 1) i WHERE "
         "COALESCE((f.sent ->> (EXCLUDED.stage || ':' || (i - 1)))::int, 0) "
         "< (%(maxes)s::int[])[i])")
# After a customer turn, one statement: the follow-ups count from this message; the
# step is the first not sent its `max` times yet, due `after` it (none when every step
# was, when the stage has none, or when the customer opted out, now or before).
TOUCH = sql.SQL(
    "INSERT INTO {} AS f (funnel, session_id, stage, step, anchor_at, anchor_id, due_at, "
    "opted_out) VALUES (%(f)s, %(s)s, %(stage)s, 0, %(at)s, %(id)s, CASE WHEN %(out)s THEN "
    "NULL ELSE %(at)s + (%(afters)s::float8[])[1] * INTERVAL '1 s' END, %(out)s) "
    "ON CONFLICT (funnel, session_id) DO UPDATE SET stage = EXCLUDED.stage, "
    "anchor_at = EXCLUDED.anchor_at, anchor_id = EXCLUDED.anchor_id, "
    "opted_out = f.opted_out OR EXCLUDED.opted_out, updated_at = NOW(), "
    "step = COALESCE(" + _NEXT + " - 1, 0), "
    "due_at = CASE WHEN f.opted_out OR EXCLUDED.opted_out THEN NULL ELSE EXCLUDED.anchor_at "
    "+ (%(afters)s::float8[])[" + _NEXT + "] * INTERVAL '1 s' END").format(_F)
MOVE = sql.SQL("UPDATE {} SET step = %s, due_at = %s, sent = %s, updated_at = NOW() "
               "WHERE funnel = %s AND session_id = %s").format(_F)
CANCEL = sql.SQL("UPDATE {} SET due_at = NULL, opted_out = opted_out OR %s, "
                 "updated_at = NOW() WHERE funnel = %s AND session_id = %s").format(_F)
# The customer's newest message: one written since the row's anchor cancels what is due.
LAST_CUSTOMER = sql.SQL("SELECT id FROM {} WHERE funnel = %s AND session_id = %s AND "
                        "role = 'user' ORDER BY id DESC LIMIT 1").format(_M)
# Stamped by the database, as a turn's record is: the report's windows compare the two.
LOG = sql.SQL("INSERT INTO {} (funnel, session_id, role, content, stage, follow_up) "
              "VALUES (%s, %s, 'assistant', %s, %s, %s) RETURNING id").format(_M)
RECORD = sql.SQL(
    "INSERT INTO {} (funnel, funnel_version, session_id, stage_before, stage_after, model, "
    "follow_up, claims, prompt_tokens, completion_tokens, cost) "
    "VALUES (%s, %s, %s, %s, %s, 'follow-up', %s, %s, %s, %s, %s)"
).format(_T)

@dataclass
class LockedFollowUp:
    """A due row, locked for one transaction: send it, move it on, or cancel it
    (:class:`engine.store.base.FollowUpClaim`)."""

    conn: psycopg.AsyncConnection[Any]
    funnel: str
    row: dict[str, Any]

    @property
    def session_id(self) -> str:
        return str(self.row["session_id"])

    async def customer_wrote(self) -> bool:
        """Whether the customer wrote since the row's anchor (the turn reschedules)."""
        found = await (await self.conn.execute(LAST_CUSTOMER, (self.funnel, self.session_id))
                       ).fetchone()
        return found is not None and int(found[0]) > int(self.row["anchor_id"])

    async def move(self, step: int, due: datetime | None,
                   sent: dict[str, int] | None = None) -> None:
        await self.conn.execute(MOVE, (step, due, Jsonb(sent if sent is not None
                                                        else self.row["sent"] or {}),
                                       self.funnel, self.session_id))

    async def cancel(self, *, opted_out: bool = False) -> None:
        await self.conn.execute(CANCEL, (opted_out, self.funnel, self.session_id))

    async def send(self, *, text: str, version: int, record: dict[str, Any],
                   delivery: OutboxItem | None, claims: list[dict[str, Any]],
                   spend: tuple[int, int, float | None] = (0, 0, 0.0)) -> int | None:
        """Log the follow-up (a message and a turn record marked so) and queue its
        delivery; its message id, or None when the outbox had its key (sent before).
        ``spend``: the writing model's tokens and cost (a declared text's are 0)."""
        stage = str(self.row["stage"])
        if delivery is not None and not await outbox.add(self.conn, self.funnel,
                                                         self.session_id, [delivery]):
            return None
        found = await (await self.conn.execute(LOG, (
            self.funnel, self.session_id, text, stage, f"{stage}:{record['step']}"))
                       ).fetchone()
        assert found is not None
        await self.conn.execute(RECORD, (self.funnel, version, self.session_id, stage, stage,
                                         Jsonb(record), Jsonb(claims), *spend))
        return int(found[0])


class FollowUpMixin:
    """Follow-up methods of the PostgreSQL store."""

    def _conn(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        raise NotImplementedError

    async def follow_up_touch(self, funnel: str, session_id: str, stage: str,
                              anchor_at: datetime, anchor_id: int,
                              steps: Sequence[tuple[float, int]], *,
                              opted_out: bool = False) -> None:
        """After a customer turn in a stage with follow-ups (``steps``: each one's
        ``after`` in seconds and ``max``): they count from this message. One statement."""
        async with self._conn() as conn:
            await conn.execute(TOUCH, {
                "f": funnel, "s": session_id, "stage": stage, "at": anchor_at,
                "id": anchor_id, "out": opted_out,
                "afters": [float(a) for a, _ in steps] or None,
                "maxes": [int(m) for _, m in steps] or None})

    async def follow_up_cancel(self, funnel: str, session_id: str, *,
                               opted_out: bool = False) -> None:
        """Nothing more is due for the session (a take-over); ``opted_out``: ever."""
        async with self._conn() as conn:
            await conn.execute(CANCEL, (opted_out, funnel, session_id))

    async def follow_up_state(self, funnel: str, session_id: str) -> dict[str, Any] | None:
        """The session's follow-up row: stage, step, anchor, due time, sent, opted out."""
        async with self._conn() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(READ, (funnel, session_id))
            return await cur.fetchone()

    async def due_follow_ups(self, funnel: str, now: datetime, limit: int = 100) -> list[str]:
        """The sessions with a follow-up due at ``now``, oldest due first."""
        async with self._conn() as conn:
            rows = await (await conn.execute(DUE, (funnel, now, limit))).fetchall()
        return [str(r[0]) for r in rows]

    @asynccontextmanager
    async def claim_follow_up(self, funnel: str, session_id: str, now: datetime
                              ) -> AsyncIterator[FollowUpClaim | None]:
        """The session's row if it is still due and no other worker holds it (else None),
        locked until the block ends; what the block writes commits with it."""
        async with self._conn() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(CLAIM, (funnel, session_id, now))
            row = await cur.fetchone()
            yield None if row is None else LockedFollowUp(conn, funnel, row)
