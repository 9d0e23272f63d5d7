"""The PostgreSQL store (psycopg 3, async pools). The only module that runs SQL.

Two pools: ``pool`` for short statements, ``lock_pool`` for the per-session
advisory locks that a turn holds while the model thinks (seconds). Keeping
them apart means slow model calls can never starve the short statements;
``lock_pool``'s size bounds how many turns one process runs at once (see
docs/persistence.md).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..errors import ConcurrentUpdate, SchemaOutdated, StoreError, StoreUnavailable
from ..prompts import Message
from ..spec import FunnelSpec
from . import ddl
from . import OutboxItem, TurnWrite

_ENGINE_ONLY = ("stage", "stage_iteration", "stage_history", "turns", "funnel_version",
                "notices")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_default)


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _safe_url(url: str) -> str:
    """The URL without its password, for error messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "the given database URL"
    host = info.get("host") or "localhost"
    return f"{host}:{info.get('port') or 5432}/{info.get('dbname') or ''}"


class _Table:
    """Statements for one funnel's session table, built once."""

    def __init__(self, spec: FunnelSpec) -> None:
        self.spec = spec
        t = sql.Identifier(spec.table)
        engine_types = {n: ty for n, ty, _, _ in ddl.engine_columns(spec)}
        self.columns: list[tuple[str, str]] = [("session_id", "text")]
        self.columns += [(n, engine_types[n]) for n in ("stage", "stage_iteration",
                                                         "stage_history")]
        self.columns += [(f.name, f.column_type) for f in spec.state.values()]
        self.columns += [(n, engine_types[n]) for n in ("turns", "funnel_version", "notices")]
        self.json_columns = {n for n, ty in self.columns if ty == "jsonb"}
        write_once = {f.name for f in spec.state.values() if f.write_once}
        names = [sql.Identifier(n) for n, _ in self.columns]
        values = [sql.SQL("{}::{}").format(sql.Placeholder(n), ddl.column_type(ty))
                  for n, ty in self.columns]
        sets = []
        for n, _ in self.columns[1:]:
            col = sql.Identifier(n)
            if n in write_once:
                sets.append(sql.SQL("{} = COALESCE({}.{}, EXCLUDED.{})").format(col, t, col, col))
            else:
                sets.append(sql.SQL("{} = EXCLUDED.{}").format(col, col))
        self.upsert = sql.SQL(
            "INSERT INTO {t} ({names}, row_version, created_at, updated_at, last_message_at) "
            "VALUES ({values}, 1, NOW(), NOW(), NOW()) "
            "ON CONFLICT (session_id) DO UPDATE SET {sets}, "
            "row_version = {t}.row_version + 1, updated_at = NOW(), last_message_at = NOW() "
            "WHERE {t}.row_version = %(__expected)s "
            "RETURNING row_version"
        ).format(t=t, names=sql.SQL(", ").join(names), values=sql.SQL(", ").join(values),
                 sets=sql.SQL(", ").join(sets))
        self.select = sql.SQL("SELECT * FROM {} WHERE session_id = %s").format(t)
        self.stage_of = sql.SQL("SELECT stage FROM {} WHERE session_id = %s").format(t)

    def params(self, write: TurnWrite) -> dict[str, Any]:
        out: dict[str, Any] = {"__expected": write.expected_version,
                               "session_id": write.session_id}
        for name, _ in self.columns[1:]:
            value = write.values.get(name)
            out[name] = Jsonb(value, dumps=_dumps) if name in self.json_columns and \
                value is not None else value
        return out


class PostgresStore:
    """A :class:`engine.store.Store` on PostgreSQL."""

    def __init__(self, url: str, pool: AsyncConnectionPool, lock_pool: AsyncConnectionPool,
                 timeout: float) -> None:
        self.url = url
        self.pool = pool
        self.lock_pool = lock_pool
        self.timeout = timeout
        self._tables: dict[str, _Table] = {}

    @classmethod
    async def open(cls, url: str, *, max_connections: int = 10, max_turns: int = 50,
                   timeout: float = 5.0) -> PostgresStore:
        """Open both pools and check the database answers.

        Raises:
            StoreUnavailable: no connection within ``timeout`` seconds.
        """
        kwargs: dict[str, Any] = {"autocommit": True}
        pool = AsyncConnectionPool(url, min_size=1, max_size=max_connections, open=False,
                                   kwargs=kwargs, timeout=timeout, check=AsyncConnectionPool.check_connection,
                                   name="funnel")
        lock_pool = AsyncConnectionPool(url, min_size=0, max_size=max_turns, open=False,
                                        kwargs=kwargs, timeout=timeout * 12,
                                        check=AsyncConnectionPool.check_connection,
                                        name="funnel-locks")
        store = cls(url, pool, lock_pool, timeout)
        try:
            await pool.open(wait=True, timeout=timeout)
            await lock_pool.open()
        except PoolTimeout:
            await store.close()
            raise StoreUnavailable(
                f"cannot connect to PostgreSQL at {_safe_url(url)} within {timeout:g} s; "
                "check that it runs and the URL (--db / FUNNEL_DB) is right"
            ) from None
        return store

    async def close(self) -> None:
        await self.pool.close()
        await self.lock_pool.close()

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        try:
            async with self.pool.connection(timeout=self.timeout) as conn:
                yield conn
        except PoolTimeout:
            raise StoreUnavailable(
                f"PostgreSQL at {_safe_url(self.url)} did not answer within {self.timeout:g} s; "
                "nothing was written"
            ) from None
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"lost the connection to PostgreSQL at {_safe_url(self.url)}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}; "
                "nothing was written"
            ) from None

    def table(self, spec: FunnelSpec) -> _Table:
        t = self._tables.get(spec.name)
        if t is None or t.spec is not spec:
            t = self._tables[spec.name] = _Table(spec)
        return t

    # -- schema ------------------------------------------------------------------------
    async def ensure_schema(self, funnel: FunnelSpec) -> None:
        from .migrate import apply_shared, existing_columns, migrate_funnel, missing_columns

        async with self._conn() as conn:
            await apply_shared(conn)
            if not await existing_columns(conn, funnel.table):
                await migrate_funnel(conn, funnel)  # a new table: create it under the lock
                return
            missing = await missing_columns(conn, funnel)
            if missing:
                raise SchemaOutdated(
                    f"table {funnel.table!r} is behind funnel '{funnel.name}' v{funnel.version}: "
                    f"missing column(s) {', '.join(missing)}; run `funnel migrate "
                    f"{funnel.path}` to add them"
                )

    async def migrate(self, funnel: FunnelSpec, *, drop: bool = False, check: bool = False
                      ) -> list[str]:
        from .migrate import migrate_funnel

        async with self._conn() as conn:
            return await migrate_funnel(conn, funnel, drop=drop, check=check)

    # -- turns -------------------------------------------------------------------------
    async def log_message(self, funnel: FunnelSpec, session_id: str, role: str, content: str
                          ) -> int:
        q = sql.SQL(
            "INSERT INTO {m} (funnel, session_id, role, content, stage) VALUES "
            "(%s, %s, %s, %s, COALESCE(({stage_of}), %s)) RETURNING id"
        ).format(m=sql.Identifier(ddl.MESSAGES), stage_of=self.table(funnel).stage_of)
        async with self._conn() as conn:
            row = await (await conn.execute(
                q, (funnel.name, session_id, role, content, session_id, funnel.initial)
            )).fetchone()
        assert row is not None
        return int(row[0])

    async def load(self, funnel: FunnelSpec, session_id: str) -> dict[str, Any] | None:
        async with self._conn() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self.table(funnel).select, (session_id,))
            return await cur.fetchone()

    async def recent_messages(self, funnel: FunnelSpec, session_id: str, limit: int,
                              current_id: int) -> list[Message]:
        if limit <= 0:
            return []
        # The window is applied in SQL. Replies logged after the current message
        # (a turn that finished while this message waited) still belong to it.
        q = sql.SQL(
            "SELECT role, content FROM (SELECT id, role, content FROM {m} "
            "WHERE funnel = %s AND session_id = %s AND id <> %s "
            "AND (id < %s OR role = 'assistant') ORDER BY id DESC LIMIT %s) w ORDER BY id"
        ).format(m=sql.Identifier(ddl.MESSAGES))
        async with self._conn() as conn:
            rows = await (await conn.execute(
                q, (funnel.name, session_id, current_id, current_id, limit))).fetchall()
        return [Message(r[0], r[1]) for r in rows]

    async def save_turn(self, funnel: FunnelSpec, write: TurnWrite) -> int:
        table = self.table(funnel)
        async with self._conn() as conn, conn.transaction():
            row = await (await conn.execute(table.upsert, table.params(write))).fetchone()
            if row is None:
                found = await (await conn.execute(
                    sql.SQL("SELECT row_version FROM {} WHERE session_id = %s").format(
                        sql.Identifier(funnel.table)), (write.session_id,))).fetchone()
                raise ConcurrentUpdate(write.session_id, write.expected_version,
                                       found[0] if found else None)
            if write.reply is not None:
                await conn.execute(
                    sql.SQL("INSERT INTO {} (funnel, session_id, role, content, stage) "
                            "VALUES (%s, %s, 'assistant', %s, %s)").format(
                                sql.Identifier(ddl.MESSAGES)),
                    (funnel.name, write.session_id, write.reply, write.stage_after))
            await self._record_turn(conn, funnel, write)
            for item in write.outbox:
                await self._enqueue(conn, funnel, write.session_id, item)
            return int(row[0])

    async def _record_turn(self, conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                           write: TurnWrite) -> None:
        t = write.turn
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (funnel, funnel_version, session_id, stage_before, stage_after, "
                "transitions, actions, refused, validation_failures, repaired, fallback, llm_ms, "
                "turn_ms, prompt_tokens, completion_tokens, cost, model, error) VALUES "
                "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            ).format(sql.Identifier(ddl.TURNS)),
            (funnel.name, funnel.version, write.session_id, t["stage_before"], t["stage_after"],
             Jsonb(t["transitions"], dumps=_dumps), Jsonb(t["actions"], dumps=_dumps),
             Jsonb(t["refused"], dumps=_dumps), t["validation_failures"], t["repaired"],
             t["fallback"], t.get("llm_ms"), t.get("turn_ms"), t["prompt_tokens"],
             t["completion_tokens"], t.get("cost"), t.get("model"), t.get("error")))

    async def _enqueue(self, conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                       session_id: str, item: OutboxItem) -> None:
        await conn.execute(
            sql.SQL("INSERT INTO {} (idempotency_key, funnel, session_id, kind, payload) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (idempotency_key) DO NOTHING"
                    ).format(sql.Identifier(ddl.OUTBOX)),
            (item.key, funnel.name, session_id, item.kind, Jsonb(item.payload, dumps=_dumps)))

    @asynccontextmanager
    async def session_lock(self, funnel: FunnelSpec, session_id: str) -> AsyncIterator[None]:
        key = f"{funnel.name}/{session_id}"
        try:
            async with self.lock_pool.connection() as conn:
                await conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
                try:
                    yield
                finally:
                    try:
                        await conn.execute(
                            "SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))
                    except psycopg.Error:
                        await conn.close()  # a closed connection releases its locks
        except PoolTimeout:
            raise StoreUnavailable(
                f"no database connection for session {session_id!r}: too many turns are "
                "running at once or PostgreSQL is not answering; try again"
            ) from None
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"lost the connection to PostgreSQL: {exc}") from None

    # -- outbox ------------------------------------------------------------------------
    async def claim_outbox(self, funnel: str | None = None, session_id: str | None = None,
                           limit: int = 50) -> list[dict[str, Any]]:
        # Claiming pushes next_attempt_at forward, so two dispatchers never send
        # the same row at once; a crashed dispatcher's claim expires by itself.
        q = sql.SQL(
            "UPDATE {o} SET attempts = attempts + 1, next_attempt_at = NOW() + INTERVAL '60 s' "
            "WHERE id IN (SELECT id FROM {o} WHERE delivered_at IS NULL "
            "AND next_attempt_at <= NOW() AND (%(f)s::text IS NULL OR funnel = %(f)s) "
            "AND (%(s)s::text IS NULL OR session_id = %(s)s) ORDER BY id LIMIT %(n)s "
            "FOR UPDATE SKIP LOCKED) RETURNING id, idempotency_key, funnel, session_id, kind, "
            "payload, attempts"
        ).format(o=sql.Identifier(ddl.OUTBOX))
        async with self._conn() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(q, {"f": funnel, "s": session_id, "n": limit})
            return await cur.fetchall()

    async def finish_outbox(self, item_id: int, error: str | None) -> None:
        o = sql.Identifier(ddl.OUTBOX)
        async with self._conn() as conn:
            if error is None:
                await conn.execute(sql.SQL("UPDATE {} SET delivered_at = NOW(), last_error = NULL "
                                           "WHERE id = %s").format(o), (item_id,))
            else:
                await conn.execute(sql.SQL(
                    "UPDATE {} SET last_error = %s, next_attempt_at = NOW() + "
                    "LEAST(3600, 5 * POWER(2, attempts)) * INTERVAL '1 s' WHERE id = %s"
                ).format(o), (error[:1000], item_id))

    async def history(self, funnel: FunnelSpec, session_id: str, limit: int
                      ) -> list[dict[str, Any]]:
        q = sql.SQL(
            "SELECT role, content, stage, created_at FROM (SELECT * FROM {} WHERE funnel = %s "
            "AND session_id = %s ORDER BY id DESC LIMIT %s) m ORDER BY id"
        ).format(sql.Identifier(ddl.MESSAGES))
        async with self._conn() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(q, (funnel.name, session_id, limit))
            return await cur.fetchall()


__all__ = ["PostgresStore", "StoreError"]
