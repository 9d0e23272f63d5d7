"""A turn holds a lease on its session, not a database connection, while the model thinks."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from engine import Engine, ModelRequest, ScriptedModel
from engine.llm.models import Completion
from engine.store import open_store
from engine.store.ddl import LEASES

TABLE = "puramur_sessions_state"


class Thinking:
    """The scripted model, taking its time like a real one."""

    name = "scripted"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.inner = ScriptedModel.from_data({"default": {"reply": "ok"}})

    async def complete(self, request: ModelRequest) -> Completion:
        await asyncio.sleep(self.seconds)
        return await self.inner.complete(request)


async def test_turns_in_flight_are_not_bounded_by_connections(puramur: Any, db_url: str,
                                                              sql: Any) -> None:
    store = await open_store(db_url, max_connections=2)
    engine = await Engine.open(puramur, store=store, model=Thinking(0.4))
    try:
        started = time.perf_counter()
        results = await asyncio.gather(*(engine.handle(f"c{i}", "Hi") for i in range(20)))
        elapsed = time.perf_counter() - started
    finally:
        await engine.close()
        await store.close()
    assert all(r.reply == "ok" for r in results)
    # 20 turns of 0.4 s each over 2 connections: held connections would need 4 s.
    assert elapsed < 2.0, elapsed
    assert sql(f"SELECT COUNT(*) FROM {LEASES} WHERE holder <> ''") == [(0,)]  # all given back
    assert sql(f"SELECT COUNT(*), SUM(turns) FROM {TABLE}") == [(20, 20)]


async def test_a_lease_left_by_a_crashed_process_expires(puramur: Any, db_url: str,
                                                        sql: Any) -> None:
    engine = await Engine.open(puramur, db=db_url, model=Thinking(0))
    try:
        await engine.handle("crash", "Hi")
        # Another process took the session and died mid-turn: its lease runs 1.5 s more.
        sql(f"INSERT INTO {LEASES} (lock_key, holder, expires_at) VALUES "
            "('puramur/crash', 'dead-process', NOW() + INTERVAL '1.5 seconds') "
            "ON CONFLICT (lock_key) DO UPDATE SET holder = EXCLUDED.holder, "
            "expires_at = EXCLUDED.expires_at")
        started = time.perf_counter()
        result = await engine.handle("crash", "Still there?")
        waited = time.perf_counter() - started
    finally:
        await engine.close()
    assert result.reply == "ok" and 1.0 <= waited < 5.0, waited
    assert sql(f"SELECT turns FROM {TABLE} WHERE session_id = 'crash'") == [(2,)]
    assert sql(f"SELECT COUNT(*) FROM {LEASES} WHERE holder <> ''") == [(0,)]


async def test_a_second_message_waits_for_the_first_turn(puramur: Any, db_url: str,
                                                         sql: Any) -> None:
    engine = await Engine.open(puramur, db=db_url, model=Thinking(0.3))
    try:
        first, second = await asyncio.gather(engine.handle("pair", "one"),
                                             engine.handle("pair", "two"))
    finally:
        await engine.close()
    assert {first.state["turns"], second.state["turns"]} == {1, 2}  # one after the other
    assert sql(f"SELECT turns, row_version FROM {TABLE} WHERE session_id = 'pair'") == [(2, 2)]
