"""The manager's handoff alert through `funnel serve`: a JSON webhook, delivered once.

A fake manager endpoint on 127.0.0.1 records every request. The service's
background dispatcher runs every 0.2 s here; the outbox's backoff (10 s, 20 s,
...) is cut short by setting ``next_attempt_at = now()`` in SQL.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from service_support import running
from starlette.testclient import TestClient

from engine.service.app import create_app
from engine.service.config import ServiceConfig

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
DEMO = ROOT / "funnels" / "puramur" / "demo.yaml"
KEY = "converse-key-3f9a1c77e2b4"
BASE = "/v1/funnels/puramur"
PUBLIC = "https://chat.example.com"

pytestmark = pytest.mark.postgres


class Receiver:
    """A manager webhook on 127.0.0.1: records each request; answers 500 ``fail`` times first."""

    def __init__(self, fail: int = 0) -> None:
        self.requests: list[dict[str, Any]] = []
        self.fail = fail
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    status = 500 if receiver.fail > 0 else 200
                    receiver.fail -= 1
                    receiver.requests.append({
                        "path": self.path, "status": status, "body": json.loads(body),
                        "key": self.headers.get("Idempotency-Key"),
                        "type": self.headers.get("Content-Type")})
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/alerts"

    def delivered(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["status"] == 200]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def config(db_url: str, receiver: Receiver, model: str = f"scripted:{DEMO}",
           **overrides: Any) -> ServiceConfig:
    options: dict[str, Any] = {
        "funnels": [PURAMUR], "db": db_url, "model": model,
        "api_keys": {KEY: frozenset({"converse"})}, "secret": b"test-secret-0123456789abcdef",
        "rate_limit": (1000, 60.0), "handoff_webhook": receiver.url, "public_url": PUBLIC + "/",
        "dispatch_interval": 0.2}
    options.update(overrides)
    return ServiceConfig(**options)


def demo(client: TestClient, session: str) -> list[dict[str, Any]]:
    script = [str(m) for m in yaml.safe_load(DEMO.read_text())["customer"]]
    results = []
    for text in script[:7]:  # the 7th message completes the contact: the handoff
        r = client.post(f"{BASE}/sessions/{session}/messages", json={"text": text},
                        headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200, r.text
        results.append(r.json())
    assert [r["handoff"] for r in results] == [False] * 6 + [True]
    return results


def wait_for(check: Callable[[], Any], timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def test_handoff_alert_is_delivered_once_with_its_fields(db_url: str, sql: Any,
                                                         receiver: Receiver) -> None:
    with TestClient(create_app(config(db_url, receiver))) as client:
        demo(client, "crm-1842")
        time.sleep(0.7)  # three background dispatches: nothing more to send
    assert len(receiver.requests) == 1
    request = receiver.requests[0]
    body = request["body"]
    assert request["path"] == "/alerts" and request["type"] == "application/json"
    assert request["key"] == body["idempotency_key"] == "puramur:crm-1842:handoff"
    assert body["event"] == "handoff"
    assert (body["funnel"], body["session_id"], body["channel"]) == ("puramur", "crm-1842", "api")
    assert body["reason"] == "cart_confirmed"
    assert body["customer"]["name"] == "Anna" and body["customer"]["phone"] == "+380661234567"
    lines = body["cart"]["lines"]
    assert {line["sku"]: line["qty"] for line in lines if not line.get("is_gift")} == {
        "PR251010": 1, "PR251020": 2}
    assert body["cart"]["total"] == 277 + 2 * 420
    assert body["link"] == f"{PUBLIC}/v1/funnels/puramur/sessions/crm-1842"
    assert sql("SELECT attempts, delivered_at IS NOT NULL, last_error FROM funnel_outbox") == [
        (1, True, None)]


def test_a_failing_receiver_gets_the_alert_exactly_once_after_retries(
        db_url: str, sql: Any) -> None:
    receiver = Receiver(fail=2)

    def settled(attempts: int) -> bool:
        # The dispatch finished (failed or not): no claim holds the row (a claim
        # pushes next_attempt_at 60 s ahead; the backoff after failure k is 5 * 2^k s).
        rows = sql("SELECT attempts, delivered_at IS NOT NULL OR next_attempt_at < "
                   "now() + interval '50 s' FROM funnel_outbox")
        return rows == [(attempts, True)]

    try:
        with TestClient(create_app(config(db_url, receiver, public_url=None))) as client:
            demo(client, "s-retry")  # the turn's own dispatch: HTTP 500
            wait_for(lambda: settled(1))
            error, backoff = sql("SELECT last_error, next_attempt_at - now() FROM funnel_outbox")[0]
            assert "500" in error and 5 < backoff.total_seconds() <= 10
            time.sleep(0.5)  # the background dispatcher waits for the backoff
            assert len(receiver.requests) == 1
            for attempts in (2, 3):
                sql("UPDATE funnel_outbox SET next_attempt_at = now()")  # the backoff is over
                wait_for(lambda a=attempts: settled(a))  # type: ignore[misc]
            time.sleep(0.5)
    finally:
        receiver.close()
    assert [r["status"] for r in receiver.requests] == [500, 500, 200]
    assert {r["key"] for r in receiver.requests} == {"puramur:s-retry:handoff"}
    assert "link" not in receiver.requests[0]["body"]  # no FUNNEL_PUBLIC_URL: no link
    assert len(receiver.delivered()) == 1
    assert sql("SELECT attempts, delivered_at IS NOT NULL, last_error FROM funnel_outbox") == [
        (3, True, None)]


async def test_duplicate_handoff_triggers_deliver_once(db_url: str, sql: Any,
                                                       receiver: Receiver,
                                                       tmp_path: Path) -> None:
    script = tmp_path / "manager.yaml"
    script.write_text(yaml.safe_dump({
        "match": [{"pattern": "manager", "output": {"reply": "A manager will call you.", "actions": [
            {"type": "request_handoff", "reason": "explicit_request"}]}}],
        "default": {"reply": "ok"}}))
    app = create_app(config(db_url, receiver, model=f"scripted:{script}", session_queue=20))
    with running(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30,
                                     headers={"Authorization": f"Bearer {KEY}"}) as http:
            async def send() -> dict[str, Any]:
                r = await http.post(f"{BASE}/sessions/dup/messages", json={"text": "manager!"})
                assert r.status_code == 200, r.text
                return dict(r.json())

            results = await asyncio.gather(*(send() for _ in range(8)))
            assert [r["handoff"] for r in results].count(True) == 1
            # The handoff fires again (an operator reopened the session): the alert's
            # key is taken, so nothing new is queued or sent.
            sql("UPDATE puramur_sessions_state SET handoff_triggered_at = NULL, "
                "stage = 'greeting'")
            assert (await send())["handoff"] is True
            await asyncio.sleep(0.7)
    assert len(receiver.requests) == 1 and receiver.delivered()[0]["body"]["session_id"] == "dup"
    assert sql("SELECT COUNT(*), COUNT(delivered_at) FROM funnel_outbox") == [(1, 1)]
    assert sql("SELECT turns FROM puramur_sessions_state") == [(9,)]
