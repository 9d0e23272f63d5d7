"""The knowledge base: chunking, full-text retrieval on a real PostgreSQL, budgets,
citations in the turn record, and `funnel knowledge`."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import PURAMUR, run_funnel

from engine import knowledge
from engine.errors import ConfigError
from engine.format.spec import KnowledgeSpec, StageKnowledge
from engine.funnel.compiled import CompiledFunnel
from engine.knowledge.chunks import chunk_folder, chunk_text, markdown_files
from engine.llm.models import ScriptedModel
from engine.scenarios.run import prompt_messages
from engine.store import Store, open_store
from engine.turn.engine import Engine

SPHYNX_DRY = "cats#sphynx-dry-skin"


# -- chunking ----------------------------------------------------------------------------
def test_chunks_follow_headings_with_stable_ids() -> None:
    text = "# Cats\n\nIntro.\n\n## Sphynx\n\nHairless.\n\n### Dry skin\n\nMoisturise.\n"
    chunks = chunk_text(text, "cats.md", 200)
    assert [(c.id, c.title, c.body) for c in chunks] == [
        ("cats#cats", "Cats", "Intro."),
        ("cats#sphynx", "Cats > Sphynx", "Hairless."),
        ("cats#dry-skin", "Cats > Sphynx > Dry skin", "Moisturise."),
    ]
    assert chunk_text(text, "cats.md", 200) == chunks


def test_a_long_section_is_cut_within_the_token_cap() -> None:
    paragraphs = "\n\n".join(f"Paragraph {i} " + "word " * 30 for i in range(20))
    chunks = chunk_text(f"# Long\n\n{paragraphs}\n\n# Huge\n\n" + "x" * 5000, "a.md", 60)
    assert len(chunks) > 10 and all(c.tokens <= 60 + 5 for c in chunks)  # + the title
    assert len({c.id for c in chunks}) == len(chunks)


def test_a_link_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "knowledge"
    folder.mkdir()
    (tmp_path / "secret.md").write_text("# Secret\n\nno\n")
    os.symlink(tmp_path / "secret.md", folder / "link.md")
    with pytest.raises(ConfigError, match="outside the folder"):
        markdown_files(folder)


def test_a_file_that_is_not_utf8_names_itself(tmp_path: Path) -> None:
    (tmp_path / "bad.md").write_bytes(b"# T\n\n\xff\xfe")
    with pytest.raises(ConfigError, match=r"bad\.md is not UTF-8"):
        chunk_folder(tmp_path, 200)


def test_the_budget_and_top_k_are_respected() -> None:
    chunks = chunk_text("# A\n\n" + "a " * 200 + "\n# B\n\nb\n# C\n\nc\n# D\n\nd\n", "x.md", 500)
    found = [(c, 1.0) for c in chunks]
    assert [c.id for c in knowledge.fit(found, 3, 50)] == ["x#b", "x#c", "x#d"]  # A is too big
    assert [c.id for c in knowledge.fit(found, 2, 50)] == ["x#b", "x#c"]
    assert knowledge.fit(found, 3, 0) == []


def test_facts_are_read_at_dotted_paths() -> None:
    state = {"pet": {"breed": "Sphynx", "problems": ["dry_skin", "odor"]}, "x": 1}
    assert knowledge.facts_text(state, ["pet.breed", "pet.problems", "pet.missing", "x"]) \
        == "Sphynx dry skin odor"


# -- retrieval on PostgreSQL -------------------------------------------------------------
@pytest.fixture
async def indexed(store: Store, puramur: CompiledFunnel) -> AsyncIterator[Store]:
    await store.ensure_schema(puramur.spec)
    done = await knowledge.reindex(store, puramur.spec)
    assert done is not None and done[0] > 15 and done[1] == "english"
    yield store


async def test_the_right_chunk_for_a_sphynx_with_dry_skin(indexed: Store) -> None:
    found = await indexed.knowledge_search("puramur", "my Sphynx has dry skin", 3)
    assert SPHYNX_DRY in [c.id for c, _ in found]
    assert found[0][0].id == SPHYNX_DRY


async def test_facts_find_chunks_for_a_message_in_another_language(
        indexed: Store, puramur: CompiledFunnel) -> None:
    want = StageKnowledge(top_k=3, budget=300, facts=("pet.breed", "pet.problems"))
    state = {"pet": {"breed": "Sphynx", "problems": ["dry_skin"]}}
    got = await knowledge.retrieve(indexed, puramur.spec, want, "Що порадите?", state)
    assert SPHYNX_DRY in got.ids
    assert sum(len(c["text"]) for c in got.chunks) > 0


async def test_retrieval_keeps_to_the_stage_budget(indexed: Store,
                                                   puramur: CompiledFunnel) -> None:
    for budget in (60, 120, 300):
        want = StageKnowledge(top_k=5, budget=budget)
        got = await knowledge.retrieve(indexed, puramur.spec, want,
                                       "dry skin shedding tangles odor dandruff coat", {})
        found = await indexed.knowledge_search("puramur", "x", 1)  # the store still answers
        assert found is not None
        tokens = [c.tokens for c, _ in await indexed.knowledge_search(
            "puramur", "dry skin shedding tangles odor dandruff coat", 50) if c.id in got.ids]
        assert got.ids and sum(tokens) <= budget and len(got.ids) <= 5


@pytest.mark.parametrize("query", ["'; DROP TABLE funnel_knowledge; --", "a & | ! :* <-> ()",
                                   "", "   ", "\\", "the and of", "x" * 5000])
async def test_hostile_or_empty_queries_find_nothing_or_something(indexed: Store,
                                                                   query: str) -> None:
    found = await indexed.knowledge_search("puramur", query, 5)
    assert isinstance(found, list) and len(found) <= 5
    assert (await indexed.knowledge_search("puramur", "Sphynx", 1))  # the table is intact


async def test_reindex_is_skipped_when_nothing_changed(store: Store, puramur: CompiledFunnel,
                                                       tmp_path: Path) -> None:
    await store.ensure_schema(puramur.spec)
    (tmp_path / "a.md").write_text("# Parrots\n\nFeathers need misting.\n")
    spec = dataclasses.replace(puramur.spec, knowledge=KnowledgeSpec(tmp_path, 200, "en"))
    assert await knowledge.reindex(store, spec, force=False) == (1, "english")
    assert await knowledge.reindex(store, spec, force=False) is None
    (tmp_path / "a.md").write_text("# Parrots\n\nFeathers need misting.\n\n# Fish\n\nWater.\n")
    await knowledge.ensure_index(store, spec)
    assert [c.id for c, _ in await store.knowledge_search("puramur", "fish", 5)] == ["a#fish"]


# -- through the engine ------------------------------------------------------------------
SHOW = {"reply": "For dry Sphynx skin: Exotic Spa shampoo and lotion.",
        "actions": [{"type": "present_products", "skus": ["PR251010"]}]}


@pytest.fixture
async def engine(db_url: str, puramur: CompiledFunnel) -> AsyncIterator[Engine]:
    model = ScriptedModel.from_data({"turns": [
        {"reply": "Hello! Is your pet a cat or a dog?"},
        {"reply": "Sphynx skin needs gentle care. Shall I recommend something?",
         "updates": {"pet": {"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"]}}},
        SHOW]})
    calls: list[Any] = []
    complete = model.complete

    async def spy(request: Any) -> Any:
        calls.append(request)
        return await complete(request)

    model.complete = spy  # type: ignore[method-assign]
    e = await Engine.open(puramur, db=db_url, model=model)
    e.calls = calls  # type: ignore[attr-defined]
    yield e
    await e.close()


def _prompt(request: Any) -> str:
    """The prompt without the conversation: static prefix, summary, parts, notices."""
    return "\n".join(m["content"] for m in prompt_messages(request.messages))


async def test_the_presentation_prompt_gets_and_cites_the_chunks(engine: Engine, sql: Any
                                                                 ) -> None:
    await engine.handle("s1", "Hi!")
    second = await engine.handle("s1", "I have a Sphynx cat, her skin is very dry")
    assert second.stage_after == "presentation"
    third = await engine.handle("s1", "What would you recommend?")
    assert not third.fallback
    calls = engine.calls  # type: ignore[attr-defined]
    # the chunks depend on the message: in the turn part, after the static prefix
    discovery_prompt, presentation_prompt = (_prompt(calls[1]), _prompt(calls[2]))
    assert f"[{SPHYNX_DRY}]" not in calls[2].messages[0]["content"]
    assert "Care notes" not in discovery_prompt  # no knowledge -> no section
    assert f"[{SPHYNX_DRY}]" in presentation_prompt
    cited = [r[0] for r in sql("SELECT knowledge FROM funnel_turns ORDER BY id")]
    assert cited[0] == [] and cited[1] == []
    assert SPHYNX_DRY in cited[2] and len(cited[2]) <= 2


async def test_a_funnel_without_knowledge_has_no_section(db_url: str, sql: Any,
                                                         puramur: CompiledFunnel) -> None:
    stages = {n: dataclasses.replace(s, knowledge=None) for n, s in puramur.spec.stages.items()}
    bare = CompiledFunnel(dataclasses.replace(puramur.spec, knowledge=None, stages=stages))
    prompts: list[str] = []
    model = ScriptedModel.from_data({"turns": [
        {"reply": "Hello!"}, {"reply": "Lovely.", "updates": {"pet": {
            "type": "cat", "breed": "Sphynx", "problems": ["dry_skin"]}}}, SHOW]})
    complete = model.complete

    async def spy(request: Any) -> Any:
        prompts.append(_prompt(request))
        return await complete(request)

    model.complete = spy  # type: ignore[method-assign]
    async with await Engine.open(bare, db=db_url, model=model) as e:
        for text in ("Hi!", "A Sphynx cat with dry skin", "What would you recommend?"):
            result = await e.handle("s1", text)
        assert result.stage_before == "presentation"
        assert await e.store.knowledge_digest("puramur") is None  # nothing indexed
    assert "Care notes" not in prompts[-1] and "Exotic Spa" in prompts[-1]
    assert [r[0] for r in sql("SELECT knowledge FROM funnel_turns")] == [[], [], []]


# -- the command ---------------------------------------------------------------------------
def test_funnel_knowledge_reindex_and_search(db_url: str) -> None:
    out = run_funnel("knowledge", str(PURAMUR), "reindex", "--db", db_url)
    assert out.returncode == 0 and "chunk(s)" in out.stdout and "english" in out.stdout
    out = run_funnel("knowledge", str(PURAMUR), "search", "my Sphynx has dry skin",
                     "--stage", "presentation", "--db", db_url)
    assert out.returncode == 0 and SPHYNX_DRY in out.stdout.splitlines()[0]
    out = run_funnel("knowledge", str(PURAMUR), "search", "zzzqqq", "--db", db_url)
    assert out.returncode == 1 and "no chunk matches" in out.stdout
    out = run_funnel("knowledge", str(PURAMUR), "search", "--db", db_url)
    assert out.returncode == 1 and "needs a QUERY" in out.stderr


async def test_concurrent_reindexes_do_not_collide(db_url: str, puramur: CompiledFunnel) -> None:
    # Service workers start together and each finds the folder changed.
    stores = [await open_store(db_url) for _ in range(3)]
    try:
        await stores[0].ensure_schema(puramur.spec)
        done = await asyncio.gather(*(knowledge.reindex(s, puramur.spec) for s in stores))
        assert all(d is not None and d[0] == done[0][0] for d in done)  # type: ignore[index]
        found = await stores[0].knowledge_search("puramur", "Sphynx dry skin", 50)
        assert len({c.id for c, _ in found}) == len(found)  # no duplicates
    finally:
        for s in stores:
            await s.close()
