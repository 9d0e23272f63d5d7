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
                           files: dict[str, str], *, trial: bool = False) -> bool:
        """Store a version's bundle (or mark it deployed again); True when it was new.

        A ``trial`` (docs/versions.md) is stored by hash only: never the copy a pinned
        session loads, and storing it again changes nothing a deployment wrote (a
        deployed copy tried again stays deployed)."""
        if trial:
            # deployed_at of a trial: when it was last tried (what retention reads).
            q = (f"INSERT INTO {ddl.VERSIONS} AS v (funnel, version, hash, entry, files, trial) "
                 "VALUES (%s, %s, %s, %s, %s, TRUE) ON CONFLICT (funnel, version, hash) DO "
                 "UPDATE SET deployed_at = CASE WHEN v.trial THEN NOW() ELSE v.deployed_at END "
                 "RETURNING (xmax = 0)")
        else:
            q = (f"INSERT INTO {ddl.VERSIONS} (funnel, version, hash, entry, files) "
                 "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (funnel, version, hash) DO UPDATE "
                 "SET deployed_at = NOW(), trial = FALSE RETURNING (xmax = 0)")
        async with self._conn() as conn:
            row = await (await conn.execute(
                q, (funnel, version, digest, entry, Jsonb(files)))).fetchone()
        return bool(row and row[0])

    async def load_version(self, funnel: str, version: int
                           ) -> tuple[str, str, dict[str, str]] | None:
        """(hash, entry, files) of the version's bundle deployed last (never a trial), or
        None."""
        async with self._conn() as conn:
            row = await (await conn.execute(
                f"SELECT hash, entry, files FROM {ddl.VERSIONS} WHERE funnel = %s AND "
                "version = %s AND NOT trial ORDER BY deployed_at DESC, created_at DESC LIMIT 1",
                (funnel, version))).fetchone()
        return (str(row[0]), str(row[1]), dict(row[2])) if row else None

    async def list_versions(self, funnel: str) -> list[dict[str, Any]]:
        """Every stored bundle of the funnel: version, hash, created_at, deployed_at (for a
        trial: when it was last tried), trial, and for a trial the sessions whose turns ran
        on it (none when the version store does not exist yet)."""
        async with self._conn() as conn:
            exists = await (await conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                               (ddl.VERSIONS,))).fetchone()
            if not (exists and exists[0]):
                return []
            # A database not migrated yet (`funnel migrate`) has no trials.
            trials = await (await conn.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_schema = "
                "current_schema() AND table_name = %s AND column_name = 'trial'",
                (ddl.VERSIONS,))).fetchone()
            columns = (
                f"trial, CASE WHEN trial THEN (SELECT count(DISTINCT t.session_id) FROM "
                f"{ddl.TURNS} t WHERE t.funnel = v.funnel AND t.funnel_hash = v.hash) END"
                if trials else "FALSE AS trial, NULL::bigint")
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                f"SELECT version, hash, created_at, deployed_at, {columns} AS sessions "
                f"FROM {ddl.VERSIONS} v WHERE funnel = %s ORDER BY version, deployed_at",
                (funnel,))
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
