"""The pool's connections: how each is configured when it opens, and when one is checked
before use (:class:`Health`). Used by :mod:`engine.store.postgres`."""

from __future__ import annotations

import time
import weakref
from typing import Any

import orjson
import psycopg
from psycopg.types.json import set_json_loads

__all__ = ["Health", "configure"]


async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
    # A turn reads its row and window as JSON: orjson decodes it several times faster.
    set_json_loads(orjson.loads, conn)


class Health:
    """Checks a pooled connection before use only if it sat idle for a while.

    Checking every checkout costs a round trip per statement; checking none
    hands out connections that a database restart broke. A connection used in
    the last few seconds is trusted; an older one gets an empty query, and the
    pool replaces it if that fails (so the pool reconnects by itself).
    """

    def __init__(self, trust_seconds: float = 2.0) -> None:
        self.trust = trust_seconds
        self.broken_at = float("-inf")
        # Weak keys: a connection the pool discards leaves no entry behind.
        self.last_used: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], float] = (
            weakref.WeakKeyDictionary())

    async def check(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if time.monotonic() - self.last_used.get(conn, 0.0) > self.trust:
            try:
                await conn.execute("")
            except psycopg.Error:
                self.broken_at = time.monotonic()
                raise

    def recently_broken(self) -> bool:
        """A pooled connection was found broken in the last few seconds (a restart)."""
        return time.monotonic() - self.broken_at < 10

    def used(self, conn: psycopg.AsyncConnection[Any]) -> None:
        # Recorded by the store's own checkout, not by a pool `reset` callback: with
        # one, psycopg_pool hands every returned connection to a background task.
        self.last_used[conn] = time.monotonic()

    def distrust(self) -> None:
        """A connection was lost, so the server may have restarted: every pooled
        connection is checked at its next use, however recently it was used.
        Otherwise each of them would fail one turn before the pool replaces it."""
        self.last_used.clear()
