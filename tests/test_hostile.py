"""The hostile corpus, through the service and the real litellm HTTP path.

Every model output of tests/hostile_corpus.py is played by the fake OpenAI
server (tests/fake_openai.py) behind ``funnel serve``'s app, on a real
PostgreSQL, for a session of its own: a good first turn, the hostile turn, and
a normal turn after it. For every case: HTTP 200 with a non-blank reply, one
turn record a message, the customer's and the assistant's messages logged, the
state row valid against the funnel's field schemas, and the model called again
(and its answer used) on the next turn. Invalid outputs are repaired once and
then answered with the fallback; valid envelopes are applied as far as the
engine allows. Customer inputs get a clear 4xx or a reply, never a 500.

The funnel is Puramur with output schemas that accept any ``{reply}`` object,
so that the engine's own checks meet every output (the stage schemas are the
first guard, and would hide them). One app, one fake server and one schema
serve the whole module. At the end, the invariant checker runs on all of it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import jsonschema
import psycopg
import pytest
import yaml
from conftest import puramur_data, said, sql_runner, temporary_schema
from fake_openai import FakeOpenAI
from hostile_corpus import CUSTOMER_INPUTS, MODEL_OUTPUTS, env
from psycopg.rows import dict_row

from engine.format.texts import TOO_LONG
from engine.funnel.compiled import CompiledFunnel, load_funnel
from engine.memory.observations import text_tokens
from engine.records.messages import estimate_tokens
from engine.service.app import create_app
from engine.service.config import ServiceConfig
from engine.turn.invariants import check_funnel, check_row

# The last test counts the cases the others tried: the suite runs each file on one xdist
# worker, in order (`--dist loadfile`).
pytestmark = pytest.mark.postgres

KEY = "hostile-key-7d3c9b1a5e"
BASE = "/v1/funnels/puramur"
HEADERS = {"Authorization": f"Bearer {KEY}"}
NOT_CALLED = {"too-long-for-budget", "max-length"}  # asked to shorten: no model call


@pytest.fixture(scope="module")
def url(server_dsn: str) -> Iterator[str]:
    with temporary_schema(server_dsn, "hostile") as u:
        yield u


@pytest.fixture(scope="module")
def sql(url: str) -> Iterator[Any]:
    with sql_runner(url) as run:
        yield run


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def observer() -> Iterator[FakeOpenAI]:
    """The summarizer's endpoint, a server of its own (so that the model's queue above
    stays exact): one observation a fold, and the reflector's answer is one line too."""
    server = FakeOpenAI().respond_with(
        lambda body: json.dumps({"observations": ["The customer wrote again."]})).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def funnel(tmp_path_factory: pytest.TempPathFactory, observer: FakeOpenAI) -> CompiledFunnel:
    """Puramur (model timeout 1 s, no retries) whose stage schemas accept any reply; its
    observational memory is written at ``observer``."""
    data = puramur_data()
    data["model"].update(timeout=2, retries=0)
    data["memory"]["summarizer_api_base"] = observer.api_base
    path = tmp_path_factory.mktemp("hostile") / "puramur.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    compiled = load_funnel(path)
    loose = jsonschema.Draft202012Validator({"type": "object", "required": ["reply"]})
    for name, stage in list(compiled.stages.items()):
        compiled.stages[name] = dataclasses.replace(stage, validator=loose)
    return compiled


@pytest.fixture(scope="module")
async def client(url: str, fake: FakeOpenAI, funnel: CompiledFunnel
                 ) -> AsyncIterator[httpx.AsyncClient]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", "sk-test-dummy")
        app = create_app(ServiceConfig(
            funnels=[funnel], db=url, model="openai/fake-model", api_base=fake.api_base,
            api_keys={KEY: frozenset({"converse", "read_state"})}, secret=b"k" * 32,
            rate_limit=(100_000, 60.0), telegram_api="http://127.0.0.1:9"))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://svc") as c:
                yield c
        if "litellm" in sys.modules:
            from litellm.llms.custom_httpx.async_client_cleanup import (
                close_litellm_async_clients,
            )

            await close_litellm_async_clients()
            sys.modules["litellm"].in_memory_llm_clients_cache.flush_cache()


async def say(client: httpx.AsyncClient, session: str, text: str) -> httpx.Response:
    return await client.post(f"{BASE}/sessions/{session}/messages", json={"text": text},
                             headers=HEADERS)


def row_of(url: str, session: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn, conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT * FROM puramur_sessions_state WHERE session_id = %s", (session,))
        row = cur.fetchone()
    assert row is not None
    return row


tried: dict[str, int] = {"model": 0, "customer": 0}


@pytest.mark.parametrize(("name", "content", "invalid"), MODEL_OUTPUTS,
                         ids=[c[0] for c in MODEL_OUTPUTS])
async def test_a_hostile_model_output_ends_in_a_reply_and_a_valid_state(
        name: str, content: str, invalid: bool, client: httpx.AsyncClient, fake: FakeOpenAI,
        funnel: CompiledFunnel, url: str, sql: Any) -> None:
    session = f"m-{name}"
    fake.reply(env("Hello! A dog, lovely.", updates={"pet": {"type": "dog"}}))
    assert (await say(client, session, "Hi, I have a dog")).status_code == 200
    calls = fake.calls
    for _ in range(2 if invalid else 1):  # an invalid output gets one repair call
        fake.reply(content)
    response = await say(client, session, "Tell me more")
    tried["model"] += 1

    assert response.status_code == 200, response.text
    reply = response.json()["reply"]
    assert isinstance(reply, str) and reply.strip()
    assert fake.calls == calls + (2 if invalid else 1)
    fake.reply(env("Back to normal."))
    after = await say(client, session, "ok")
    assert after.status_code == 200 and after.json()["reply"] == "Back to normal."
    assert fake.pending == 0 and fake.calls == calls + (3 if invalid else 2)

    records = sql("SELECT stage_before, fallback, error FROM funnel_turns "
                  "WHERE session_id = %s ORDER BY id", (session,))
    assert len(records) == 3
    stage, fallback, error = records[1]
    assert fallback is invalid, error
    assert records[2][1] is False
    if invalid:
        assert reply == said(funnel.stage(stage).spec.fallback, row_of(url, session))
        assert error and "after repair" in error
    logged = sql("SELECT role, content FROM funnel_messages WHERE session_id = %s "
                 "ORDER BY id", (session,))
    assert [r for r, _ in logged] == ["user", "assistant"] * 3
    assert logged[2:4] == [("user", "Tell me more"), ("assistant", reply)]
    assert check_row(funnel, row_of(url, session)) == []


async def test_what_the_engine_refused_reaches_the_model_as_short_data(
        client: httpx.AsyncClient, fake: FakeOpenAI, url: str) -> None:
    """A 5,000-character SKU is refused; the model hears of it in the data message, as a
    short excerpt, and never in the system message."""
    session = "m-told"
    fake.reply(env("Hello!", updates={"pet": {"type": "dog"}}))
    fake.reply(env("ok", actions=[{"type": "add_to_cart", "sku": "Q" * 5000}]))
    fake.reply(env("Sorry, that product does not exist."))
    for text in ("Hi, a dog", "Add it", "Well?"):
        assert (await say(client, session, text)).status_code == 200
    messages = fake.requests[-1]["messages"]
    assert "<data>" in messages[0]["content"]  # the rule that explains the data block
    assert not any("QQQQ" in m["content"] for m in messages if m["role"] == "system")
    # after the turn part (no summary yet), right before the message: the notices, as data
    assert [m["role"] for m in messages[-3:]] == ["system", "user", "user"]
    data = messages[-2]["content"]
    assert data.startswith("<data>")
    assert "add_to_cart refused: unknown SKU 'QQQQ" in data and "(5000 chars)" in data
    assert len(data) < 600
    assert row_of(url, session)["notices"] == []  # shown once, then cleared


async def test_no_session_grows_out_of_reach_of_the_model(
        client: httpx.AsyncClient, fake: FakeOpenAI, funnel: CompiledFunnel, url: str,
        sql: Any, observer: FakeOpenAI) -> None:
    """50 objections of 200 characters, a 5,000-character SKU, 100 turns with the model
    down: the next turn still calls the model, within the stage's budget; all along, the
    observer folds the messages into an observation list that stays within its own."""
    session = "m-budget"
    fake.reply(env("Hello!", updates={"pet": {"type": "dog"}}))
    assert (await say(client, session, "Hi, a dog")).status_code == 200
    for i in range(50):
        fake.reply(env("I hear you.", actions=[{"type": "record_objection",
                                                "objection": f"{i} " + "too pricey " * 18}]))
        response = await say(client, session, f"Objection {i}: " + "it costs too much " * 10)
        assert response.status_code == 200 and response.json()["reply"] == "I hear you."
    fake.reply(env("ok", actions=[{"type": "add_to_cart", "sku": "S" * 5000}]))
    assert (await say(client, session, "Add that one")).status_code == 200
    for _ in range(100):
        fake.fail(500)
        response = await say(client, session, "Hello?")
        assert response.status_code == 200 and response.json()["reply"]
    row = row_of(url, session)
    assert len(row["objections_raised"]) == 50  # the row keeps everything
    assert check_row(funnel, row) == []
    calls = fake.calls
    fake.reply(env("I am back."))
    response = await say(client, session, "Are you there?")
    assert response.json()["reply"] == "I am back." and fake.calls == calls + 1
    budget = funnel.stage(row["stage"]).spec.memory.prompt_budget
    assert budget is not None
    sent = fake.requests[-1]["messages"]
    assert estimate_tokens(sent) <= budget
    # The observation list was folded all along, and kept within its budget.
    block = row["conversation_summary"]
    assert observer.calls > 10 and "The customer wrote again." in block
    assert text_tokens(block) <= funnel.spec.memory.observation_budget
    assert sql("SELECT count(*), count(*) FILTER (WHERE fallback) FROM funnel_turns "
               "WHERE session_id = %s", (session,)) == [(153, 100)]


@pytest.mark.parametrize(("name", "request_", "status"), CUSTOMER_INPUTS,
                         ids=[c[0] for c in CUSTOMER_INPUTS])
async def test_hostile_customer_input_gets_a_reply_or_a_clear_refusal(
        name: str, request_: dict[str, Any], status: int, client: httpx.AsyncClient,
        fake: FakeOpenAI, sql: Any) -> None:
    session = request_.get("session", f"c-{name}")
    path = f"{BASE}/sessions/{session}/messages"
    calls = fake.calls
    called = status == 200 and name not in NOT_CALLED
    if called:
        fake.reply(env("Thanks!"))
    if "raw" in request_:
        response = await client.post(path, content=request_["raw"],
                                     headers={**HEADERS, "Content-Type": "application/json"})
    else:
        response = await client.post(path, json=request_["json"], headers=HEADERS)
    tried["customer"] += 1

    assert response.status_code == status, response.text
    body = response.json()
    if status == 200:
        assert body["reply"] == "Thanks!" if called else body["reply"] in dict(TOO_LONG.texts).values()
    else:
        assert body["error"] in ("bad_request", "too_large") and body["message"]
        assert sql("SELECT count(*) FROM funnel_messages WHERE session_id LIKE %s",
                   (f"c-{name}%",)) == [(0,)]  # refused: nothing was accepted
    assert fake.calls == calls + called and fake.pending == 0


async def test_the_invariants_hold_after_the_whole_corpus(funnel: CompiledFunnel, url: str,
                                                          client: httpx.AsyncClient) -> None:
    violations = await check_funnel(funnel, url)
    assert [str(v) for v in violations if v.severity == "error"] == []
    assert tried["model"] == len(MODEL_OUTPUTS) >= 60
    assert tried["customer"] == len(CUSTOMER_INPUTS)


def test_the_corpus_is_large_enough() -> None:
    assert len(MODEL_OUTPUTS) >= 60 and len({c[0] for c in MODEL_OUTPUTS}) == len(MODEL_OUTPUTS)
    assert sum(invalid for *_, invalid in MODEL_OUTPUTS) >= 40


