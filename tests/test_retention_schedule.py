"""The retention purge inside `funnel serve` (engine.service.retention): on a schedule,
one worker at a time and once per interval, failures logged and retried.

Two app instances on one real database stand for two workers. Sessions are made
old by moving their ``last_message_at`` back past Puramur's ``retention: 365d``.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from service_support import stop, wait_ready
from starlette.testclient import TestClient

from engine.service.app import create_app
from engine.service.config import ServiceConfig

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
DEMO = ROOT / "funnels" / "puramur" / "demo.yaml"
KEY = "converse-key-1b3d5f7a9c2e"
SECRET = b"test-secret-0123456789abcdef"
TABLE = "puramur_sessions_state"

pytestmark = pytest.mark.postgres


def config(db_url: str, interval: float) -> ServiceConfig:
    return ServiceConfig(funnels=[PURAMUR], db=db_url, model=f"scripted:{DEMO}", secret=SECRET,
                         api_keys={KEY: frozenset({"converse"})}, rate_limit=(1000, 60.0),
                         retention_interval=interval)


@pytest.fixture
def two_workers(db_url: str) -> Iterator[tuple[TestClient, TestClient]]:
    # A long interval: the schedulers' own wake-ups stay out of the test's way.
    with ExitStack() as stack:
        yield (stack.enter_context(TestClient(create_app(config(db_url, 3600)))),
               stack.enter_context(TestClient(create_app(config(db_url, 3600)))))


def sessions(client: TestClient, sql: Any, *names: str, old: bool) -> None:
    for name in names:
        r = client.post(f"/v1/funnels/puramur/sessions/{name}/messages", json={"text": "Hi"},
                        headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200, r.text
    if old:
        sql(f"UPDATE {TABLE} SET last_message_at = NOW() - INTERVAL '400 days' "
            "WHERE session_id = ANY(%s)", (list(names),))


def left(sql: Any) -> list[str]:
    return [r[0] for r in sql(f"SELECT session_id FROM {TABLE} ORDER BY 1")]


def run_once(client: TestClient) -> dict[str, str]:
    scheduler = client.app.state.retention  # type: ignore[attr-defined]
    result: dict[str, str] = client.portal.call(scheduler.run_once)  # type: ignore[union-attr]
    return result


def metric(client: TestClient, outcome: str) -> float:
    metrics = client.app.state.service.metrics  # type: ignore[attr-defined]
    return float(metrics.value("funnel_retention_runs_total", funnel="puramur",
                               outcome=outcome))


def test_one_worker_purges_once_per_interval(two_workers: tuple[TestClient, TestClient],
                                             sql: Any, caplog: pytest.LogCaptureFixture) -> None:
    a, b = two_workers
    sessions(a, sql, "old-1", "old-2", old=True)
    sessions(a, sql, "new-1", old=False)
    caplog.set_level(logging.INFO, "funnel.service.retention")

    # Both wake up at once: one purges, the other finds it taken or already done.
    with ThreadPoolExecutor(2) as pool:
        outcomes = [o["puramur"] for o in pool.map(run_once, (a, b))]
    assert outcomes.count("done") == 1 and set(outcomes) - {"done"} <= {"busy", "not_due"}
    assert left(sql) == ["new-1"]
    assert sql("SELECT messages_gone FROM (SELECT count(*) = 0 AS messages_gone FROM "
               "funnel_messages WHERE session_id LIKE 'old-%') m") == [(True,)]
    [line] = [r.getMessage() for r in caplog.records if "deleted" in r.getMessage()]
    assert line.startswith("retention purge of funnel puramur: deleted 2 session(s)")
    assert metric(a, "done") + metric(b, "done") == 1

    # Within the interval nobody purges again, whatever is old by now.
    sessions(b, sql, "old-3", old=True)
    assert run_once(a) == run_once(b) == {"puramur": "not_due"}
    assert left(sql) == ["new-1", "old-3"]

    # An interval later (the last run moved back), the next wake-up purges.
    sql("UPDATE funnel_jobs SET last_run_at = last_run_at - INTERVAL '1 hour'")
    assert run_once(b) == {"puramur": "done"} and run_once(a) == {"puramur": "not_due"}
    assert left(sql) == ["new-1"]


def test_a_failed_purge_is_logged_and_retried(two_workers: tuple[TestClient, TestClient],
                                              sql: Any, caplog: pytest.LogCaptureFixture
                                              ) -> None:
    a, _ = two_workers
    sessions(a, sql, "old-1", old=True)
    sql(f"ALTER TABLE {TABLE} RENAME TO parked")
    try:
        assert run_once(a) == {"puramur": "failed"}
    finally:
        sql(f"ALTER TABLE parked RENAME TO {TABLE}")
    assert any("retention purge of funnel puramur failed" in r.getMessage()
               for r in caplog.records)
    assert metric(a, "failed") == 1
    # The failure did not count as the interval's run: the next wake-up purges.
    assert run_once(a) == {"puramur": "done"}
    assert left(sql) == []
    assert a.get("/healthz").status_code == 200  # and the service runs on


def test_the_schedule_runs_by_itself(db_url: str, sql: Any,
                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "funnel.service.retention")
    def logged() -> bool:
        return any(r.getMessage().startswith("retention purge of funnel puramur: deleted 1")
                   for r in caplog.records)

    with TestClient(create_app(config(db_url, 0.2))) as client:
        sessions(client, sql, "old-1", old=True)
        deadline = time.monotonic() + 30
        # The run logs after its transaction: wait for the line, not only for the rows.
        while not logged() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert logged()
        assert left(sql) == []
        assert metric(client, "done") >= 1


def test_zero_interval_disables_it(db_url: str) -> None:
    assert ServiceConfig.from_env({"FUNNEL_SERVE_FUNNELS": str(PURAMUR),
                                   "FUNNEL_RETENTION_INTERVAL": "0"}).retention_interval == 0
    assert ServiceConfig.from_env({"FUNNEL_SERVE_FUNNELS": str(PURAMUR)}
                                  ).retention_interval == 3600
    with TestClient(create_app(config(db_url, 0))) as client:
        assert client.app.state.retention._task is None  # type: ignore[attr-defined]


@pytest.mark.slow
def test_funnel_serve_logs_each_run(db_url: str, sql: Any, tmp_path: Path) -> None:
    # The real command, two workers: the engine's log line reaches the service's log.
    assert subprocess.run([sys.executable, "-m", "engine.cli", "migrate", str(PURAMUR),
                           "--db", db_url], cwd=ROOT, capture_output=True).returncode == 0
    sql(f"INSERT INTO {TABLE} (session_id, last_message_at) VALUES "
        "('old-1', NOW() - INTERVAL '400 days'), ('old-2', NOW() - INTERVAL '400 days')")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    log = tmp_path / "serve.log"
    env = {**os.environ, "FUNNEL_RETENTION_INTERVAL": "1", "FUNNEL_SECRET": SECRET.decode()}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "serve", str(PURAMUR), "--db", db_url,
             "--port", str(port), "--workers", "2", "--model", f"scripted:{DEMO}"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, log)
        deadline = time.monotonic() + 60
        while "deleted 2 session(s)" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop(proc)
    text = log.read_text()
    assert "INFO:     retention purge of funnel puramur: deleted 2 session(s)" in text, text
    assert left(sql) == []
