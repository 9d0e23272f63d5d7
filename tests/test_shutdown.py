"""SIGTERM stops `funnel serve` within its documented bound, whatever its hooks do.

A real `funnel serve` (a subprocess, its own process group) runs Puramur with two hooks that
never return: the handoff notify hook (the outbox dispatcher is inside it) and an action hook
(a customer's turn is inside it when the signal comes). The process must exit before
:data:`engine.service.server.SHUTDOWN_BOUND_SECONDS` (plus the time a Python process takes to
start its exit), the turn in flight must end as turns end (the stage's fallback, a turn record
naming the hook), and the log must say what was cut.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import PURAMUR, ROOT, puramur_data
from service_support import stop, wait_ready

from engine.llm.models import ScriptedModel
from engine.service.config import ServiceConfig
from engine.service.core import Service
from engine.service.server import SHUTDOWN_BOUND_SECONDS
from engine.store.ddl import OUTBOX, TURNS

pytestmark = pytest.mark.postgres

KEY = "converse-key-3f9a1c77e2b4"
BASE = "/v1/funnels/puramur/sessions"
HELLO = {"reply": "Hello! Is your pet a cat or a dog?"}
HANDOFF = {"reply": "A manager will write to you.",
           "actions": [{"type": "request_handoff", "reason": "complaint"}]}
HOOKS = """
import pathlib, threading

def tag(call):
    if call.session_id == "stuck":
        pathlib.Path({tagged!r}).write_text("1")
        threading.Event().wait()  # never returns
    return None

def alert(payload):
    pathlib.Path({alerted!r}).write_text("1")
    threading.Event().wait()  # never returns
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(path: Path, proc: subprocess.Popen[Any], log: Path, seconds: float = 60) -> None:
    end = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > end:
            raise AssertionError(f"{path.name} never appeared; the log:\n{log.read_text()}")
        time.sleep(0.05)


def test_sigterm_exits_within_the_bound_while_hooks_never_return(
        tmp_path: Path, db_url: str, sql: Any) -> None:
    tagged, alerted = tmp_path / "tagged", tmp_path / "alerted"
    (tmp_path / "pet_hooks.py").write_text(
        HOOKS.format(tagged=str(tagged), alerted=str(alerted)), "utf-8")
    data = puramur_data()
    data["actions"]["tag"] = {"hook": "pet_hooks:tag", "writes": ["objections_raised"]}
    data["stages"]["greeting"]["on_enter"] = [{"type": "tag"}]
    data["handoff"]["notify"] = {"hook": "pet_hooks:alert"}
    data["model"]["deadline"] = 6
    funnel = tmp_path / "puramur.yaml"
    funnel.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"turns": [HELLO, HANDOFF], "default": HELLO}))
    port, log = _free_port(), tmp_path / "serve.log"
    env = {**os.environ, "FUNNEL_API_KEYS": f"{KEY}:converse",
           "FUNNEL_SECRET": "test-secret-0123456789abcdef", "FUNNEL_LOG_LEVEL": "info"}
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {KEY}"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "serve", str(funnel), "--db", db_url,
             "--port", str(port), "--model", f"scripted:{script}"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    answers: list[httpx.Response] = []
    try:
        wait_ready(url, proc, log)
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            assert client.post(f"{BASE}/h/messages", json={"text": "Hi"}).status_code == 200
            handoff = client.post(f"{BASE}/h/messages", json={"text": "I want to complain"})
            assert handoff.status_code == 200 and handoff.json()["handoff"] is True
        _wait_for(alerted, proc, log)  # the outbox's delivery is inside the notify hook

        def stuck() -> None:
            with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
                answers.append(client.post(f"{BASE}/stuck/messages", json={"text": "Hi"}))

        in_flight = threading.Thread(target=stuck)
        in_flight.start()
        _wait_for(tagged, proc, log)  # a turn is inside the action hook
        signalled = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(SHUTDOWN_BOUND_SECONDS + 15)  # the bound, and a Python exit's slack
        except subprocess.TimeoutExpired:
            raise AssertionError(f"`funnel serve` still running {SHUTDOWN_BOUND_SECONDS + 15} s "
                                 f"after SIGTERM; its log:\n{log.read_text()}") from None
        took = time.monotonic() - signalled
        in_flight.join(30)
    finally:
        if proc.poll() is None:
            stop(proc)
    text = log.read_text()
    # uvicorn ends by raising the signal it stopped for again: a clean exit by SIGTERM.
    assert proc.returncode in (0, -signal.SIGTERM), text
    assert took < SHUTDOWN_BOUND_SECONDS + 15
    # The turn in flight ended as turns end: the fallback, a record naming the hook.
    [answer] = answers
    assert answer.status_code == 200, answer.text
    assert answer.json()["fallback"] is True
    [(fallback, error)] = sql(f"SELECT fallback, error FROM {TURNS} WHERE session_id = 'stuck'")
    assert fallback is True and "did not return within 6 s" in error
    # The alert is not lost: its outbox row waits for the next process.
    [(delivered,)] = sql(f"SELECT delivered_at FROM {OUTBOX} WHERE kind = 'handoff'")
    assert delivered is None
    assert "Traceback" not in text


class _StuckChannel:
    """A channel whose accepted turns never finish (a Telegram turn on a 600 s deadline)."""

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        await asyncio.Event().wait()

    def queued(self) -> int:
        return 0


async def test_a_part_that_never_stops_is_cut_at_the_budget_and_named(
        db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    config = ServiceConfig(funnels=[PURAMUR], db=db_url, secret=b"s" * 32,
                           model=ScriptedModel.from_data({"default": HELLO}))
    service = Service(config)
    service.attach_telegram(_StuckChannel())  # type: ignore[arg-type]
    await service.start()
    store = service.store
    assert store is not None
    with caplog.at_level(logging.ERROR, logger="funnel.service"):
        # Far longer than the budget: a close that waited for the channel would time out here.
        await asyncio.wait_for(service.close(budget=3), 60)
    assert any("the Telegram channel's accepted turns still running" in r.getMessage()
               for r in caplog.records), caplog.text
    # What comes after the cut still ran: the database pool is closed.
    assert store.pool.closed  # type: ignore[attr-defined]
