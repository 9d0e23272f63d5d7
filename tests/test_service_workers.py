"""Two `funnel serve` processes on one PostgreSQL, through HTTP: nothing lost, nothing twice.

200 sessions x 2 messages sent at once, one message of each session to each
process, so the two turns of a session always run in different processes and
meet at the session's advisory lock.
"""

from __future__ import annotations

import asyncio
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
from service_support import stop, wait_ready

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
KEY = "converse-key-3f9a1c77e2b4"
BASE = "/v1/funnels/puramur"
SCRIPT = {
    "delay": 0.02,  # the turns of a session overlap
    "match": [
        {"pattern": "alpha", "output": {"reply": "a", "updates": {"pet": {"type": "cat"}}}},
        {"pattern": "beta", "output": {"reply": "b", "updates": {"customer": {"name": "Bo"}}}},
    ],
    "default": {"reply": "ok"},
}

pytestmark = pytest.mark.postgres


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def two_services(db_url: str, tmp_path: Path) -> Iterator[list[str]]:
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump(SCRIPT))
    env = {**os.environ, "FUNNEL_API_KEYS": f"{KEY}:converse",
           "FUNNEL_SECRET": "test-secret-0123456789abcdef", "FUNNEL_LOG_LEVEL": "warning",
           "FUNNEL_RATE_LIMIT": "100000/60", "FUNNEL_TURN_POOL": "20"}
    procs, urls, logs = [], [], []
    for n in range(2):
        port = _free_port()
        log = tmp_path / f"serve-{n}.log"
        with log.open("w") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "engine.cli", "serve", str(PURAMUR), "--db", db_url,
                 "--port", str(port), "--model", f"scripted:{script}"],
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


@pytest.mark.slow
async def test_two_processes_200_sessions_two_messages_each(two_services: list[str],
                                                            sql: Any) -> None:
    n = 200
    statuses: dict[int, int] = {}
    retried: list[str] = []
    clients = [httpx.AsyncClient(base_url=url, timeout=60, headers={"X-API-Key": KEY},
                                 limits=httpx.Limits(max_connections=n)) for url in two_services]

    async def send(client: httpx.AsyncClient, session: str, text: str) -> None:
        for _ in range(10):
            r = await client.post(f"{BASE}/sessions/{session}/messages", json={"text": text})
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code != 503:
                assert r.status_code == 200, r.text
                return
            assert "Retry-After" in r.headers  # a documented refusal: send again
            retried.append(session)
            await asyncio.sleep(min(float(r.headers["Retry-After"]), 2))
        raise AssertionError(f"{session}: still refused after 10 tries")

    try:
        await asyncio.gather(*(send(clients[0], f"s-{i}", "alpha") for i in range(n)),
                             *(send(clients[1], f"s-{i}", "beta: I am Bo") for i in range(n)))
    finally:
        for client in clients:
            await client.aclose()
    assert statuses.get(200) == 2 * n, (statuses, retried)
    rows = sql("SELECT session_id, turns, pet, customer, row_version FROM "
               "puramur_sessions_state ORDER BY session_id")
    assert len(rows) == n
    for sid, turns, pet, customer, version in rows:
        assert (turns, version) == (2, 2), sid  # each turn saw the other's saved state
        assert pet.get("type") == "cat" and customer.get("name") == "Bo", sid  # nothing lost
    # A 503 that refused a message before the engine took it wrote nothing, so the
    # log has each message once (retried ones included).
    assert sql("SELECT role, COUNT(*) FROM funnel_messages GROUP BY role ORDER BY role") == [
        ("assistant", 2 * n), ("user", 2 * n)]
    assert sql("SELECT COUNT(DISTINCT (session_id, content)) FROM funnel_messages "
               "WHERE role = 'user'") == [(2 * n,)]
    assert sql("SELECT COUNT(*) FROM funnel_turns") == [(2 * n,)]
    print(f"statuses {statuses}; retried after a 503: {len(retried)}")
