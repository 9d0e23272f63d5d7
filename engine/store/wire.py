"""The two statements of every turn, sent on libpq directly (``psycopg.pq``).

A turn is two round trips (``engine.store.session``): the turn function's call and the
save. Through psycopg's cursors a statement costs the client about 150 µs of CPU on a
small query (a cursor, the generators that wait, the adapters, the prepared-statement
cache keyed by the query's text); sent here, on the same pooled connection, about 50.
In a realistic turn the two took 0.72 ms of the client's CPU before, 0.54 after
(docs/persistence.md). Everything else keeps using psycopg.

What psycopg would do is kept: a statement is prepared once per connection (under a
name of its own: psycopg's are ``_pg3_*``) and executed by name, with parameters in
text format; a failed statement raises the same ``psycopg.errors`` exception psycopg
raises (``error_from_result``), a lost connection ``psycopg.OperationalError``, so the
store's error handling is unchanged. A statement the server forgot (``DISCARD ALL``) is
prepared again. A turn cancelled while it waits leaves the connection busy, and the
pool discards it when it comes back.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import weakref
from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import pq
from psycopg.errors import InvalidSqlStatementName, error_from_result
from psycopg.types.json import Jsonb

__all__ = ["Prepared", "encode", "positional", "run"]

# What each connection has prepared (weak keys: a connection the pool drops leaves
# nothing behind).
_PREPARED: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], set[bytes]] = (
    weakref.WeakKeyDictionary())


class Prepared:
    """A statement with ``$n`` placeholders, prepared once per connection.

    Args:
        query: The SQL.
        types: The parameters' type OIDs (``0``: the server infers it from the query).
    """

    __slots__ = ("name", "query", "types")

    def __init__(self, query: str, types: Sequence[int] = ()) -> None:
        self.query = query.encode()
        self.types = list(types)
        digest = hashlib.sha1(self.query + repr(self.types).encode()).hexdigest()[:20]
        self.name = f"funnel_{digest}".encode()


_NAMED = re.compile(r"%\((\w+)\)s")


def positional(query: str) -> tuple[str, tuple[str, ...]]:
    """``%(name)s`` placeholders as ``$n`` (one per name), and the names in that order.

    For :class:`Prepared`, from SQL written with psycopg's named placeholders."""
    names: dict[str, int] = {}

    def number(m: re.Match[str]) -> str:
        return f"${names.setdefault(m.group(1), len(names) + 1)}"

    return _NAMED.sub(number, query), tuple(names)


def encode(value: Any) -> bytes | None:
    """A parameter in PostgreSQL's text format (``None`` is NULL).

    Raises:
        psycopg.DataError: a string holds NUL, which libpq would cut the value at (psycopg
            refuses it the same way).
    """
    if value is None:
        return None
    if isinstance(value, str):
        if "\x00" in value:
            raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
        return value.encode()
    if isinstance(value, bool):  # before int: a bool is an int
        return b"t" if value else b"f"
    if isinstance(value, int | Decimal):
        return str(value).encode()
    if isinstance(value, float):
        return repr(value).encode()
    if isinstance(value, Jsonb):
        dumps = value.dumps
        if dumps is None:
            raise TypeError("a Jsonb parameter of the turn needs its dumps")
        out = dumps(value.obj)
        return out.encode() if isinstance(out, str) else bytes(out)
    if isinstance(value, datetime | date):
        return value.isoformat().encode()
    raise TypeError(f"cannot send a {type(value).__name__} as a turn parameter")


async def run(conn: psycopg.AsyncConnection[Any], stmt: Prepared,
              params: Sequence[bytes | None]) -> pq.abc.PGresult:
    """Execute ``stmt`` with encoded ``params`` on ``conn`` (autocommit) and return its
    result, after preparing it on this connection if it is the first time.

    Raises:
        psycopg.Error: what psycopg raises for the same failure.
    """
    async with conn.lock:
        prepared = _PREPARED.get(conn)
        if prepared is None:
            prepared = _PREPARED[conn] = set()
        if stmt.name not in prepared:
            await _prepare(conn, stmt)
            prepared.add(stmt.name)
        try:
            return await _execute(conn, stmt, params)
        except InvalidSqlStatementName:  # the server forgot it (DISCARD ALL): again
            prepared.clear()
            await _prepare(conn, stmt)
            prepared.add(stmt.name)
            return await _execute(conn, stmt, params)


async def _prepare(conn: psycopg.AsyncConnection[Any], stmt: Prepared) -> None:
    conn.pgconn.send_prepare(stmt.name, stmt.query, param_types=stmt.types or None)
    _check(conn, await _result(conn))


async def _execute(conn: psycopg.AsyncConnection[Any], stmt: Prepared,
                   params: Sequence[bytes | None]) -> pq.abc.PGresult:
    conn.pgconn.send_query_prepared(stmt.name, params)
    return _check(conn, await _result(conn))


def _check(conn: psycopg.AsyncConnection[Any], result: pq.abc.PGresult | None
           ) -> pq.abc.PGresult:
    if result is None:
        raise psycopg.OperationalError("the server sent no result")
    if result.status == pq.ExecStatus.FATAL_ERROR:
        raise error_from_result(result, encoding=conn.info.encoding)
    return result


async def _result(conn: psycopg.AsyncConnection[Any]) -> pq.abc.PGresult | None:
    """Send what libpq holds, then read until the statement's last result."""
    pgconn = conn.pgconn
    fd = pgconn.socket
    loop = asyncio.get_running_loop()
    while pgconn.flush():  # a large save may not fit the socket's buffer at once
        await _ready(loop, fd, write=True)
    last = None
    while True:
        pgconn.consume_input()
        while not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:
                return last
            if last is None or last.status != pq.ExecStatus.FATAL_ERROR:
                last = result  # an error wins over what follows it
        await _ready(loop, fd)


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, write: bool = False) -> None:
    done = loop.create_future()
    if write:
        loop.add_writer(fd, _wake, done)
    else:
        loop.add_reader(fd, _wake, done)
    try:
        await done
    finally:
        if write:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


def _wake(done: asyncio.Future[None]) -> None:
    # The loop may call this again before the waiter runs and stops watching.
    if not done.done():
        done.set_result(None)
