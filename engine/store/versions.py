"""The version store (``funnel_versions``, docs/versions.md) and the session rows that
move between versions, for :class:`engine.store.postgres.PostgresStore`.

A version is stored once per content hash: ``(funnel, version, hash)`` with the
bundle's files as JSON. A version's current bundle is the one deployed last.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from ..format.spec import FunnelSpec
from . import ddl
from .statements import dumps


class VersionsMixin:
    """Version store methods of the PostgreSQL store."""

    def _conn(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        raise NotImplementedError

    async def save_version(self, funnel: str, version: int, digest: str, entry: str,
                           files: dict[str, str]) -> bool:
        """Store a version's bundle (or mark it deployed again); True when it was new."""
        async with self._conn() as conn:
            row = await (await conn.execute(
                f"INSERT INTO {ddl.VERSIONS} (funnel, version, hash, entry, files) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (funnel, version, hash) DO UPDATE "
                "SET deployed_at = NOW() RETURNING (xmax = 0)",
                (funnel, version, digest, entry, Jsonb(files)))).fetchone()
        return bool(row and row[0])

    async def load_version(self, funnel: str, version: int
                           ) -> tuple[str, str, dict[str, str]] | None:
        """(hash, entry, files) of the version's bundle deployed last, or None."""
        async with self._conn() as conn:
            row = await (await conn.execute(
                f"SELECT hash, entry, files FROM {ddl.VERSIONS} WHERE funnel = %s AND "
                "version = %s ORDER BY deployed_at DESC, created_at DESC LIMIT 1",
                (funnel, version))).fetchone()
        return (str(row[0]), str(row[1]), dict(row[2])) if row else None

    async def list_versions(self, funnel: str) -> list[dict[str, Any]]:
        """Every stored bundle of the funnel: version, hash, created_at, deployed_at (none
        when the version store does not exist yet)."""
        async with self._conn() as conn:
            exists = await (await conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                               (ddl.VERSIONS,))).fetchone()
            if not (exists and exists[0]):
                return []
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                f"SELECT version, hash, created_at, deployed_at FROM {ddl.VERSIONS} "
                "WHERE funnel = %s ORDER BY version, deployed_at", (funnel,))
            return await cur.fetchall()

    async def sessions_by_version(self, funnel: FunnelSpec) -> dict[int, int]:
        """How many sessions each version holds (``{}`` when the table does not exist)."""
        q = sql.SQL("SELECT funnel_version, COUNT(*) FROM {} GROUP BY 1").format(
            sql.Identifier(funnel.table))
        async with self._conn() as conn:
            exists = await (await conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                               (f'"{funnel.table}"',))).fetchone()
            if not (exists and exists[0]):
                return {}
            rows = await (await conn.execute(q)).fetchall()
        return {int(r[0]): int(r[1]) for r in rows}

    async def sessions_on_other_versions(self, funnel: FunnelSpec, after: str = "",
                                         limit: int = 500) -> list[dict[str, Any]]:
        """Rows (as JSON objects) not on ``funnel.version``, by session id after ``after``."""
        q = sql.SQL("SELECT session_id, to_jsonb(s) FROM {} s WHERE funnel_version <> %s "
                    "AND session_id > %s ORDER BY session_id LIMIT %s").format(
                        sql.Identifier(funnel.table))
        async with self._conn() as conn:
            rows = await (await conn.execute(q, (funnel.version, after, limit))).fetchall()
        return [dict(r[1]) for r in rows]

    async def move_session(self, funnel: FunnelSpec, values: dict[str, Any],
                           expected_version: int) -> bool:
        """Write a session's migrated state, stage and version if its row is still at
        ``expected_version`` (a turn in between wins; it moves the session itself)."""
        columns = ["stage", "stage_iteration", "funnel_version", *funnel.state]
        names = sql.SQL(", ").join(map(sql.Identifier, columns))
        q = sql.SQL(
            "UPDATE {t} SET ({names}) = (SELECT {names} FROM jsonb_populate_record(NULL::{t}, "
            "%s)), row_version = {t}.row_version + 1 WHERE session_id = %s AND "
            "row_version = %s").format(t=sql.Identifier(funnel.table), names=names)
        async with self._conn() as conn:
            cur = await conn.execute(q, (Jsonb(values, dumps=lambda v: dumps(v).decode()),
                                         values["session_id"], expected_version))
        return cur.rowcount == 1
