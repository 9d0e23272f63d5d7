"""`funnel serve`: the HTTP service on the real engine, a real PostgreSQL and the scripted model.

Most tests use Starlette's TestClient; those that need real concurrency, real
logs, a browser or schemathesis run the app under uvicorn on 127.0.0.1
(tests/service_support.py), with a fake Telegram Bot API and a TCP proxy in
front of PostgreSQL that a test can cut.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from service_support import FakeTelegram, TcpProxy, running, stop, wait_ready
from starlette.testclient import TestClient
from studio_support import chromium as _chromium  # skipped, or failed on CI

from engine.boundary.customer import MAX_MESSAGE_CHARS
from engine.errors import ConfigError
from engine.llm.models import Completion, ModelRequest, ScriptedModel
from engine.service.app import create_app
from engine.service.auth import WidgetTokens
from engine.service.config import ServiceConfig, TelegramBot, parse_api_keys
from engine.service.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
DEMO = ROOT / "funnels" / "puramur" / "demo.yaml"
GREETING = "Hello! I'm the Puramur consultant. Is your pet a cat or a dog?"
CONVERSE = "converse-key-3f9a1c77e2b4"
READER = "read-state-key-8d21b5c04e9f"
ADMIN = "admin-key-5b7e2f19a6c3d8"
METRICS = "metrics-key-0c4d8e1f7a2b"
BOT_TOKEN = "123456:TEST-bot-token"
HOOK_SECRET = "hook-secret-4c8e1b"
SECRET = b"test-secret-0123456789abcdef"
BASE = "/v1/funnels/puramur"

pytestmark = pytest.mark.postgres


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def config(db_url: str, **overrides: Any) -> ServiceConfig:
    options: dict[str, Any] = {
        "funnels": [PURAMUR], "db": db_url, "model": f"scripted:{DEMO}",
        "api_keys": {CONVERSE: frozenset({"converse"}), READER: frozenset({"read_state"}),
                     ADMIN: frozenset({"admin"}), METRICS: frozenset({"metrics"})},
        "secret": SECRET, "rate_limit": (1000, 60.0), "telegram_api": "http://127.0.0.1:9",
        "telegram": {"PURAMUR": TelegramBot(BOT_TOKEN, HOOK_SECRET)},
    }
    options.update(overrides)
    return ServiceConfig(**options)


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(config(db_url))) as c:
        yield c


@pytest.fixture
def telegram() -> Iterator[FakeTelegram]:
    fake = FakeTelegram().start()
    yield fake
    fake.stop()


class GatedModel:
    """The demo script, but each call waits until the test opens the gate."""

    name = "gated"

    def __init__(self) -> None:
        self.inner = ScriptedModel.from_file(DEMO)
        self.called = threading.Event()
        self.gate = threading.Event()

    async def complete(self, request: ModelRequest) -> Completion:
        self.called.set()
        await asyncio.to_thread(self.gate.wait, 30)
        return await self.inner.complete(request)


def user_messages(sql: Any, session: str) -> list[str]:
    return [r[0] for r in sql("SELECT content FROM funnel_messages WHERE session_id = %s "
                              "AND role = 'user' ORDER BY id", (session,))]


# -- the API --------------------------------------------------------------------------


def test_messages_round_trip_and_state(client: TestClient, sql: Any) -> None:
    r = client.post(f"{BASE}/sessions/s-1/messages", json={"text": "Hi!"}, headers=bearer(CONVERSE))
    assert r.status_code == 200, r.text
    turn_id = sql("SELECT id FROM funnel_messages WHERE session_id = 's-1'")[0][0]
    assert r.json() == {"reply": GREETING, "stage": "discovery", "handoff": False,
                        "fallback": False, "replayed": False, "turn_id": turn_id}
    assert "idempotent-replayed" not in r.headers
    r = client.post(f"{BASE}/sessions/s-1/messages", json={"text": "A Sphynx, dry skin"},
                    headers={"X-API-Key": CONVERSE})
    assert r.json()["stage"] == "presentation"
    state = client.get(f"{BASE}/sessions/s-1", headers=bearer(READER)).json()
    assert state["stage"] == "presentation" and state["pet"]["breed"] == "Sphynx"
    assert state["turns"] == 2 and "explain" not in state
    explained = client.get(f"{BASE}/sessions/s-1?explain=1", headers=bearer(READER)).json()
    assert [step["stage"] for step in explained["explain"]] == ["discovery", "presentation"]
    assert explained["explain"][0]["fired"] == "presentation"
    assert user_messages(sql, "s-1") == ["Hi!", "A Sphynx, dry skin"]
    assert client.get(f"{BASE}/sessions/nobody", headers=bearer(ADMIN)).status_code == 404
    assert client.get("/v1/funnels/nope/sessions/s-1", headers=bearer(ADMIN)).status_code == 404
    r = client.post(f"{BASE}/sessions/s-1/messages", content=b"{not json",
                    headers=bearer(CONVERSE))
    assert r.status_code == 400 and r.json()["error"] == "bad_request"
    assert client.post(f"{BASE}/sessions/s-1/messages", json={"text": "  "},
                       headers=bearer(CONVERSE)).status_code == 400


def test_the_demo_conversation_reaches_handoff(client: TestClient) -> None:
    script = [str(m) for m in yaml.safe_load(DEMO.read_text())["customer"]]
    results = [client.post(f"{BASE}/sessions/demo/messages", json={"text": text},
                           headers=bearer(CONVERSE)).json() for text in script]
    assert [r["handoff"] for r in results].count(True) == 1
    assert results[-1]["stage"] == "handoff"


def test_each_funnels_demo_page_shows_its_own_content(db_url: str) -> None:
    b2b = ROOT / "funnels" / "b2b_demo.yaml"
    with TestClient(create_app(config(db_url, funnels=[PURAMUR, b2b], telegram={}))) as c:
        page = c.get("/demo/b2b_demo").text
    assert 'data-funnel="b2b_demo"' in page
    assert "Qualifies a company for a B2B analytics product" in page  # its description
    assert "UAH" not in page and "shampoo" not in page.lower()  # nothing of Puramur's


def test_health_ready_openapi_and_static(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["funnels"] == {"puramur": "ok"}
    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.") and f"{BASE}/sessions/{{session}}/messages".replace(
        "puramur", "{funnel}") in doc["paths"]
    js = client.get("/widget.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert "localStorage" in js.text and "/widget/session" in js.text
    assert "fw-panel" in client.get("/widget.css").text
    demo = client.get("/demo/puramur")
    assert 'data-funnel="puramur"' in demo.text
    assert "Brilliant White shampoo" in demo.text  # its own catalog's first products
    assert client.get("/demo/nope").status_code == 404


# -- authentication --------------------------------------------------------------------


def test_auth_missing_wrong_and_scopes(client: TestClient) -> None:
    url = f"{BASE}/sessions/a-1/messages"
    r = client.post(url, json={"text": "Hi!"})
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    assert client.post(url, json={"text": "Hi!"}, headers=bearer("x" * 24)).status_code == 401
    assert client.post(url, json={"text": "Hi!"}, headers=bearer(READER)).status_code == 403
    assert client.post(url, json={"text": "Hi!"}, headers=bearer(METRICS)).status_code == 403
    assert client.post(url, json={"text": "Hi!"}, headers=bearer(ADMIN)).status_code == 200
    assert client.get(f"{BASE}/sessions/a-1", headers=bearer(CONVERSE)).status_code == 403
    assert client.get(f"{BASE}/sessions/a-1").status_code == 401
    assert client.get(f"{BASE}/sessions/a-1", headers=bearer(READER)).status_code == 200
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=bearer(CONVERSE)).status_code == 403
    assert client.get("/metrics", headers=bearer(METRICS)).status_code == 200


def test_keys_never_reach_the_logs(db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "wrong-key-that-must-not-be-logged"
    with running(create_app(config(db_url))) as url, httpx.Client(base_url=url) as http:
        for key in (CONVERSE, READER, wrong):
            http.post(f"{BASE}/sessions/log-1/messages", json={"text": "Hi!"},
                      headers=bearer(key))
            http.get(f"{BASE}/sessions/log-1", headers={"X-API-Key": key})
        body = http.get(f"{BASE}/sessions/log-1", headers=bearer(wrong)).text
    logged = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert "/sessions/log-1/messages" in logged  # the access log was captured
    for key in (CONVERSE, READER, wrong, SECRET.decode()):
        assert key not in logged
        assert key not in body
    assert parse_api_keys(f"{CONVERSE}:converse;{ADMIN}:admin") == {
        CONVERSE: frozenset({"converse"}), ADMIN: frozenset({"admin"})}
    with pytest.raises(Exception, match="unknown scope") as bad:
        parse_api_keys(f"{CONVERSE}:converse,root")
    assert CONVERSE not in str(bad.value)


# -- the widget's session tokens ------------------------------------------------------


def _widget(client: TestClient) -> str:
    r = client.post(f"{BASE}/widget/session")
    assert r.status_code == 200, r.text
    return str(r.json()["token"])


def test_widget_token_reaches_only_its_own_session(client: TestClient, sql: Any) -> None:
    a, b = _widget(client), _widget(client)
    tokens = WidgetTokens(SECRET, 3600)
    sa, sb = tokens.verify(a, "puramur"), tokens.verify(b, "puramur")
    assert sa and sb and sa.session_id != sb.session_id and sa.session_id.startswith("w-")
    r = client.post(f"{BASE}/widget/messages", json={"text": "Hi!"}, headers=bearer(a))
    assert r.status_code == 200 and r.json()["reply"] == GREETING
    client.post(f"{BASE}/widget/messages", json={"text": "B's secret order"}, headers=bearer(b))
    history = client.get(f"{BASE}/widget/messages", headers=bearer(a)).json()["messages"]
    assert [m["content"] for m in history] == ["Hi!", GREETING]
    assert user_messages(sql, sa.session_id) == ["Hi!"]

    # The same payload naming B's session, with A's signature: refused.
    payload, signature = a.split(".")
    data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    data["s"] = sb.session_id
    forged = base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()
    for token in (f"{forged}.{signature}", WidgetTokens(b"another-secret-123456", 60).issue(
            "puramur", sb.session_id)[0], WidgetTokens(SECRET, -10).issue(
            "puramur", sb.session_id)[0], "garbage", ""):
        for method, body in (("POST", {"text": "show me B"}), ("GET", None)):
            r = client.request(method, f"{BASE}/widget/messages", headers=bearer(token),
                               json=body)
            assert r.status_code == 401, (token, r.text)
    # A widget token is no API key, and session ids in API paths need one.
    assert client.get(f"{BASE}/sessions/{sb.session_id}", headers=bearer(a)).status_code == 401
    assert client.post(f"{BASE}/sessions/{sb.session_id}/messages", json={"text": "x"},
                       headers=bearer(a)).status_code == 401
    assert tokens.verify(a, "b2b_demo") is None  # bound to its funnel
    assert user_messages(sql, sb.session_id) == ["B's secret order"]
    # Renewing keeps the session; the service, not the browser, chose it.
    renewed = client.post(f"{BASE}/widget/session", headers=bearer(a)).json()["token"]
    renewed_session = tokens.verify(renewed, "puramur")
    assert renewed_session is not None and renewed_session.session_id == sa.session_id


def test_widget_origins_are_an_allow_list(db_url: str) -> None:
    shop = "https://shop.example"
    with TestClient(create_app(config(db_url, cors_origins=[shop]))) as client:
        ok = client.post(f"{BASE}/widget/session", headers={"Origin": shop})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == shop
        evil = client.post(f"{BASE}/widget/session", headers={"Origin": "https://evil.example"})
        assert evil.status_code == 403 and "access-control-allow-origin" not in evil.headers
        pre = client.options(f"{BASE}/widget/messages", headers={
            "Origin": shop, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert pre.status_code == 200 and "authorization" in pre.headers[
            "access-control-allow-headers"].lower()


# -- limits ---------------------------------------------------------------------------


def test_message_size_limit_is_413_and_nothing_is_logged(client: TestClient, sql: Any) -> None:
    url = f"{BASE}/sessions/big/messages"
    r = client.post(url, json={"text": "a" * (MAX_MESSAGE_CHARS + 1)}, headers=bearer(CONVERSE))
    assert r.status_code == 413 and str(MAX_MESSAGE_CHARS) in r.json()["message"]
    r = client.post(url, content=b'{"text": "' + b"b" * 200_000 + b'"}',
                    headers={**bearer(CONVERSE), "Content-Type": "application/json"})
    assert r.status_code == 413
    token = _widget(client)
    assert client.post(f"{BASE}/widget/messages", json={"text": "c" * (MAX_MESSAGE_CHARS + 1)},
                       headers=bearer(token)).status_code == 413
    assert user_messages(sql, "big") == []
    r = client.post(url, json={"text": "d" * MAX_MESSAGE_CHARS}, headers=bearer(CONVERSE))
    assert r.status_code == 200, r.text


def test_rate_limit_is_429_with_retry_after(db_url: str, sql: Any) -> None:
    with TestClient(create_app(config(db_url, rate_limit=(2, 60.0)))) as client:
        url = f"{BASE}/sessions/rl/messages"
        codes = [client.post(url, json={"text": f"m{i}"}, headers=bearer(CONVERSE))
                 for i in range(3)]
        assert [r.status_code for r in codes] == [200, 200, 429]
        assert int(codes[2].headers["Retry-After"]) >= 1
        assert codes[2].json()["error"] == "rate_limited"
        # Per client: another key still gets through.
        assert client.post(url, json={"text": "m3"}, headers=bearer(ADMIN)).status_code == 200
        metrics = client.get("/metrics", headers=bearer(ADMIN)).text
    assert user_messages(sql, "rl") == ["m0", "m1", "m3"]  # the refused one was never accepted
    assert 'funnel_requests_refused_total{funnel="puramur",reason="rate_limited"} 1' in metrics


def test_database_down_is_503_with_retry_after_and_not_ready(db_url: str) -> None:
    dead = "postgresql://postgres@127.0.0.1:1/x?connect_timeout=1"
    with TestClient(create_app(config(dead, db_timeout=1.0, retry_after=3))) as client:
        assert client.get("/healthz").status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["ready"] is False
        assert "unreachable" in ready.json()["database"] and "Retry-After" in ready.headers
        r = client.post(f"{BASE}/sessions/d-1/messages", json={"text": "Hi!"},
                        headers=bearer(CONVERSE))
        assert r.status_code == 503 and 1 <= int(r.headers["Retry-After"]) <= 3
        assert client.get(f"{BASE}/sessions/d-1", headers=bearer(READER)).status_code == 503
        token = _widget(client)  # issuing a token needs no database
        r = client.post(f"{BASE}/widget/messages", json={"text": "Hi!"}, headers=bearer(token))
        assert r.status_code == 503 and "Retry-After" in r.headers


def test_database_lost_mid_turn_keeps_the_accepted_message(db_url: str, sql: Any) -> None:
    proxy = TcpProxy(db_url)
    model = GatedModel()
    app = create_app(config(proxy.dsn, model=model, db_timeout=1.0, retry_after=1))
    try:
        with running(app) as url, httpx.Client(base_url=url, timeout=60) as http:
            model.gate.set()
            assert http.post(f"{BASE}/sessions/m-1/messages", json={"text": "Hi!"},
                             headers=bearer(CONVERSE)).status_code == 200
            model.gate.clear()
            model.called.clear()
            box: dict[str, httpx.Response] = {}
            worker = threading.Thread(target=lambda: box.setdefault("r", http.post(
                f"{BASE}/sessions/m-1/messages", json={"text": "my cat is a Sphynx"},
                headers=bearer(CONVERSE))))
            worker.start()
            assert model.called.wait(10)  # the message is logged; the model is thinking
            proxy.cut()
            model.gate.set()
            worker.join(60)
            r = box["r"]
            assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
            assert user_messages(sql, "m-1") == ["Hi!", "my cat is a Sphynx"]
            assert http.get("/readyz").status_code == 503
            proxy.restore()
            deadline = time.monotonic() + 20
            while http.get("/readyz").status_code != 200:
                assert time.monotonic() < deadline, "the service did not recover"
                time.sleep(0.3)
            r = http.post(f"{BASE}/sessions/m-1/messages", json={"text": "She is 3"},
                          headers=bearer(CONVERSE))
            assert r.status_code == 200, r.text
    finally:
        proxy.close()
    assert user_messages(sql, "m-1") == ["Hi!", "my cat is a Sphynx", "She is 3"]


def test_full_session_queue_is_503_with_retry_after(db_url: str, sql: Any) -> None:
    model = GatedModel()
    with running(create_app(config(db_url, model=model, session_queue=1))) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        box: dict[str, httpx.Response] = {}
        worker = threading.Thread(target=lambda: box.setdefault("r", http.post(
            f"{BASE}/sessions/q-1/messages", json={"text": "first"}, headers=bearer(CONVERSE))))
        worker.start()
        assert model.called.wait(10)
        r = http.post(f"{BASE}/sessions/q-1/messages", json={"text": "second"},
                      headers=bearer(CONVERSE))
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert r.json()["error"] == "session_busy"
        model.gate.set()
        worker.join(30)
        assert box["r"].status_code == 200
        again = http.post(f"{BASE}/sessions/q-1/messages", json={"text": "second"},
                          headers=bearer(CONVERSE))
        assert again.status_code == 200
    assert user_messages(sql, "q-1") == ["first", "second"]


# -- metrics --------------------------------------------------------------------------


def test_metrics_count_turns_errors_fallbacks_and_handoffs(db_url: str) -> None:
    model = ScriptedModel.from_data({
        "match": [{"pattern": "^boom", "output": {"error": "the model is down"}},
                  {"pattern": "^junk", "output": {"output": "not json", "repair": "still not"}}],
        "default": {"reply": "Hello!"}})
    with TestClient(create_app(config(db_url, model=model))) as client:
        for i, text in enumerate(("Hi!", "boom", "junk")):  # each a first turn: greeting
            r = client.post(f"{BASE}/sessions/mx-{i}/messages", json={"text": text},
                            headers=bearer(CONVERSE))
            assert r.status_code == 200
        text = client.get("/metrics", headers=bearer(METRICS)).text
    assert 'funnel_turns_total{funnel="puramur",stage="greeting"} 3' in text
    assert 'funnel_turn_duration_seconds_count{funnel="puramur",stage="greeting"} 3' in text
    assert 'funnel_turn_duration_seconds_bucket{funnel="puramur",le="+Inf",stage="greeting"} 3' \
        in text
    assert 'funnel_model_errors_total{funnel="puramur",stage="greeting"} 1' in text
    assert 'funnel_validation_failures_total{funnel="puramur",stage="greeting"} 2' in text
    assert 'funnel_fallbacks_total{funnel="puramur",stage="greeting"} 2' in text
    assert "# TYPE funnel_turn_duration_seconds histogram" in text


def test_a_metrics_folder_without_prometheus_multiproc_dir_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="PROMETHEUS_MULTIPROC_DIR"):
        Metrics(str(tmp_path))


# One worker of a multi-process service: prometheus_client decides on its multiprocess
# mode at import, so each "worker" is a process of its own, as under `funnel serve`.
_WORKER = """
import os, sys
from engine.service.metrics import Metrics
m = Metrics(os.environ["PROMETHEUS_MULTIPROC_DIR"])
m.declare("puramur", ["greeting"], telegram=False)
m.count("funnel_telegram_updates_total", funnel="puramur", kind="text")
m.observe("funnel_turn_duration_seconds", 0.2, funnel="puramur", stage="greeting")
m.in_flight(+1)
m.version("puramur", [1, 2])
m.version("puramur", [2])
m.gauge("funnel_outbox_backlog", float(sys.argv[1]), funnel="puramur")
if sys.argv[2] == "exits":
    m.close()
"""


def test_refused_claims_are_counted_by_declared_name(db_url: str) -> None:
    """A name nobody gave (grounded), a hand-off nobody asked for (confirm:): each refusal
    counted under the declared field or action, never under the model's text."""
    invented = {"reply": "Nice to meet you!", "updates": {
        "customer": {"name": "Pramesh <script>"}, "pet": {"type": "cat", "name": "Puramur"}}}
    handoff = {"reply": "A manager will call.",
               "actions": [{"type": "request_handoff", "reason": "explicit_request"}]}
    model = ScriptedModel.from_data({"match": [{"pattern": "^shampoo", "output": handoff}],
                                     "default": invented})
    with TestClient(create_app(config(db_url, model=model))) as client:
        for session, text in (("fr-1", "Hi, a cat"), ("fr-2", "Hello"),
                              ("fr-1", "shampoo for a cat?")):
            r = client.post(f"{BASE}/sessions/{session}/messages", json={"text": text},
                            headers=bearer(CONVERSE))
            assert r.status_code == 200
        text = client.get("/metrics", headers=bearer(METRICS)).text
    family = [line for line in text.splitlines() if line.startswith("funnel_facts_refused")]
    assert sorted(family) == sorted([
        'funnel_facts_refused_total{claim="customer.name",funnel="puramur",kind="ungrounded"} 2.0',
        'funnel_facts_refused_total{claim="pet.name",funnel="puramur",kind="ungrounded"} 2.0',
        'funnel_facts_refused_total{claim="request_handoff",funnel="puramur",'
        'kind="unconfirmed"} 1.0'])
    assert "# TYPE funnel_facts_refused_total counter" in text
    # "A manager will call." with the hand-off refused: a promise nothing backs, refused in
    # the answer and in its repair (the scripted model repeats itself), counted by kind.
    assert ('funnel_reply_claims_refused_total{funnel="puramur",kind="promise",'
            'stage="discovery"} 2.0') in text.splitlines()


def test_a_reply_is_one_text_stripped_once(db_url: str, sql: Any) -> None:
    """A model's reply with surrounding spaces: the turn's answer, the message log and the
    replay of its key hold the same text, stripped."""
    model = ScriptedModel.from_data({"default": {"reply": "  Welcome! Cat or dog?  \n"}})
    with TestClient(create_app(config(db_url, model=model))) as client:
        headers = {**bearer(CONVERSE), "Idempotency-Key": "strip-1"}
        first = client.post(f"{BASE}/sessions/sp-1/messages", json={"text": "Hi"},
                            headers=headers)
        again = client.post(f"{BASE}/sessions/sp-1/messages", json={"text": "Hi"},
                            headers=headers)
    assert first.json()["reply"] == again.json()["reply"] == "Welcome! Cat or dog?"
    assert sql("SELECT content FROM funnel_messages WHERE session_id = 'sp-1' AND "
               "role = 'assistant'") == [("Welcome! Cat or dog?",)]


def test_a_refused_action_is_counted_and_the_reply_kept(db_url: str) -> None:
    """An action the stage does not allow (greeting may not add to the cart), and one the
    funnel never declared: the reply is sent, each refusal counted under a bounded label."""
    output = {"reply": "Welcome! Shall I help you choose?", "actions": [
        {"type": "add_to_cart", "sku": "PR251010", "qty": 1}]}
    model = ScriptedModel.from_data({"default": output})
    with TestClient(create_app(config(db_url, model=model))) as client:
        r = client.post(f"{BASE}/sessions/ar-1/messages", json={"text": "Hi"},
                        headers=bearer(CONVERSE))
        assert r.status_code == 200 and r.json()["reply"] == output["reply"]
        text = client.get("/metrics", headers=bearer(METRICS)).text
    family = [line for line in text.splitlines() if line.startswith("funnel_actions_refused")]
    assert family == ['funnel_actions_refused_total{action="add_to_cart",funnel="puramur",'
                      'stage="greeting"} 1.0']


def test_metrics_of_several_workers_add_up(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for backlog, end in (("3", "exits"), ("5", "dies")):  # the second is measured last
        subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", _WORKER, backlog, end], cwd=ROOT,
                       env=env, check=True, timeout=120)
    text = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", "import os; from engine.service.metrics import "
         "Metrics; print(Metrics(os.environ['PROMETHEUS_MULTIPROC_DIR']).render())"],
        cwd=ROOT, env=env, check=True, timeout=120, capture_output=True, text=True).stdout
    assert 'funnel_telegram_updates_total{funnel="puramur",kind="text"} 2.0' in text
    assert 'funnel_turn_duration_seconds_bucket{funnel="puramur",le="0.25",stage="greeting"} ' \
        '2.0' in text
    assert 'funnel_turns_total{funnel="puramur",stage="greeting"} 0.0' in text  # declared
    # Live gauges add up over the workers still running: the one that exited is gone.
    assert "funnel_turns_in_flight 1.0" in text
    assert 'funnel_versions_loaded{funnel="puramur",version="2"} 1.0' in text
    assert 'funnel_versions_loaded{funnel="puramur",version="1"} 0.0' in text  # dropped
    # A gauge of the shared database: the latest measurement, not a sum.
    assert 'funnel_outbox_backlog{funnel="puramur"} 5.0' in text


# -- Telegram -------------------------------------------------------------------------


def _update(update_id: int, **message: Any) -> dict[str, Any]:
    msg = {"message_id": update_id, "date": 1700000000, "chat": {"id": 4242, "type": "private"},
           "from": {"id": 4242, "is_bot": False, "first_name": "Anna"}, **message}
    return {"update_id": update_id, "message": msg}


def test_telegram_webhook(db_url: str, telegram: FakeTelegram, sql: Any) -> None:
    """The webhook end to end (tests/test_telegram.py has the channel's own tests)."""
    app = create_app(config(db_url, telegram_api=telegram.url, dispatch_interval=0.2))
    hook = f"{BASE}/telegram"
    secret = {"X-Telegram-Bot-Api-Secret-Token": HOOK_SECRET}
    with TestClient(app) as client:
        r = client.post(hook, json=_update(2, text="Hi!"), headers=secret)
        assert r.status_code == 200 and r.json()["ok"] is True
        assert telegram.wait_sent(1)[-1] == {"chat_id": 4242, "text": GREETING}
        assert telegram.calls[-1]["token"] == BOT_TOKEN
        assert client.post(hook, json=_update(2, text="Hi!"), headers=secret).json()[
            "duplicate"] is True  # Telegram re-sent it: not answered twice
        client.post(hook, json=_update(7, photo=[{"file_id": "p"}], caption="A Sphynx, dry skin"),
                    headers=secret)
        assert telegram.wait_sent(2)[-1]["text"].startswith("Sphynx skin needs gentle care")
        state = client.get(f"{BASE}/sessions/tg-4242", headers=bearer(ADMIN)).json()
        assert state["stage"] == "presentation"

        telegram.fail = True  # the Bot API is down: the turn is saved, the reply waits
        r = client.post(hook, json=_update(8, text="She is 3, Murka"), headers=secret)
        assert r.status_code == 200
        deadline = time.monotonic() + 10
        while len(telegram.attempts()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        metrics = client.get("/metrics", headers=bearer(ADMIN)).text
        telegram.fail = False
        assert telegram.wait_sent(3, timeout=30)[-1]["text"].startswith("For Murka")
    assert 'funnel_telegram_send_errors_total{funnel="puramur"} 1' in metrics
    assert 'funnel_telegram_updates_total{funnel="puramur",kind="text"} 3' in metrics
    assert user_messages(sql, "tg-4242")[-1] == "She is 3, Murka"
    assert telegram.violations == []


# -- `funnel serve` with workers ------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_funnel_serve_with_two_workers(db_url: str, tmp_path: Path) -> None:
    port = _free_port()
    env = {**os.environ, "FUNNEL_API_KEYS": f"{ADMIN}:admin", "FUNNEL_SECRET": SECRET.decode(),
           "FUNNEL_LOG_LEVEL": "warning"}
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "serve", str(PURAMUR), "--db", db_url,
             "--port", str(port), "--workers", "2", "--model", f"scripted:{DEMO}"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc, log)
        with httpx.Client(base_url=url, timeout=30) as http:
            replies = [http.post(f"{BASE}/sessions/cli-{i}/messages", json={"text": "Hi!"},
                                 headers=bearer(ADMIN)).json()["reply"] for i in range(6)]
            assert replies == [GREETING] * 6
            token = http.post(f"{BASE}/widget/session").json()["token"]
            for _ in range(4):  # whichever worker answers knows the shared secret
                assert http.get(f"{BASE}/widget/messages", headers=bearer(token)
                                ).status_code == 200
            for _ in range(3):  # whichever worker answers adds up both workers' counts
                metrics = http.get("/metrics", headers=bearer(ADMIN)).text
                assert 'funnel_turns_total{funnel="puramur",stage="greeting"} 6.0' in metrics
                assert 'funnel_turn_duration_seconds_count{funnel="puramur",stage="greeting"} ' \
                    '6.0' in metrics
                # Both workers hold the funnel: a live gauge summed over the workers.
                assert 'funnel_versions_loaded{funnel="puramur",version="1"} 2.0' in metrics
    finally:
        stop(proc)


# -- schemathesis against /openapi.json -----------------------------------------------


@pytest.mark.slow
def test_schemathesis_finds_no_problem(db_url: str, telegram: FakeTelegram,
                                       tmp_path: Path) -> None:
    app = create_app(config(db_url, telegram_api=telegram.url, rate_limit=(100_000, 60.0)))
    token = WidgetTokens(SECRET, 3600).issue("puramur")[0]
    (tmp_path / "schemathesis.toml").write_text(
        f'[auth.openapi.apiKey]\nbearer = "{ADMIN}"\n'
        f'[auth.openapi.apiKeyHeader]\napi_key = "{ADMIN}"\n'
        f'[auth.openapi.widgetToken]\nbearer = "{token}"\n'
        f'[auth.openapi.telegramSecret]\napi_key = "{HOOK_SECRET}"\n'
        # Invalid requests may also be refused as too large (413, the documented size limit).
        '[checks.negative_data_rejection]\n'
        'expected-statuses = ["400", "401", "403", "404", "405", "413", "422"]\n'
        # An order's time may be schema-valid yet in the future, which no schema can say:
        # that one operation answers a valid-looking order with 422 (engine.records.orders).
        '[[operations]]\ninclude-operation-id = "recordConversion"\n'
        '[operations.checks.positive_data_acceptance]\n'
        'expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429", "5xx"]\n'
        # Likewise a release's stage and field values: the funnel's, not the schema's.
        '[[operations]]\ninclude-operation-id = "release"\n'
        '[operations.checks.positive_data_acceptance]\n'
        'expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429", "5xx"]\n')
    with running(app) as url:
        proc = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "--config-file",
             str(tmp_path / "schemathesis.toml"), "run", f"{url}/openapi.json",
             "--checks", "all", "--max-examples", "25", "--seed", "1", "--workers", "1",
             "--request-timeout", "20", "--max-failures", "5"],
            cwd=tmp_path, capture_output=True, text=True, timeout=540,
            env={**os.environ, "SCHEMATHESIS_TELEMETRY": "false", "NO_COLOR": "1"})
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


# -- the widget in a real browser -----------------------------------------------------


@pytest.mark.slow
def test_widget_in_headless_chromium(db_url: str, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    browser, driver_path = _chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1200,860",
                 f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    monkeypatch.setenv("SE_OFFLINE", "true")  # never let selenium-manager download anything
    with running(create_app(config(db_url))) as url:
        driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
        try:
            wait = WebDriverWait(driver, 20)
            driver.get(f"{url}/demo/puramur")
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".fw-launcher"))
            driver.find_element(By.CSS_SELECTOR, ".fw-launcher").click()
            wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".fw-panel").is_displayed())

            def say(text: str, bots: int) -> list[str]:
                box = driver.find_element(By.CSS_SELECTOR, ".fw-input")
                box.send_keys(text)
                box.send_keys("\n")
                def texts(d: Any) -> list[str]:
                    # One script call reads every bubble at once (no stale elements while the
                    # widget re-renders), and textContent is there before a fade-in ends.
                    return list(d.execute_script(
                        "return [...document.querySelectorAll('.fw-bot .fw-bubble')]"
                        ".map(e => e.textContent.trim())"))

                def done(d: Any) -> bool:
                    bubbles = texts(d)
                    return len(bubbles) >= bots and all(bubbles) and not d.execute_script(
                        "return document.querySelectorAll('.fw-typing').length")

                wait.until(done)
                return texts(driver)

            assert say("Hi!", 2)[-1] == GREETING  # after the page's greeting bubble
            bots = say("I have a Sphynx cat, her skin is very dry", 3)
            assert bots[-1].startswith("Sphynx skin needs gentle care")
            token = driver.execute_script(
                "return localStorage.getItem(Object.keys(localStorage)[0])")
            session = WidgetTokens(SECRET, 60).verify(token, "puramur")
            assert session is not None
            time.sleep(0.5)  # let the last bubble's fade-in finish
            shot = tmp_path / "widget.png"
            driver.save_screenshot(str(shot))
            assert shot.stat().st_size > 10_000
            docs = ROOT / "docs" / "widget-example.png"  # the picture in docs/service.md
            if os.environ.get("FUNNEL_UPDATE_SCREENSHOT") or not docs.exists():
                shutil.copyfile(shot, docs)

            driver.refresh()  # the same session comes back from localStorage
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".fw-launcher"))
            driver.find_element(By.CSS_SELECTOR, ".fw-launcher").click()
            def users(d: Any) -> list[str]:
                return list(d.execute_script(
                    "return [...document.querySelectorAll('.fw-user .fw-bubble')]"
                    ".map(e => e.textContent.trim())"))

            wait.until(lambda d: len(users(d)) == 2)
            assert users(driver) == ["Hi!", "I have a Sphynx cat, her skin is very dry"]

            # The widget's own words follow the page's language: a Ukrainian page's
            # customer reads why a message was refused in Ukrainian (docs/language.md).
            driver.execute_script(
                "document.documentElement.lang = 'uk';"
                "const box = document.querySelector('.fw-input');"
                f"box.value = 'x'.repeat({MAX_MESSAGE_CHARS + 1});"
                "box.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true}));")
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".fw-notice"))
            notice = driver.execute_script(
                "return document.querySelector('.fw-notice').textContent")
            assert notice == "Повідомлення задовге. Будь ласка, розділіть його."
        finally:
            driver.quit()
