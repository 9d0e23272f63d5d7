"""The manager API across two `funnel serve` processes on one PostgreSQL: a customer's
messages go to one process while a manager takes the session over on the other; each
message is answered by the bot or held for the manager, never both."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from projects import copy_puramur
from service_support import stop, wait_ready

from engine.funnel.compiled import load_funnel
from engine.turn.invariants import check_funnel

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
CONVERSE = "converse-key-3f9a1c77e2b4"
MANAGE = "manage-key-71c0e9a4d25b"
BASE = "/v1/funnels/puramur"
SCRIPT = {"delay": 0.03, "default": {"reply": "bot"}}  # turns overlap the take-over

pytestmark = pytest.mark.postgres


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _serving(db_url: str, tmp_path: Path, funnel: Path, script: dict[str, Any]
             ) -> Iterator[list[str]]:
    """Two `funnel serve` processes of ``funnel`` on one database; their base URLs."""
    script_file = tmp_path / "script.yaml"
    script_file.write_text(yaml.safe_dump(script))
    env = {**os.environ, "FUNNEL_API_KEYS": f"{CONVERSE}:converse;{MANAGE}:manage",
           "FUNNEL_SECRET": "test-secret-0123456789abcdef", "FUNNEL_LOG_LEVEL": "warning",
           "FUNNEL_RATE_LIMIT": "100000/60"}
    procs, urls, logs = [], [], []
    for n in range(2):
        port = _free_port()
        log = tmp_path / f"serve-{n}.log"
        with log.open("w") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "engine.cli", "serve", str(funnel), "--db", db_url,
                 "--port", str(port), "--model", f"scripted:{script_file}"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        urls.append(f"http://127.0.0.1:{port}")
        logs.append(log)
    try:
        for proc, url, log in zip(procs, urls, logs, strict=True):
            wait_ready(url, proc, log)
        yield urls
    finally:
        for proc in procs:
            stop(proc)


@pytest.fixture
def two_services(db_url: str, tmp_path: Path) -> Iterator[list[str]]:
    with _serving(db_url, tmp_path, PURAMUR, SCRIPT) as urls:
        yield urls


async def test_take_over_on_one_worker_while_the_other_answers(
        two_services: list[str], sql: Any, db_url: str) -> None:
    customer = httpx.AsyncClient(base_url=two_services[0], timeout=60,
                                 headers={"X-API-Key": CONVERSE})
    manager = httpx.AsyncClient(base_url=two_services[1], timeout=60,
                                headers={"X-API-Key": MANAGE})
    sessions = [f"w{n}" for n in range(8)]
    async with customer, manager:
        for s in sessions:  # each session exists, answered by the bot
            assert (await customer.post(f"{BASE}/sessions/{s}/messages",
                                        json={"text": "hi"})).status_code == 200

        async def talk(s: str) -> list[dict[str, Any]]:
            out = []
            for n in range(6):
                r = await customer.post(f"{BASE}/sessions/{s}/messages",
                                        json={"text": f"m{n}"})
                assert r.status_code == 200, r.text
                out.append(r.json())
            return out

        async def take(s: str) -> dict[str, Any]:
            await asyncio.sleep(0.05)  # while the customer's turns run
            r = await manager.post(f"{BASE}/sessions/{s}/takeover", json={"manager": "Olena"})
            assert r.status_code == 200, r.text
            return dict(r.json())

        results = await asyncio.gather(*(talk(s) for s in sessions),
                                       *(take(s) for s in sessions))
        answers = results[:len(sessions)]
        after = [(await customer.post(f"{BASE}/sessions/{s}/messages",
                                      json={"text": "still there?"})).json()
                 for s in sessions]
        assert all(a["held"] is True and a["reply"] == "" for a in after)

        for s, replies in zip(sessions, answers, strict=True):
            held = [a.get("held", False) for a in replies]
            # Once one message is held, every later one is: the take-over happened once.
            assert held == sorted(held), (s, held)
            since = sql("SELECT since FROM funnel_control WHERE session_id = %s", (s,))[0][0]
            late = sql("SELECT count(*) FROM funnel_messages WHERE session_id = %s AND "
                       "role = 'assistant' AND NOT held AND created_at > %s", (s, since))
            assert late == [(0,)], s  # no bot reply after the take-over
            both = sql("SELECT count(*) FROM funnel_messages m JOIN funnel_turns t ON "
                       "t.session_id = m.session_id AND m.held AND m.role = 'user' "
                       "AND t.created_at > m.created_at WHERE m.session_id = %s", (s,))
            assert both == [(0,)], s  # no turn ran after a held message

        # Back to the bot on the other worker: the next message is the bot's again.
        for s in sessions:
            r = await customer.post(f"{BASE}/sessions/{s}/release", json={})
            assert r.status_code == 403  # the converse key cannot release
            r = await manager.post(f"{BASE}/sessions/{s}/release", json={"stage": "discovery"})
            assert r.status_code == 200, r.text
            r = await customer.post(f"{BASE}/sessions/{s}/messages", json={"text": "ok"})
            assert r.json()["reply"] == "bot" and "held" not in r.json()
    assert [str(v) for v in await check_funnel(load_funnel(PURAMUR), db_url)] == []


HOLD = "A manager confirms this in a moment."


async def test_an_approval_on_one_worker_while_the_customer_writes_to_the_other(
        db_url: str, tmp_path: Path, sql: Any) -> None:
    """Each customer message is handled once: held (the holding reply) before the
    approval, answered by the bot after it; two managers approving at once on the two
    workers decide it once."""
    funnel = copy_puramur(tmp_path / "project")
    data = yaml.safe_load(funnel.read_text())
    data["stages"]["discovery"]["approval"] = {"when": "pet.type == 'cat'", "timeout": "1h",
                                               "on_timeout": "reject", "holding_reply": HOLD}
    funnel.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    script = {"delay": 0.03, "match": [{"pattern": "cat", "output": {
        "reply": "A cat!", "updates": {"pet": {"type": "cat"}}}}], "default": {"reply": "bot"}}
    sessions = [f"g{n}" for n in range(6)]
    with _serving(db_url, tmp_path, funnel, script) as urls:
        customer = httpx.AsyncClient(base_url=urls[0], timeout=60,
                                     headers={"X-API-Key": CONVERSE})
        managers = [httpx.AsyncClient(base_url=u, timeout=60, headers={"X-API-Key": MANAGE})
                    for u in urls]
        async with customer, managers[0], managers[1]:
            for s in sessions:
                r = await customer.post(f"{BASE}/sessions/{s}/messages",
                                        json={"text": "I have a cat"})
                assert r.json()["reply"] == HOLD, r.text

            async def talk(s: str) -> list[dict[str, Any]]:
                out = []
                for n in range(6):
                    r = await customer.post(f"{BASE}/sessions/{s}/messages",
                                            json={"text": f"m{n}"})
                    assert r.status_code == 200, r.text
                    out.append(r.json())
                return out

            async def approve(s: str, who: int) -> int:
                await asyncio.sleep(0.05)  # while the customer's messages arrive
                r = await managers[who].post(f"{BASE}/sessions/{s}/approve",
                                             json={"manager": f"m{who}"})
                assert r.status_code in (200, 409), r.text
                return r.status_code

            results = await asyncio.gather(*(talk(s) for s in sessions),
                                           *(approve(s, 0) for s in sessions),
                                           *(approve(s, 1) for s in sessions))
        answers, codes = results[:len(sessions)], results[len(sessions):]
        for n, s in enumerate(sessions):
            assert sorted([codes[n], codes[n + len(sessions)]]) == [200, 409], s
            replies = answers[n]
            held = [a.get("held", False) for a in replies]
            # Held until the approval, the bot's after it: never both, never back.
            assert held == sorted(held, reverse=True), (s, held)
            assert all(a["reply"] == (HOLD if h else "bot") for a, h in zip(
                replies, held, strict=True)), s
            assert all(a["stage"] == ("greeting" if h else "discovery")
                       for a, h in zip(replies, held, strict=True)), s
            # Every customer message: held, or answered by exactly one turn.
            counts = sql("SELECT count(*) FILTER (WHERE role = 'user' AND held), "
                         "count(*) FILTER (WHERE role = 'user' AND NOT held), "
                         "(SELECT count(*) FROM funnel_turns t WHERE t.session_id = %s) "
                         "FROM funnel_messages WHERE session_id = %s", (s, s))
            assert counts == [(sum(held), 7 - sum(held), 7 - sum(held))], s
            assert sql("SELECT event FROM funnel_control_events WHERE session_id = %s "
                       "ORDER BY id", (s,)) == [("approval",), ("approved",)], s
    assert [str(v) for v in await check_funnel(load_funnel(funnel), db_url)] == []
