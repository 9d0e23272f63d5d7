"""The same work's floor: exactly the statements a realistic turn runs, on plain psycopg.

The engine's turn is compared with a baseline that does the same database work and
nothing else (issue 32): the statements the engine sent for each turn of
``realistic_turn``'s conversation are recorded once, with their parameters, and the
floor runs them again for every session, on plain psycopg (an ``AsyncRawCursor`` for the
statements the engine sends with ``$n`` placeholders, ``conn.execute`` for the others),
on autocommit connections like the engine's, with the session id of each session in
place of the recorded one. So the floor logs the message in its own commit, reads the
row and the window, and saves the row, the reply, the turn record (and once the outbox
row) exactly as the engine does; what the engine costs above it is the turn itself:
language, prompt, validation, state, machine, explanation, the turn record's contents.

The recorded message ids are made unique (the messages' id sequence is moved far up
before the recording) so that each replayed turn can put its own logged message's id
where the recording had the template's.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from engine import Engine, ScriptedModel, load_funnel
from engine.format.names import MESSAGES
from engine.store import open_store
from engine.store import wire as wire_module

TEMPLATE = "floor-template-session"
ID_START = 7_000_000_000  # recorded message ids: ten digits, no other parameter looks alike


@dataclass
class Statement:
    raw: bool  # True: ``$n`` placeholders, text parameters (what engine.store.wire sends)
    query: str
    params: Any  # a list (``$n`` or ``%s``), a mapping (``%(name)s``) or None
    returns_id: bool = False  # its first value is the logged message's id (the turn's begin)


@dataclass
class Recording:
    turns: list[list[Statement]] = field(default_factory=list)
    ids: list[str | None] = field(default_factory=list)  # per turn, the logged message's id


def _swap(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, dict):
        return {_swap(k, old, new): _swap(v, old, new) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_swap(v, old, new) for v in value)
    if hasattr(value, "obj") and hasattr(value, "dumps"):  # psycopg's Jsonb / Json
        return type(value)(_swap(value.obj, old, new))
    return value


_RECORDED: dict[tuple[str, int], Recording] = {}


async def record(url: str, script: list[dict[str, Any]], messages: Sequence[str]) -> Recording:
    """Play one session of ``script`` through the engine and record every statement that
    each turn sent (its background work, drained, included). Once per database and
    length: the recording is the same for every run."""
    key = (url, len(messages))
    if key not in _RECORDED:
        _RECORDED[key] = await _record(url, script, messages)
    return _RECORDED[key]


async def _record(url: str, script: list[dict[str, Any]], messages: Sequence[str]) -> Recording:
    funnel = load_funnel_cached()
    model = ScriptedModel.from_data({"turns": script, "default": {"reply": "OK."}})
    store = await open_store(url, max_connections=2, max_turns=2)
    engine = await Engine.open(funnel, model=model, store=store)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        seq = (await (await conn.execute(
            "SELECT pg_get_serial_sequence(%s, 'id')", (MESSAGES,))).fetchone() or [None])[0]
        assert seq is not None, "the message log has no id sequence"
        # Past any id a recording before this one took (a second length, the same database).
        top = (await (await conn.execute(sql.SQL("SELECT COALESCE(max(id), 0) FROM {}").format(
            sql.Identifier(MESSAGES)))).fetchone() or [0])[0]
        await conn.execute(sql.SQL("ALTER SEQUENCE {} RESTART WITH {}").format(
            sql.SQL(seq), sql.Literal(max(ID_START, int(top) + 1000))))  # seq: quoted by the server
    out = Recording()
    current: list[Statement] = []
    logged: list[str | None] = [None]
    real_run = wire_module.run
    real_execute = psycopg.AsyncConnection.execute

    async def run(conn: Any, stmt: Any, params: Sequence[bytes | None]) -> Any:
        result = await real_run(conn, stmt, params)
        query = stmt.query.decode()
        is_begin = "leased" in query and "replayed" in query
        current.append(Statement(True, query, [None if p is None else p.decode() for p in params],
                                 returns_id=is_begin))
        if is_begin and logged[0] is None and result.ntuples:
            value = result.get_value(0, 0)
            logged[0] = value.decode() if value is not None else None
        return result

    async def execute(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        text = query.as_string(self) if isinstance(query, sql.Composable) else query
        current.append(Statement(False, text if isinstance(text, str) else text.decode(), params))
        return await real_execute(self, query, params, **kw)

    wire_module.run = run  # type: ignore[assignment]
    psycopg.AsyncConnection.execute = execute  # type: ignore[method-assign]
    try:
        for text in messages:
            current.clear()
            logged[0] = None
            await engine.handle(TEMPLATE, text)
            await engine.drain()
            out.turns.append(list(current))
            out.ids.append(logged[0])
    finally:
        wire_module.run = real_run  # type: ignore[assignment]
        psycopg.AsyncConnection.execute = real_execute  # type: ignore[method-assign]
        await engine.close()
        await store.close()
    return out


_FUNNEL: list[Any] = []


def load_funnel_cached() -> Any:
    from pathlib import Path

    if not _FUNNEL:
        _FUNNEL.append(load_funnel(Path(__file__).resolve().parent.parent / "funnels" /
                                   "puramur.yaml"))
    return _FUNNEL[0]


async def replay_turn(conn: psycopg.AsyncConnection[Any], recording: Recording, t: int,
                      sid: str) -> None:
    """Turn ``t`` of session ``sid``: the recorded statements, with this session's id and
    this turn's logged message id."""
    new_id: str | None = None
    for st in recording.turns[t]:
        new_id = await _replay(conn, st, recording.ids[t], new_id, sid)


async def replay_split(connection: Callable[[], AbstractAsyncContextManager[Any]],
                       recording: Recording, t: int, sid: str,
                       pause: Callable[[], Awaitable[None]]) -> None:
    """:func:`replay_turn` as the engine's turn runs it (bench/floor_service.py): the
    statements before the save on one connection, ``pause`` (the model's time) with no
    connection held, then the save on a connection taken again."""
    new_id: str | None = None
    *first, save = recording.turns[t]
    async with connection() as conn:
        for st in first:
            new_id = await _replay(conn, st, recording.ids[t], new_id, sid)
    await pause()
    async with connection() as conn:
        await _replay(conn, save, recording.ids[t], new_id, sid)


async def _replay(conn: psycopg.AsyncConnection[Any], st: Statement, template_id: str | None,
                  new_id: str | None, sid: str) -> str | None:
    """Run one recorded statement for ``sid``; the turn's logged message id, once known."""
    params = _swap(st.params, TEMPLATE, sid)
    if template_id is not None and new_id is not None and isinstance(params, list):
        params = [new_id if p == template_id else p for p in params]
    if st.raw:
        cur = psycopg.AsyncRawCursor(conn)
        await cur.execute(st.query, params)
        rows = await cur.fetchall() if cur.description else []
        if st.returns_id and rows and new_id is None and rows[0][0] is not None:
            return str(rows[0][0])
    else:
        cur2 = await conn.execute(st.query, params)
        if cur2.description:
            await cur2.fetchall()
    return new_id


def describe(recording: Recording) -> str:
    """How many statements each recorded turn sent, for the bench's header."""
    counts = [len(t) for t in recording.turns]
    kinds = json.dumps(sorted({st.query.split("(")[0][:40] for t in recording.turns for st in t}))
    return f"statements per turn {counts} ({kinds})"
