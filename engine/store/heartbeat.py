"""Leases that end with their turn: this process renews the leases its turns hold.

A turn's lease on its session (``funnel_leases``) and its claim on the message's
delivery key (``funnel_inbound.alive_until``) are taken for :data:`LEASE_SECONDS`
and renewed every :data:`RENEW_EVERY` seconds while the turn runs, whatever the
model call takes. A process that dies (kill -9, a lost machine) stops renewing,
so its sessions are free again within seconds, not after the slowest model call
the funnel allows; another worker then takes the session, and a message the dead
process had accepted but not answered (engine.store.idempotency) is claimed and
answered there. A live turn that lost its lease to a stall cannot overwrite newer
state: its save is checked against the row version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

from ..errors import StoreUnavailable
from . import ddl

Connect = Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]]

log = logging.getLogger("funnel.store.heartbeat")

LEASE_SECONDS = 6.0
RENEW_EVERY = 2.0

# By lease key (the primary key), and the delivery keys' claims among the unanswered
# rows (the partial index): both stay cheap however many sessions the tables hold.
_RENEW = (
    f"WITH l AS (UPDATE {ddl.LEASES} SET expires_at = NOW() + %(s)s * INTERVAL '1 second' "
    "WHERE lock_key = ANY(%(k)s) AND holder = ANY(%(h)s)) "
    f"UPDATE {ddl.INBOUND} SET alive_until = NOW() + %(s)s * INTERVAL '1 second' "
    "WHERE response IS NULL AND alive_until > NOW() - INTERVAL '1 hour' "
    "AND holder = ANY(%(h)s)"
)


class Heartbeat:
    """The lease holders of this process's turns in flight, renewed in one statement
    every ``every`` seconds by a task that runs while there is any."""

    def __init__(self, connect: Connect, seconds: float = LEASE_SECONDS,
                 every: float = RENEW_EVERY) -> None:
        self.connect = connect
        self.seconds = seconds
        self.every = every
        self.holders: dict[str, str] = {}  # holder -> the lease key it holds
        self.renewals = 0  # statements run, for tests and metrics
        self._task: asyncio.Task[None] | None = None

    def hold(self, holder: str, key: str) -> None:
        """Renew ``holder``'s lease on ``key`` (and its claims) until :meth:`drop`."""
        self.holders[holder] = key
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def drop(self, holder: str) -> None:
        self.holders.pop(holder, None)

    async def _run(self) -> None:
        while self.holders:
            await asyncio.sleep(self.every)
            if not self.holders:
                return
            try:
                async with self.connect() as conn:
                    await conn.execute(_RENEW, {"s": self.seconds, "h": list(self.holders),
                                                "k": list(self.holders.values())})
                self.renewals += 1
            except (StoreUnavailable, psycopg.Error) as exc:
                # The leases run out by themselves if this goes on; the turns' saves
                # are checked against the row version either way.
                log.warning("could not renew %d lease(s): %s", len(self.holders), exc)

    async def close(self) -> None:
        self.holders.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
