"""Leases that end with their turn, and side effects delivered per target.

A worker renews its leases while its turns run; a worker killed with SIGKILL stops
renewing, so its session is free again in seconds. Each target of a handoff alert
is delivered and retried on its own; a kill during a webhook POST is counted as
the duplicate it causes (delivery is at least once, with a stable key).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from service_support import record_fault

from engine import Engine, ModelRequest, ScriptedModel
from engine.errors import DuplicateDelivery
from engine.llm.models import Completion
from engine.store import OutboxItem, open_store
from engine.store.ddl import INBOUND, LEASES
from engine.turn.notify import Targets, dispatch

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).with_name("_crash_worker.py")

pytestmark = pytest.mark.postgres


class Thinking:
    name = "scripted"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.inner = ScriptedModel.from_data({"default": {"reply": "ok"}})

    async def complete(self, request: ModelRequest) -> Completion:
        await asyncio.sleep(self.seconds)
        return await self.inner.complete(request)


def wait_for(check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


async def test_a_worker_killed_during_the_model_call_blocks_its_session_for_seconds(
        puramur: Any, db_url: str, sql: Any) -> None:
    engine = await Engine.open(puramur, db=db_url, model=Thinking(0))
    child = subprocess.Popen([sys.executable, str(WORKER), "turn", db_url, "crash", "k-1"])
    try:
        assert wait_for(lambda: sql(f"SELECT 1 FROM {LEASES} WHERE lock_key = 'puramur/crash' "
                                    "AND holder <> ''")), "the child never took the lease"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        killed = time.perf_counter()
        result = await engine.handle("crash", "Still there?")
        waited = time.perf_counter() - killed
        # The killed turn's message is pending; its second delivery runs no turn here.
        with pytest.raises(DuplicateDelivery) as dup:
            await engine.handle("crash", "I take two lotions", key="k-1")
    finally:
        if child.poll() is None:
            child.kill()
        await engine.close()
    assert result.reply == "ok" and waited < 10, waited
    assert dup.value.response is None and dup.value.message_id is not None
    assert sql(f"SELECT COUNT(*) FROM {INBOUND} WHERE response IS NULL") == [(1,)]
    record_fault("kill -9 during the model call", tried=1, lost=0, duplicated=0,
                 next_turn_seconds=round(waited, 1))


async def test_the_heartbeat_keeps_a_long_turn_s_lease(puramur: Any, db_url: str,
                                                       sql: Any) -> None:
    store: Any = await open_store(db_url)  # the PostgreSQL store: its heartbeat, its tables
    store.heartbeat.seconds, store.heartbeat.every = 1.0, 0.25
    store.table(puramur.spec).lease_seconds = 1.0
    engine = await Engine.open(puramur, store=store, model=Thinking(2.5))
    try:
        first = asyncio.create_task(engine.handle("long", "one"))
        await asyncio.sleep(0.3)
        second = asyncio.create_task(engine.handle("long", "two"))
        await asyncio.sleep(1.8)  # past the 1 s lease: renewed, so still the first turn's
        [(holder, alive)] = sql(f"SELECT holder, expires_at > NOW() FROM {LEASES} "
                                "WHERE lock_key = 'puramur/long'")
        results = await asyncio.gather(first, second)
    finally:
        await engine.close()
        await store.close()
    assert holder != "" and alive
    assert [r.state["turns"] for r in results] == [1, 2]
    assert sql("SELECT turns, row_version FROM puramur_sessions_state") == [(2, 2)]
    assert store.heartbeat.renewals >= 4


class Receiver:
    """A manager's webhook on 127.0.0.1: records each POST; ``hang`` holds them open."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.hang = threading.Event()
        self.got = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.posts.append((self.headers["Idempotency-Key"], body))
                receiver.got.set()
                if receiver.hang.is_set():
                    time.sleep(30)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/alert"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.httpd.shutdown()


async def test_a_failing_hook_never_resends_a_delivered_webhook(puramur: Any, db_url: str,
                                                                sql: Any) -> None:
    """notify: {webhook, hook}: the hook fails twice; the webhook got the alert once."""
    calls = {"webhook": 0, "hook": 0}

    async def webhook(payload: Any) -> None:
        calls["webhook"] += 1

    def hook(payload: Any) -> None:
        calls["hook"] += 1
        if calls["hook"] < 3:
            raise RuntimeError("CRM said 502")

    store = await open_store(db_url)
    try:
        await store.ensure_schema(puramur.spec)
        await store.add_outbox("puramur", "s-1", [OutboxItem("puramur:s-1:handoff", "handoff",
                                                             {"session_id": "s-1"})])
        delivered = []
        for _ in range(3):
            delivered.append(await dispatch(store, {"puramur": Targets(
                {"webhook": webhook, "hook": hook})}))
            sql("UPDATE funnel_outbox SET next_attempt_at = NOW()")  # the backoff is over
    finally:
        await store.close()
    assert calls == {"webhook": 1, "hook": 3} and delivered == [0, 0, 1]
    assert sql("SELECT done_targets, delivered_at IS NOT NULL FROM funnel_outbox") == [
        (["webhook", "hook"], True)]


async def test_a_kill_during_the_webhook_post_sends_it_twice_with_one_key(
        puramur: Any, db_url: str, sql: Any, receiver: Receiver) -> None:
    """The crash window of at-least-once: killed while the POST is in flight, the alert
    is POSTed again by the next dispatch, with the same Idempotency-Key."""
    store = await open_store(db_url)
    await store.ensure_schema(puramur.spec)
    await store.add_outbox("puramur", "s-9", [OutboxItem("puramur:s-9:handoff", "handoff",
                                                         {"session_id": "s-9"})])
    receiver.hang.set()
    child = subprocess.Popen([sys.executable, str(WORKER), "dispatch", db_url, receiver.url])
    try:
        assert receiver.got.wait(30), "the child never POSTed"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        receiver.hang.clear()
        sql("UPDATE funnel_outbox SET next_attempt_at = NOW()")  # the claim ran out
        from engine.turn.notify import make_notifier

        delivered = await dispatch(store, {"puramur": make_notifier(puramur.spec,
                                                                    webhook=receiver.url)})
    finally:
        if child.poll() is None:
            child.kill()
        await store.close()
    keys = [k for k, _ in receiver.posts]
    assert delivered == 1 and keys == ["puramur:s-9:handoff"] * 2
    record_fault("kill -9 during the handoff webhook POST", tried=1, lost=0,
                 duplicated=len(keys) - 1, same_idempotency_key=len(set(keys)) == 1)
