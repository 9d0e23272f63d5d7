"""The playground's sessions: the ones the studio made, never a customer's.

``funnel_playground`` holds one row per session the studio created (a new playground
session, or a branch of another session, with where it came from), written before the
session's first turn. It is a table of its own rather than a column of the funnel's
session table, so that a table made from the seed's DDL, and the seed's queries on
it, stay as they are, and no ``funnel migrate`` is needed: the shared migrations
create it (engine.store.ddl).

The studio runs turns only on sessions registered here (engine.studio.playground);
the figures leave them out unless asked: `funnel report` and the experiments' figures
(:func:`real_session` in their queries), `funnel replay` (engine.evidence.records),
the open sessions of ``/metrics`` (engine.store.open_sessions) and the studio's
sessions list.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import sql

from ..errors import StoreUnavailable, first_line
from . import ddl
from .base import Store

__all__ = ["mark", "origin", "real_session"]


def real_session(funnel: sql.Composable, session_id: sql.Composable) -> sql.Composed:
    """A condition that holds for a session that is not a playground session: ``funnel``
    and ``session_id`` are the SQL of the funnel's name and the session's id."""
    return sql.SQL("NOT EXISTS (SELECT 1 FROM {} pg WHERE pg.funnel = {} AND "
                   "pg.session_id = {})").format(sql.Identifier(ddl.PLAYGROUND), funnel,
                                                 session_id)


@asynccontextmanager
async def _connect(store: Store) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    # The store's pool (the report's SQL builders import this module, and the store's
    # module imports them: no import of the store itself here).
    pool = getattr(store, "pool", None)
    if pool is None:
        raise StoreUnavailable("the playground's sessions are registered in PostgreSQL; "
                               "this store has no pool")
    try:
        async with pool.connection() as conn:
            yield conn
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"PostgreSQL did not answer: {first_line(exc)}") from None


async def mark(store: Store, funnel: str, session_id: str, *, branched_from: str | None = None,
               turn: int | None = None) -> None:
    """Register ``session_id`` as a playground session of ``funnel`` (again: nothing).

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    async with _connect(store) as conn:
        await conn.execute(sql.SQL(
            "INSERT INTO {} (funnel, session_id, branched_from, branched_turn) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (funnel, session_id) DO NOTHING").format(
                sql.Identifier(ddl.PLAYGROUND)), (funnel, session_id, branched_from, turn))


async def origin(store: Store, funnel: str, session_id: str) -> dict[str, Any] | None:
    """``{"branched_from", "turn"}`` of a playground session (both None for one started
    afresh); None for any other session.

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    async with _connect(store) as conn:
        row = await (await conn.execute(sql.SQL(
            "SELECT branched_from, branched_turn FROM {} WHERE funnel = %s AND session_id = %s"
        ).format(sql.Identifier(ddl.PLAYGROUND)), (funnel, session_id))).fetchone()
    return None if row is None else {"branched_from": row[0], "turn": row[1]}
