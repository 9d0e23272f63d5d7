"""One turn's access to a session: a lease instead of a held connection.

A turn takes a lease on its session (a row in ``funnel_leases``) in the same
statement that logs the message and reads the row and the window (the turn
function, ``engine.store.functions``), and gives it back in the statement that
saves the turn. No connection is held while the model thinks, so the number of
turns in flight is not bounded by PostgreSQL's connections. A turn that finds
the session leased waits (polling with backoff, queued next in line) and then
reads the state the other turn saved. A lease is short and renewed while the
turn runs (``engine.store.heartbeat``), so it outlives a crashed process by a
few seconds; a turn that outlives its lease cannot overwrite newer state (the
row-version check). See docs/persistence.md.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import orjson
import psycopg

from ..errors import ConcurrentUpdate, DuplicateDelivery, StoreUnavailable
from ..format.spec import FunnelSpec
from ..records.messages import Message
from . import control, wire
from .base import Control, Held, Inbound, TurnWrite
from .statements import RELEASE, Statements

Connect = Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]]


async def save_turn_on(conn: psycopg.AsyncConnection[Any], table: Statements, write: TurnWrite
                       ) -> int:
    stmt, names = table.statement(write)
    params = table.params(write)
    result = await wire.run(conn, stmt, [wire.encode(params[n]) for n in names])
    if not result.ntuples:
        found = await (await conn.execute(table.version_of, (write.session_id,))).fetchone()
        raise ConcurrentUpdate(write.session_id, write.expected_version,
                               found[0] if found else None)
    table.saved(write)
    return int(result.get_value(0, 0) or 0)


# A lease holder is unique per turn: this process's random id and a counter (a new
# id in a forked child, which would otherwise count from the same point).
_PROCESS = uuid.uuid4().hex[:16]
_TURNS = itertools.count(1)


def _new_process_id() -> None:
    global _PROCESS
    _PROCESS = uuid.uuid4().hex[:16]


os.register_at_fork(after_in_child=_new_process_id)


class SessionHandle:
    """One turn's view of a session: ``load`` takes the lease, ``save`` gives it back."""

    def __init__(self, table: Statements, connect: Connect, session_id: str,
                 wait: float, holder: str | None = None,
                 renew: Callable[[str, str], None] | None = None,
                 tables: Callable[[FunnelSpec], Statements] | None = None) -> None:
        self.table = table
        self.tables = tables  # the statements of another version of the funnel
        self.connect = connect
        self.session_id = session_id
        self.key = f"{table.spec.name}/{session_id}"
        # A lease this process could not give back (the database went away) is taken
        # up again by its next turn of the session, instead of waiting for it to expire.
        self.holder = holder or f"{_PROCESS}-{next(_TURNS)}"
        self.locked = False
        self.wait = wait
        self.renew = renew  # the heartbeat: keeps this turn's lease and key claim alive
        self.inbound: Inbound | None = None
        self.message_id = 0
        # Who answers the session besides the bot, read with the row under the lease.
        self.control: Control | None = None

    async def load(self, window: int, *, text: str | None = None, current_id: int = 0,
                   inbound: Inbound | None = None
                   ) -> tuple[int, dict[str, Any] | None, list[Message]]:
        """Log the user's message (when ``text`` is given), take the session's lease, and
        read its row and last ``window`` messages: one round trip when the session is free.

        The message commits in the statement that asks for the lease, whether the
        lease is free or not, so it is durable whatever happens to the turn. Returns
        (message id, the row as JSON-friendly values or None, messages oldest first).

        With ``inbound``, the message's delivery key is recorded with it (or, for a
        message logged before, ``current_id``, only remembered for the save).

        Raises:
            StoreUnavailable: the session stayed leased by another turn for ``wait`` s.
            DuplicateDelivery: the key was recorded before; nothing was logged.
        """
        self.inbound = inbound
        if self.renew is not None:
            self.renew(self.holder, self.key)
        deadline = time.monotonic() + self.wait
        delay = 0.005
        waiting = False  # after the first try, a waiting turn holds its place in line
        while True:
            logged, row, messages = await self._try(window, text, current_id, queue=waiting)
            if logged is not None:
                current_id, text = logged, None  # logged once, whatever happens next
            if self.locked:
                self.message_id = current_id
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
        table = self.table
        spec = table.spec
        inbound = self.inbound
        encode = wire.encode
        async with self.connect() as conn:
            result = await wire.run(conn, table.begin, [
                encode(spec.name), encode(self.session_id), encode(text), encode(spec.initial),
                encode(self.key), encode(self.holder), encode(float(table.lease_seconds)),
                encode(window), encode(current_id), encode(queue),
                encode(inbound.channel if inbound else None),
                encode(inbound.key if inbound else None), b"t"])
        # One row of text values: bigint, boolean, jsonb, jsonb, boolean, jsonb.
        message_id, leased, state, recent, replayed, held_by = (
            result.get_value(0, i) for i in range(6))
        self.locked = leased == b"t"
        if replayed == b"t":
            assert inbound is not None
            raise DuplicateDelivery(self.session_id, inbound.key,
                                    int(message_id) if message_id is not None else None,
                                    orjson.loads(state) if state is not None else None)
        logged = int(message_id) if text is not None and message_id is not None else None
        if not self.locked:
            return logged, None, []
        self.control = control.control_from_json(orjson.loads(held_by)) if held_by else None
        # A manager's message reads as the business's side of the chat (engine.turn.manager).
        messages = [Message("assistant" if r[0] == "manager" else r[0], r[1], r[2])
                    for r in orjson.loads(recent or b"[]")]
        return logged, (table.plain_row(orjson.loads(state)) if state is not None else None), \
            messages

    async def save(self, write: TurnWrite) -> int:
        """Save the turn and give the lease back, in one statement and one commit."""
        write.holder = self.holder
        write.inbound, write.message_id = self.inbound, self.message_id
        table = self.table
        if write.spec is not None and write.spec is not table.spec and self.tables:
            table = self.tables(write.spec)  # a session on another version (docs/versions.md)
        async with self.connect() as conn:
            try:
                version = await save_turn_on(conn, table, write)
            except ConcurrentUpdate:
                self.locked = False  # the statement ran, and released the lease
                raise
            self.locked = False
            return version

    async def hold(self, held: Held) -> None:
        """End the turn without the bot (a manager holds the session): the message is
        marked held, the holding reply logged, the delivery key answered and the lease
        given back, in one transaction (engine.store.control)."""
        inbound = self.inbound
        async with self.connect() as conn:
            await control.hold(conn, self.table.spec, self.session_id, held, self.key,
                               self.holder, (inbound.channel, inbound.key) if inbound else None)
        self.locked = False

    async def release(self) -> bool:
        """Give the lease back without saving (the turn failed); False if that failed too."""
        try:
            async with self.connect() as conn:
                await conn.execute(RELEASE, {"key": self.key, "holder": self.holder})
        except (psycopg.Error, StoreUnavailable):
            return False  # it expires by itself, or this process's next turn takes it up
        self.locked = False
        return True
