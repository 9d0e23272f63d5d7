"""Server-Sent Events on ``POST .../messages``: each event sequence, on uvicorn, with the model
on the real litellm HTTP path against the fake OpenAI server (tests/fake_openai.py), which
streams OpenAI's chunks (tests/fake_stream.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fake_openai import FakeOpenAI
from fake_stream import Stream
from service_support import running
from test_litellm_path import close_litellm_clients, loopback_only  # noqa: F401
from test_service import BASE, CONVERSE, bearer, config

from engine.llm.models import LiteLLMModel
from engine.service.app import create_app

pytestmark = pytest.mark.postgres

# The greeting's fallback as a new session gets it: "Hi!" tells no language, so the
# session's is Puramur's default, Ukrainian.
GREETING = "Вітаю! Я консультант Puramur. Скажіть, у вас кішка чи собака?"
HELLO = {"reply": "Hello! I'm the Puramur consultant. Is your pet a cat or a dog?",
         "language": "en"}
SSE = {**bearer(CONVERSE), "Accept": "text/event-stream"}


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from engine.llm import strategy, stream

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    strategy.forget()
    stream.forget()
    yield
    strategy.forget()
    stream.forget()


@pytest.fixture
def served(db_url: str) -> Iterator[tuple[str, FakeOpenAI]]:
    with FakeOpenAI() as fake, running(create_app(config(db_url, model=LiteLLMModel(
            "openai/gpt-4o-mini", api_base=fake.api_base)))) as url:
        yield url, fake


def events(response: httpx.Response) -> list[tuple[str, Any]]:
    """The events of a ``text/event-stream`` response, parsed."""
    found: list[tuple[str, Any]] = []
    event = ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            found.append((event, json.loads(line.removeprefix("data: "))))
    return found


def post(url: str, session: str, text: str, headers: dict[str, str] | None = None
         ) -> tuple[httpx.Response, list[tuple[str, Any]]]:
    with httpx.stream("POST", f"{url}{BASE}/sessions/{session}/messages", json={"text": text},
                      headers=headers or SSE, timeout=30) as r:
        return r, events(r) if r.status_code == 200 else []


def shown(found: list[tuple[str, Any]]) -> str:
    text = ""
    for kind, data in found:
        if kind == "delta":
            text += data["text"]
        elif kind == "replace":
            text = data["text"]
    return text


def turn_count(sql: Any, session: str) -> int:
    return int(sql("SELECT count(*) FROM funnel_turns WHERE session_id = %s", (session,))[0][0])


def test_a_turn_streams_its_reply_then_the_turn(served: tuple[str, FakeOpenAI], sql: Any
                                                ) -> None:
    url, fake = served
    fake.reply(json.dumps(HELLO))
    r, found = post(url, "sse-1", "Hi!")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    kinds = [k for k, _ in found]
    assert kinds[-1] == "turn" and set(kinds[:-1]) == {"delta"} and len(kinds) >= 4
    turn = found[-1][1]
    assert shown(found) == turn["reply"] == HELLO["reply"]
    # The same turn as the JSON API's.
    assert set(turn) == {"reply", "stage", "handoff", "fallback", "turn_id", "replayed"}
    assert turn["stage"] == "discovery" and turn["replayed"] is False
    assert fake.requests[-1]["stream"] is True
    assert turn_count(sql, "sse-1") == 1

    fake.reply(json.dumps(HELLO))
    plain = httpx.post(f"{url}{BASE}/sessions/sse-2/messages", json={"text": "Hi!"},
                       headers=bearer(CONVERSE), timeout=30)
    assert plain.headers["content-type"].startswith("application/json")
    assert set(plain.json()) == set(turn)


def test_repaired_and_fallback_turns_replace_what_was_streamed(
        served: tuple[str, FakeOpenAI]) -> None:
    url, fake = served
    fake.reply(json.dumps({"reply": "Rejected, since actions is no list", "actions": 1}))
    fake.reply(json.dumps(HELLO))
    _, found = post(url, "sse-r", "Hi!")
    kinds = [k for k, _ in found]
    assert kinds.count("replace") == 1 and kinds.index("replace") > 0
    assert found[kinds.index("replace")][1]["text"] != ""
    assert shown(found) == found[-1][1]["reply"] == HELLO["reply"]

    for _ in range(2):
        fake.reply(json.dumps({"reply": "Rejected twice", "actions": 1}))
    _, found = post(url, "sse-f", "Hi!")
    turn = found[-1][1]
    assert turn["fallback"] is True and turn["reply"] == GREETING
    assert found[-2] == ("replace", {"text": GREETING})


def test_a_provider_error_mid_stream(served: tuple[str, FakeOpenAI], sql: Any) -> None:
    url, fake = served
    fake.reply(json.dumps({"reply": "Cut off in the middle"}), stream=Stream(cut_after=12))
    fake.reply(json.dumps(HELLO))
    _, found = post(url, "sse-e", "Hi!")
    kinds = [k for k, _ in found]
    assert kinds[0] == "delta" and "replace" in kinds and kinds[-1] == "turn"
    assert shown(found) == found[-1][1]["reply"] == HELLO["reply"]
    assert turn_count(sql, "sse-e") == 1


def test_a_client_gone_mid_stream_leaves_the_turn_to_complete_once(
        served: tuple[str, FakeOpenAI], sql: Any) -> None:
    url, fake = served
    hold = threading.Event()
    fake.reply(json.dumps(HELLO), stream=Stream(hold=hold))
    with httpx.stream("POST", f"{url}{BASE}/sessions/sse-gone/messages",
                      json={"text": "Hi!"}, headers=SSE, timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines) == "event: delta"  # the model is still writing
    hold.set()  # the client has gone; the model finishes its answer
    deadline = time.monotonic() + 20
    while turn_count(sql, "sse-gone") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert turn_count(sql, "sse-gone") == 1
    replies = sql("SELECT content FROM funnel_messages WHERE session_id = %s AND role = "
                  "'assistant'", ("sse-gone",))
    assert [r[0] for r in replies] == [HELLO["reply"]]


def test_a_replayed_streamed_message_returns_the_final_turn(
        served: tuple[str, FakeOpenAI], sql: Any) -> None:
    url, fake = served
    fake.reply(json.dumps(HELLO))
    headers = {**SSE, "Idempotency-Key": "msg-7f3a"}
    _, first = post(url, "sse-k", "Hi!", headers)
    _, again = post(url, "sse-k", "Hi!", headers)
    assert again == [("delta", {"text": HELLO["reply"]}),
                     ("turn", {**first[-1][1], "replayed": True})]
    plain = httpx.post(f"{url}{BASE}/sessions/sse-k/messages", json={"text": "Hi!"},
                       headers={**bearer(CONVERSE), "Idempotency-Key": "msg-7f3a"}, timeout=30)
    assert plain.json() == {**first[-1][1], "replayed": True}
    assert turn_count(sql, "sse-k") == 1 and fake.calls == 1


def test_a_refusal_before_the_stream_is_plain_json(served: tuple[str, FakeOpenAI]) -> None:
    url, _ = served
    r = httpx.post(f"{url}{BASE}/sessions/sse-x/messages", json={"text": "Hi!"},
                   headers={"Accept": "text/event-stream"}, timeout=30)
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"


@pytest.mark.slow
def test_the_widget_shows_the_reply_as_it_arrives(db_url: str, tmp_path: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from studio_support import chromium as _chromium

    browser, driver_path = _chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    monkeypatch.setenv("SE_OFFLINE", "true")
    hold = threading.Event()
    with FakeOpenAI() as fake, running(create_app(config(db_url, model=LiteLLMModel(
            "openai/gpt-4o-mini", api_base=fake.api_base)))) as url:
        fake.reply(json.dumps(HELLO), stream=Stream(hold=hold, hold_after=24))
        driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
        try:
            wait = WebDriverWait(driver, 20)
            driver.get(f"{url}/demo/puramur")
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".fw-launcher"))
            driver.find_element(By.CSS_SELECTOR, ".fw-launcher").click()
            wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".fw-panel").is_displayed())
            box = driver.find_element(By.CSS_SELECTOR, ".fw-input")
            box.send_keys("Hi!")
            box.send_keys("\n")

            def partial(d: Any) -> str:
                return str(d.execute_script(
                    "var b = document.querySelector('[data-testid=fw-streaming] .fw-bubble');"
                    "return b ? b.textContent : ''"))

            # The model is held mid-answer: what the bubble shows arrived before the turn.
            wait.until(lambda d: partial(d) != "")
            early = partial(driver)
            assert HELLO["reply"].startswith(early) and early != HELLO["reply"]
            hold.set()

            def final(d: Any) -> bool:
                return bool(d.execute_script(
                    "return !document.querySelector('[data-testid=fw-streaming]') && "
                    "[...document.querySelectorAll('.fw-bot .fw-bubble')]"
                    ".some(e => e.textContent === arguments[0])", HELLO["reply"]))

            wait.until(final)
        finally:
            driver.quit()
