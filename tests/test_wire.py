"""The turn's two statements on libpq directly (engine.store.wire) behave as psycopg does.

Parameters travel in text format (NUL refused, as psycopg refuses it); a failed
statement raises psycopg's own exception class; a statement the server forgot is
prepared again; a value larger than the socket's buffer is sent whole; a lost
connection raises ``OperationalError``; a wait cancelled mid-statement leaves a
connection the pool discards, and the next turn runs.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from engine.store.statements import dumps
from engine.store.wire import Prepared, encode, run

pytestmark = pytest.mark.postgres


def test_parameters_in_text_format() -> None:
    when = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    assert [encode(v) for v in (None, "héllo", True, False, 7, -3, 1.5, Decimal("697.00"),
                                when, Jsonb({"a": [1, "б"]}, dumps=dumps))] == [
        None, "héllo".encode(), b"t", b"f", b"7", b"-3", b"1.5", b"697.00",
        b"2026-12-01T08:00:00+00:00", '{"a":[1,"б"]}'.encode()]
    with pytest.raises(psycopg.DataError, match="NUL"):
        encode("a\x00b")  # libpq would cut the value there
    with pytest.raises(TypeError, match="set"):
        encode({1, 2})


async def test_values_round_trip_with_the_types_given(store: Any) -> None:
    stmt = Prepared("SELECT $1::text, $2 + 1, $3::jsonb -> 'k', $4, $5::timestamptz",
                    [25, 20, 3802, 16, 0])
    when = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    async with store._conn() as conn:
        for i in range(3):  # prepared once, executed by name after
            result = await run(conn, stmt, [encode("ü"), encode(41 + i),
                                            encode(Jsonb({"k": "v"}, dumps=dumps)),
                                            encode(i % 2 == 0), encode(when)])
            assert [result.get_value(0, c) for c in range(4)] == [
                "ü".encode(), str(42 + i).encode(), b'"v"', b"t" if i % 2 == 0 else b"f"]
        null = await run(conn, stmt, [None] * 5)
        assert [null.get_value(0, c) for c in range(5)] == [None] * 5


async def test_a_failed_statement_raises_psycopgs_exception(store: Any) -> None:
    stmt = Prepared("SELECT 1 / $1::int")
    async with store._conn() as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            await run(conn, stmt, [b"0"])
        ok = await run(conn, stmt, [b"1"])  # the connection is fine afterwards
        assert ok.get_value(0, 0) == b"1"
        with pytest.raises(psycopg.errors.UndefinedTable):
            await run(conn, Prepared("SELECT * FROM no_such_table_here"), [])


async def test_a_statement_the_server_forgot_is_prepared_again(store: Any) -> None:
    stmt = Prepared("SELECT $1::int * 2")
    async with store._conn() as conn:
        assert (await run(conn, stmt, [b"2"])).get_value(0, 0) == b"4"
        await conn.execute("DEALLOCATE ALL")
        assert (await run(conn, stmt, [b"3"])).get_value(0, 0) == b"6"


async def test_a_value_larger_than_the_socket_buffer_is_sent_whole(store: Any) -> None:
    big = "x" * 4_000_000
    async with store._conn() as conn:
        result = await run(conn, Prepared("SELECT length($1::text)"), [encode(big)])
    assert result.get_value(0, 0) == b"4000000"


async def test_a_lost_connection_raises_operational_error(store: Any, db_url: str) -> None:
    async with store._conn() as conn:
        pid = conn.info.backend_pid
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        await asyncio.sleep(0.2)
        with pytest.raises(psycopg.OperationalError):
            await run(conn, Prepared("SELECT 1"), [])


async def test_a_cancelled_wait_leaves_a_connection_the_pool_discards(store: Any) -> None:
    stmt = Prepared("SELECT pg_sleep($1::float8)")
    task = None
    async with store._conn() as conn:
        task = asyncio.ensure_future(run(conn, stmt, [b"5"]))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.ACTIVE
    # The pool closes it instead of lending it again; every later use is clean.
    for _ in range(4):
        async with store._conn() as again:
            assert (await run(again, Prepared("SELECT 2"), [])).get_value(0, 0) == b"2"
