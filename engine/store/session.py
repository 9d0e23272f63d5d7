"""One turn's access to a session: a lease instead of a held connection.

A turn takes a lease on its session (a row in ``funnel_leases``) in the same
pipeline that logs the message and reads the row and the window, and gives
it back in the statement that saves the turn. No connection is held while the
model thinks, so the number of turns in flight is not bounded by PostgreSQL's
connections. A turn that finds the session leased waits (polling with
backoff, queued next in line) and then reads the state the other turn saved. A lease outlives a
crashed process by at most its length; a turn that outlives its lease cannot
overwrite newer state (the row-version check). See docs/persistence.md.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ..errors import ConcurrentUpdate, StoreUnavailable
from ..prompts import Message
from . import TurnWrite
from .statements import ACQUIRE, QUEUE, RECENT, RECENT_AFTER_LOG, RELEASE, Statements

Connect = Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]]


async def save_turn_on(conn: psycopg.AsyncConnection[Any], table: Statements, write: TurnWrite
                       ) -> int:
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
    commit only together with the lease. libpq's PQpipelineSync does not wait;
    psycopg exposes it only privately, so fall back to the waiting ``sync()``.
    """
    enqueue = getattr(pipeline, "_enqueue_sync", None)
    if callable(enqueue):
        enqueue()
    else:  # pragma: no cover - a psycopg without the private hook
        await pipeline.sync()


class SessionHandle:
    """One turn's view of a session: ``load`` takes the lease, ``save`` gives it back."""

    def __init__(self, table: Statements, connect: Connect, session_id: str,
                 wait: float, holder: str | None = None) -> None:
        self.table = table
        self.connect = connect
        self.session_id = session_id
        self.key = f"{table.spec.name}/{session_id}"
        # A lease this process could not give back (the database went away) is taken
        # up again by its next turn of the session, instead of waiting for it to expire.
        self.holder = holder or uuid.uuid4().hex
        self.locked = False
        self.wait = wait

    async def load(self, window: int, *, text: str | None = None, current_id: int = 0
                   ) -> tuple[int, dict[str, Any] | None, list[Message]]:
        """Log the user's message (when ``text`` is given), take the session's lease, and
        read its row and last ``window`` messages: one round trip when the session is free.

        The message commits on its own, before the lease is asked for, so it is
        durable whatever happens to the turn. Returns (message id, row or None,
        messages oldest first).

        Raises:
            StoreUnavailable: the session stayed leased by another turn for ``wait`` s.
        """
        deadline = time.monotonic() + self.wait
        delay = 0.005
        waiting = False  # after the first try, a waiting turn holds its place in line
        while True:
            logged, row, messages = await self._try(window, text, current_id, queue=waiting)
            if logged is not None:
                current_id, text = logged, None  # logged once, whatever happens next
            if self.locked:
                return current_id, row, messages
            if time.monotonic() >= deadline:
                raise StoreUnavailable(
                    f"session {self.session_id!r} is busy: another turn has held it for "
                    f"{self.wait:g} s; the message is logged, try again")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
            waiting = True

    async def _try(self, window: int, text: str | None, current_id: int, queue: bool
                   ) -> tuple[int | None, dict[str, Any] | None, list[Message]]:
        spec = self.table.spec
        async with self.connect() as conn:
            log_cur = conn.cursor()
            lease_cur = conn.cursor()
            row_cur = conn.cursor(row_factory=dict_row)
            msg_cur = conn.cursor()
            async with conn.pipeline() as pipeline:
                if text is not None:
                    await log_cur.execute(self.table.log, (spec.name, self.session_id, "user",
                                                           text, self.session_id, spec.initial))
                    await commit_point(pipeline)
                lease = {"key": self.key, "holder": self.holder,
                         "seconds": self.table.lease_seconds}
                await lease_cur.execute(ACQUIRE, lease)
                if queue:  # waiting already: hold our place in line
                    await conn.execute(QUEUE, lease)
                await row_cur.execute(self.table.select,
                                      (*self.table.select_args, self.session_id))
                if window > 0:
                    if text is not None:
                        await msg_cur.execute(RECENT_AFTER_LOG,
                                              (spec.name, self.session_id, window))
                    else:
                        await msg_cur.execute(RECENT, (spec.name, self.session_id, current_id,
                                                       current_id, window))
            logged = None
            if text is not None:
                first = await log_cur.fetchone()
                assert first is not None
                logged = int(first[0])
            self.locked = await lease_cur.fetchone() is not None
            if not self.locked:
                return logged, None, []
            row = await row_cur.fetchone()
            messages = [Message(r[0], r[1], r[2]) for r in await msg_cur.fetchall()] \
                if window > 0 else []
            return logged, row, messages

    async def save(self, write: TurnWrite) -> int:
        """Save the turn and give the lease back, in one statement and one commit."""
        write.holder = self.holder
        async with self.connect() as conn:
            try:
                version = await save_turn_on(conn, self.table, write)
            except ConcurrentUpdate:
                self.locked = False  # the statement ran, and released the lease
                raise
            self.locked = False
            return version

    async def release(self) -> bool:
        """Give the lease back without saving (the turn failed); False if that failed too."""
        try:
            async with self.connect() as conn:
                await conn.execute(RELEASE, {"key": self.key, "holder": self.holder})
        except (psycopg.Error, StoreUnavailable):
            return False  # it expires by itself, or this process's next turn takes it up
        self.locked = False
        return True
