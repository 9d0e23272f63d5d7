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

from typing import TYPE_CHECKING, Any

from psycopg import sql

from . import ddl
from .base import Store

if TYPE_CHECKING:
    from .postgres import PostgresStore

__all__ = ["mark", "origin", "real_session"]


def real_session(funnel: sql.Composable, session_id: sql.Composable) -> sql.Composed:
    """A condition that holds for a session that is not a playground session: ``funnel``
    and ``session_id`` are the SQL of the funnel's name and the session's id."""
    return sql.SQL("NOT EXISTS (SELECT 1 FROM {} pg WHERE pg.funnel = {} AND "
                   "pg.session_id = {})").format(sql.Identifier(ddl.PLAYGROUND), funnel,
                                                 session_id)


def _postgres(store: Store) -> PostgresStore:
    # Imported here: the report's SQL builders import this module, and the store them.
    from .postgres import PostgresStore

    if not isinstance(store, PostgresStore):
        raise TypeError("the playground's sessions are registered in PostgreSQL")
    return store


async def mark(store: Store, funnel: str, session_id: str, *, branched_from: str | None = None,
               turn: int | None = None) -> None:
    """Register ``session_id`` as a playground session of ``funnel`` (again: nothing).

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    async with _postgres(store)._conn() as conn:
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
    async with _postgres(store)._conn() as conn:
        row = await (await conn.execute(sql.SQL(
            "SELECT branched_from, branched_turn FROM {} WHERE funnel = %s AND session_id = %s"
        ).format(sql.Identifier(ddl.PLAYGROUND)), (funnel, session_id))).fetchone()
    return None if row is None else {"branched_from": row[0], "turn": row[1]}
