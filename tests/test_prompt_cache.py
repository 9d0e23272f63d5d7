"""The cache-friendly prompt layout and providers' prompt caches.

The static prefix (the template outside ``{% block turn %}``) is the first
system message and the same text on every turn of a stage; the summary, the
turn part, the notices and the window follow. Anthropic gets that prefix marked
``cache_control``, and the last window message (the end of what the next turn
repeats); the cached prompt tokens a provider reports (Anthropic's
``cache_read_input_tokens``, OpenAI's ``prompt_tokens_details.cached_tokens``)
and the tokens written to the cache (``cache_creation_input_tokens``) reach the
turn record and ``funnel report``. Against the recording fake servers of tests/fake_providers.py.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PURAMUR, puramur_data
from fake_providers import FakeProvider
from test_litellm_path import close_litellm_clients, loopback_only  # noqa: F401
from test_providers import SESSION, fresh_strategies, happy_turns, keys, open_engine  # noqa: F401

from engine.errors import ConfigError, FunnelInvalid
from engine.funnel.compiled import load_funnel
from engine.memory.summary import ExtractiveSummarizer
from engine.records.messages import Message
from engine.turn.budget import Parts, assemble, fit
from engine.turn.prompts import render_parts

BASE = Path(__file__).resolve().parent / "corpus" / "_base"


def _texts(blocks: Any) -> list[str]:
    return [b["text"] for b in blocks] if isinstance(blocks, list) else [blocks]


def _marked(value: Any) -> list[Any]:
    """Every ``cache_control`` anywhere in ``value``."""
    if isinstance(value, dict):
        found = [value["cache_control"]] if "cache_control" in value else []
        return found + [m for v in value.values() for m in _marked(v)]
    if isinstance(value, list):
        return [m for v in value for m in _marked(v)]
    return []


# -- the layout -------------------------------------------------------------------------


def _funnel_with(tmp_path: Path, greeting: str) -> Any:
    for name in ("prompts", "schemas"):
        shutil.copytree(BASE / name, tmp_path / name)
    text = (BASE / "funnel.yaml").read_text("utf-8")
    (tmp_path / "funnel.yaml").write_text(
        text.replace("prompts: ../_base/prompts", "prompts: prompts")
        .replace("schemas: ../_base/schemas", "schemas: schemas"), "utf-8")
    (tmp_path / "prompts" / "greeting.j2").write_text(greeting, "utf-8")
    return load_funnel(tmp_path / "funnel.yaml").stage("greeting")


def test_the_turn_block_is_rendered_apart_from_the_static_part(tmp_path: Path) -> None:
    stage = _funnel_with(tmp_path, 'Greet the customer. Stage: {{ stage }}.\n'
                         '{% block turn %}Facts: {{ state_json }}{% endblock %}\n'
                         'Answer with JSON: {"reply": "..."}\n')
    context = {"stage": "greeting", "state_json": '{"name":"Ann"}', "funnel": "f",
               "stage_description": "", "catalog": [], "currency": "", "thresholds": {}}
    static, state, turn = render_parts(stage, context)
    assert static == 'Greet the customer. Stage: greeting.\nAnswer with JSON: {"reply": "..."}'
    assert (state, turn) == ("", 'Facts: {"name":"Ann"}')


def test_the_state_block_is_rendered_apart_from_the_turn_block(tmp_path: Path) -> None:
    # A state block nested in the turn block renders once, in its own part.
    stage = _funnel_with(tmp_path, 'Greet the customer.\nAnswer with JSON.\n'
                         '{% block turn %}Round {{ stage_iteration }}.\n'
                         '{% block state %}Facts: {{ state_json }}{% endblock %}'
                         '{% endblock %}\n')
    context = {"stage": "greeting", "state_json": '{"name":"Ann"}', "funnel": "f",
               "stage_description": "", "catalog": [], "currency": "", "thresholds": {},
               "stage_iteration": 2}
    parts = render_parts(stage, context)
    assert parts == ("Greet the customer.\nAnswer with JSON.", 'Facts: {"name":"Ann"}',
                     "Round 2.")
    assert (parts.static, parts.state, parts.turn) == parts


def test_the_static_part_is_rendered_once_per_stage_and_catalog(tmp_path: Path) -> None:
    stage = _funnel_with(tmp_path, "Sell: {% for p in catalog %}{{ p.sku }} {% endfor %}\n"
                         "{% block turn %}Facts: {{ state_json }}{% endblock %}\n")
    catalog = [{"sku": "A1"}]
    base = {"stage": "greeting", "funnel": "f", "stage_description": "", "currency": "",
            "thresholds": {}, "catalog": catalog}
    first = render_parts(stage, {**base, "state_json": "{}"})
    second = render_parts(stage, {**base, "state_json": '{"name":"Ann"}'})
    assert first.static == second.static == "Sell: A1"
    assert second.turn == 'Facts: {"name":"Ann"}'
    assert len(stage.static_prompts) == 1  # the second turn reused the first's
    # Another funnel's catalog (a variant sharing the stage) gets its own static part.
    other = render_parts(stage, {**base, "catalog": [{"sku": "B2"}], "state_json": "{}"})
    assert other.static == "Sell: B2" and len(stage.static_prompts) == 2
    assert render_parts(stage, {**base, "state_json": "{}"}).static == "Sell: A1"


def test_the_chat_is_static_summary_state_window_turn_notices_message() -> None:
    history = [Message("user", "earlier"), Message("assistant", "answer")]
    chat = assemble(Parts("STATIC", "STATE", "TURN"), "summary", ["refused"], history, "now")
    assert [m["role"] for m in chat] == ["system", "user", "system", "user", "assistant",
                                         "system", "user", "user"]
    contents = [m["content"] for m in chat]
    assert contents[0].startswith("STATIC\n\n") and contents[1].startswith("<data>")
    assert contents[2:6] == ["STATE", "earlier", "answer", "TURN"]
    assert "refused" in contents[6] and contents[7] == "now"
    # Empty parts leave no empty messages.
    assert [m["content"] for m in assemble(Parts("S"), "", [], [], "m")][1:] == ["m"]


def test_the_budget_cuts_the_unobserved_messages_at_once_down_to_the_window() -> None:
    # Six messages at hand, the stage's window is two: the four older ones (not observed
    # yet) go together, so that the window's start does not move on every turn.
    history = [Message("user" if i % 2 == 0 else "assistant", f"m{i} " + "x" * 200, i)
               for i in range(6)]
    parts = Parts("RULES", "STATE", "TURN")
    full = fit("s", lambda level: parts, "", [], history, "hi", None, window=2)
    assert full.cut.window == 6
    fitted = fit("s", lambda level: parts, "", [], history, "hi", full.tokens - 10, window=2)
    assert fitted.cut.window == 2 and fitted.dropped_messages == 4
    assert [m["content"][:2] for m in fitted.messages if m["role"] != "system"] == \
        ["m4", "m5", "hi"]
    # Without a stage window (the extractive summary) one message goes at a time.
    assert fit("s", lambda level: parts, "", [], history, "hi",
               full.tokens - 10).cut.window == 5


def test_the_static_part_may_not_read_what_changes_every_turn(tmp_path: Path) -> None:
    bad = ('Greet the customer.\nFacts: {{ state_json }}\n'
           '{% block turn %}Stage: {{ stage }}{% endblock %}\n')
    with pytest.raises(FunnelInvalid) as invalid:  # funnel validate: F206
        _funnel_with(tmp_path, bad)
    [problem] = [d for d in invalid.value.diagnostics if d.code == "F206"]
    assert problem.line == 2 and "'state_json' changes from turn to turn" in problem.message
    # A template changed after validation fails the render, naming the file and line.
    template = tmp_path / "prompts" / "greeting.j2"
    template.write_text("Greet the customer.\n{% block turn %}{% endblock %}\n", "utf-8")
    stage = load_funnel(tmp_path / "funnel.yaml").stage("greeting")
    template.write_text(bad, "utf-8")
    environment = stage.template.environment
    environment.cache = None  # what a reload of the changed file sees
    stage = dataclasses.replace(stage, template=environment.get_template("greeting.j2"))
    with pytest.raises(ConfigError) as caught:
        render_parts(stage, {"stage": "greeting", "state_json": "{}"})
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'prompts' / 'greeting.j2'}:2: ")
    assert "'state_json' is undefined" in message and "{% block turn %}" in message
    assert "{% block state %}" in message


def test_a_template_without_the_block_is_one_static_part(tmp_path: Path) -> None:
    stage = _funnel_with(tmp_path, "Greet the customer. Facts: {{ state_json }}\n")
    assert render_parts(stage, {"state_json": "{}"}) == ("Greet the customer. Facts: {}", "",
                                                          "")


# -- Anthropic: cache_control on the static prefix and the last window message ----------


async def test_anthropic_gets_the_static_prefix_marked_and_reports_cached_tokens(
        db_url: str, sql: Any, keys: None) -> None:  # noqa: F811
    from engine.report import build_report, render_html, render_table

    turns_ = happy_turns(3)
    with FakeProvider("anthropic") as fake:
        engine = await open_engine(PURAMUR, db_url, "anthropic/claude-sonnet-4-5",
                                   fake.api_base)
        try:
            for i, (text, output) in enumerate(turns_):
                fake.reply(json.dumps(output), prompt_tokens=1500, completion_tokens=40,
                           cached_tokens=1200 if i else 0, written_tokens=100 if i else 1200)
                assert not (await engine.handle(SESSION, text)).fallback
        finally:
            await engine.close()
        bodies = fake.requests

    turns = [b for b in bodies if "Answer with one JSON object only" in b["system"][0]["text"]]
    assert len(turns) == 3  # (and the observer's request, not answered here)
    for i, body in enumerate(turns):
        system = body["system"]
        assert isinstance(system, list) and system  # the static prefix first
        assert system[0]["cache_control"] == {"type": "ephemeral"}
        # The static prefix, and from the second turn the last window message (the
        # previous reply): not the turn part, not the customer's message.
        assert _marked(body) == [{"type": "ephemeral"}] * (2 if i else 1)
        assert all("cache_control" not in block for block in system[1:])
        if i:
            last_reply = body["messages"][-2]
            assert last_reply["role"] == "assistant"
            assert last_reply["content"] == [{"type": "text", "text": turns_[i - 1][1]["reply"],
                                              "cache_control": {"type": "ephemeral"}}]
        assert all("cache_control" not in block for block in body["messages"][-1]["content"])
    presentation = turns[2]["system"]
    assert "Stage: presentation." in presentation[0]["text"]
    assert "\"breed\":\"Sphynx\"" not in presentation[0]["text"]  # the state: in its part
    # The state and turn parts follow in order (litellm keeps a system message after the
    # first user turn in place, so that the conversation before it stays cacheable).
    later = _texts(presentation[1:]) + [text for m in turns[2]["messages"]
                                        for text in _texts(m["content"])]
    assert any("\"breed\":\"Sphynx\"" in text for text in later)

    rows = sql("SELECT prompt_tokens, cached_prompt_tokens, cache_write_tokens FROM "
               "funnel_turns WHERE session_id = %s ORDER BY id", (SESSION,))
    assert [(cached, written) for _, cached, written in rows] == \
        [(0, 1200), (1200, 100), (1200, 100)]
    assert all(prompt == 1500 for prompt, _, _ in rows)

    report = await build_report(PURAMUR, db=db_url)
    costs = report["costs"]["conversations"]
    assert costs["cached_prompt_tokens"] == 2400 and costs["prompt_tokens"] == 4500
    assert float(costs["cached_prompt_pct"]) == pytest.approx(53.3)
    assert costs["cache_write_tokens"] == 1400
    assert float(costs["cache_write_pct"]) == pytest.approx(31.1)
    presentation_row = next(s for s in report["costs"]["stages"] if s["stage"] == "presentation")
    assert presentation_row["cached_prompt_tokens"] == 1200
    assert presentation_row["cache_write_tokens"] == 100
    assert float(presentation_row["cache_write_pct"]) == pytest.approx(6.7)
    table = render_table(report)
    assert "2,400 of 4,500 prompt tokens were read from the provider's prompt cache" in table
    assert "1,400 of 4,500 prompt tokens (31.1%) were written to the provider's prompt cache" \
        in table
    assert "31.1% written to the cache" in render_html(report)


# -- OpenAI: caches by itself; the cached tokens are recorded ----------------------------


async def test_openai_is_not_marked_and_its_cached_tokens_are_recorded(
        db_url: str, sql: Any, keys: None) -> None:  # noqa: F811
    with FakeProvider("openai") as fake:
        engine = await open_engine(PURAMUR, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            for i, (text, output) in enumerate(happy_turns(2)):
                fake.reply(json.dumps(output), prompt_tokens=1100, completion_tokens=40,
                           cached_tokens=1024 if i else 0)
                assert not (await engine.handle(SESSION, text)).fallback
        finally:
            await engine.close()
        bodies = fake.requests
    for body in bodies:
        assert _marked(body) == []  # OpenAI caches a shared prefix by itself
        messages = body["messages"]
        assert messages[0]["role"] == "system" and isinstance(messages[0]["content"], str)
        assert messages[-1] == {"role": "user", "content": messages[-1]["content"]}
    rows = sql("SELECT cached_prompt_tokens FROM funnel_turns WHERE session_id = %s "
               "ORDER BY id", (SESSION,))
    assert rows == [(0,), (1024,)]


# -- the static prefix does not change within a stage ------------------------------------


async def test_consecutive_turns_of_a_stage_share_the_static_prefix(
        db_url: str, keys: None, tmp_path: Path) -> None:  # noqa: F811
    questions = ["Is it safe if she licks it?", "How long does a bottle last?"]
    # Room for the whole layout: the budget counts with gpt-4o-mini's tokenizer
    # (engine.llm.tokens), and Puramur's 1000 would cut the summary at the fifth turn.
    spec = puramur_data()
    spec["memory"]["prompt_budget"] = 1400
    funnel = tmp_path / "puramur.yaml"
    funnel.write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True), "utf-8")
    with FakeProvider("openai") as fake:
        engine = await open_engine(funnel, db_url, "openai/gpt-4o-mini", fake.api_base)
        # The offline summary: an observer would ask this fake too, and take the replies
        # queued for the turns (the layout, not the memory, is under test here).
        engine.summary.summarizer = ExtractiveSummarizer()
        try:
            for text, output in happy_turns(3):
                fake.reply(json.dumps(output))
                await engine.handle(SESSION, text)
            for text in questions:  # no action: the session stays in presentation
                fake.reply(json.dumps({"reply": "It is gentle and lasts two months."}))
                assert (await engine.handle(SESSION, text)).stage_after == "presentation"
        finally:
            await engine.close()
        last, before = fake.requests[-1]["messages"], fake.requests[-2]["messages"]
    assert last[0] == before[0]  # the static prefix, word for word
    assert "Already shown" not in last[0]["content"]
    # the summary (data) comes before the turn part (system), which holds the state
    roles = [m["role"] for m in last]
    data = [i for i, m in enumerate(last) if m["content"].startswith("<data>")]
    turn = roles.index("system", 1)
    assert data and data[0] < turn and "Already shown" in last[turn]["content"]
    assert last[-1]["content"] == questions[-1]
