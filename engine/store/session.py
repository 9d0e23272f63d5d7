"""One turn's locked access to a session: two round trips, two commits.

See docs/persistence.md for why the Sync points sit where they do.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from ..errors import ConcurrentUpdate
from ..prompts import Message
from . import TurnWrite
from .statements import LOCK, RECENT, RECENT_AFTER_LOG, UNLOCK, Statements


async def save_turn_on(conn: psycopg.AsyncConnection[Any], table: Statements, write: TurnWrite) -> int:
    row = await (await conn.execute(table.statement(write), table.params(write))).fetchone()
    if row is None:
        found = await (await conn.execute(table.version_of, (write.session_id,))).fetchone()
        raise ConcurrentUpdate(write.session_id, write.expected_version,
                               found[0] if found else None)
    return int(row[0])


async def commit_point(pipeline: psycopg.AsyncPipeline) -> None:
    """End the pipeline's implicit transaction here, without waiting for the results.

    In pipeline mode every statement up to a Sync message runs in one implicit
    transaction, even in autocommit: without a Sync, the user's message would
    commit only after the lock is granted, and the unlock would let the next
    turn in before the save commits. libpq's PQpipelineSync does not wait;
    psycopg exposes it only privately, so fall back to the waiting ``sync()``.
    """
    enqueue = getattr(pipeline, "_enqueue_sync", None)
    if callable(enqueue):
        enqueue()
    else:  # pragma: no cover - a psycopg without the private hook
        await pipeline.sync()


class SessionHandle:
    """One turn's view of a session, on the connection that holds its advisory lock.

    ``load`` sends lock + row + message window in one round trip (pipeline);
    ``save`` sends the turn's single statement and the unlock in another.
    """

    def __init__(self, table: Statements, conn: psycopg.AsyncConnection[Any], session_id: str
                 ) -> None:
        self.table = table
        self.conn = conn
        self.session_id = session_id
        self.key = f"{table.spec.name}/{session_id}"
        self.locked = False

    async def lock(self) -> None:
        await self.conn.execute(LOCK, (self.key,))
        self.locked = True

    async def load(self, window: int, *, text: str | None = None, current_id: int = 0
                   ) -> tuple[int, dict[str, Any] | None, list[Message]]:
        """Log the user's message (when ``text`` is given), lock the session, and read its
        row and last ``window`` messages: one round trip.

        The message's INSERT commits on its own before the lock is even asked
        for, so it is durable whatever happens to the turn. Returns
        (message id, row or None, messages oldest first).
        """
        conn = self.conn
        spec = self.table.spec
        log_cur = conn.cursor()
        row_cur = conn.cursor(row_factory=dict_row)
        msg_cur = conn.cursor()
        async with conn.pipeline() as pipeline:
            if text is not None:
                await log_cur.execute(self.table.log, (spec.name, self.session_id, "user", text,
                                                       self.session_id, spec.initial))
                await commit_point(pipeline)
            await conn.execute(LOCK, (self.key,))
            self.locked = True
            await row_cur.execute(self.table.select, (*self.table.select_args, self.session_id))
            if window > 0:
                if text is not None:
                    await msg_cur.execute(RECENT_AFTER_LOG, (spec.name, self.session_id, window))
                else:
                    await msg_cur.execute(RECENT, (spec.name, self.session_id, current_id,
                                                    current_id, window))
        if text is not None:
            logged = await log_cur.fetchone()
            assert logged is not None
            current_id = int(logged[0])
        row = await row_cur.fetchone()
        messages = [Message(r[0], r[1], r[2]) for r in await msg_cur.fetchall()] \
            if window > 0 else []
        return current_id, row, messages

    async def save(self, write: TurnWrite) -> int:
        """Save the turn and release the lock in one round trip."""
        conn = self.conn
        cur = conn.cursor()
        async with conn.pipeline() as pipeline:
            await cur.execute(self.table.statement(write), self.table.params(write))
            await commit_point(pipeline)  # the save commits before the lock is released
            await conn.execute(UNLOCK, (self.key,))
        self.locked = False
        row = await cur.fetchone()
        if row is None:
            found = await (await conn.execute(self.table.version_of,
                                              (write.session_id,))).fetchone()
            raise ConcurrentUpdate(write.session_id, write.expected_version,
                                   found[0] if found else None)
        return int(row[0])

    async def release(self) -> None:
        try:
            await self.conn.execute(UNLOCK, (self.key,))
        except psycopg.Error:
            await self.conn.close()  # a closed connection releases its locks
        self.locked = False
