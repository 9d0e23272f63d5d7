"""Retention and turns exclude each other per session (issue 29).

A session idle past the retention period gets a new message; its turn waits on
the model (the fake server holds the request) while `funnel purge` runs. Purge
and turn must not interleave: a session whose turn is in flight is not idle
and is skipped (and said so by the counts), a purge that holds a session makes
its next turn wait for it, and a turn that lost its lease (a stalled worker) can
no longer write back what it read before the purge. Each case ends with
`funnel check-state` clean: no reply without the customer's message.

The purge runs the three ways an operator reaches it: the store's call (what the
service's scheduler runs, `purge_when_due`), and the `funnel purge` command.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from conftest import PURAMUR, run_funnel

from engine.errors import ConcurrentUpdate
from engine.llm.models import LiteLLMModel
from engine.store import open_store
from engine.store.ddl import LEASES, MESSAGES, TURNS
from engine.turn.engine import Engine
from engine.turn.invariants import check_funnel

pytestmark = pytest.mark.postgres

TABLE = "puramur_sessions_state"
SID = "idle-customer"
NAME, PHONE = "Olena Kovalenko", "+380671234567"
YEAR = 365 * 86400.0

Purge = Callable[[str, bool], Awaitable[dict[str, int] | None]]


async def _store_purge(db_url: str, anonymize: bool) -> dict[str, int] | None:
    store = await open_store(db_url)
    try:
        return await store.purge(_spec(), YEAR, anonymize=anonymize)
    finally:
        await store.close()


async def _scheduled_purge(db_url: str, anonymize: bool) -> dict[str, int] | None:
    store = await open_store(db_url)
    try:
        outcome, counts = await store.purge_when_due(_spec(), YEAR, 3600, anonymize=anonymize)
        assert outcome == "done"
        return counts
    finally:
        await store.close()


async def _cli_purge(db_url: str, anonymize: bool) -> dict[str, int] | None:
    args = ["purge", str(PURAMUR), "--db", db_url] + (["--anonymize"] if anonymize else [])
    done = await asyncio.to_thread(run_funnel, *args)
    assert done.returncode == 0, done.stderr
    text = done.stdout.strip()
    if text.startswith("nothing to purge") or "would" in text:
        return {"sessions": 0}
    return {"sessions": int(text.split()[1])}


PURGES = {"store": _store_purge, "scheduled": _scheduled_purge, "cli": _cli_purge}


def _spec() -> Any:
    from engine.funnel.compiled import load_funnel

    return load_funnel(PURAMUR).spec


async def _idle_session(engine: Engine, fake: Any, sql: Any) -> None:
    """A session with one turn, the customer's name and phone, idle for 400 days."""
    fake.reply(json.dumps({"reply": "Hello! What pet do you have?"}))
    await engine.handle(SID, f"Hi, I am {NAME}, {PHONE}")
    sql(f"UPDATE {TABLE} SET customer = %s, last_message_at = NOW() - INTERVAL '400 days' "
        "WHERE session_id = %s", (json.dumps({"name": NAME, "phone": PHONE}), SID))
    sql(f"UPDATE {MESSAGES} SET created_at = NOW() - INTERVAL '400 days'")


async def _open(db_url: str, fake: Any) -> Engine:
    return await Engine.open(PURAMUR, db=db_url,
                             model=LiteLLMModel("openai/gpt-4o-mini", api_base=fake.api_base))


def _pairs(sql: Any) -> list[tuple[str, str]]:
    return sql(f"SELECT role, content FROM {MESSAGES} WHERE session_id = %s ORDER BY id", (SID,))


async def _clean(db_url: str) -> None:
    from engine.funnel.compiled import load_funnel

    problems = await check_funnel(load_funnel(PURAMUR), db_url)
    assert [p for p in problems if p.severity == "error"] == [], problems


@pytest.mark.parametrize("how", sorted(PURGES))
@pytest.mark.parametrize("anonymize", [True, False], ids=["anonymize", "delete"])
async def test_a_purge_skips_a_session_whose_turn_is_in_flight(
        db_url: str, fake_llm: Any, sql: Any, how: str, anonymize: bool) -> None:
    engine = await _open(db_url, fake_llm)
    try:
        await _idle_session(engine, fake_llm, sql)
        gate = fake_llm.hold(json.dumps({"reply": f"Nice to meet you, {NAME}!"}))
        turn = asyncio.create_task(engine.handle(SID, "I am back: I have a cat"))
        await asyncio.to_thread(gate.wait_arrived)
        counts = await PURGES[how](db_url, anonymize)
        gate.release()
        result = await turn
    finally:
        await engine.close()
    # The customer is writing: the session is not idle, and the purge says it left it.
    assert counts is not None and counts["sessions"] == 0, counts
    assert result.reply == f"Nice to meet you, {NAME}!"
    assert fake_llm.calls == 2  # the model was called once for the turn, not again
    [(customer, anonymized)] = sql(f"SELECT customer, notices @> '[\"anonymized\"]' FROM "
                                   f"{TABLE} WHERE session_id = %s", (SID,))
    assert customer == {"name": NAME, "phone": PHONE} and not anonymized
    assert [r for r, _ in _pairs(sql)] == ["user", "assistant", "user", "assistant"]
    assert sql(f"SELECT COUNT(*) FROM {LEASES} WHERE holder <> ''") == [(0,)]
    await _clean(db_url)


@pytest.mark.parametrize("how", ["store", "cli"])
async def test_a_turn_that_lost_its_lease_cannot_undo_an_anonymize(
        db_url: str, fake_llm: Any, sql: Any, how: str) -> None:
    engine = await _open(db_url, fake_llm)
    try:
        await _idle_session(engine, fake_llm, sql)
        gate = fake_llm.hold(json.dumps({"reply": "Welcome back!"}))
        turn = asyncio.create_task(engine.handle(SID, "I am back"))
        await asyncio.to_thread(gate.wait_arrived)
        # The worker stalled past its lease (no heartbeat): the session is free to purge.
        sql(f"UPDATE {LEASES} SET expires_at = NOW() - INTERVAL '1 second'")
        counts = await PURGES[how](db_url, True)
        assert counts is not None and counts["sessions"] == 1
        fake_llm.reply(json.dumps({"reply": "Welcome back!"}))  # the turn, again, on what is left
        gate.release()
        await turn
    finally:
        await engine.close()
    [(customer,)] = sql(f"SELECT customer FROM {TABLE} WHERE session_id = %s", (SID,))
    assert customer == {}  # the stale save was refused: the name is not written back
    assert NAME not in json.dumps(sql(f"SELECT * FROM {TABLE}"), default=str)
    roles = [r for r, _ in _pairs(sql)]
    assert roles[-1] == "assistant" and roles.count("user") == roles.count("assistant")
    await _clean(db_url)


@pytest.mark.parametrize("how", ["store", "cli"])
async def test_a_turn_that_lost_its_lease_cannot_bring_back_a_deleted_session(
        db_url: str, fake_llm: Any, sql: Any, how: str) -> None:
    engine = await _open(db_url, fake_llm)
    try:
        await _idle_session(engine, fake_llm, sql)
        gate = fake_llm.hold(json.dumps({"reply": "Welcome back!"}))
        turn = asyncio.create_task(engine.handle(SID, "I am back"))
        await asyncio.to_thread(gate.wait_arrived)
        sql(f"UPDATE {LEASES} SET expires_at = NOW() - INTERVAL '1 second'")
        counts = await PURGES[how](db_url, False)
        assert counts is not None and counts["sessions"] == 1
        gate.release()
        with pytest.raises(ConcurrentUpdate):  # the session is gone: "send it again"
            await turn
    finally:
        await engine.close()
    assert fake_llm.calls == 2  # not asked again for a session that no longer exists
    assert sql(f"SELECT COUNT(*) FROM {TABLE}") == [(0,)]
    assert _pairs(sql) == []  # no reply without its customer's message
    assert sql(f"SELECT COUNT(*) FROM {TURNS}") == [(0,)]
    await _clean(db_url)


@pytest.mark.parametrize("anonymize", [True, False], ids=["anonymize", "delete"])
async def test_a_turn_that_starts_during_a_purge_waits_for_it(
        db_url: str, fake_llm: Any, sql: Any, anonymize: bool) -> None:
    """The purge holds the session's lease inside its transaction: a turn that arrives
    meanwhile reads what the purge left, never the row as it was."""
    import psycopg

    engine = await _open(db_url, fake_llm)
    try:
        await _idle_session(engine, fake_llm, sql)
        # The purge's transaction, stopped after it took the session's lease.
        with psycopg.connect(db_url) as conn:
            conn.execute(f"INSERT INTO {LEASES} (lock_key, holder, expires_at) VALUES "
                         "(%s, '', '-infinity') ON CONFLICT DO NOTHING", (f"puramur/{SID}",))
            conn.commit()
        from engine.store import retention

        store = await open_store(db_url)
        try:
            async with store._conn() as conn, conn.transaction():  # type: ignore[attr-defined]
                taken = await retention.take_leases(conn, _spec(), [SID])
                assert taken == [SID]
                fake_llm.reply(json.dumps({"reply": "Hello again!"}))
                turn = asyncio.create_task(engine.handle(SID, "Hello?"))
                await asyncio.sleep(0)  # let the turn reach the lease (it waits on it)
                await (retention.anonymize_sessions if anonymize else
                       retention.delete_sessions)(conn, _spec(), [SID], {
                           "sessions": 0, "messages": 0, "turns": 0})
                await retention.give_back(conn, _spec(), [SID])
            result = await turn
        finally:
            await store.close()
    finally:
        await engine.close()
    assert result.reply == "Hello again!"
    [(customer,)] = sql(f"SELECT customer FROM {TABLE} WHERE session_id = %s", (SID,))
    assert customer == {}
    await _clean(db_url)
