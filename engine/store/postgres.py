"""The PostgreSQL store (psycopg 3, async pools). The only module that runs SQL.

Two pools: ``pool`` for short statements, ``lock_pool`` for the per-session
advisory locks that a turn holds while the model thinks (seconds). Keeping
them apart means slow model calls can never starve the short statements;
``lock_pool``'s size bounds how many turns one process runs at once (see
docs/persistence.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..errors import ConcurrentUpdate, SchemaOutdated, StoreUnavailable
from ..prompts import Message
from ..spec import FunnelSpec
from . import TurnWrite, ddl


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


class _Health:
    """Checks a pooled connection before use only if it sat idle for a while.

    Checking every checkout costs a round trip per statement; checking none
    hands out connections that a database restart broke. A connection used in
    the last few seconds is trusted; an older one gets an empty query, and the
    pool replaces it if that fails (so the pool reconnects by itself).
    """

    def __init__(self, trust_seconds: float = 2.0) -> None:
        self.trust = trust_seconds
        self.last_used: dict[int, float] = {}

    async def check(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if time.monotonic() - self.last_used.get(id(conn), 0.0) > self.trust:
            await conn.execute("")

    async def reset(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.last_used[id(conn)] = time.monotonic()

    def distrust(self) -> None:
        """A connection was lost, so the server may have restarted: every pooled
        connection is checked at its next use, however recently it was used.
        Otherwise each of them would fail one turn before the pool replaces it."""
        self.last_used.clear()


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
        update_sets = []
        # The rolling summary is written only by the summarizer (engine.memory).
        only_insert = {spec.memory.summary} if spec.memory.summary else set()
        for (n, _), value in zip(self.columns[1:], values[1:], strict=True):
            if n in only_insert:
                # Written by a turn only when it folded a new summary (else kept).
                keep = sql.SQL("{} = COALESCE(%(__summary)s::text, {}.{})").format(
                    sql.Identifier(n), t, sql.Identifier(n))
                sets.append(keep)
                update_sets.append(keep)
                continue
            col = sql.Identifier(n)
            if n in write_once:
                sets.append(sql.SQL("{} = COALESCE({}.{}, EXCLUDED.{})").format(col, t, col, col))
                update_sets.append(sql.SQL("{} = COALESCE({}.{}, {})").format(col, t, col, value))
            else:
                sets.append(sql.SQL("{} = EXCLUDED.{}").format(col, col))
                update_sets.append(sql.SQL("{} = {}").format(col, value))
        upto = sql.SQL("summary_upto = COALESCE(%(__summary_upto)s::bigint, {}.summary_upto)"
                       ).format(t)
        # A session the turn loaded is only ever updated: if it was deleted
        # meanwhile (purge), the save must not bring it back.
        update = sql.SQL(
            "UPDATE {t} SET {sets}, {upto}, row_version = {t}.row_version + 1, updated_at = %(__now)s, "
            "last_message_at = %(__now)s WHERE session_id = %(session_id)s "
            "AND row_version = %(__expected)s RETURNING row_version"
        ).format(t=t, sets=sql.SQL(", ").join(update_sets), upto=upto)
        upsert = sql.SQL(
            "INSERT INTO {t} ({names}, row_version, created_at, updated_at, last_message_at) "
            "VALUES ({values}, 1, %(__now)s, %(__now)s, %(__now)s) "
            "ON CONFLICT (session_id) DO UPDATE SET {sets}, {upto}, "
            "row_version = {t}.row_version + 1, updated_at = %(__now)s, "
            "last_message_at = %(__now)s "
            "WHERE {t}.row_version = %(__expected)s "
            "RETURNING row_version"
        ).format(t=t, names=sql.SQL(", ").join(names), values=sql.SQL(", ").join(values),
                 sets=sql.SQL(", ").join(sets), upto=upto)
        # One statement saves the whole turn: the state (if the version still
        # matches), the reply, the turn record and the outbox rows. Atomic, one
        # round trip, one commit; nothing but the state is written on a mismatch.
        def whole_turn(write: sql.Composable) -> str:
            return sql.SQL(
                "WITH s AS ({write}), "
                "m AS (INSERT INTO {messages} (funnel, session_id, role, content, stage) "
                "SELECT %(__funnel)s, %(session_id)s, 'assistant', %(__reply)s::text, "
                "%(__stage_after)s FROM s WHERE %(__reply)s::text IS NOT NULL), "
                "tr AS (INSERT INTO {turns} (funnel, funnel_version, session_id, stage_before, "
                "stage_after, transitions, actions, refused, validation_failures, repaired, fallback, "
                "llm_ms, turn_ms, prompt_tokens, completion_tokens, cost, model, error) "
                "SELECT %(__funnel)s, %(funnel_version)s, %(session_id)s, %(__t_stage_before)s, "
                "%(__stage_after)s, %(__t_transitions)s, %(__t_actions)s, %(__t_refused)s, "
                "%(__t_validation_failures)s, %(__t_repaired)s, %(__t_fallback)s, %(__t_llm_ms)s, "
                "%(__t_turn_ms)s, %(__t_prompt_tokens)s, %(__t_completion_tokens)s, "
                "%(__t_cost)s, %(__t_model)s, %(__t_error)s FROM s), "
                "o AS (INSERT INTO {outbox} (idempotency_key, funnel, session_id, kind, payload) "
                "SELECT x.key, %(__funnel)s, %(session_id)s, x.kind, x.payload FROM s, "
                "jsonb_to_recordset(%(__outbox)s::jsonb) AS x(key text, kind text, payload jsonb) "
                "ON CONFLICT (idempotency_key) DO NOTHING) "
                "SELECT row_version FROM s"
            ).format(write=write, messages=sql.Identifier(ddl.MESSAGES),
                     turns=sql.Identifier(ddl.TURNS), outbox=sql.Identifier(ddl.OUTBOX)).as_string()

        self.save = whole_turn(upsert)
        self.save_existing = whole_turn(update)
        if spec.memory.summary:
            # With the row: how many messages are not folded into the summary yet.
            self.select = sql.SQL(
                "SELECT s.*, (SELECT COUNT(*) FROM {m} WHERE funnel = %s AND session_id = "
                "s.session_id AND id > s.summary_upto) AS message_backlog FROM {t} s "
                "WHERE s.session_id = %s").format(m=sql.Identifier(ddl.MESSAGES), t=t).as_string()
            self.select_args: tuple[str, ...] = (spec.name,)
        else:
            self.select = sql.SQL("SELECT * FROM {} WHERE session_id = %s").format(t).as_string()
            self.select_args = ()
        self.log = sql.SQL(
            "INSERT INTO {m} (funnel, session_id, role, content, stage) VALUES "
            "(%s, %s, %s, %s, COALESCE((SELECT stage FROM {t} WHERE session_id = %s), %s)) "
            "RETURNING id"
        ).format(m=sql.Identifier(ddl.MESSAGES), t=t).as_string()
        self.version_of = sql.SQL("SELECT row_version FROM {} WHERE session_id = %s").format(
            t).as_string()

    def statement(self, write: TurnWrite) -> str:
        """INSERT-or-update for a new session, UPDATE for one the turn loaded."""
        return self.save if write.expected_version == 0 else self.save_existing

    def params(self, write: TurnWrite) -> dict[str, Any]:
        # Timestamps come from the engine's clock (tests and scenarios move it);
        # without one, the current time.
        out: dict[str, Any] = {"__expected": write.expected_version,
                               "session_id": write.session_id,
                               "__now": write.message_time or datetime.now(UTC)}
        for name, _ in self.columns[1:]:
            value = write.values.get(name)
            out[name] = Jsonb(value, dumps=_dumps) if name in self.json_columns and \
                value is not None else value
        t = write.turn
        out["__summary_upto"] = write.summary_upto
        if self.spec.memory.summary:
            out["__summary"] = write.summary
        out.update({
            "__funnel": self.spec.name, "__reply": write.reply,
            "__stage_after": write.stage_after, "__t_stage_before": t["stage_before"],
            "__t_transitions": Jsonb(t["transitions"], dumps=_dumps),
            "__t_actions": Jsonb(t["actions"], dumps=_dumps),
            "__t_refused": Jsonb(t["refused"], dumps=_dumps),
            "__outbox": Jsonb([{"key": o.key, "kind": o.kind, "payload": o.payload}
                               for o in write.outbox], dumps=_dumps),
        })
        for key in ("validation_failures", "repaired", "fallback", "llm_ms", "turn_ms",
                    "prompt_tokens", "completion_tokens", "cost", "model", "error"):
            out[f"__t_{key}"] = t.get(key)
        return out


class PostgresStore:
    """A :class:`engine.store.Store` on PostgreSQL."""

    def __init__(self, url: str, pool: AsyncConnectionPool, lock_pool: AsyncConnectionPool,
                 timeout: float, health: _Health | None = None) -> None:
        self.url = url
        self.pool = pool
        self.lock_pool = lock_pool
        self.timeout = timeout
        self.health = health or _Health()
        self._tables: dict[str, _Table] = {}

    @classmethod
    async def open(cls, url: str, *, max_connections: int = 10, max_turns: int = 50,
                   timeout: float = 5.0) -> PostgresStore:
        """Open both pools and check the database answers.

        Raises:
            StoreUnavailable: no connection within ``timeout`` seconds.
        """
        kwargs: dict[str, Any] = {"autocommit": True}
        health = _Health()
        # psycopg_pool retries a failed connection in the background with a doubling
        # delay (1, 2, 4, ... s) for up to 5 minutes: after a minute down, the next
        # attempt may come a minute after the database is back, and every request
        # times out until then. Giving up after ``timeout`` lets the next request
        # start a fresh attempt at once.
        pool = AsyncConnectionPool(url, min_size=1, max_size=max_connections, open=False,
                                   kwargs=kwargs, timeout=timeout, check=health.check,
                                   reset=health.reset, name="funnel",
                                   reconnect_timeout=timeout)
        lock_pool = AsyncConnectionPool(url, min_size=0, max_size=max_turns, open=False,
                                        kwargs=kwargs, timeout=timeout * 12, check=health.check,
                                        reset=health.reset, name="funnel-locks",
                                        reconnect_timeout=timeout)
        store = cls(url, pool, lock_pool, timeout, health)
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
            self.health.distrust()
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
            await cur.execute(self.table(funnel).select, (*self.table(funnel).select_args, session_id))
            return await cur.fetchone()

    async def recent_messages(self, funnel: FunnelSpec, session_id: str, limit: int,
                              current_id: int) -> list[Message]:
        if limit <= 0:
            return []
        async with self._conn() as conn:
            rows = await (await conn.execute(
                _RECENT, (funnel.name, session_id, current_id, current_id, limit))).fetchall()
        return [Message(r[0], r[1], r[2]) for r in rows]

    async def save_turn(self, funnel: FunnelSpec, write: TurnWrite) -> int:
        table = self.table(funnel)
        async with self._conn() as conn:
            return await _save(conn, table, write)

    @asynccontextmanager
    async def session(self, funnel: FunnelSpec, session_id: str) -> AsyncIterator[SessionHandle]:
        """Hold the session's lock for one turn; load and save through the handle."""
        conn = await self._lock_connection(session_id)
        try:
            handle = SessionHandle(self.table(funnel), conn, session_id)
            try:
                yield handle
            finally:
                if handle.locked:
                    await handle.release()
        except psycopg.OperationalError as exc:
            self.health.distrust()
            raise StoreUnavailable(f"lost the connection to PostgreSQL at "
                                   f"{_safe_url(self.url)}: {_first_line(exc)}; the turn was "
                                   "not saved") from None
        finally:
            await self.lock_pool.putconn(conn)

    async def _lock_connection(self, session_id: str) -> psycopg.AsyncConnection[Any]:
        """A connection for one turn, from ``lock_pool``.

        Waiting for a free one is normal while many turns run (up to the lock
        pool's timeout), but a database that is down must fail fast, not after
        that long wait: when no connection comes within ``timeout``, one empty
        statement on the short pool tells a busy pool from an unreachable server.
        """
        deadline = time.monotonic() + self.lock_pool.timeout
        while True:
            try:
                return await self.lock_pool.getconn(
                    timeout=max(0.01, min(self.timeout, deadline - time.monotonic())))
            except PoolTimeout:
                pass
            async with self._conn() as probe:  # StoreUnavailable (naming the server) if down
                await probe.execute("")
            if time.monotonic() >= deadline:
                raise StoreUnavailable(
                    f"no database connection for session {session_id!r}: too many turns are "
                    "running at once; try again"
                )

    @asynccontextmanager
    async def session_lock(self, funnel: FunnelSpec, session_id: str) -> AsyncIterator[None]:
        async with self.session(funnel, session_id) as handle:
            await handle.lock()
            yield

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

    async def purge(self, funnel: FunnelSpec, older_than: float, *, anonymize: bool = False,
                    batch: int = 1000) -> dict[str, int]:
        """Delete (or anonymize) sessions idle for more than ``older_than`` seconds, with their
        messages, turn records and outbox rows, ``batch`` sessions per transaction."""
        t = sql.Identifier(funnel.table)
        personal = [f for f in funnel.state.values() if f.personal]
        counts = {"sessions": 0, "messages": 0, "turns": 0}
        pick = sql.SQL(
            "SELECT session_id FROM {t} WHERE last_message_at < NOW() - %s * INTERVAL '1 s' "
            "{extra} ORDER BY session_id LIMIT %s FOR UPDATE SKIP LOCKED"
        )
        while True:
            async with self._conn() as conn, conn.transaction():
                if anonymize:
                    extra = sql.SQL("AND NOT (notices @> '[\"anonymized\"]')")
                    ids = [r[0] for r in await (await conn.execute(
                        pick.format(t=t, extra=extra), (older_than, batch))).fetchall()]
                    if not ids:
                        return counts
                    sets: list[sql.Composable] = [sql.SQL("{} = {}").format(sql.Identifier(f.name),
                                                       _default_literal(f))
                            for f in personal]
                    # The rolling summary retells the messages whose text is cleared below.
                    summary = funnel.state.get(funnel.memory.summary or "")
                    if summary is not None and not summary.personal:
                        sets.append(sql.SQL("{} = {}").format(sql.Identifier(summary.name),
                                                              _default_literal(summary)))
                    sets.append(sql.SQL("notices = '[\"anonymized\"]'::jsonb"))
                    await conn.execute(sql.SQL("UPDATE {} SET {} WHERE session_id = ANY(%s)")
                                       .format(t, sql.SQL(", ").join(sets)), (ids,))
                    # Outbox payloads (the handoff alert) carry a copy of the state.
                    payload: sql.Composable = sql.SQL("payload")
                    for f in personal:
                        payload = sql.SQL("({} #- ARRAY['state', {}]) - {}").format(
                            payload, sql.Literal(f.name), sql.Literal(f.name))
                    if personal:
                        await conn.execute(sql.SQL(
                            "UPDATE {} SET payload = {} WHERE funnel = %s AND "
                            "session_id = ANY(%s)").format(sql.Identifier(ddl.OUTBOX), payload),
                            (funnel.name, ids))
                    cur = await conn.execute(sql.SQL(
                        "UPDATE {} SET content = '[anonymized]' WHERE funnel = %s AND "
                        "session_id = ANY(%s)").format(sql.Identifier(ddl.MESSAGES)),
                        (funnel.name, ids))
                    counts["messages"] += cur.rowcount
                else:
                    ids = [r[0] for r in await (await conn.execute(
                        pick.format(t=t, extra=sql.SQL("")), (older_than, batch))).fetchall()]
                    if not ids:
                        return counts
                    for table, key in ((ddl.MESSAGES, "messages"), (ddl.TURNS, "turns"),
                                       (ddl.OUTBOX, None)):
                        cur = await conn.execute(sql.SQL(
                            "DELETE FROM {} WHERE funnel = %s AND session_id = ANY(%s)").format(
                                sql.Identifier(table)), (funnel.name, ids))
                        if key:
                            counts[key] += cur.rowcount
                    await conn.execute(sql.SQL("DELETE FROM {} WHERE session_id = ANY(%s)")
                                       .format(t), (ids,))
                counts["sessions"] += len(ids)

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
        """Store a new summary under the session's lock, if no other job got there first."""
        field = funnel.memory.summary
        assert field is not None
        update = sql.SQL(
            "UPDATE {} SET {} = %s, summary_upto = %s, row_version = row_version + 1 "
            "WHERE session_id = %s AND summary_upto = %s").format(
                sql.Identifier(funnel.table), sql.Identifier(field))
        async with self.session(funnel, session_id) as handle:
            conn = handle.conn
            cur = conn.cursor()
            async with conn.pipeline() as pipeline:  # lock, update, commit, unlock: one trip
                await conn.execute(_LOCK, (handle.key,))
                handle.locked = True
                await cur.execute(update, (summary, new_upto, session_id, old_upto))
                await _commit_point(pipeline)
                await conn.execute(_UNLOCK, (handle.key,))
            handle.locked = False
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


def _default_literal(field: Any) -> sql.Composable:
    if field.default is None:
        return sql.SQL("NULL")
    if field.is_json:
        return sql.SQL("{}::jsonb").format(sql.Literal(_dumps(field.default)))
    return sql.Literal(field.default)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


_LOCK = "SELECT pg_advisory_lock(hashtextextended(%s, 0))"
_UNLOCK = "SELECT pg_advisory_unlock(hashtextextended(%s, 0))"


async def _save(conn: psycopg.AsyncConnection[Any], table: _Table, write: TurnWrite) -> int:
    row = await (await conn.execute(table.statement(write), table.params(write))).fetchone()
    if row is None:
        found = await (await conn.execute(table.version_of, (write.session_id,))).fetchone()
        raise ConcurrentUpdate(write.session_id, write.expected_version,
                               found[0] if found else None)
    return int(row[0])


async def _commit_point(pipeline: psycopg.AsyncPipeline) -> None:
    """End the pipeline's implicit transaction here, without waiting for the results.

    In pipeline mode every statement up to a Sync message runs in one implicit
    transaction, even in autocommit: without a Sync, the user's message would
    commit only after the lock is granted, and the unlock would let the next
    turn in before the save commits. libpq's PQpipelineSync does not wait;
    psycopg exposes it only privately, so fall back to the waiting ``sync()``.
    """
    enqueue = getattr(pipeline, "_enqueue_sync", None)
    if callable(enqueue):
        enqueue()
    else:  # pragma: no cover - a psycopg without the private hook
        await pipeline.sync()


class SessionHandle:
    """One turn's view of a session, on the connection that holds its advisory lock.

    ``load`` sends lock + row + message window in one round trip (pipeline);
    ``save`` sends the turn's single statement and the unlock in another.
    """

    def __init__(self, table: _Table, conn: psycopg.AsyncConnection[Any], session_id: str
                 ) -> None:
        self.table = table
        self.conn = conn
        self.session_id = session_id
        self.key = f"{table.spec.name}/{session_id}"
        self.locked = False

    async def lock(self) -> None:
        await self.conn.execute(_LOCK, (self.key,))
        self.locked = True

    async def load(self, window: int, *, text: str | None = None, current_id: int = 0
                   ) -> tuple[int, dict[str, Any] | None, list[Message]]:
        """Log the user's message (when ``text`` is given), lock the session, and read its
        row and last ``window`` messages: one round trip.

        The message's INSERT commits on its own before the lock is even asked
        for, so it is durable whatever happens to the turn. Returns
        (message id, row or None, messages oldest first).
        """
        conn = self.conn
        spec = self.table.spec
        log_cur = conn.cursor()
        row_cur = conn.cursor(row_factory=dict_row)
        msg_cur = conn.cursor()
        async with conn.pipeline() as pipeline:
            if text is not None:
                await log_cur.execute(self.table.log, (spec.name, self.session_id, "user", text,
                                                       self.session_id, spec.initial))
                await _commit_point(pipeline)
            await conn.execute(_LOCK, (self.key,))
            self.locked = True
            await row_cur.execute(self.table.select, (*self.table.select_args, self.session_id))
            if window > 0:
                if text is not None:
                    await msg_cur.execute(_RECENT_CURRVAL, (spec.name, self.session_id, window))
                else:
                    await msg_cur.execute(_RECENT, (spec.name, self.session_id, current_id,
                                                    current_id, window))
        if text is not None:
            logged = await log_cur.fetchone()
            assert logged is not None
            current_id = int(logged[0])
        row = await row_cur.fetchone()
        messages = [Message(r[0], r[1], r[2]) for r in await msg_cur.fetchall()] \
            if window > 0 else []
        return current_id, row, messages

    async def save(self, write: TurnWrite) -> int:
        """Save the turn and release the lock in one round trip."""
        conn = self.conn
        cur = conn.cursor()
        async with conn.pipeline() as pipeline:
            await cur.execute(self.table.statement(write), self.table.params(write))
            await _commit_point(pipeline)  # the save commits before the lock is released
            await conn.execute(_UNLOCK, (self.key,))
        self.locked = False
        row = await cur.fetchone()
        if row is None:
            found = await (await conn.execute(self.table.version_of,
                                              (write.session_id,))).fetchone()
            raise ConcurrentUpdate(write.session_id, write.expected_version,
                                   found[0] if found else None)
        return int(row[0])

    async def release(self) -> None:
        try:
            await self.conn.execute(_UNLOCK, (self.key,))
        except psycopg.Error:
            await self.conn.close()  # a closed connection releases its locks
        self.locked = False


# The window is applied in SQL. Replies logged after the current message (a
# turn that finished while this message waited for the lock) still belong to it.
_RECENT = (
    f"SELECT role, content, id FROM (SELECT id, role, content FROM {ddl.MESSAGES} "
    "WHERE funnel = %s AND session_id = %s AND id <> %s "
    "AND (id < %s OR role = 'assistant') ORDER BY id DESC LIMIT %s) w ORDER BY id"
)

# The same, for the message this connection has just logged (currval is per connection).
_RECENT_CURRVAL = (
    f"SELECT role, content, id FROM (SELECT id, role, content FROM {ddl.MESSAGES} "
    "WHERE funnel = %s AND session_id = %s "
    f"AND id <> currval(pg_get_serial_sequence('{ddl.MESSAGES}', 'id')) "
    f"AND (id < currval(pg_get_serial_sequence('{ddl.MESSAGES}', 'id')) OR role = 'assistant') "
    "ORDER BY id DESC LIMIT %s) w ORDER BY id"
)

__all__ = ["PostgresStore", "SessionHandle"]
