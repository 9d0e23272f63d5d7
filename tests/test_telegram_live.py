"""A Telegram reply shown as the model writes it (``FUNNEL_TELEGRAM_STREAM_<NAME>``): the
first text as ``sendMessage``, then ``editMessageText`` at most once a second, the
validated reply as the last edit; against the fake Bot API (tests/service_support.py),
with the model streaming on the real litellm HTTP path (tests/fake_openai.py) or the
offline scripted model's pieces."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fake_openai import FakeOpenAI
from fake_stream import Stream
from service_support import FakeTelegram
from starlette.testclient import TestClient
from test_litellm_path import close_litellm_clients, loopback_only  # noqa: F401
from test_telegram import HEADERS, HOOK, SECRET, TOKEN, config, private

from engine.llm.models import LiteLLMModel, ScriptedModel
from engine.service.app import create_app
from engine.service.config import TelegramBot
from engine.service.telegram.live import EDIT_INTERVAL

pytestmark = pytest.mark.postgres

HELLO = {"reply": "Hello! I'm the Puramur consultant. Is your pet a cat or a dog?",
         "language": "en"}
CHAT = 4242


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from engine.llm import strategy, stream

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    strategy.forget()
    stream.forget()
    yield
    strategy.forget()
    stream.forget()


def _customer(fake: FakeTelegram) -> list[dict[str, Any]]:
    return [c for c in fake.calls if c["method"] in ("sendMessage", "editMessageText")
            and c["body"].get("chat_id") == CHAT]


def _wait(done: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_the_reply_streams_into_one_message_and_ends_as_the_validated_reply(
        db_url: str) -> None:
    fake = FakeTelegram().start()
    hold = threading.Event()
    try:
        with FakeOpenAI() as model:
            model.reply(json.dumps(HELLO), stream=Stream(hold=hold, hold_after=24))
            app = create_app(config(db_url, fake.url, model=LiteLLMModel(
                "openai/gpt-4o-mini", api_base=model.api_base),
                telegram={"PURAMUR": TelegramBot(TOKEN, SECRET, stream=True)}))
            with TestClient(app) as c:
                assert c.post(HOOK, json=private(1, "Hi!"), headers=HEADERS).status_code == 200
                # The model is still writing: the customer sees its first words already.
                _wait(lambda: fake.sent())
                first = fake.sent()[0]
                assert first["chat_id"] == CHAT and HELLO["reply"].startswith(first["text"])
                assert first["text"] != HELLO["reply"]
                hold.set()
                _wait(lambda: any(b["text"] == HELLO["reply"] for b in
                                  fake.sent("editMessageText")))
                calls = _customer(fake)
        # One message: sent once, then edited into the validated reply (the last call).
        assert [c["method"] for c in calls].count("sendMessage") == 1
        assert calls[-1]["method"] == "editMessageText"
        assert calls[-1]["body"]["text"] == HELLO["reply"]
        edited = {c["body"]["message_id"] for c in calls if c["method"] == "editMessageText"}
        assert len(edited) == 1 and fake.texts[edited.pop()] == HELLO["reply"]
        assert fake.violations == []
    finally:
        fake.stop()


def test_edits_come_at_most_once_a_second_and_the_final_is_delivered_once(
        db_url: str, sql: Any) -> None:
    said = "Sphynx skin is delicate: " + "wash it gently, once a week, and moisturize. " * 4
    model = ScriptedModel.from_data({"chunk_delay": 0.05, "default": {"reply": said}})
    reply = said.strip()  # the text sent is the reply stripped once (engine.turn.save)
    fake = FakeTelegram().start()
    try:
        app = create_app(config(db_url, fake.url, model=model, telegram={
            "PURAMUR": TelegramBot(TOKEN, SECRET, stream=True)}))
        with TestClient(app) as c:
            c.post(HOOK, json=private(1, "Hi!"), headers=HEADERS)
            _wait(lambda: any(b["text"] == reply for b in fake.sent("editMessageText")))
            calls = _customer(fake)
            # The next message is a message of its own (its stream starts afresh).
            c.post(HOOK, json=private(2, "And a dog?"), headers=HEADERS)
            _wait(lambda: len(fake.sent()) == 2 and fake.texts.get(
                max(fake.texts)) == reply)
        assert len(calls) >= 3  # streamed: a send, edits as it grew, the last one
        gaps = [b["at"] - a["at"] for a, b in zip(calls, calls[1:], strict=False)]
        # Every call but the delivery's (the final edit) keeps the interval.
        assert all(g >= EDIT_INTERVAL * 0.95 for g in gaps[:-1]), gaps
        assert [c["body"]["text"] for c in calls][-1] == reply
        assert sum(1 for b in fake.sent("editMessageText") if b["text"] == reply) == 2
        assert len(fake.sent()) == 2  # one message per reply, never a second copy
        assert sql("SELECT count(*) FROM funnel_outbox WHERE kind = 'reply' AND "
                   "delivered_at IS NOT NULL") == [(2,)]
        assert fake.violations == []
    finally:
        fake.stop()


def test_without_a_live_message_the_reply_is_sent_as_before(db_url: str) -> None:
    fake = FakeTelegram().start()
    fake.script = [(500, {"ok": False, "error_code": 500, "description": "down"})]
    model = ScriptedModel.from_data({"default": {"reply": HELLO["reply"]}})
    try:
        app = create_app(config(db_url, fake.url, model=model, dispatch_interval=0.2,
                                telegram={"PURAMUR": TelegramBot(TOKEN, SECRET, stream=True)}))
        with TestClient(app) as c:
            c.post(HOOK, json=private(1, "Hi!"), headers=HEADERS)
            # The live message's send failed (best effort, not retried): the outbox
            # sends the reply itself, retried until it is delivered.
            sent = fake.wait_sent(1, timeout=30)
        assert [b["text"] for b in sent] == [HELLO["reply"]]
        assert fake.sent("editMessageText") == []
        assert fake.violations == []
    finally:
        fake.stop()
