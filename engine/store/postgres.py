"""The PostgreSQL store (psycopg 3, one async pool).

One pool of connections, each used only for the length of a statement: a
turn holds a lease on its session (``engine.store.session``), not a
connection, while the model thinks. See docs/persistence.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..errors import SchemaOutdated, StoreUnavailable, first_line
from ..format.spec import FunnelSpec
from ..records.chunks import Chunk
from ..records.messages import Message
from ..records.orders import Conversion, Order
from . import conversions, ddl, erasure, jobs, retention, turns
from . import knowledge as knowledge_sql
from . import recall as recall_sql
from .base import Match, TurnWrite, VectorSupport
from .connect import safe_url
from .control import ControlMixin
from .delivery import DeliveryMixin
from .follow_ups import FollowUpMixin
from .health import Health, configure
from .heartbeat import Heartbeat
from .migrate import (
    apply_shared,
    ensure_turn_function,
    existing_columns,
    migrate_funnel,
    missing_columns,
)
from .session import SessionHandle, save_turn_on
from .statements import Statements
from .versions import VersionsMixin


class _Checkout:
    """One use of a pooled connection. A class, not a generator-based context manager:
    every turn takes two, and this is the cheaper of the two by a fair margin."""

    __slots__ = ("store", "conn")

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.conn: psycopg.AsyncConnection[Any] | None = None

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        store = self.store
        try:
            try:
                self.conn = await store.pool.getconn(timeout=store.timeout)
            except PoolTimeout:
                # After a restart the pool discards a broken connection and backs off
                # about a second before trying the next one, which outlasts `timeout`.
                # Checking every idle connection at once leaves only good ones.
                if not store.health.recently_broken():
                    raise
                await store.pool.check()
                self.conn = await store.pool.getconn(timeout=store.timeout)
        except PoolTimeout:
            raise store._timed_out() from None
        except psycopg.OperationalError as exc:
            raise store._lost(exc) from None
        return self.conn

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: object) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            self.store.health.used(conn)
            await self.store.pool.putconn(conn)  # rolls back whatever a failure left open
        if isinstance(exc, PoolTimeout):
            raise self.store._timed_out() from None
        if isinstance(exc, psycopg.OperationalError):
            raise self.store._lost(exc) from None


class _Turn:
    """``async with store.session(...)``: a slot among the process's turns in flight and
    a :class:`SessionHandle`; a lease the turn still holds is given back on the way out."""

    __slots__ = ("store", "funnel", "session_id", "handle")

    def __init__(self, store: PostgresStore, funnel: FunnelSpec, session_id: str) -> None:
        self.store, self.funnel, self.session_id = store, funnel, session_id
        self.handle: SessionHandle | None = None

    async def __aenter__(self) -> SessionHandle:
        store = self.store
        try:
            if store._turns.locked():  # wait_for costs a task: only when there is a wait
                await asyncio.wait_for(store._turns.acquire(), timeout=store.turn_wait)
            else:
                await store._turns.acquire()
        except TimeoutError:
            raise StoreUnavailable(
                f"no room for session {self.session_id!r}: {store.max_turns} turns are "
                "running in this process; try again") from None
        key = f"{self.funnel.name}/{self.session_id}"
        self.handle = SessionHandle(store.table(self.funnel), store._conn, self.session_id,
                                    wait=store.turn_wait, holder=store._orphans.pop(key, None),
                                    renew=store.heartbeat.hold, tables=store.table)
        return self.handle

    async def __aexit__(self, *exc: object) -> None:
        handle, store = self.handle, self.store
        if handle is not None:
            store.heartbeat.drop(handle.holder)
        try:
            if handle is not None and handle.locked and not await handle.release():
                store._orphans[handle.key] = handle.holder
        finally:
            store._turns.release()


class PostgresStore(DeliveryMixin, VersionsMixin, ControlMixin, FollowUpMixin):
    """A :class:`engine.store.Store` on PostgreSQL."""

    def __init__(self, url: str, pool: AsyncConnectionPool, timeout: float,
                 health: Health | None = None, max_turns: int = 500) -> None:
        self.url = url
        self.pool = pool
        self.timeout = timeout
        self.max_turns = max_turns
        self._turns = asyncio.Semaphore(max_turns)
        self._orphans: dict[str, str] = {}  # leases not given back: session key -> holder
        # A turn may wait this long for its session (another turn's model call) or a slot.
        self.turn_wait = timeout * 24
        self.health = health or Health()
        self._tables: dict[tuple[str, int], Statements] = {}
        self._vectors: VectorSupport | None = None  # recall_prepare's answer
        self.heartbeat = Heartbeat(self._conn)

    @classmethod
    async def open(cls, url: str, *, max_connections: int = 10, max_turns: int = 500,
                   timeout: float = 5.0) -> PostgresStore:
        """Open the pool and check the database answers.

        Raises:
            StoreUnavailable: no connection within ``timeout`` seconds.
        """
        # One direct attempt first: a wrong database name, user or password is then
        # reported at once, in PostgreSQL's words, instead of after the pool's
        # `timeout` of silent retries (and its log lines).
        try:
            probe = await psycopg.AsyncConnection.connect(
                url, autocommit=True, connect_timeout=max(1, int(timeout)))
        except psycopg.OperationalError as exc:
            text = str(exc)
            if "FATAL:" in text:  # the server answered: no such database, user, password
                reason = text.split("FATAL:", 1)[1].strip().splitlines()[0]
                raise StoreUnavailable(
                    f"cannot connect to PostgreSQL at {safe_url(url)}: {reason}; check the "
                    "URL (--db / FUNNEL_DB)") from None
            raise StoreUnavailable(
                f"cannot connect to PostgreSQL at {safe_url(url)} within {timeout:g} s; "
                "check that it runs and the URL (--db / FUNNEL_DB) is right") from None
        await probe.close()
        kwargs: dict[str, Any] = {"autocommit": True}
        health = Health()
        # psycopg_pool retries a failed connection in the background with a doubling
        # delay (1, 2, 4, ... s) for up to 5 minutes: after a minute down, the next
        # attempt may come a minute after the database is back, and every request
        # times out until then. Giving up after ``timeout`` lets the next request
        # start a fresh attempt at once.
        pool = AsyncConnectionPool(url, min_size=1, max_size=max_connections, open=False,
                                   kwargs=kwargs, timeout=timeout, check=health.check,
                                   configure=configure,
                                   name="funnel",
                                   reconnect_timeout=timeout)
        store = cls(url, pool, timeout, health, max_turns)
        try:
            await pool.open(wait=True, timeout=timeout)
        except PoolTimeout:
            await store.close()
            raise StoreUnavailable(
                f"cannot connect to PostgreSQL at {safe_url(url)} within {timeout:g} s; "
                "check that it runs and the URL (--db / FUNNEL_DB) is right"
            ) from None
        return store

    async def close(self) -> None:
        await self.heartbeat.close()
        await self.pool.close()

    def _conn(self) -> _Checkout:
        """``async with store._conn() as conn``: a pooled connection, with the pool's and
        the connection's failures raised as :class:`StoreUnavailable`."""
        return _Checkout(self)

    def _timed_out(self) -> StoreUnavailable:
        return StoreUnavailable(
            f"PostgreSQL at {safe_url(self.url)} did not answer within {self.timeout:g} s; "
            "nothing was written")

    def _lost(self, exc: BaseException) -> StoreUnavailable:
        self.health.distrust()
        return StoreUnavailable(
            f"lost the connection to PostgreSQL at {safe_url(self.url)}: {first_line(exc)}; "
            "nothing was written")

    def table(self, spec: FunnelSpec) -> Statements:
        # Per version: sessions pinned to an old version save with its statements.
        key = (spec.name, spec.version)
        t = self._tables.get(key)
        if t is None or t.spec is not spec:
            t = self._tables[key] = Statements(spec)
        return t

    # -- schema ------------------------------------------------------------------------
    async def ensure_schema(self, funnel: FunnelSpec) -> None:
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
            await ensure_turn_function(conn, funnel)

    async def check_schema(self, funnel: FunnelSpec) -> tuple[list[str], list[str]]:
        """(columns the funnel declares that its table lacks, columns the table has that
        the funnel does not declare): the first blocks turns, the second does not."""
        declared = [name for name, _ in ddl.column_defs(funnel)]
        async with self._conn() as conn:
            have = await existing_columns(conn, funnel.table)
        return [c for c in declared if c not in have], [c for c in have if c not in declared]

    async def migrate(self, funnel: FunnelSpec, *, drop: bool = False, check: bool = False
                      ) -> list[str]:
        async with self._conn() as conn:
            return await migrate_funnel(conn, funnel, drop=drop, check=check)

    # -- turns -------------------------------------------------------------------------
    async def log_message(self, funnel: FunnelSpec, session_id: str, role: str, content: str
                          ) -> int:
        q = self.table(funnel).log
        async with self._conn() as conn:
            row = await (await conn.execute(
                q, (funnel.name, session_id, role, content, session_id, funnel.initial)
            )).fetchone()
        assert row is not None
        return int(row[0])

    async def load(self, funnel: FunnelSpec, session_id: str) -> dict[str, Any] | None:
        async with self._conn() as conn:
            cur = conn.cursor(row_factory=dict_row)
            try:
                # Not prepared: its columns change when a migration adds one (a prepared
                # `SELECT *` would then fail with "cached plan must not change result type").
                await cur.execute(self.table(funnel).select_row, (session_id,), prepare=False)
            except psycopg.errors.UndefinedTable:
                raise SchemaOutdated(
                    f"table {funnel.table} does not exist in {safe_url(self.url)} yet: no "
                    f"session of funnel '{funnel.name}' was saved there; run `funnel migrate` "
                    "for it, or check --db / FUNNEL_DB") from None
            return await cur.fetchone()

    async def save_turn(self, funnel: FunnelSpec, write: TurnWrite) -> int:
        table = self.table(funnel)
        async with self._conn() as conn:
            return await save_turn_on(conn, table, write)

    def session(self, funnel: FunnelSpec, session_id: str) -> _Turn:
        """One turn's access to a session: ``load`` takes its lease, ``save`` gives it back.

        No connection is held in between. At most ``max_turns`` turns of this
        process are in flight at once; a turn past that waits for a slot.
        """
        return _Turn(self, funnel, session_id)

    async def purge(self, funnel: FunnelSpec, older_than: float, *, anonymize: bool = False,
                    batch: int = 1000) -> dict[str, int]:
        """Delete (or anonymize) sessions idle for more than ``older_than`` seconds, with their
        messages, turn records and outbox rows, ``batch`` sessions per transaction."""
        return await retention.purge(self._conn, funnel, older_than, anonymize=anonymize, batch=batch)

    async def purge_when_due(self, funnel: FunnelSpec, older_than: float, period: float, *,
                             anonymize: bool = False) -> tuple[str, dict[str, int] | None]:
        """:meth:`purge` if no other worker runs it now and it did not run within ``period``
        seconds (engine.store.jobs): ``("done", counts)``, else ``("busy"|"not_due", None)``."""
        return await jobs.run_if_due(
            self._conn, f"retention:{funnel.name}", period,
            lambda: self.purge(funnel, older_than, anonymize=anonymize), result=dict)

    async def purge_preview(self, funnel: FunnelSpec, older_than: float, *,
                            anonymize: bool = False) -> dict[str, int] | None:
        """What :meth:`purge` would touch, counted; ``None`` when the funnel has no table."""
        return await retention.preview(self._conn, funnel, older_than, anonymize=anonymize)

    async def erase_session(self, funnel: FunnelSpec, session_id: str, *, by: str,
                            wait: float = 60.0) -> dict[str, Any]:
        """Delete every copy of one session after its turn; the receipt (engine.store.erasure)."""
        return await erasure.erase(self._conn, funnel, session_id, by=by, wait=wait)

    async def export_session(self, funnel: FunnelSpec, session_id: str, *, by: str
                             ) -> dict[str, Any]:
        """Everything stored of one session, as one JSON-ready document."""
        return await erasure.export(self._conn, funnel, session_id, by=by)

    async def turn_records(self, funnel: FunnelSpec, session_id: str, limit: int = 1000
                           ) -> list[dict[str, Any]]:
        """A session's turn records, oldest first, with each turn's message and reply."""
        return await turns.turn_records(self._conn, funnel.name, session_id, limit)

    async def record_conversion(self, funnel: FunnelSpec, order: Order) -> Conversion:
        """Record an order against its session, once per order id (engine.records.orders)."""
        return await conversions.record(self._conn, funnel, order)

    async def summary_backlog(self, funnel: FunnelSpec, session_id: str, window: int,
                              limit: int = 200) -> tuple[str, int, list[tuple[int, Message]]]:
        """(summary, summary_upto, messages that left the window and are not summarized)."""
        field = funnel.memory.summary
        assert field is not None
        async with self._conn() as conn:
            row = await (await conn.execute(sql.SQL(
                "SELECT {}, summary_upto FROM {} WHERE session_id = %s").format(
                    sql.Identifier(field), sql.Identifier(funnel.table)),
                (session_id,))).fetchone()
            if row is None:
                return "", 0, []
            rows = await (await conn.execute(
                f"SELECT id, role, content FROM {ddl.MESSAGES} WHERE funnel = %s AND "
                "session_id = %s AND id > %s AND id < COALESCE((SELECT MIN(id) FROM (SELECT id "
                f"FROM {ddl.MESSAGES} WHERE funnel = %s AND session_id = %s ORDER BY id DESC "
                "LIMIT %s) w), 9223372036854775807) ORDER BY id LIMIT %s",
                (funnel.name, session_id, row[1], funnel.name, session_id, window, limit),
            )).fetchall()
        return row[0] or "", int(row[1]), [(int(r[0]), Message(r[1], r[2])) for r in rows]

    async def save_summary(self, funnel: FunnelSpec, session_id: str, summary: str,
                           old_upto: int, new_upto: int) -> bool:
        """Store a new summary if no other job got there first (compare-and-set on
        ``summary_upto``). No lease is needed: a turn's save keeps the summary columns
        unless it folded a summary itself, and this leaves ``row_version`` alone, so a
        turn in flight is never made to retry."""
        field = funnel.memory.summary
        assert field is not None
        update = sql.SQL(
            "UPDATE {} SET {} = %s, summary_upto = %s WHERE session_id = %s "
            "AND summary_upto = %s").format(sql.Identifier(funnel.table), sql.Identifier(field))
        async with self._conn() as conn:
            cur = await conn.execute(update, (summary, new_upto, session_id, old_upto))
            return cur.rowcount == 1

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

    # -- knowledge (engine/knowledge, docs/knowledge.md) --------------------------------
    async def knowledge_digest(self, funnel: str) -> str | None:
        async with self._conn() as conn:
            return await knowledge_sql.digest_of(conn, funnel)

    async def knowledge_replace(self, funnel: str, chunks: Sequence[Chunk], digest: str,
                                language: str | None) -> str:
        async with self._conn() as conn:
            config = await knowledge_sql.text_config(conn, language)
            await knowledge_sql.replace(conn, funnel, chunks, digest, config)
            return config

    async def knowledge_search(self, funnel: str, query: str, limit: int
                               ) -> list[tuple[Chunk, float]]:
        async with self._conn() as conn:
            return await knowledge_sql.search(conn, funnel, query, limit)

    # -- semantic recall (engine/memory/recall.py, docs/memory.md) ----------------------
    async def recall_prepare(self) -> VectorSupport:
        async with self._conn() as conn:
            self._vectors = await recall_sql.prepare(conn)
            return self._vectors

    async def recall_pending(self, funnel: str, session_id: str, model: str, limit: int
                             ) -> list[tuple[int, str]]:
        async with self._conn() as conn:
            return await recall_sql.pending(conn, funnel, session_id, model, limit)

    async def recall_save(self, funnel: str, model: str,
                          vectors: Sequence[tuple[int, Sequence[float]]]) -> None:
        async with self._conn() as conn:
            await recall_sql.save(conn, funnel, model, vectors)

    async def recall_dimension(self, model: str) -> int | None:
        vectors = self._vectors or await self.recall_prepare()
        async with self._conn() as conn:
            return await recall_sql.dimension(conn, vectors, model)

    async def recall_search(self, funnel: str, session_id: str, model: str,
                            query: Sequence[float], *, upto: int, top_k: int, before: int,
                            after: int, min_similarity: float) -> list[Match]:
        vectors = self._vectors or await self.recall_prepare()
        async with self._conn() as conn:
            return await recall_sql.search(conn, vectors, funnel, session_id, model, query,
                                           upto=upto, top_k=top_k, before=before,
                                           after=after, min_similarity=min_similarity)


__all__ = ["PostgresStore", "SessionHandle"]
