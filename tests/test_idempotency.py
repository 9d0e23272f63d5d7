"""Exactly-once turns over HTTP: the ``Idempotency-Key`` header (or ``client_message_id``).

A client may retry a message as often as it likes with the same key: during the
first turn, after it, on another worker, after a 503 that came after the message
was logged. One turn runs; every answer is that turn's.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_support import TcpProxy, record_fault, running
from starlette.testclient import TestClient

from engine.llm.models import ScriptedModel
from engine.service.app import create_app
from engine.service.auth import ApiKeys
from engine.service.config import ServiceConfig

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
DEMO = ROOT / "funnels" / "puramur" / "demo.yaml"
KEY = "converse-key-3f9a1c77e2b4"
OTHER = "another-client-key-77d1e0a9"
BASE = "/v1/funnels/puramur"

pytestmark = pytest.mark.postgres


def config(db_url: str, **overrides: Any) -> ServiceConfig:
    options: dict[str, Any] = {
        "funnels": [PURAMUR], "db": db_url, "model": f"scripted:{DEMO}",
        "api_keys": {KEY: frozenset({"converse"}), OTHER: frozenset({"converse"})},
        "secret": b"test-secret-0123456789abcdef", "rate_limit": (1000, 60.0),
    }
    options.update(overrides)
    return ServiceConfig(**options)


def headers(key: str | None = None, api_key: str = KEY) -> dict[str, str]:
    out = {"Authorization": f"Bearer {api_key}"}
    if key is not None:
        out["Idempotency-Key"] = key
    return out


def same_turn(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "replayed"}


def test_five_concurrent_deliveries_and_one_after_run_one_turn(db_url: str, sql: Any) -> None:
    slow = ScriptedModel.from_file(DEMO)
    slow.delay = 1.0
    apps = [create_app(config(db_url, model=slow)) for _ in range(2)]  # two workers
    with running(apps[0]) as a, running(apps[1]) as b:
        def send(url: str) -> httpx.Response:
            return httpx.post(f"{url}{BASE}/sessions/k-1/messages", json={"text": "Hi!"},
                              headers=headers("msg-0001"), timeout=30)

        with ThreadPoolExecutor(5) as pool:
            answers = list(pool.map(send, [a, b, a, b, a]))
        after = send(b)
    bodies = [r.json() for r in [*answers, after]]
    assert all(r.status_code == 200 for r in [*answers, after])
    assert all(same_turn(x) == same_turn(bodies[0]) for x in bodies)
    assert sorted(x["replayed"] for x in bodies[:5]) == [False, True, True, True, True]
    assert bodies[5]["replayed"] is True and after.headers["Idempotent-Replayed"] == "true"
    assert [r.headers.get("Idempotent-Replayed") for r in answers].count(None) == 1
    assert sql("SELECT COUNT(*) FROM funnel_turns") == [(1,)]
    assert sql("SELECT COUNT(*) FROM funnel_messages WHERE role = 'user'") == [(1,)]
    assert bodies[0]["turn_id"] == sql("SELECT id FROM funnel_messages WHERE role = 'user'")[0][0]
    record_fault("HTTP Idempotency-Key x5 concurrent + 1 after, two workers", tried=1, lost=0,
                 duplicated=sql("SELECT COUNT(*) - 1 FROM funnel_turns")[0][0])


def test_keys_are_checked_and_scoped(db_url: str, sql: Any) -> None:
    with TestClient(create_app(config(db_url))) as client:
        url = f"{BASE}/sessions/k-2/messages"
        first = client.post(url, json={"text": "Hi!", "client_message_id": "m-1"},
                            headers=headers())
        again = client.post(url, json={"text": "Hi!"}, headers=headers("m-1"))
        assert first.status_code == 200 and again.json()["replayed"] is True
        assert same_turn(first.json()) == same_turn(again.json())
        # another client, or another session, with the same key: its own turn
        theirs = client.post(url, json={"text": "Hi!"}, headers=headers("m-1", OTHER))
        assert theirs.json()["replayed"] is False
        other = client.post(f"{BASE}/sessions/k-3/messages", json={"text": "Hi!"},
                            headers=headers("m-1"))
        assert other.json()["replayed"] is False
        for bad in ("", "has space", "x" * 201):
            r = client.post(url, json={"text": "Hi!"}, headers=headers(bad))
            assert r.status_code == 400 and "Idempotency-Key" in r.json()["message"], bad
        for bad_id in ("ключ", "m-2\n"):  # a trailing newline too: patterns match whole
            r = client.post(url, json={"text": "Hi!", "client_message_id": bad_id},
                            headers=headers())
            assert r.status_code == 400 and "client_message_id" in r.json()["message"], bad_id
        r = client.post(url, json={"text": "Hi!", "client_message_id": "a"}, headers=headers("m-1"))
        assert r.json()["replayed"] is True  # the header wins
        r = client.post(url, json={"text": "Hi!", "client_message_id": 7}, headers=headers())
        assert r.status_code == 400
    assert sql("SELECT COUNT(*) FROM funnel_turns") == [(3,)]


def test_widget_messages_take_a_client_message_id(db_url: str, sql: Any) -> None:
    with TestClient(create_app(config(db_url))) as client:
        token = client.post(f"{BASE}/widget/session").json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        one = client.post(f"{BASE}/widget/messages", json={"text": "Hi!",
                                                           "client_message_id": "w-1"},
                          headers=auth)
        two = client.post(f"{BASE}/widget/messages", json={"text": "Hi!",
                                                           "client_message_id": "w-1"},
                          headers=auth)
    assert one.json()["replayed"] is False and two.json()["replayed"] is True
    assert sql("SELECT COUNT(*) FROM funnel_turns") == [(1,)]


class GatedModel:
    """The demo script, but a call waits until the test opens the gate."""

    name = "gated"

    def __init__(self) -> None:
        self.inner = ScriptedModel.from_file(DEMO)
        self.called = threading.Event()
        self.gate = threading.Event()

    async def complete(self, request: Any) -> Any:
        import asyncio

        self.called.set()
        await asyncio.to_thread(self.gate.wait, 30)
        return await self.inner.complete(request)


def test_a_retry_after_a_503_that_followed_the_log_runs_the_turn_once(db_url: str,
                                                                       sql: Any) -> None:
    """The database goes away during the model call: the client gets a 503 although its
    message was logged. Its retry with the same key runs that message's turn, once (the
    message is not logged again)."""
    proxy = TcpProxy(db_url)
    model = GatedModel()
    app = create_app(config(proxy.dsn, model=model, db_timeout=1.0, retry_after=1))
    try:
        with running(app) as url, httpx.Client(base_url=url, timeout=60) as http:
            box: dict[str, httpx.Response] = {}
            worker = threading.Thread(target=lambda: box.setdefault("r", http.post(
                f"{BASE}/sessions/r-1/messages", json={"text": "Hi!"},
                headers=headers("retry-1"))))
            worker.start()
            assert model.called.wait(10)  # logged; the model is thinking
            proxy.cut()
            model.gate.set()
            worker.join(60)
            assert box["r"].status_code == 503 and "Retry-After" in box["r"].headers
            proxy.restore()
            deadline = time.monotonic() + 30
            statuses = []
            while True:
                r = http.post(f"{BASE}/sessions/r-1/messages", json={"text": "Hi!"},
                              headers=headers("retry-1"))
                statuses.append(r.status_code)
                if r.status_code == 200 or time.monotonic() > deadline:
                    break
                assert r.status_code == 503 and "Retry-After" in r.headers
                time.sleep(float(r.headers["Retry-After"]))
    finally:
        proxy.close()
    assert r.status_code == 200, r.text
    assert r.json()["replayed"] is True and r.json()["reply"].startswith("Hello!")
    assert sql("SELECT COUNT(*) FROM funnel_messages WHERE role = 'user'") == [(1,)]
    assert sql("SELECT COUNT(*) FROM funnel_turns") == [(1,)]
    record_fault("HTTP retry with the key after a 503 that followed the log", tried=1,
                 lost=0, duplicated=sql("SELECT COUNT(*) - 1 FROM funnel_turns")[0][0],
                 retries=len(statuses))


async def test_a_claimed_message_answered_meanwhile_runs_no_second_turn(puramur: Any,
                                                                       db_url: str,
                                                                       sql: Any) -> None:
    """A worker that stalled past its claim saves after all; the worker that claimed the
    message finds the answer once it holds the lease, and runs nothing."""
    from engine import Engine
    from engine.errors import DuplicateDelivery

    engine = await Engine.open(puramur, db=db_url, model=ScriptedModel.from_file(DEMO))
    try:
        first = await engine.handle("late", "Hi!", channel="telegram", key="1:5")
        with pytest.raises(DuplicateDelivery) as dup:
            await engine.handle("late", "Hi!", channel="telegram", key="1:5",
                                message_id=first.message_id)
    finally:
        await engine.close()
    assert dup.value.response is not None and dup.value.response["reply"] == first.reply
    assert sql("SELECT COUNT(*) FROM funnel_turns") == [(1,)]
    assert sql("SELECT COUNT(*) FROM funnel_leases WHERE holder <> ''") == [(0,)]


async def test_keys_expire_with_retention(puramur: Any, db_url: str, sql: Any) -> None:
    from engine import Engine

    engine = await Engine.open(puramur, db=db_url, model=ScriptedModel.from_file(DEMO))
    try:
        await engine.handle("old", "Hi!", key="api/old/k-1")
        await engine.store.log_message(puramur.spec, "left", "user", "no turn")
        sql("INSERT INTO funnel_inbound (funnel, channel, key, session_id, created_at) VALUES "
            "('puramur', 'api', 'stale', 'left', NOW() - INTERVAL '2 days')")
        assert sql("SELECT COUNT(*) FROM funnel_inbound") == [(2,)]
        await engine.store.purge(puramur.spec, 86400)  # a day: only the stale key goes
        assert sql("SELECT key FROM funnel_inbound") == [("api/old/k-1",)]
        sql("UPDATE puramur_sessions_state SET last_message_at = NOW() - INTERVAL '2 days'")
        await engine.store.purge(puramur.spec, 86400)  # the session goes, with its keys
    finally:
        await engine.close()
    assert sql("SELECT COUNT(*) FROM funnel_inbound") == [(0,)]


def test_a_key_reused_with_another_message_is_refused(db_url: str, sql: Any) -> None:
    with TestClient(create_app(config(db_url))) as client:
        url = f"{BASE}/sessions/k-9/messages"
        first = client.post(url, json={"text": "Hi!"}, headers=headers("pay-1"))
        assert first.status_code == 200
        other = client.post(url, json={"text": "I have a cat"}, headers=headers("pay-1"))
        assert other.status_code == 422, other.text
        assert other.json()["error"] == "idempotency_key_reused"
        assert "'pay-1'" in other.json()["message"]
        again = client.post(url, json={"text": "Hi!"}, headers=headers("pay-1"))
        assert again.status_code == 200 and again.json()["replayed"] is True
    assert sql("SELECT content FROM funnel_messages WHERE role = 'user'") == [("Hi!",)]
    record_fault("HTTP Idempotency-Key reused with another body", tried=1, lost=0,
                 duplicated=sql("SELECT COUNT(*) - 1 FROM funnel_turns")[0][0])


def test_keys_are_scoped_by_the_api_key_not_its_place_in_the_list(db_url: str, sql: Any
                                                                  ) -> None:
    url = f"{BASE}/sessions/k-10/messages"
    with TestClient(create_app(config(db_url))) as client:
        mine = client.post(url, json={"text": "Hi!"}, headers=headers("ord-1", KEY))
        assert mine.json()["replayed"] is False
    # The operator swaps the keys' order: OTHER now holds KEY's place (key#1).
    swapped = {OTHER: frozenset({"converse"}), KEY: frozenset({"converse"})}
    with TestClient(create_app(config(db_url, api_keys=swapped))) as client:
        theirs = client.post(url, json={"text": "Hi!"}, headers=headers("ord-1", OTHER))
        assert theirs.json()["replayed"] is False  # its own turn, not KEY's answer
        mine = client.post(url, json={"text": "Hi!"}, headers=headers("ord-1", KEY))
        assert mine.json()["replayed"] is True  # still KEY's, at its new place
    first = ApiKeys({KEY: frozenset()}).check(KEY)
    assert first is not None and KEY not in first.identity and first.name == "key#1"
    assert sql("SELECT COUNT(*) FROM funnel_turns") == [(2,)]
