"""The real litellm HTTP path, end to end: Engine -> LiteLLMModel -> litellm -> HTTP.

A fake OpenAI-compatible server on 127.0.0.1 (``fake_llm``, tests/fake_openai.py)
plays the model; the puramur funnel runs on a real PostgreSQL. The model is
``openai/fake-model`` pointed at the fake's ``api_base``; litellm is imported
once (the first LiteLLMModel) for the whole run.

Failure cases check the guarantees of a turn whose model fails: the customer's
message is logged, the reply is the stage's ``fallback``, the state is unchanged
(only bookkeeping moves), and ``funnel_turns.error`` says what went wrong.

A socket audit hook fails any test here that opens a connection (or resolves a
name) anywhere but the loopback.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PURAMUR, ROOT, puramur_data, said

pytestmark = pytest.mark.postgres

SESSION = "tg-100"
MODEL = "openai/fake-model"

# -- no network but the loopback -----------------------------------------------------

_LOCAL_HOSTS = {"127.0.0.1", "::1", "localhost", "0.0.0.0"}
_guard: dict[str, Any] = {"on": False, "violations": []}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _guard["on"]:
        return
    if event == "socket.connect":
        address = args[1]
        if isinstance(address, tuple) and str(address[0]) not in _LOCAL_HOSTS:
            _guard["violations"].append(f"connect {address!r}")
            raise ConnectionRefusedError(f"test network guard: connect to {address!r}")
    elif event == "socket.getaddrinfo":
        host = args[0]
        if isinstance(host, bytes):
            host = host.decode()
        if host is not None and str(host) not in _LOCAL_HOSTS:
            _guard["violations"].append(f"getaddrinfo {host!r}")
            raise OSError(f"test network guard: name lookup of {host!r}")


sys.addaudithook(_audit)


@pytest.fixture(autouse=True, scope="module")
def loopback_only() -> Iterator[None]:
    """Refuse (and report) any connection or name lookup off 127.0.0.1 in this module."""
    _guard["on"] = True
    try:
        yield
    finally:
        _guard["on"] = False
    assert not _guard["violations"], f"network use off the loopback: {_guard['violations']}"


@pytest.fixture(autouse=True, scope="module")
async def close_litellm_clients() -> AsyncIterator[None]:
    """Close litellm's cached HTTP clients on the loop that opened them."""
    yield
    if "litellm" in sys.modules:
        from litellm.llms.custom_httpx.async_client_cleanup import close_litellm_async_clients

        await close_litellm_async_clients()
        sys.modules["litellm"].in_memory_llm_clients_cache.flush_cache()


# -- helpers -------------------------------------------------------------------------


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-dummy")


@pytest.fixture(scope="session")
def fast_puramur(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the puramur funnel with ``model: {timeout: 1, retries: 0}``."""
    data = puramur_data()
    data["model"].update(timeout=1, retries=0)
    path = tmp_path_factory.mktemp("funnel") / "puramur_fast.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    return path


async def open_engine(funnel: Path, db_url: str, fake: Any, name: str = MODEL) -> Any:
    from engine.llm.models import LiteLLMModel
    from engine.turn.engine import Engine

    return await Engine.open(funnel, db=db_url, model=LiteLLMModel(name, api_base=fake.api_base))


def out(reply: str, **rest: Any) -> str:
    return json.dumps({"reply": reply, **rest})


def turns(sql: Any) -> list[dict[str, Any]]:
    cols = ("stage_before", "stage_after", "validation_failures", "repaired", "fallback",
            "prompt_tokens", "completion_tokens", "cost", "model", "error", "llm_ms")
    rows = sql(f"SELECT {', '.join(cols)} FROM funnel_turns WHERE session_id = %s ORDER BY id",
               (SESSION,))
    return [dict(zip(cols, r, strict=True)) for r in rows]


def messages(sql: Any) -> list[tuple[str, str]]:
    return sql("SELECT role, content FROM funnel_messages WHERE session_id = %s ORDER BY id",
               (SESSION,))


def state_fields(engine: Any, row: dict[str, Any]) -> dict[str, Any]:
    return {name: row[name] for name in engine.spec.state}


async def warm_up(engine: Any, fake: Any) -> dict[str, Any]:
    """Turn 1 (greeting): a good answer that sets the pet type; returns the row after it."""
    fake.reply(out("Hello! A dog, lovely. What breed?", language="en",
                   updates={"pet": {"type": "dog"}}), prompt_tokens=200, completion_tokens=20)
    result = await engine.handle(SESSION, "Hi, I have a dog")
    assert not result.fallback and result.stage_after == "discovery"
    row = await engine.state(SESSION)
    assert row is not None and row["pet"] == {"type": "dog"}
    return row


def assert_failed_turn(engine: Any, result: Any, before: dict[str, Any],
                       after: dict[str, Any] | None, sql: Any, text: str) -> dict[str, Any]:
    """The guarantees of a turn whose model output was unusable; returns its funnel_turns row."""
    fallback = said(engine.funnel.stage("discovery").spec.fallback, result.state)
    assert result.fallback is True
    assert result.reply == fallback
    assert result.updated == [] and result.actions == []
    # the customer's message is logged, then the fallback reply
    assert messages(sql)[-2:] == [("user", text), ("assistant", fallback)]
    # the state is unchanged; only bookkeeping moved
    assert after is not None
    assert state_fields(engine, after) == state_fields(engine, before)
    assert after["stage"] == before["stage"] == "discovery"
    assert after["turns"] == before["turns"] + 1
    assert after["row_version"] == before["row_version"] + 1
    turn = turns(sql)[-1]
    assert turn["fallback"] is True and turn["repaired"] is False
    assert turn["stage_before"] == turn["stage_after"] == "discovery"
    assert turn["model"] == MODEL
    return turn


# -- the cases -----------------------------------------------------------------------


async def test_good_output_is_applied_and_recorded(db_url: str, sql: Any, fake_llm: Any,
                                                   api_key: None) -> None:
    engine = await open_engine(PURAMUR, db_url, fake_llm)
    try:
        fake_llm.reply(out("Hello! A Yorkie, lovely. How old is he?", language="en",
                           updates={"pet": {"type": "dog", "breed": "Yorkie"}}),
                       prompt_tokens=321, completion_tokens=45)
        result = await engine.handle(SESSION, "Hi, I have a Yorkie")

        assert result.reply == "Hello! A Yorkie, lovely. How old is he?"
        assert not result.fallback and not result.repaired and result.error is None
        assert result.validation_failures == 0
        assert (result.prompt_tokens, result.completion_tokens) == (321, 45)
        assert result.stage_before == "greeting" and result.stage_after == "discovery"
        row = await engine.state(SESSION)
        assert row is not None
        assert row["pet"] == {"type": "dog", "breed": "Yorkie"}
        assert row["discovery_completeness"] == 50
        assert row["response_language"] == "en"
        assert sql("SELECT pet->>'type' FROM puramur_sessions_state WHERE session_id = %s",
                   (SESSION,)) == [("dog",)]
        assert messages(sql) == [("user", "Hi, I have a Yorkie"),
                                 ("assistant", "Hello! A Yorkie, lovely. How old is he?")]
        [turn] = turns(sql)
        assert (turn["prompt_tokens"], turn["completion_tokens"]) == (321, 45)
        assert turn["model"] == MODEL and turn["error"] is None
        assert turn["fallback"] is False and turn["validation_failures"] == 0
        assert turn["llm_ms"] is not None and turn["llm_ms"] >= 0

        # what went over the wire
        assert fake_llm.calls == 1 and fake_llm.paths == ["/v1/chat/completions"]
        body = fake_llm.requests[0]
        assert body["model"] == "fake-model"
        chat = body["messages"]
        assert chat[0]["role"] == "system"
        assert "You are the Puramur consultant" in chat[0]["content"]
        assert "Greet the customer and ask whether their pet is a cat or a dog" \
            in chat[0]["content"]
        assert chat[-1] == {"role": "user", "content": "Hi, I have a Yorkie"}
        # a new session has no history: the static prefix, the turn part, the message
        assert [m["role"] for m in chat] == ["system", "system", "user"]
        assert "Known facts (JSON)" in chat[1]["content"]
        # litellm does not know the model and there is an api_base: a self-hosted
        # server, asked for the stage's portable schema first
        fmt = body["response_format"]
        assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "greeting_output"
        assert fmt["json_schema"]["schema"]["required"] == ["reply"]
        assert "maxLength" not in json.dumps(fmt["json_schema"]["schema"])
        assert body["temperature"] == 0.3
        assert body["max_tokens"] == 500
        assert not body.get("stream")

        # turn 2 carries the history and the discovery prompt
        fake_llm.reply(out("Three years, noted.", updates={"pet": {"age_years": 3}}))
        result = await engine.handle(SESSION, "He is 3")
        assert result.reply == "Three years, noted." and not result.fallback
        chat = fake_llm.requests[1]["messages"]
        assert "Stage: discovery." in chat[0]["content"]
        # discovery's facts change every turn: its turn part follows the recent messages
        assert chat[1:3] == [
            {"role": "user", "content": "Hi, I have a Yorkie"},
            {"role": "assistant", "content": "Hello! A Yorkie, lovely. How old is he?"},
        ]
        assert chat[3]["role"] == "system" and '"breed":"Yorkie"' in chat[3]["content"]
        assert chat[4:] == [{"role": "user", "content": "He is 3"}]
        row = await engine.state(SESSION)
        assert row is not None and row["pet"]["age_years"] == 3
        assert row["discovery_completeness"] == 65
        assert row["stage"] == "presentation"
    finally:
        await engine.close()


async def test_structured_output_model_gets_the_stage_schema(db_url: str, sql: Any,
                                                             fake_llm: Any,
                                                             api_key: None) -> None:
    """A model litellm knows supports response schemas gets ``json_schema`` with the stage's
    schema in OpenAI's strict form, ``strict: true``; the cost comes from litellm's local
    cost map."""
    engine = await open_engine(PURAMUR, db_url, fake_llm, name="openai/gpt-4o-mini")
    try:
        fake_llm.reply(out("Hello! Cat or dog?"), prompt_tokens=1000, completion_tokens=100)
        result = await engine.handle(SESSION, "Hello")
        assert result.reply == "Hello! Cat or dog?" and not result.fallback
        body = fake_llm.requests[0]
        assert body["model"] == "gpt-4o-mini"
        fmt = body["response_format"]
        assert fmt["type"] == "json_schema"
        assert fmt["json_schema"]["name"] == "greeting_output"
        schema = fmt["json_schema"]["schema"]
        assert fmt["json_schema"]["strict"] is True
        assert schema["required"] == ["reply", "language", "updates", "actions"]
        assert set(schema["properties"]) == {"reply", "language", "updates", "actions"}
        [turn] = turns(sql)
        assert turn["cost"] is not None and turn["cost"] > 0
    finally:
        await engine.close()


async def test_malformed_json_then_a_valid_repair(db_url: str, sql: Any, fake_llm: Any,
                                                  api_key: None) -> None:
    engine = await open_engine(PURAMUR, db_url, fake_llm)
    try:
        await warm_up(engine, fake_llm)
        bad = 'Sure! {"reply": "A Yorkie'
        fake_llm.reply(bad, prompt_tokens=300, completion_tokens=10)
        fake_llm.reply(out("A Yorkie! How old is he?", updates={"pet": {"breed": "Yorkie"}}),
                       prompt_tokens=350, completion_tokens=15)
        result = await engine.handle(SESSION, "A Yorkie")

        assert result.repaired is True and result.fallback is False
        assert result.validation_failures == 1
        assert result.reply == "A Yorkie! How old is he?"
        assert result.updated == ["pet"]
        assert (result.prompt_tokens, result.completion_tokens) == (650, 25)
        row = await engine.state(SESSION)
        assert row is not None and row["pet"] == {"type": "dog", "breed": "Yorkie"}

        assert fake_llm.calls == 3  # warm-up, first answer, one repair call
        first, repair = fake_llm.requests[1]["messages"], fake_llm.requests[2]["messages"]
        assert repair[:len(first)] == first
        assert repair[-2] == {"role": "assistant", "content": bad}
        assert repair[-1]["role"] == "user"
        assert "Your last answer was rejected: not valid JSON" in repair[-1]["content"]
        assert fake_llm.requests[2]["response_format"]["type"] == "json_schema"

        turn = turns(sql)[-1]
        assert turn["repaired"] is True and turn["validation_failures"] == 1
        assert (turn["prompt_tokens"], turn["completion_tokens"]) == (650, 25)
        assert turn["error"] is None
        assert messages(sql)[-1] == ("assistant", "A Yorkie! How old is he?")
    finally:
        await engine.close()


async def test_schema_invalid_twice_gives_the_fallback(db_url: str, sql: Any, fake_llm: Any,
                                                       api_key: None) -> None:
    engine = await open_engine(PURAMUR, db_url, fake_llm)
    try:
        before = await warm_up(engine, fake_llm)
        # a field the stage may not write, then no reply at all
        fake_llm.reply(out("Noted!", updates={"pet": {"type": "cat"}, "cart_total": 0}))
        fake_llm.reply(json.dumps({"updates": {"pet": {"type": "cat"}}}))
        text = "Actually it is a cat"
        result = await engine.handle(SESSION, text)

        assert result.validation_failures == 2
        assert fake_llm.calls == 3  # warm-up, first answer, one repair call: no more
        repair = fake_llm.requests[2]["messages"]
        assert "Your last answer was rejected: at $.updates" in repair[-1]["content"]
        assert "cart_total" in repair[-1]["content"]
        after = await engine.state(SESSION)
        turn = assert_failed_turn(engine, result, before, after, sql, text)
        assert after is not None and after["pet"] == {"type": "dog"}  # nothing applied
        assert turn["validation_failures"] == 2
        assert "after repair" in (turn["error"] or "")
        assert "reply" in (turn["error"] or "")
        # both calls' tokens are still counted
        assert (turn["prompt_tokens"], turn["completion_tokens"]) == (240, 60)
    finally:
        await engine.close()


async def test_http_500_retried_then_fallback(db_url: str, sql: Any, fake_llm: Any,
                                              api_key: None,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """puramur.yaml says ``retries: 2``: the engine makes three calls, then the turn falls
    back; the turn record counts them."""
    engine = await open_engine(PURAMUR, db_url, fake_llm)
    try:
        before = await warm_up(engine, fake_llm)
        for _ in range(3):
            fake_llm.fail(500)
        text = "He is a Yorkie"
        result = await engine.handle(SESSION, text)

        assert fake_llm.calls == 1 + 3 and fake_llm.pending == 0
        after = await engine.state(SESSION)
        turn = assert_failed_turn(engine, result, before, after, sql, text)
        assert result.validation_failures == 0
        assert "InternalServerError" in (turn["error"] or "")
        assert "after 2 retries" in (turn["error"] or "")
        assert "LiteLLM Retried" not in (turn["error"] or "")
        assert sql("SELECT attempts FROM funnel_turns WHERE session_id = %s ORDER BY id",
                   (SESSION,)) == [(1,), (3,)]
        assert result.error == turn["error"]
        assert (turn["prompt_tokens"], turn["completion_tokens"]) == (0, 0)
        # litellm's "Give Feedback / Get Help" banners stay off stdout
        assert capsys.readouterr().out == ""
    finally:
        await engine.close()


async def test_http_500_without_retries(db_url: str, sql: Any, fake_llm: Any,
                                        api_key: None, fast_puramur: Path) -> None:
    engine = await open_engine(fast_puramur, db_url, fake_llm)
    try:
        before = await warm_up(engine, fake_llm)
        fake_llm.fail(500, "The upstream model is overloaded")
        text = "He is a Yorkie"
        result = await engine.handle(SESSION, text)

        assert fake_llm.calls == 2  # warm-up and one failed call: no retry, no repair
        after = await engine.state(SESSION)
        turn = assert_failed_turn(engine, result, before, after, sql, text)
        assert "InternalServerError" in (turn["error"] or "")
        assert "overloaded" in (turn["error"] or "")
    finally:
        await engine.close()


async def test_timeout_gives_the_fallback_quickly(db_url: str, sql: Any, fake_llm: Any,
                                                  api_key: None, fast_puramur: Path) -> None:
    engine = await open_engine(fast_puramur, db_url, fake_llm)
    try:
        before = await warm_up(engine, fake_llm)
        fake_llm.sleep(30)
        text = "He is a Yorkie"
        started = time.perf_counter()
        result = await engine.handle(SESSION, text)
        elapsed = time.perf_counter() - started

        assert elapsed < 5, f"the 1 s timeout took {elapsed:.1f} s"
        assert fake_llm.calls == 2
        after = await engine.state(SESSION)
        turn = assert_failed_turn(engine, result, before, after, sql, text)
        assert "Timeout" in (turn["error"] or "")
    finally:
        await engine.close()


def test_the_network_guard_is_armed() -> None:
    seen = len(_guard["violations"])
    with pytest.raises(OSError, match="test network guard"):
        socket.getaddrinfo("example.com", 443)
    with socket.socket() as sock, pytest.raises(OSError, match="test network guard"):
        sock.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed
    assert len(_guard["violations"]) == seen + 2
    del _guard["violations"][seen:]


def test_engine_imports_do_not_import_litellm() -> None:
    """litellm (seconds of CPU) is imported only when a LiteLLMModel is built, and only after
    LITELLM_LOCAL_MODEL_COST_MAP is set (so it never fetches the cost map)."""
    code = """
import json, os, sys
os.environ.pop("LITELLM_LOCAL_MODEL_COST_MAP", None)
import engine, engine.validation, engine.turn.engine, engine.llm.models, engine.cli
from engine.llm.models import ScriptedModel, make_model
ScriptedModel.from_data({"default": {"reply": "hi"}})
before = "litellm" in sys.modules
seen = []

class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "litellm":
            seen.append(os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP"))
            raise ImportError("stopped by the test")
        return None

sys.meta_path.insert(0, Spy())
try:
    make_model("openai/fake-model")
except ImportError:
    pass
print(json.dumps({"before": before, "seen": seen}))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"before": False, "seen": ["True"]}


async def test_a_call_cut_at_the_deadline_is_recorded_and_its_request_closed(
        db_url: str, fake_llm: Any, sql: Any, tmp_path: Path) -> None:
    """A server that keeps generating (its body trickles: no read ever times out) is
    stopped by the turn's deadline: the connection is closed, so a server that honours
    it stops, and the turn record counts the time and the prompt tokens spent."""
    data = puramur_data()
    data["model"].update(timeout=30, retries=0, deadline=2)
    path = tmp_path / "puramur_deadline.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    fake_llm.trickle(120)
    engine = await open_engine(path, db_url, fake_llm)
    try:
        result = await engine.handle(SESSION, "Hello")
    finally:
        await engine.close()
    assert result.fallback and "deadline" in (result.error or "")
    # The server notices the client went away (a write fails) long before its 120 s.
    assert await asyncio.to_thread(fake_llm.client_closed.wait, 60)
    [record] = turns(sql)
    assert record["fallback"] and record["llm_ms"] > 0  # the time until the deadline, spent
    assert record["prompt_tokens"] > 0 and record["cost"] is None  # sent, billed, unpriced
