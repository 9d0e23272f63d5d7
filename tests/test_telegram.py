"""The Telegram channel: real ``Update`` payloads, a fake Bot API that checks every call
against the Bot API contract, and a real PostgreSQL.

The webhook acknowledges once the message and its key are committed; the turn runs
after; the reply is an outbox row delivered with retries. Faults are counted for
bench/fault_suite.py (tests/service_support.py: record_fault).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hostile_corpus import TELEGRAM_UPDATES
from service_support import FakeTelegram, record_fault, running
from starlette.testclient import TestClient

from engine.llm.models import ScriptedModel
from engine.service.app import create_app
from engine.service.config import ServiceConfig, TelegramBot
from engine.service.telegram import parse
from engine.service.telegram.botapi import judge

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
DEMO = ROOT / "funnels" / "puramur" / "demo.yaml"
UPDATES = json.loads((Path(__file__).with_name("telegram_updates.json")).read_text("utf-8"))
BOT_ID = 123456
TOKEN = f"{BOT_ID}:TEST-bot-token"
SECRET = "hook-secret-4c8e1b"
HEADERS = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
HOOK = "/v1/funnels/puramur/telegram"
GREETING = "Hello! I'm the Puramur consultant. Is your pet a cat or a dog?"

pytestmark = pytest.mark.postgres


def case(name: str) -> dict[str, Any]:
    return next(c["update"] for c in UPDATES["cases"] if c["name"] == name)


def private(update_id: int, text: str, chat: int = 4242) -> dict[str, Any]:
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": 1700000000, "text": text,
        "chat": {"id": chat, "type": "private", "first_name": "Anna"},
        "from": {"id": chat, "is_bot": False, "first_name": "Anna"}}}


def lotions(delay: float = 0.0) -> ScriptedModel:
    """Answers "two lotions" by adding two lotions (2 x 420 UAH) to the cart."""
    model = ScriptedModel.from_data({
        "match": [{"pattern": "Sphynx", "output": {
            "reply": "A Sphynx! Try the Exotic Spa lotion.",
            "updates": {"pet": {"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"],
                                "age_years": 3, "name": "Murka"}}}},
                  {"pattern": "lotion", "output": {
            "reply": "Two Exotic Spa lotions are in your cart.",
            "actions": [{"type": "add_to_cart", "sku": "PR251020", "qty": 2}]}}],
        "default": {"reply": "How can I help?"}, "delay": delay})
    return model


def config(db_url: str, api: str, **overrides: Any) -> ServiceConfig:
    options: dict[str, Any] = {
        "funnels": [PURAMUR], "db": db_url, "model": f"scripted:{DEMO}",
        "secret": b"test-secret-0123456789abcdef", "rate_limit": (1000, 60.0),
        "telegram_api": api, "telegram": {"PURAMUR": TelegramBot(TOKEN, SECRET)},
        "dispatch_interval": 0.2,
    }
    options.update(overrides)
    return ServiceConfig(**options)


@pytest.fixture
def telegram() -> Iterator[FakeTelegram]:
    fake = FakeTelegram().start()
    yield fake
    fake.stop()


def wait_for(check: Any, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    return check()


# -- parsing ---------------------------------------------------------------------------
@pytest.mark.parametrize("item", UPDATES["cases"], ids=[c["name"] for c in UPDATES["cases"]])
def test_documented_updates_are_classified(item: dict[str, Any]) -> None:
    expect = item["expect"]
    got = parse(item["update"], bot_id=BOT_ID, username="puramur_shop_bot",
                groups=bool(expect.get("groups")))
    assert got.kind == expect["kind"]
    if "session" in expect:
        assert got.session_id == expect["session"]
    if "text" in expect:
        assert got.text == expect["text"]
    assert got.thread_id == expect.get("thread")
    assert got.start_payload == expect.get("payload")
    assert got.callback_id == expect.get("callback")


@pytest.mark.parametrize("status,body,expect", [
    (200, {"ok": True, "result": {}}, (True, None, None, False)),
    (429, {"ok": False, "error_code": 429, "description": "Too Many Requests: retry after 2",
           "parameters": {"retry_after": 2}}, (False, 2.0, None, False)),
    (403, {"ok": False, "error_code": 403, "description": "Forbidden: bot was blocked by the "
           "user"}, (False, None, "Forbidden: bot was blocked by the user", True)),
    (400, {"ok": False, "error_code": 400, "description": "Bad Request: chat not found"},
     (False, None, "Bad Request: chat not found", True)),
    (400, {"ok": False, "error_code": 400, "description": "Bad Request: message text is "
           "empty"}, (False, None, None, True)),
    (502, None, (False, None, None, False)),
])
def test_bot_api_answers_are_judged(status: int, body: Any, expect: tuple[Any, ...]) -> None:
    result = judge("sendMessage", status, body)
    assert (result.ok, result.retry_in, result.unreachable, result.final) == expect


# -- the webhook -----------------------------------------------------------------------
def test_webhook_acknowledges_then_replies_through_the_outbox(db_url: str, telegram: FakeTelegram,
                                                             sql: Any) -> None:
    with TestClient(create_app(config(db_url, telegram.url))) as client:
        assert client.post(HOOK, json=private(1, "Hi!")).status_code == 401
        assert client.post(HOOK, json=private(1, "Hi!"), headers={
            "X-Telegram-Bot-Api-Secret-Token": "wrong"}).status_code == 401
        r = client.post(HOOK, json=private(2, "Hi!"), headers=HEADERS)
        assert r.status_code == 200 and r.json() == {"ok": True}
        assert telegram.wait_sent(1) == [{"chat_id": 4242, "text": GREETING}]
        # "typing..." while the turn ran (before the reply: the turn starts with it).
        assert telegram.sent("sendChatAction") == [{"chat_id": 4242, "action": "typing"}]
        again = client.post(HOOK, json=private(2, "Hi!"), headers=HEADERS)
        assert again.json() == {"ok": True, "duplicate": True}
        for name in ("sticker", "voice", "edited message"):
            client.post(HOOK, json=case(name), headers=HEADERS)
        client.post(HOOK, json=case("sticker"), headers=HEADERS)  # re-delivered: one note
        sent = telegram.wait_sent(4)
        assert "sticker" in sent[1]["text"].lower() and "edited" in sent[3]["text"]
        client.post(HOOK, json=case("callback query"), headers=HEADERS)
        client.post(HOOK, json=case("my_chat_member (the customer blocked the bot)"),
                    headers=HEADERS)
        client.post(HOOK, json=case("group message while groups are off"), headers=HEADERS)
        answered = telegram.wait_sent(1, method="answerCallbackQuery")
        assert answered == [{"callback_query_id": "4382bfdwdsb323b2d9"}]
        time.sleep(0.5)  # a few dispatch rounds: nothing else goes out
        metrics = client.get("/metrics").status_code
    assert metrics in (401, 200)
    assert len(telegram.sent()) == 4 and telegram.violations == []
    assert sql("SELECT content FROM funnel_messages WHERE role = 'user'") == [("Hi!",)]
    assert sql("SELECT delivery FROM funnel_inbound") == [("delivered",)]


def test_redelivery_in_flight_to_two_workers_runs_one_turn(db_url: str, telegram: FakeTelegram,
                                                           sql: Any) -> None:
    """The same update delivered 3 times, 0.3 s apart, to two workers, while a 2 s model
    thinks: 1 turn, 1 reply, cart 840 (not 2,520)."""
    update = case("private text")
    apps = [create_app(config(db_url, telegram.url, model=lotions(delay=2.0)))
            for _ in range(2)]
    with running(apps[0]) as a, running(apps[1]) as b:
        httpx.post(f"{a}{HOOK}", json=private(1, "A Sphynx, dry skin"), headers=HEADERS)
        telegram.wait_sent(1)
        answers = []
        for url in (a, b, a):
            started = time.perf_counter()
            r = httpx.post(f"{url}{HOOK}", json=update, headers=HEADERS, timeout=10)
            answers.append((r.status_code, r.json(), time.perf_counter() - started))
            time.sleep(0.3)
        assert len(telegram.sent()) == 1  # acknowledged while the turn still runs
        telegram.wait_sent(2)
        time.sleep(1.0)  # dispatch rounds on both workers: still one reply
        sent = telegram.sent()[1:]
    assert [a[1] for a in answers] == [{"ok": True}, {"ok": True, "duplicate": True},
                                       {"ok": True, "duplicate": True}]
    assert sent == [{"chat_id": 4242, "text": "Two Exotic Spa lotions are in your cart."}]
    assert sql("SELECT COUNT(*) FROM funnel_turns") == [(2,)]
    assert sql("SELECT cart_total, cart_gift_eligible FROM puramur_sessions_state") == [
        (840, False)]
    record_fault("telegram update x3 in flight, two workers", tried=1,
                 lost=1 - len(sent), duplicated=len(sent) - 1 + sql(
                     "SELECT COUNT(*) - 2 FROM funnel_turns")[0][0])


def test_429_then_500_then_200_delivers_one_reply_in_order(db_url: str, telegram: FakeTelegram,
                                                           sql: Any) -> None:
    telegram.script = [
        (429, {"ok": False, "error_code": 429, "description": "Too Many Requests: retry after 2",
               "parameters": {"retry_after": 2}}),
        (500, {"ok": False, "error_code": 500, "description": "Internal Server Error"}),
    ]
    with TestClient(create_app(config(db_url, telegram.url))) as client:
        client.post(HOOK, json=private(1, "Hi!"), headers=HEADERS)
        client.post(HOOK, json=private(2, "A Sphynx, dry skin"), headers=HEADERS)
        sent = telegram.wait_sent(2, timeout=30)
        attempts = telegram.attempts()
    assert [s["text"] for s in sent] == [GREETING, "Sphynx skin needs gentle care. How old "
                                         "is she, and what's her name?"]
    assert [a["status"] for a in attempts] == [429, 500, 200, 200]  # the second waited
    assert all(a["body"]["text"] == GREETING for a in attempts[:3])
    assert telegram.violations == []
    assert sql("SELECT COUNT(*) FROM funnel_outbox WHERE delivered_at IS NULL") == [(0,)]
    record_fault("Bot API 429 (retry_after 2), 500, 200", tried=2, lost=2 - len(sent),
                 duplicated=len(sent) - 2)


def test_403_gives_up_at_once_and_marks_the_session(db_url: str, telegram: FakeTelegram,
                                                    sql: Any) -> None:
    telegram.blocked.add(4242)
    with TestClient(create_app(config(db_url, telegram.url))) as client:
        client.post(HOOK, json=private(1, "Hi!"), headers=HEADERS)
        wait_for(lambda: sql("SELECT 1 FROM funnel_unreachable"))
        time.sleep(1.0)  # five dispatch rounds: no retry
    assert len(telegram.attempts()) == 1 and telegram.sent() == []
    assert sql("SELECT session_id, channel, reason FROM funnel_unreachable") == [
        ("tg-4242", "telegram", "Forbidden: bot was blocked by the user")]
    [(delivery,)] = sql("SELECT delivery FROM funnel_inbound")
    assert delivery.startswith("failed: sendMessage: HTTP 403")
    assert sql("SELECT next_attempt_at = 'infinity' FROM funnel_outbox") == [(True,)]
    assert sql("SELECT COUNT(*) FROM funnel_turns") == [(1,)]  # the turn itself was saved
    record_fault("Bot API 403 (blocked)", tried=1, lost=0, duplicated=0,
                 retries=len(telegram.attempts()) - 1)


def test_groups_topics_and_start_payload(db_url: str, telegram: FakeTelegram, sql: Any,
                                         tmp_path: Path) -> None:
    """Groups opted in: a session per member, only messages addressed to the bot, the
    reply in the topic; `/start PAYLOAD` kept in the declared `source` field."""
    for folder in ("funnels", "prompts", "schemas"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    # A copy of the project: its funnels read ../prompts and ../schemas (engine.format.paths)
    (tmp_path / "pyproject.toml").write_text("", "utf-8")
    funnel = tmp_path / "funnels" / "puramur.yaml"
    text = funnel.read_text("utf-8")
    funnel.write_text(text.replace("\nstate:\n", "\nstate:\n  source: {type: string, nullable: "
                                   "true, owner: engine}\n", 1), "utf-8")
    bot = TelegramBot(TOKEN, SECRET, groups=True)  # username from getMe
    with TestClient(create_app(config(db_url, telegram.url, funnels=[funnel],
                                      telegram={"PURAMUR": bot}))) as client:
        for name in ("group command for another bot", "group chatter not addressed to the bot",
                     "group mention of this bot", "forum topic, replying to the bot",
                     "/start with a deep-link payload"):
            assert client.post(HOOK, json=case(name), headers=HEADERS).status_code == 200
        sent = telegram.wait_sent(3)
    assert telegram.violations == []
    by_chat = {(s["chat_id"], s.get("message_thread_id")): s for s in sent}
    assert set(by_chat) == {(-1001234567890, None), (-1009876543210, 77), (6161, None)}
    assert by_chat[(-1001234567890, None)]["reply_parameters"]["message_id"] == 13
    sessions = sql("SELECT session_id, source FROM puramur_sessions_state ORDER BY 1")
    assert sessions == [("tg--1001234567890-5252", None), ("tg--1009876543210-5353", None),
                        ("tg-6161", "ref_spring-sale_42")]
    # the model saw "/start", never the payload
    assert sql("SELECT content FROM funnel_messages WHERE session_id = 'tg-6161' "
               "AND role = 'user'") == [("/start",)]


def test_a_message_acknowledged_by_a_dead_worker_is_answered_by_another(
        db_url: str, telegram: FakeTelegram, sql: Any) -> None:
    """The message log is the queue: a message accepted (and acknowledged) whose worker
    died before its turn is claimed by another worker's sweep and answered once."""
    with TestClient(create_app(config(db_url, telegram.url))) as client:
        client.get("/readyz")  # the tables exist
        # What a worker killed right after the 200 leaves behind: the message and its
        # key, claimed by a holder that no longer renews it.
        sql("INSERT INTO funnel_messages (id, funnel, session_id, role, content, stage) "
            "VALUES (nextval(pg_get_serial_sequence('funnel_messages', 'id')), 'puramur', "
            "'tg-4242', 'user', 'Hi!', 'greeting')")
        sql("INSERT INTO funnel_inbound (funnel, channel, key, session_id, message_id, holder, "
            "alive_until, meta) SELECT 'puramur', 'telegram', '123456:77', 'tg-4242', MAX(id), "
            "'dead', NOW() - INTERVAL '1 s', '{\"reply_to\": {\"chat_id\": 4242}}' "
            "FROM funnel_messages")
        sent = telegram.wait_sent(1)
        again = client.post(HOOK, json=private(77, "Hi!"), headers=HEADERS).json()
        time.sleep(0.6)
    assert sent == [{"chat_id": 4242, "text": GREETING}] and telegram.sent() == sent
    assert again == {"ok": True, "duplicate": True}
    assert sql("SELECT COUNT(*) FROM funnel_turns") == [(1,)]
    record_fault("Telegram message acknowledged, worker died before the turn", tried=1,
                 lost=1 - len(sent), duplicated=len(telegram.sent()) - 1)


def test_bot_options_come_from_the_environment() -> None:
    config = ServiceConfig.from_env({
        "FUNNEL_SERVE_FUNNELS": str(PURAMUR), "FUNNEL_TELEGRAM_TOKEN_PURAMUR": TOKEN,
        "FUNNEL_TELEGRAM_SECRET_PURAMUR": SECRET, "FUNNEL_TELEGRAM_GROUPS_PURAMUR": "1",
        "FUNNEL_TELEGRAM_USERNAME_PURAMUR": "@puramur_shop_bot",
        "FUNNEL_TELEGRAM_START_FIELD_PURAMUR": "utm_source"})
    assert config.telegram_bot("puramur") == TelegramBot(
        TOKEN, SECRET, groups=True, username="puramur_shop_bot", start_field="utm_source")
    plain = ServiceConfig.from_env({
        "FUNNEL_SERVE_FUNNELS": str(PURAMUR), "FUNNEL_TELEGRAM_TOKEN_PURAMUR": TOKEN,
        "FUNNEL_TELEGRAM_SECRET_PURAMUR": SECRET})
    assert plain.telegram_bot("puramur") == TelegramBot(TOKEN, SECRET)


@pytest.mark.parametrize(("name", "update"), TELEGRAM_UPDATES, ids=[c[0] for c in TELEGRAM_UPDATES])
def test_an_update_the_engine_cannot_take_is_acknowledged_and_counted(
        name: str, update: dict[str, Any], db_url: str, telegram: FakeTelegram, sql: Any) -> None:
    assert parse(update, bot_id=BOT_ID, username=None, groups=False).kind == "unusable"
    # counted as funnel_telegram_updates_total{kind="unusable"} by the webhook
    with TestClient(create_app(config(db_url, telegram.url))) as client:
        # json.dumps escapes a lone surrogate (`\ud800`), as Telegram would send it
        response = client.post(HOOK, content=json.dumps(update), headers={
            **HEADERS, "Content-Type": "application/json"})
        assert response.status_code == 200 and response.json() == {"ok": True}
        again = client.post(HOOK, json=private(77, "Hi!"), headers=HEADERS)  # the next is fine
        assert again.status_code == 200
        assert telegram.wait_sent(1) == [{"chat_id": 4242, "text": GREETING}]
    assert sql("SELECT content FROM funnel_messages WHERE role = 'user'") == [("Hi!",)]
