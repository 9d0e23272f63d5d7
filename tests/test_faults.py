"""Faults: the database goes down or restarts, the model call fails.

The engine reaches the test server through :class:`Proxy`, a small TCP proxy on
127.0.0.1 that the tests switch "down" (every connection is closed and new ones
are refused), "up" again, or "restart" (every live connection is dropped, new
ones are accepted). For the embedded server, which listens on a Unix socket,
the proxy connects to the socket file.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from conftest import said

from engine import Engine, ScriptedModel
from engine.errors import StoreUnavailable
from engine.funnel.compiled import CompiledFunnel
from engine.store import ddl, open_store
from engine.turn.invariants import check_funnel

TABLE = "puramur_sessions_state"
HELLO = {"reply": "Hello! Is your pet a cat or a dog?"}
PROFILE = {"reply": "A Sphynx! How old is she?",
           "updates": {"pet": {"type": "cat", "breed": "Sphynx"}}}


class Proxy:
    """Forwards 127.0.0.1:<port> to the PostgreSQL of ``dsn`` (TCP or Unix socket)."""

    def __init__(self, dsn: str) -> None:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        host = str(info.get("host") or "localhost")
        port = int(info.get("port") or 5432)
        self.unix = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else None
        self.target = (host, port)
        self.dsn = dsn
        self.accepting = True
        self.port = 0
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """``dsn`` (its database, user and options) through the proxy."""
        return psycopg.conninfo.make_conninfo(self.dsn, host="127.0.0.1", port=str(self.port))

    async def start(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def down(self) -> None:
        """The database is gone: drop every connection, refuse new ones."""
        self.accepting = False
        self.drop()

    def up(self) -> None:
        self.accepting = True

    def restart(self) -> None:
        """The database restarted: every live connection breaks, new ones work."""
        self.drop()

    def drop(self) -> None:
        for client, upstream in list(self._links):
            client.transport.abort()
            upstream.transport.abort()
        self._links.clear()

    @property
    def live(self) -> int:
        return len(self._links)

    async def stop(self) -> None:
        self.accepting = False
        self.drop()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if not self.accepting:
                writer.transport.abort()
                return
            self.accepted += 1
            try:
                if self.unix:
                    up_reader, up_writer = await asyncio.open_unix_connection(self.unix)
                else:
                    up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                writer.transport.abort()
                return
            link = (writer, up_writer)
            self._links.add(link)
            try:
                await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
            finally:
                self._links.discard(link)
                writer.transport.abort()
                up_writer.transport.abort()
        finally:
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()


@pytest.fixture
async def proxy(db_url: str) -> AsyncIterator[Proxy]:
    p = await Proxy(db_url).start()
    yield p
    await p.stop()


@pytest.fixture
async def tables(db_url: str, puramur: CompiledFunnel) -> None:
    """The funnel's tables, created directly (not through the proxy)."""
    store = await open_store(db_url)
    try:
        await store.ensure_schema(puramur.spec)
    finally:
        await store.close()


async def open_engine(proxy: Proxy, puramur: CompiledFunnel, script: dict[str, Any]
                      ) -> Engine:
    store = await open_store(proxy.url, timeout=1)
    try:
        return await Engine.open(puramur, store=store, model=ScriptedModel.from_data(script))
    except BaseException:
        await store.close()
        raise


@contextlib.asynccontextmanager
async def engine_on(proxy: Proxy, puramur: CompiledFunnel, script: dict[str, Any]
                    ) -> AsyncIterator[Engine]:
    engine = await open_engine(proxy, puramur, script)
    try:
        yield engine
    finally:
        await engine.store.close()


def assert_clean(exc: BaseException, proxy: Proxy) -> None:
    """A StoreUnavailable that says what happened and where, with no psycopg error shown."""
    assert isinstance(exc, StoreUnavailable)
    text = str(exc)
    assert f"127.0.0.1:{proxy.port}" in text, text
    assert "PostgreSQL" in text
    shown = "".join(traceback.format_exception(exc))
    assert "psycopg" not in shown.replace("engine/store/postgres.py", ""), shown
    assert "During handling" not in shown and "direct cause" not in shown, shown
    assert exc.__cause__ is None and exc.__suppress_context__


# -- the database is down --------------------------------------------------------------
@pytest.mark.usefixtures("tables")
async def test_database_down_when_a_message_arrives(proxy: Proxy, puramur: CompiledFunnel,
                                                    sql: Any) -> None:
    async with engine_on(proxy, puramur, {"turns": [HELLO, PROFILE]}) as engine:
        proxy.down()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            await engine.handle("s1", "Hi")
        elapsed = time.monotonic() - started
        assert elapsed < 5, f"took {elapsed:.1f} s with timeout=1"
        assert_clean(info.value, proxy)

        proxy.up()
        assert sql(f"SELECT COUNT(*) FROM {TABLE}") == [(0,)]
        logged = sql(f"SELECT session_id, role, content FROM {ddl.MESSAGES}")
        assert logged in ([], [("s1", "user", "Hi")])  # at most the user's message
        assert sql(f"SELECT COUNT(*) FROM {ddl.TURNS}") == [(0,)]
        assert sql(f"SELECT COUNT(*) FROM {ddl.OUTBOX}") == [(0,)]

        # the next message after recovery works
        result = await engine.handle("s1", "Hi again")
        assert result.reply == HELLO["reply"] and not result.fallback
        assert result.stage_before == "greeting" and result.stage_after == "discovery"
        result = await engine.handle("s1", "I have a Sphynx")
        assert result.reply == PROFILE["reply"]
    row = sql(f"SELECT turns, pet->>'breed', row_version FROM {TABLE} WHERE session_id = 's1'")
    assert row == [(2, "Sphynx", 2)]
    replies = sql(f"SELECT content FROM {ddl.MESSAGES} WHERE role = 'assistant' ORDER BY id")
    assert replies == [(HELLO["reply"],), (PROFILE["reply"],)]


async def test_database_down_when_the_engine_opens(proxy: Proxy, puramur: CompiledFunnel
                                                   ) -> None:
    proxy.down()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        await open_store(proxy.url, timeout=1)
    assert time.monotonic() - started < 5
    assert_clean(info.value, proxy)
    assert "within 1 s" in str(info.value)


@pytest.mark.usefixtures("tables")
async def test_database_down_for_a_while_then_back(proxy: Proxy, puramur: CompiledFunnel,
                                                   sql: Any, db_url: str) -> None:
    async with engine_on(proxy, puramur, {"default": HELLO}) as engine:
        await engine.handle("warm", "Hi")
        proxy.down()
        for i in range(3):  # several messages while it is down, each fails fast
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as info:
                await engine.handle(f"down-{i}", "Hello?")
            assert time.monotonic() - started < 5
            assert_clean(info.value, proxy)
            await asyncio.sleep(0.5)
        proxy.up()
        result = await engine.handle("back", "Hi")
        assert result.reply == HELLO["reply"]
    assert sql(f"SELECT session_id FROM {TABLE} ORDER BY 1") == [("back",), ("warm",)]
    assert [str(v) for v in await check_funnel(puramur, db_url) if v.severity == "error"] == []


# -- the database restarts between two turns ---------------------------------------------
@pytest.mark.usefixtures("tables")
@pytest.mark.parametrize("pause", [0.0, 2.5], ids=["at-once", "after-the-trust-window"])
async def test_database_restart_between_two_turns(proxy: Proxy, puramur: CompiledFunnel,
                                                  sql: Any, pause: float, db_url: str) -> None:
    """Pooled connections that a restart broke are replaced: the next turn, or at the latest
    the one after it, succeeds. A connection idle for more than 2 s is checked before use
    (``engine.store.health.Health``), so after a pause even the first turn succeeds."""
    async with engine_on(proxy, puramur, {"turns": [HELLO, PROFILE, {"reply": "3"},
                                                    {"reply": "4"}]}) as engine:
        # Several sessions at once, as in a service: both pools hold several connections.
        first, *_ = await asyncio.gather(*(engine.handle(f"r{i}", "Hi") for i in range(1, 5)))
        assert first.reply == HELLO["reply"]
        assert proxy.live >= 3
        proxy.restart()
        assert proxy.live == 0
        await asyncio.sleep(pause)

        failures: list[StoreUnavailable] = []
        texts = iter(["I have a Sphynx", "retry 1", "retry 2"])
        while True:
            try:
                second = await engine.handle("r1", next(texts))
                break
            except StoreUnavailable as exc:
                assert_clean(exc, proxy)
                failures.append(exc)
                assert len(failures) < 2, "two turns in a row failed after one restart:\n" + \
                    "\n".join(str(f) for f in failures)
        assert second.reply == PROFILE["reply"]
        if pause > 2:
            assert failures == []  # the health check replaced the broken connections
        third = await engine.handle("r1", "and then?")
        assert not third.fallback
    [(turns, breed, version)] = sql(f"SELECT turns, pet->>'breed', row_version FROM {TABLE} "
                                    "WHERE session_id = 'r1'")
    assert breed == "Sphynx" and turns == version == 3
    assert sql(f"SELECT COUNT(*) FROM {ddl.TURNS} WHERE session_id = 'r1'") == [(3,)]
    assert [str(v) for v in await check_funnel(puramur, db_url) if v.severity == "error"] == []


# -- the model fails ---------------------------------------------------------------------
async def test_a_failed_model_call_gets_the_fallback(db_url: str, puramur: CompiledFunnel,
                                                     sql: Any) -> None:
    script = {"turns": [HELLO, {"error": "upstream 503: model overloaded"}, PROFILE]}
    engine = await Engine.open(puramur, db=db_url, model=ScriptedModel.from_data(script))
    try:
        assert (await engine.handle("m1", "Hi")).stage_after == "discovery"
        failed = await engine.handle("m1", "I have a cat")
        fallback = said(puramur.stage("discovery").spec.fallback, failed.state)
        assert failed.fallback and failed.reply == fallback
        assert failed.error is not None and "model overloaded" in failed.error
        assert failed.stage_after == "discovery" and failed.updated == []

        log = sql(f"SELECT role, content, stage FROM {ddl.MESSAGES} ORDER BY id")
        assert log[2:] == [("user", "I have a cat", "discovery"),
                           ("assistant", fallback, "discovery")]
        turn = sql(f"SELECT fallback, error, stage_before, stage_after FROM {ddl.TURNS} "
                   "ORDER BY id")
        assert turn[1][0] is True and "model overloaded" in turn[1][1]
        assert turn[1][2:] == ("discovery", "discovery")

        after = await engine.handle("m1", "A Sphynx")  # the next turn continues normally
        assert after.reply == PROFILE["reply"] and not after.fallback and after.error is None
        state = await engine.state("m1")
        assert state is not None and state["pet"]["breed"] == "Sphynx" and state["turns"] == 3
        assert sql(f"SELECT error FROM {ddl.TURNS} ORDER BY id")[2] == (None,)
        found = await check_funnel(puramur, db_url)
        assert [str(v) for v in found if v.severity == "error"] == []
    finally:
        await engine.close()
