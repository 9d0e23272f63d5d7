"""A manager in the session: take over, write, release, through the HTTP API on the real
engine, a real PostgreSQL and the scripted model (the Telegram Bot API is the fake one)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from projects import copy_puramur
from service_support import FakeTelegram
from starlette.testclient import TestClient

from engine.funnel.compiled import load_funnel
from engine.llm.models import Completion, ModelRequest, ScriptedModel
from engine.service.app import create_app
from engine.service.config import ServiceConfig, TelegramBot
from engine.turn.invariants import check_funnel

CONVERSE = "converse-key-3f9a1c77e2b4"
MANAGE = "manage-key-71c0e9a4d25b"
BOT_TOKEN = "123456:TEST-bot-token"
HOOK_SECRET = "hook-secret-4c8e1b"
BASE = "/v1/funnels/puramur"
HOLDING = "A manager is on it and will answer you here shortly."
SCRIPT = {"match": [
    {"pattern": "cat", "output": {"reply": "A cat!", "updates": {"pet": {"type": "cat"}}}},
    {"pattern": "complain", "output": {"reply": "Sorry! A manager will help.", "actions": [
        {"type": "request_handoff", "reason": "complaint"}]}}], "default": {"reply": "ok"}}
MANAGERS = -100555

pytestmark = pytest.mark.postgres


class CountingModel:
    """The script, counting its calls (a held turn must call no model); with ``gate``
    set, each call waits until the test opens it."""

    name = "counting"

    def __init__(self, path: Path) -> None:
        self.inner = ScriptedModel.from_file(path)
        self.calls = 0
        self.called = threading.Event()
        self.gate: threading.Event | None = None

    async def complete(self, request: ModelRequest) -> Completion:
        import asyncio

        self.calls += 1
        self.called.set()
        if self.gate is not None:
            await asyncio.to_thread(self.gate.wait, 30)
        return await self.inner.complete(request)


@pytest.fixture
def funnel(tmp_path: Path) -> Path:
    path = copy_puramur(tmp_path / "project")
    data = yaml.safe_load(path.read_text())
    data["handoff"]["holding_reply"] = HOLDING
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


@pytest.fixture
def model(tmp_path: Path) -> CountingModel:
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump(SCRIPT))
    return CountingModel(script)


def _config(db_url: str, funnel: Path, model: Any, **overrides: Any) -> ServiceConfig:
    options: dict[str, Any] = {
        "funnels": [funnel], "db": db_url, "model": model,
        "api_keys": {CONVERSE: frozenset({"converse"}), MANAGE: frozenset({"manage"})},
        "secret": b"test-secret-0123456789abcdef", "rate_limit": (1000, 60.0),
        "telegram_api": "http://127.0.0.1:9",
        "telegram": {"PURAMUR": TelegramBot(BOT_TOKEN, HOOK_SECRET)},
    }
    options.update(overrides)
    return ServiceConfig(**options)


@pytest.fixture
def client(db_url: str, funnel: Path, model: CountingModel) -> Iterator[TestClient]:
    with TestClient(create_app(_config(db_url, funnel, model))) as c:
        yield c


def key(k: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {k}"}


def say(client: TestClient, session: str, text: str) -> dict[str, Any]:
    r = client.post(f"{BASE}/sessions/{session}/messages", json={"text": text},
                    headers=key(CONVERSE))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def manage(client: TestClient, session: str, action: str, **body: Any) -> Any:
    return client.post(f"{BASE}/sessions/{session}/{action}", json=body, headers=key(MANAGE))


def messages(sql: Any, session: str) -> list[tuple[str, str, str | None, bool]]:
    return [tuple(r) for r in sql("SELECT role, content, author, held FROM funnel_messages "
                                  "WHERE session_id = %s ORDER BY id", (session,))]


async def violations(db_url: str, funnel: Path) -> list[str]:
    return [str(v) for v in await check_funnel(load_funnel(funnel), db_url)]


async def test_take_over_write_and_release(client: TestClient, model: CountingModel,
                                           sql: Any, db_url: str, funnel: Path) -> None:
    assert say(client, "s1", "Hello")["reply"] == "ok"
    r = manage(client, "s1", "takeover", manager="Olena")
    assert r.status_code == 200, r.text
    assert r.json()["control"] == "manager" and r.json()["manager"] == "Olena"
    calls = model.calls

    held = say(client, "s1", "Is anyone there?")
    assert held["held"] is True and held["reply"] == HOLDING  # once per take-over
    again = say(client, "s1", "Hello??")
    assert again["held"] is True and again["reply"] == ""
    assert model.calls == calls  # the model is not called while a manager holds it

    r = manage(client, "s1", "manager-messages", manager="Olena", text="Hi, Olena here.")
    assert r.status_code == 200, r.text
    assert r.json()["delivery"] == "messages"  # an API session: its client reads the log

    # A release is validated as any update: nothing is written when one part is refused.
    r = manage(client, "s1", "release", manager="Olena", stage="nowhere",
               updates={"pet": {"type": "horse"}, "cart_total": 1, "nope": 1})
    assert r.status_code == 422
    problems = r.json()["message"]
    assert "nowhere" in problems and "pet.type" in problems
    assert "cart_total" in problems and "nope" in problems
    status = client.get(f"{BASE}/sessions/s1/control", headers=key(MANAGE)).json()
    assert status["control"] == "manager"

    r = manage(client, "s1", "release", manager="Olena", stage="presentation",
               updates={"pet": {"type": "dog", "name": "Rex"}})
    assert r.status_code == 200, r.text
    assert r.json()["stage"] == "presentation" and r.json()["updated"] == ["pet"]
    state = client.get(f"{BASE}/sessions/s1", headers=key(MANAGE))
    assert state.status_code == 403  # reading state is another scope

    back = say(client, "s1", "Thanks")
    assert "held" not in back and back["stage"] == "presentation"
    assert model.calls == calls + 1
    assert messages(sql, "s1") == [
        ("user", "Hello", None, False), ("assistant", "ok", None, False),
        ("user", "Is anyone there?", None, True), ("assistant", HOLDING, None, True),
        ("user", "Hello??", None, True), ("manager", "Hi, Olena here.", "Olena", False),
        ("user", "Thanks", None, False), ("assistant", "ok", None, False)]
    rows = sql("SELECT pet, stage FROM puramur_sessions_state WHERE session_id = 's1'")
    assert rows == [({"type": "dog", "name": "Rex"}, "presentation")]
    events = sql("SELECT event, manager FROM funnel_control_events WHERE session_id = 's1' "
                 "ORDER BY id")
    assert events == [("takeover", "Olena"), ("message", "Olena"), ("release", "Olena")]
    assert await violations(db_url, funnel) == []


def test_refusals(client: TestClient) -> None:
    say(client, "s2", "Hello")
    assert client.post(f"{BASE}/sessions/s2/takeover", json={},
                       headers=key(CONVERSE)).status_code == 403
    assert client.post(f"{BASE}/sessions/s2/takeover").status_code == 401
    assert manage(client, "nobody", "takeover").status_code == 404
    r = manage(client, "s2", "manager-messages", text="hi")
    assert r.status_code == 409 and r.json()["error"] == "not_taken_over"
    assert manage(client, "s2", "release").status_code == 409
    assert manage(client, "s2", "takeover", manager="").status_code == 400
    assert manage(client, "s2", "takeover", manager="x" * 81).status_code == 400
    assert manage(client, "s2", "release", stage="greeting", extra=1).status_code == 400
    assert manage(client, "s2", "manager-messages", text="  ").status_code == 400
    # No `manager`: the API key's client name is logged.
    r = client.post(f"{BASE}/sessions/s2/takeover", headers=key(MANAGE))
    assert r.status_code == 200 and r.json()["manager"] == "key#2"
    assert manage(client, "s2", "release").json()["control"] == "bot"


def test_the_openapi_document_has_the_manager_api(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for route in ("takeover", "manager-messages", "release", "control"):
        assert f"/v1/funnels/{{funnel}}/sessions/{{session}}/{route}" in paths


def test_a_message_in_flight_is_answered_by_the_bot_before_the_take_over(
        client: TestClient, model: CountingModel, sql: Any) -> None:
    """The take-over waits for the turn that holds the session's lease: the customer gets
    the bot's answer to that message, and everything after it is held."""
    say(client, "s3", "Hello")
    model.gate, model.called = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def customer() -> None:
        results["turn"] = say(client, "s3", "I have a cat")

    def takeover() -> None:
        results["takeover"] = manage(client, "s3", "takeover", manager="Ivan")

    first = threading.Thread(target=customer)
    first.start()
    assert model.called.wait(10)
    second = threading.Thread(target=takeover)
    second.start()
    time.sleep(0.3)  # the take-over is waiting for the lease, not done
    assert "takeover" not in results
    model.gate.set()
    first.join(10)
    second.join(10)
    assert results["turn"]["reply"] == "A cat!" and "held" not in results["turn"]
    assert results["takeover"].status_code == 200
    assert say(client, "s3", "And a dog")["held"] is True
    assert [m[3] for m in messages(sql, "s3")][-2:] == [True, True]  # + the holding reply


def test_telegram_customer_gets_the_manager_and_one_holding_reply(
        db_url: str, funnel: Path, model: CountingModel, sql: Any) -> None:
    fake = FakeTelegram().start()
    try:
        app = create_app(_config(db_url, funnel, model, telegram_api=fake.url,
                                 dispatch_interval=0.2))
        hook = f"{BASE}/telegram"
        secret = {"X-Telegram-Bot-Api-Secret-Token": HOOK_SECRET}

        def update(n: int, text: str) -> dict[str, Any]:
            return {"update_id": n, "message": {
                "message_id": n, "date": 1700000000, "chat": {"id": 777, "type": "private"},
                "from": {"id": 777, "is_bot": False, "first_name": "Anna"}, "text": text}}

        with TestClient(app) as client:
            client.post(hook, json=update(1, "Hi"), headers=secret)
            assert fake.wait_sent(1)[-1] == {"chat_id": 777, "text": "ok"}
            assert manage(client, "tg-777", "takeover", manager="Olena").status_code == 200
            client.post(hook, json=update(2, "Hello?"), headers=secret)
            assert fake.wait_sent(2)[-1] == {"chat_id": 777, "text": HOLDING}
            client.post(hook, json=update(3, "Anyone?"), headers=secret)
            r = manage(client, "tg-777", "manager-messages", manager="Olena",
                       text="Olena here: how can I help?")
            assert r.status_code == 200 and r.json()["delivery"] == "telegram"
            sent = fake.wait_sent(3)
            assert sent[-1] == {"chat_id": 777, "text": "Olena here: how can I help?"}
            # A re-sent held update is a duplicate: no second turn, nothing sent.
            dup = client.post(hook, json=update(3, "Anyone?"), headers=secret).json()
            assert dup.get("duplicate") is True
            manage(client, "tg-777", "release", manager="Olena")
            client.post(hook, json=update(4, "I have a cat"), headers=secret)
            assert fake.wait_sent(4)[-1] == {"chat_id": 777, "text": "A cat!"}
            time.sleep(0.5)  # a dispatch round: nothing else goes out (no sweep re-runs)
            assert len(fake.wait_sent(4)) == 4
        pending = sql("SELECT count(*) FROM funnel_inbound WHERE response IS NULL")
        assert pending == [(0,)]
    finally:
        fake.stop()


def test_the_managers_chat_takes_over_and_releases_with_the_alerts_buttons(
        db_url: str, funnel: Path, model: CountingModel, sql: Any) -> None:
    fake = FakeTelegram().start()
    try:
        bot = TelegramBot(BOT_TOKEN, HOOK_SECRET, manager_chat=MANAGERS)
        app = create_app(_config(db_url, funnel, model, telegram_api=fake.url,
                                 telegram={"PURAMUR": bot}, dispatch_interval=0.2))
        hook = f"{BASE}/telegram"
        secret = {"X-Telegram-Bot-Api-Secret-Token": HOOK_SECRET}

        def press(n: int, data: str, chat: int = MANAGERS) -> None:
            r = tg.post(hook, headers=secret, json={"update_id": n, "callback_query": {
                "id": f"cb{n}", "from": {"id": 9, "is_bot": False, "first_name": "Olena"},
                "data": data, "message": {"message_id": 1, "date": 1700000000,
                                          "chat": {"id": chat, "type": "supergroup"}}}})
            assert r.status_code == 200

        def answered(n: int) -> dict[str, Any]:
            calls = fake.wait_sent(n, method="answerCallbackQuery")
            assert len(calls) >= n
            return calls[n - 1]

        with TestClient(app) as tg:
            tg.post(hook, headers=secret, json={"update_id": 1, "message": {
                "message_id": 1, "date": 1700000000, "chat": {"id": 777, "type": "private"},
                "from": {"id": 777, "is_bot": False, "first_name": "Anna"},
                "text": "I want to complain"}})
            sent = fake.wait_sent(2)
            alert = next(m for m in sent if m["chat_id"] == MANAGERS)
            assert "tg-777" in alert["text"] and "complaint" in alert["text"]
            keyboard = alert["reply_markup"]["inline_keyboard"][0]
            assert [b["callback_data"] for b in keyboard] == ["takeover:tg-777",
                                                              "release:tg-777"]
            press(2, "takeover:tg-777", chat=4242)  # not the managers' chat: nothing runs
            assert "text" not in answered(1)
            assert sql("SELECT count(*) FROM funnel_control") == [(0,)]

            press(3, "takeover:tg-777")
            assert "Olena took over tg-777" in answered(2)["text"]
            assert sql("SELECT mode, manager FROM funnel_control") == [("manager", "Olena")]
            press(4, "release:tg-777")
            assert "back with the bot" in answered(3)["text"]
            assert sql("SELECT count(*) FROM funnel_control") == [(0,)]
            press(5, "release:tg-777")  # twice: the button says why nothing happened
            assert "take it over first" in answered(4)["text"]
        assert fake.violations == []
    finally:
        fake.stop()


async def test_check_state_reports_a_control_row_without_its_session(
        client: TestClient, sql: Any, db_url: str, funnel: Path) -> None:
    say(client, "s9", "Hello")
    assert manage(client, "s9", "takeover", manager="Olena").status_code == 200
    say(client, "s9", "Anyone?")  # held: no turn, and that is no "unanswered message"
    assert await violations(db_url, funnel) == []
    sql("DELETE FROM puramur_sessions_state WHERE session_id = 's9'")
    assert [v for v in await violations(db_url, funnel) if "control without session" in v] \
        == ["error: session 's9': control without session: a manager holds a session the "
            "funnel's table lacks"]


def test_a_release_with_a_nul_in_an_update_is_refused_naming_the_field(
        client: TestClient) -> None:
    say(client, "s10", "Hello")
    assert manage(client, "s10", "takeover", manager="Olena").status_code == 200
    r = manage(client, "s10", "release", updates={"pet": {"type": "cat", "name": "R\x00x"}})
    assert r.status_code == 422, r.text
    assert "pet.name" in r.json()["message"] and "U+0000" in r.json()["message"]
    r = manage(client, "s10", "release", updates={"pet\x00": 1})
    assert r.status_code == 422, r.text


def test_a_managers_name_refuses_bidi_controls(client: TestClient) -> None:
    say(client, "s11", "Hello")
    r = manage(client, "s11", "takeover", manager="Ole\u202ena")
    assert r.status_code == 400 and "bidi" in r.json()["message"], r.text


def test_a_manager_message_with_an_idempotency_key_is_sent_once(
        db_url: str, funnel: Path, model: CountingModel, sql: Any) -> None:
    fake = FakeTelegram().start()
    try:
        app = create_app(_config(db_url, funnel, model, telegram_api=fake.url,
                                 dispatch_interval=0.2))
        secret = {"X-Telegram-Bot-Api-Secret-Token": HOOK_SECRET}
        with TestClient(app) as client:
            client.post(f"{BASE}/telegram", headers=secret, json={"update_id": 1, "message": {
                "message_id": 1, "date": 1700000000, "chat": {"id": 778, "type": "private"},
                "from": {"id": 778, "is_bot": False, "first_name": "Anna"}, "text": "Hi"}})
            assert fake.wait_sent(1)[-1] == {"chat_id": 778, "text": "ok"}
            assert manage(client, "tg-778", "takeover", manager="Olena").status_code == 200
            headers = {**key(MANAGE), "Idempotency-Key": "send-1"}
            body = {"manager": "Olena", "text": "Olena here."}
            url = f"{BASE}/sessions/tg-778/manager-messages"
            first = client.post(url, json=body, headers=headers)
            again = client.post(url, json=body, headers=headers)
            assert first.status_code == again.status_code == 200, again.text
            assert again.json() == first.json()
            other = client.post(url, json={**body, "text": "Other."}, headers=headers)
            assert other.status_code == 422, other.text  # the key reused for another body
            assert again.headers["Idempotent-Replayed"] == "true"
            time.sleep(0.5)  # a dispatch round: nothing else goes out
            assert [m["text"] for m in fake.wait_sent(2)] == ["ok", "Olena here."]
        assert sql("SELECT count(*) FROM funnel_messages WHERE role = 'manager'") == [(1,)]
    finally:
        fake.stop()
