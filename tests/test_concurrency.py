"""Turns of one session are serialized across processes; nothing is lost or applied twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.funnel.compiled import load_funnel
from engine.turn.invariants import check_funnel

WORKER = Path(__file__).with_name("_concurrency_worker.py")


def _start(db_url: str, word: str, count: int, concurrency: int, prefix: str = "s",
           repeat: int = 1) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(WORKER), db_url, word, str(count),
                             str(concurrency), prefix, str(repeat)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


async def _prepare(db_url: str) -> None:
    # Create the tables once, so the two processes do not race to create them.
    from engine import Engine, ScriptedModel

    engine = await Engine.open(Path(__file__).parent.parent / "funnels" / "puramur.yaml",
                               db=db_url, model=ScriptedModel.from_data({"default": {
                                   "reply": "x"}}))
    await engine.close()


@pytest.mark.slow
async def test_two_processes_two_messages_per_session(db_url: str, sql: Any) -> None:
    await _prepare(db_url)
    n = 200
    a = _start(db_url, "alpha", n, 50)
    b = _start(db_url, "beta: I am Bo,", n, 50)  # the customer gives the name written
    _finish(a)
    _finish(b)
    rows = sql("SELECT session_id, turns, pet, customer, row_version FROM "
               "puramur_sessions_state ORDER BY session_id")
    assert len(rows) == n
    for sid, turns, pet, customer, version in rows:
        assert turns == 2, sid  # every turn saw the state the other one saved
        assert pet.get("type") == "cat", sid  # neither update was lost
        assert customer.get("name") == "Bo", sid
        assert version == 2, sid
    counts = sql("SELECT role, COUNT(*) FROM funnel_messages GROUP BY role ORDER BY role")
    assert counts == [("assistant", 2 * n), ("user", 2 * n)]
    assert sql("SELECT COUNT(*) FROM funnel_turns") == [(2 * n,)]
    await _invariants_hold(db_url)


@pytest.mark.slow
async def test_duplicate_handoff_triggers_deliver_once(db_url: str, sql: Any) -> None:
    await _prepare(db_url)
    # 50 concurrent "manager" messages into one session, from two processes.
    procs = [_start(db_url, "manager", 1, 25, prefix="hand", repeat=25) for _ in range(2)]
    results = [_finish(p) for p in procs]
    delivered = [sid for r in results for sid in r["delivered"]]
    assert delivered == ["hand"]
    assert sql("SELECT COUNT(*), COUNT(delivered_at) FROM funnel_outbox") == [(1, 1)]
    assert sql("SELECT handoff_reason, turns FROM puramur_sessions_state") == [
        ("explicit_request", 50)]
    await _invariants_hold(db_url)


async def _invariants_hold(db_url: str) -> None:
    funnel = load_funnel(Path(__file__).parent.parent / "funnels" / "puramur.yaml")
    found = await check_funnel(funnel, db_url)
    assert [str(v) for v in found if v.severity == "error"] == []
