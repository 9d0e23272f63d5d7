"""Semantic recall (seed 002, tier 4): the session's earlier messages like the current one.

Real parts: the funnel's model is ``openai/fake-model`` and the embedder
``openai/fake-embed``, both through litellm's HTTP path, to loopback fakes
(tests/fake_openai.py; tests/fake_embeddings.py answers a hashed bag of words, so
that messages sharing words are similar). pgvector comes from the embedded server
(the ``vector_url`` fixture), which runs in CI too; the ``real[]`` fallback runs on
the test server with pgvector hidden from the engine.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from conftest import puramur_data, sql_runner
from fake_embeddings import DIMS, FakeEmbeddings, vector
from test_litellm_path import close_litellm_clients  # noqa: F401  (autouse)

from engine import Engine
from engine.errors import FunnelInvalid
from engine.format.spec import RecallSettings
from engine.funnel.compiled import load_funnel
from engine.memory.recall import snippets
from engine.memory.summary import ExtractiveSummarizer
from engine.records.messages import Message
from engine.store import recall as recall_sql
from engine.store.base import Match
from engine.turn.budget import RECALL_HEADING, Parts, fit
from engine.validation import check_file

MODEL = "openai/fake-model"
EMBEDDER = "openai/fake-embed"
FACT = "My dog Biscuit is allergic to chicken, so no chicken in his food."
ASK = "Remember what my dog is allergic to? Is that in the food you suggest?"


def filler(i: int) -> str:
    return f"Question {i}: which shampoo suits a long coat in winter, and how often?"


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-dummy")


@pytest.fixture
def fake_embed() -> Iterator[FakeEmbeddings]:
    with FakeEmbeddings() as server:
        yield server


def funnel_file(tmp_path: Path, embed: FakeEmbeddings | None, **recall: Any) -> Path:
    """Puramur (window 4) with recall on at the fake embedder, or off without one."""
    data = puramur_data()
    data["model"].update(retries=0, timeout=5)
    if embed is not None:
        data["memory"]["recall"] = {"embedder": EMBEDDER, "api_base": embed.api_base,
                                    "top_k": 2, **recall}
    path = tmp_path / "puramur_recall.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    return path


def answer(body: dict[str, Any]) -> str:
    return json.dumps({"reply": "Noted, thanks!"})


def data_messages(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body["messages"]
            if m["role"] == "user" and str(m["content"]).startswith("<data>")]


def recall_block(body: dict[str, Any]) -> str:
    """The recalled part of the turn's data message ('' when none)."""
    for text in data_messages(body):
        if RECALL_HEADING in text:
            return text.split(RECALL_HEADING, 1)[1]
    return ""


async def converse(engine: Engine, session: str, messages: list[str]) -> list[Any]:
    out = []
    for text in messages:
        out.append(await engine.handle(session, text))
        await engine.drain()  # the embedding job after each reply, as a quiet service would
    return out


async def open_engine(path: Path, url: str, fake_llm: Any) -> Engine:
    fake_llm.respond_with(answer)
    return await Engine.open(path, db=url, model=MODEL, api_base=fake_llm.api_base,
                             summarizer=ExtractiveSummarizer())


CONVERSATION = [FACT, *(filler(i) for i in range(1, 11)), ASK]  # the fact: 22 messages back


# -- the proof, on pgvector ------------------------------------------------------------

async def test_a_fact_twenty_messages_back_reaches_the_prompt_through_pgvector(
        tmp_path: Path, vector_url: str, fake_llm: Any, fake_embed: FakeEmbeddings) -> None:
    engine = await open_engine(funnel_file(tmp_path, fake_embed), vector_url, fake_llm)
    async with engine:
        assert engine.recall is not None and engine.recall.vectors is not None
        assert engine.recall.vectors.mode == "pgvector"
        results = await converse(engine, "s-1", CONVERSATION)
    last = fake_llm.requests[-1]
    block = recall_block(last)
    assert "Customer: " + FACT in block
    # Outside the window: the chat's own messages do not hold it, the data message does.
    chat = [m["content"] for m in last["messages"] if not str(m["content"]).startswith("<")]
    assert not any("Biscuit" in str(c) for c in chat)
    with sql_runner(vector_url) as run:
        fact_id = run("SELECT id FROM funnel_messages WHERE content = %s", (FACT,))[0][0]
        kind = run("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
                   "attrelid = 'funnel_embeddings'::regclass AND attname = 'embedding'")[0][0]
        stored = run("SELECT count(*) FROM funnel_embeddings WHERE session_id = 's-1'")[0][0]
    assert fact_id in results[-1].recalled
    assert kind.endswith("vector")  # public.vector: the tests create it in public
    assert stored == 2 * len(CONVERSATION)  # every message and reply, embedded after the turn
    # The customer's message was embedded once: for the query, and that vector was stored.
    assert fake_embed.texts.count(ASK) == 1
    # The earlier turns' prompts held no recall block with the fact while it was in sight.
    assert FACT not in recall_block(fake_llm.requests[1])


async def test_recall_off_sends_no_embedding_and_no_recall_block(
        tmp_path: Path, vector_url: str, fake_llm: Any, fake_embed: FakeEmbeddings) -> None:
    engine = await open_engine(funnel_file(tmp_path, None), vector_url, fake_llm)
    async with engine:
        assert engine.recall is None
        results = await converse(engine, "s-off", CONVERSATION)
    assert fake_embed.requests == []
    assert all(recall_block(body) == "" for body in fake_llm.requests)
    assert not any("Biscuit" in json.dumps(body) for body in fake_llm.requests[-1:])
    assert results[-1].recalled == []
    with sql_runner(vector_url) as run:
        assert run("SELECT count(*) FROM funnel_embeddings")[0][0] == 0


async def test_recall_never_crosses_sessions(
        tmp_path: Path, vector_url: str, fake_llm: Any, fake_embed: FakeEmbeddings) -> None:
    engine = await open_engine(funnel_file(tmp_path, fake_embed), vector_url, fake_llm)
    other = "My dog Pepper is allergic to salmon, and my dog hates baths."
    async with engine:
        await converse(engine, "a", CONVERSATION[:-1])
        await converse(engine, "b", [other, *(filler(i) for i in range(1, 11))])
        await converse(engine, "a", [ASK])
        a_block = recall_block(fake_llm.requests[-1])
        await converse(engine, "b", [ASK])
        b_block = recall_block(fake_llm.requests[-1])
    assert "Biscuit" in a_block and "Pepper" not in a_block
    assert "Pepper" in b_block and "Biscuit" not in b_block


async def test_embeddings_go_with_the_session_anonymized_or_purged(
        tmp_path: Path, vector_url: str, fake_llm: Any, fake_embed: FakeEmbeddings) -> None:
    engine = await open_engine(funnel_file(tmp_path, fake_embed), vector_url, fake_llm)
    count = "SELECT count(*) FROM funnel_embeddings WHERE session_id = %s"
    async with engine:
        await converse(engine, "anon", CONVERSATION[:3])
        await converse(engine, "gone", CONVERSATION[:3])
        with sql_runner(vector_url) as run:
            assert run(count, ("anon",))[0][0] == 6 and run(count, ("gone",))[0][0] == 6
            run("UPDATE puramur_sessions_state SET last_message_at = NOW() - INTERVAL '2 days'")
            done = await engine.store.purge(engine.spec, 86400, anonymize=True)
            assert done["sessions"] == 2
            assert run(count, ("anon",))[0][0] == 0 and run(count, ("gone",))[0][0] == 0
            # Anonymized messages are never embedded again.
            await converse(engine, "anon", ["Hello again"])
            assert fake_embed.texts.count("[anonymized]") == 0
            assert run(count, ("anon",))[0][0] == 2
            run("UPDATE puramur_sessions_state SET last_message_at = NOW() - INTERVAL '2 days'")
            await engine.store.purge(engine.spec, 86400)
            assert run("SELECT count(*) FROM funnel_embeddings")[0][0] == 0


async def test_a_slow_or_failing_embedder_never_fails_a_turn_and_is_caught_up(
        tmp_path: Path, vector_url: str, fake_llm: Any, fake_embed: FakeEmbeddings) -> None:
    engine = await open_engine(funnel_file(tmp_path, fake_embed, deadline=0.3), vector_url,
                               fake_llm)
    async with engine:
        await converse(engine, "s", CONVERSATION[:-1])
        fake_embed.sleep(3)  # past the recall's deadline: the turn goes on without it
        slow = await engine.handle("s", ASK)
        fake_embed.sleep(0)
        assert slow.reply == "Noted, thanks!" and not slow.fallback
        assert slow.recalled == [] and recall_block(fake_llm.requests[-1]) == ""
        await engine.drain()
        fake_embed.fail(10)  # down: the turn and its job fail quietly
        down = await engine.handle("s", "And what about shampoo for his allergy?")
        await engine.drain()
        assert down.reply == "Noted, thanks!" and not down.fallback and down.recalled == []
        fake_embed.fail(0)
        back = await converse(engine, "s", [ASK])
    assert "Biscuit" in recall_block(fake_llm.requests[-1])
    with sql_runner(vector_url) as run:
        missing = run("SELECT count(*) FROM funnel_messages m WHERE session_id = 's' AND NOT "
                      "EXISTS (SELECT 1 FROM funnel_embeddings e WHERE e.message_id = m.id)")
    assert missing[0][0] == 0  # the next jobs embedded what the slow and failed ones missed
    assert back[0].recalled


def _each(value: Any) -> Any:
    """A ``serve`` answer: ``value(i, text)`` as each text's embedding."""
    return lambda texts: [{"object": "embedding", "index": i, "embedding": value(i, t)}
                          for i, t in enumerate(texts)]


BAD_ANSWERS: dict[str, Any] = {
    "strings": _each(lambda i, t: [str(x) for x in vector(t)]),
    "nan": _each(lambda i, t: [math.nan, *vector(t)[1:]]),
    "infinite": _each(lambda i, t: [math.inf, *vector(t)[1:]]),
    "wrong dimension": _each(lambda i, t: [*vector(t), 1.0]),
    "200,000 values": _each(lambda i, t: [1.0] * 200_000),
    "all zeros": _each(lambda i, t: [0.0] * DIMS),
    "not a list": _each(lambda i, t: {"values": vector(t)}),
    "a string": _each(lambda i, t: "AAAAAAAAAAAA"),
    "data not a list": lambda texts: {"embedding": vector(texts[0])},
    "too few vectors": lambda texts: [],
}


@pytest.mark.parametrize("bad", list(BAD_ANSWERS))
async def test_an_embedder_answering_no_usable_vectors_never_fails_a_turn(
        bad: str, tmp_path: Path, db_url: str, fake_llm: Any, fake_embed: FakeEmbeddings,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Strings, NaN, infinities, the wrong dimension, 200,000 values, a non-list: the turn
    answers as without recall, a warning says why, and nothing of it is stored."""
    async def no_pgvector(conn: Any) -> tuple[str | None, bool]:
        return None, False  # real[] stores anything: the engine must not hand it over

    monkeypatch.setattr(recall_sql, "support", no_pgvector)
    engine = await open_engine(funnel_file(tmp_path, fake_embed), db_url, fake_llm)
    async with engine:
        await converse(engine, "s", [FACT])  # good vectors first: the model's dimension
        fake_embed.serve(BAD_ANSWERS[bad])
        with caplog.at_level(logging.WARNING, "funnel.memory"):
            result = await engine.handle("s", ASK)
            await engine.drain()  # the job that embeds the turn's messages
        fake_embed.serve(None)
    assert result.reply == "Noted, thanks!" and not result.fallback and result.error is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # Said by the engine's check ("answered no usable vectors: ..."), or for a few (strings,
    # a non-list) by litellm first, whose pydantic warning the tests make an error.
    assert any("recall goes without this turn's query: embedder 'openai/fake-embed'" in w
               for w in warnings), warnings
    assert any("not embedded yet" in w for w in warnings), warnings
    with sql_runner(db_url) as run:
        rows = run("SELECT cardinality(embedding), embedding FROM funnel_embeddings")
    assert len(rows) == 2  # the first turn's two messages; nothing of the bad answers
    for dims, values in rows:
        assert dims == DIMS and all(math.isfinite(x) for x in values)


def test_vectors_are_checked_at_one_place() -> None:
    from engine.boundary.sanitize import Rejected
    from engine.boundary.vectors import MAX_DIMS, unit_vectors

    assert unit_vectors([[3, 4.0]], 1) == [[0.6, 0.8]]
    for answer, count, dims, why in [
        ("abc", 1, None, "a string"), ([[1.0]], 2, None, "1 vector(s) for 2 text(s)"),
        ([["1"]], 1, None, "not a number"), ([[True]], 1, None, "not a number"),
        ([[math.nan]], 1, None, "nan"), ([[-math.inf]], 1, None, "-inf"),
        ([[10**400]], 1, None, "too large"), ([[1.0, 2.0]], 1, 3, "this model's vectors"),
        ([[1.0], [1.0, 2.0]], 2, None, "this model's vectors"),
        ([[1.0] * (MAX_DIMS + 1)], 1, None, "more than the 8,192"),
        ([[0.0, 0.0]], 1, None, "all zeros"), ([[]], 1, None, "empty"),
        ([None], 1, None, "null"),
    ]:
        with pytest.raises(Rejected, match=re.escape(why)):
            unit_vectors(answer, count, dims)


# -- without pgvector: the real[] fallback, on the test server -------------------------

async def test_without_pgvector_the_fallback_recalls_and_the_start_says_so(
        tmp_path: Path, db_url: str, fake_llm: Any, fake_embed: FakeEmbeddings,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    async def no_pgvector(conn: Any) -> tuple[str | None, bool]:
        return None, False  # what the CI server (PostgreSQL 15, no pgvector) answers

    monkeypatch.setattr(recall_sql, "support", no_pgvector)
    with caplog.at_level(logging.WARNING, "funnel.memory"):
        engine = await open_engine(funnel_file(tmp_path, fake_embed), db_url, fake_llm)
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "no pgvector" in warning and "CREATE EXTENSION vector" in warning
    assert "remove memory.recall" in warning
    async with engine:
        assert engine.recall is not None and engine.recall.vectors is not None
        assert engine.recall.vectors.mode == "array"
        results = await converse(engine, "s", CONVERSATION)
    assert "Customer: " + FACT in recall_block(fake_llm.requests[-1])
    assert results[-1].recalled
    with sql_runner(db_url) as run:
        kind = run("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
                   "attrelid = 'funnel_embeddings'::regclass AND attname = 'embedding'")[0][0]
    assert kind == "real[]"


async def test_the_real_server_without_pgvector_is_detected(db_url: str) -> None:
    """Whatever the test server is, ``support`` says what it has, and ``prepare`` agrees."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        schema, available = await recall_sql.support(conn)
        has = await (await conn.execute(
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'")).fetchone()
        assert available == bool(has and has[0])
        if not available:
            found = await recall_sql.prepare(conn)
            assert found.mode == "array" and "no pgvector" in found.missing


# -- the parts -------------------------------------------------------------------------

def test_stretches_around_matches_are_merged_deduplicated_and_within_budget() -> None:
    settings = RecallSettings(embedder=EMBEDDER, top_k=3, before=2, after=1, budget=400)
    rows = [  # hits at n=5 (0.9) and n=7 (0.6): their stretches 3-6 and 5-8 overlap
        *(Match(100 + n, "user" if n % 2 else "assistant", f"m{n}", n, 5, 0.9)
          for n in (3, 4, 5, 6)),
        *(Match(100 + n, "user" if n % 2 else "assistant", f"m{n}", n, 7, 0.6)
          for n in (5, 6, 7, 8)),
        Match(120, "user", "far", 20, 20, 0.4), Match(121, "assistant", "reply", 21, 20, 0.4),
    ]
    found = snippets(rows, settings)
    assert [s.ids for s in found] == [(103, 104, 105, 106, 107, 108), (120, 121)]
    assert found[0].similarity == 0.9 and found[0].text.splitlines()[0] == "Customer: m3"
    assert found[1].text == "Customer: far\nYou: reply"
    tight = snippets(rows, RecallSettings(embedder=EMBEDDER, budget=found[0].tokens))
    assert [s.ids for s in tight] == [found[0].ids]


def test_the_budget_cuts_recall_before_the_window() -> None:
    history = [Message("user" if i % 2 else "assistant", f"window message {i} " * 5, i)
               for i in range(1, 5)]
    recall = [(1, "Customer: " + "recalled best " * 20), (9, "Customer: " + "second " * 20)]

    def render(level: int) -> Parts:
        return Parts("You are a shop assistant.")

    full = fit("s", render, "", [], history, "hi", None, recall=recall)
    assert full.recalled == 2 and RECALL_HEADING in json.dumps(full.messages)
    tight = fit("s", render, "", [], history, "hi", full.tokens - 10, recall=recall)
    assert tight.recalled == 1 and tight.dropped_messages == 0  # the least similar went
    text = json.dumps(tight.messages)
    assert "recalled best" in text and "second" not in text
    tighter = fit("s", render, "", [], history, "hi", full.tokens - 60, recall=recall)
    assert tighter.recalled == 0 and tighter.dropped_messages == 0
    assert RECALL_HEADING not in json.dumps(tighter.messages)


def test_the_schema_takes_recall_at_the_funnel_level_only(tmp_path: Path) -> None:
    data = puramur_data()
    data["memory"]["recall"] = {"embedder": EMBEDDER, "top_k": 3}
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    spec = load_funnel(good).spec
    assert spec.memory.recall == RecallSettings(embedder=EMBEDDER, top_k=3)
    assert load_funnel(puramur_copy(tmp_path, {})).spec.memory.recall is None
    data["memory"]["recall"] = {"top_k": 3}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    problems = [d for d in check_file(bad)[1] if d.severity == "error"]
    assert any("embedder" in d.message for d in problems)
    with pytest.raises(FunnelInvalid):
        load_funnel(bad)
    data["memory"].pop("recall")
    data["stages"]["greeting"]["memory"] = {"recall": {"embedder": EMBEDDER}}
    staged = tmp_path / "staged.yaml"
    staged.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    assert any("recall" in d.message for d in check_file(staged)[1] if d.severity == "error")


def puramur_copy(tmp_path: Path, memory: dict[str, Any]) -> Path:
    data = puramur_data()
    data["memory"].update(memory)
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    return path


def test_validate_warns_of_a_recall_deadline_or_budget_the_stages_cannot_afford(
        tmp_path: Path) -> None:
    data = puramur_data()
    data["memory"]["recall"] = {"embedder": EMBEDDER}
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    assert not [d for d in check_file(path)[1] if d.code in ("F212", "F213")]
    data["memory"]["recall"] = {"embedder": EMBEDDER, "deadline": 25,
                                "budget": data["memory"]["prompt_budget"]}
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    found = {d.code: d for d in check_file(path)[1] if d.code in ("F212", "F213")}
    assert set(found) == {"F212", "F213"}
    assert found["F212"].severity == "warning" and "model.deadline" in found["F212"].message
    assert found["F213"].line > 0 and "prompt_budget" in found["F213"].message
