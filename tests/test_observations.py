"""Observational memory (seed 002, tier 3): the observer, the reflector, their defaults.

The summarizer is a real model here: ``openai/fake-model`` through litellm's HTTP path
to the loopback fake OpenAI server (tests/fake_openai.py), which plays both the
funnel's model and the summarizer. The test's responder answers like a model would:
the turn's envelope, the observer's observations, the reflector's condensed list.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import puramur_data, run_funnel
from test_litellm_path import close_litellm_clients  # noqa: F401  (autouse)

from engine import Engine, ScriptedModel
from engine.llm.models import LiteLLMModel
from engine.memory.observations import (
    OBSERVATION_CHARS,
    ModelSummarizer,
    observation_lines,
    text_tokens,
)
from engine.memory.summary import ExtractiveSummarizer
from engine.records.messages import Message
from engine.validation import check_file

MODEL = "openai/fake-model"
PET = "Murka"


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-dummy")


def funnel_file(tmp_path: Path, **memory: Any) -> Path:
    """Puramur with ``memory`` merged in and no retries (a failure shows at once)."""
    data = puramur_data()
    data["memory"].update(memory)
    data["model"].update(retries=0, timeout=5)
    path = tmp_path / "puramur_observed.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    return path


# -- the model the fake server plays ---------------------------------------------------

def role_of(body: dict[str, Any]) -> str:
    """Which call a request is: ``observer``, ``reflector`` or ``turn``."""
    system = str(body["messages"][0]["content"])
    for role in ("observer", "reflector"):
        if f"You are the {role}" in system:
            return role
    return "turn"


def data_of(body: dict[str, Any]) -> str:
    return str(body["messages"][1]["content"])


def observe(body: dict[str, Any]) -> str:
    """One observation per customer message: the pet's name verbatim, questions short."""
    new = data_of(body).split("New messages:", 1)[1]
    out = []
    for line in new.splitlines():
        if not line.startswith("Customer: "):
            continue
        text = line.removeprefix("Customer: ")
        asked = re.match(r"Question (\d+):", text)
        out.append(f"Asked about shampoo {asked.group(1)}." if asked else f"Said: {text}")
    return json.dumps({"observations": out})


def reflect(body: dict[str, Any]) -> str:
    """Keeps the customer's facts, merges the questions into one line with their count."""
    lines = data_of(body).split("Observations:\n", 1)[1].split("\n</data>")[0].splitlines()
    facts = [line for line in lines if "Said:" in line]
    asked = sum(1 for line in lines if "Asked about shampoo" in line)
    asked += sum(int(m.group(1)) for line in lines
                 if (m := re.search(r"asked (\d+) questions", line)))
    date = lines[0][:10]
    return json.dumps({"observations": [*facts, f"{date}: The customer asked {asked} "
                                                 "questions about shampoos."]})


def playing_model(body: dict[str, Any]) -> str | None:
    role = role_of(body)
    if role == "observer":
        return observe(body)
    if role == "reflector":
        return reflect(body)
    return json.dumps({"reply": "Noted, thanks!"})


def requests_of(fake: Any, role: str) -> list[dict[str, Any]]:
    return [body for body in fake.requests if role_of(body) == role]


def summary_of(sql: Any, session: str) -> tuple[str, int]:
    rows = sql("SELECT conversation_summary, summary_upto FROM puramur_sessions_state "
               "WHERE session_id = %s", (session,))
    return (rows[0][0] or "", int(rows[0][1])) if rows else ("", 0)


def message(turn: int) -> str:
    if turn == 3:
        return f"My cat is called {PET} and she is 4 years old."
    return f"Question {turn}: which shampoo suits a long coat in winter, and how often?"


# -- the proof -------------------------------------------------------------------------

async def test_sixty_turns_keep_the_observations_under_budget_and_turn_3_in_sight(
        tmp_path: Path, db_url: str, sql: Any, fake_llm: Any) -> None:
    budget = 200
    funnel = funnel_file(tmp_path, observe_after=120, observation_budget=budget)
    fake_llm.respond_with(playing_model)
    engine = await Engine.open(funnel, db=db_url, model=MODEL, api_base=fake_llm.api_base)
    blocks: list[str] = []
    reflections_before: list[int] = []
    try:
        assert isinstance(engine.summary.summarizer, ModelSummarizer)
        for turn in range(1, 61):
            result = await engine.handle("long", message(turn))
            await engine.drain()
            assert result.reply == "Noted, thanks!" and not result.fallback, result.error
            block, _ = summary_of(sql, "long")
            # The observation list stays under its budget at every turn.
            assert text_tokens(block) <= budget, (turn, block)
            blocks.append(block)
            reflections_before.append(len(requests_of(fake_llm, "reflector")))
    finally:
        await engine.close()
    observers, reflectors = requests_of(fake_llm, "observer"), requests_of(fake_llm, "reflector")
    assert len(observers) >= 10 and len(reflectors) >= 2
    # Between reflections the block only grows at its end (the prompt prefix is stable).
    appended = 0
    for turn in range(1, 60):
        before, after = blocks[turn - 1], blocks[turn]
        if reflections_before[turn] == reflections_before[turn - 1]:
            assert after.startswith(before), turn
            appended += after != before
    assert appended >= 8  # folds that appended (every ~3 turns at these sizes)
    # Every observation is dated.
    assert all(re.match(r"\d{4}-\d{2}-\d{2}: ", line) for line in observation_lines(blocks[-1]))
    # What the customer said at turn 3 reaches the model at turn 60, as data.
    last = requests_of(fake_llm, "turn")[-1]["messages"]
    assert last[-1]["content"] == message(60)
    assert PET not in last[0]["content"]  # never in the system role
    data = [m["content"] for m in last if m["content"].startswith("<data>")]
    assert len(data) == 1 and f"My cat is called {PET}" in data[0]
    assert all(PET not in m["content"] for m in last if not m["content"].startswith("<data>"))


async def test_folding_is_triggered_by_tokens_not_by_message_count(
        tmp_path: Path, db_url: str, sql: Any, fake_llm: Any) -> None:
    funnel = funnel_file(tmp_path, window=6, observe_after=200)
    fake_llm.respond_with(playing_model)
    engine = await Engine.open(funnel, db=db_url, model=MODEL, api_base=fake_llm.api_base)
    try:
        for turn in range(6):  # 12 short messages: 6 have left the window, ~60 tokens
            await engine.handle("tokens", f"ok {turn}")
            await engine.drain()
        assert requests_of(fake_llm, "observer") == []
        assert summary_of(sql, "tokens") == ("", 0)
        # Messages that left the window but are not observed stay in the prompt.
        last = requests_of(fake_llm, "turn")[-1]["messages"]
        assert "ok 0" in [m["content"] for m in last]
        await engine.handle("tokens", "Here is everything about my dog: " + "fluffy " * 100)
        await engine.drain()
        # In the window it is still there verbatim: not observed yet, whatever its size.
        assert requests_of(fake_llm, "observer") == []
        for turn in range(3):  # three turns later it has left the window (6 messages)
            await engine.handle("tokens", f"fine {turn}")
            await engine.drain()
    finally:
        await engine.close()
    observers = requests_of(fake_llm, "observer")
    assert len(observers) == 1  # the tokens that left the window passed observe_after
    assert "Customer: ok 0" in data_of(observers[0])
    assert "fluffy" in data_of(observers[0])
    block, upto = summary_of(sql, "tokens")
    assert "Said: ok 0" in block and upto > 0


async def test_messages_the_budget_cuts_before_they_are_observed_are_observed_at_once(
        tmp_path: Path, db_url: str, sql: Any, fake_llm: Any) -> None:
    # observe_after is never reached; the prompt budget is: what it cuts is observed now.
    # 1200 tokens as gpt-4o-mini's tokenizer counts them (the budget asks the model's
    # tokenizer, engine.llm.tokens): the window grows past four messages before a cut.
    funnel = funnel_file(tmp_path, window=4, observe_after=100_000, observation_budget=2000,
                         prompt_budget=1200)
    fake_llm.respond_with(playing_model)
    engine = await Engine.open(funnel, db=db_url, model=MODEL, api_base=fake_llm.api_base)

    def conversation(body: dict[str, Any]) -> list[str]:
        return [str(m["content"]) for m in body["messages"][:-1]
                if m["role"] in ("user", "assistant")
                and not str(m["content"]).startswith("<data>")]

    try:
        shown: list[list[str]] = []
        observed: list[int] = []  # observer calls once each turn's jobs are done
        for turn in range(1, 9):
            await engine.handle("crowded", f"Detail {turn}: " + "my dog's coat is long. " * 24)
            await engine.drain()
            shown.append(conversation(requests_of(fake_llm, "turn")[-1]))
            observed.append(len(requests_of(fake_llm, "observer")))
    finally:
        await engine.close()
    observers = requests_of(fake_llm, "observer")
    assert observers, "the cut messages were never observed"
    block, upto = summary_of(sql, "crowded")
    assert "Said: Detail 1:" in block and upto > 0
    # From turn to turn the messages shown only grow (the start stays the same, for a
    # provider's cache) or are cut down to the stage's window (four) at once: never a
    # sliding window that drops its oldest message on every turn.
    sizes = [len(messages) for messages in shown]
    assert max(sizes) > 4 and sizes[-1] <= 4, sizes  # the budget did cut
    for before, now in zip(shown, shown[1:], strict=False):
        assert now[:len(before)] == before or len(now) <= 4, sizes
    # The turn that cut them had them observed, and the next turn's prompt shows them.
    cut = next(i for i in range(1, len(sizes)) if sizes[i] < sizes[i - 1])
    assert observed[cut - 1] == 0 and observed[cut] == 1, (sizes, observed)
    after = requests_of(fake_llm, "turn")[cut + 1]["messages"]
    data = " ".join(str(m["content"]) for m in after if str(m["content"]).startswith("<data>"))
    assert "Said: Detail 1:" in data


async def test_the_reflector_runs_past_the_budget_and_the_block_is_append_only_until_then(
        fake_llm: Any) -> None:
    fake_llm.respond_with(playing_model)
    summarizer = ModelSummarizer(LiteLLMModel(MODEL, api_base=fake_llm.api_base))
    block = ""
    for i in range(1, 30):
        before = block
        block = await summarizer.summarize(
            block, [Message("user", f"Question {i}: which one?"), Message("assistant", "This.")],
            100)
        assert text_tokens(block) <= 100
        if len(requests_of(fake_llm, "reflector")) == 0:
            assert block.startswith(before) and len(block) > len(before)
    reflections = requests_of(fake_llm, "reflector")
    assert len(reflections) >= 2
    # The reflector was sent the whole list, as data; its answer replaced the list.
    assert "Asked about shampoo 1." in data_of(reflections[0])
    assert data_of(reflections[0]).startswith("<data>")
    assert "questions about shampoos" in block


async def test_model_text_is_bounded_before_it_is_stored(fake_llm: Any) -> None:
    huge = json.dumps({"observations": ["x" * 5000, "ok\x00 </data> line", *["y"] * 50]})
    fake_llm.reply(huge)
    summarizer = ModelSummarizer(LiteLLMModel(MODEL, api_base=fake_llm.api_base))
    block = await summarizer.summarize("", [Message("user", "hi")], 400)
    lines = observation_lines(block)
    assert lines and all(len(line) <= OBSERVATION_CHARS + 20 for line in lines)
    assert "\x00" not in block and text_tokens(block) <= 400 // 2
    fake_llm.reply("not json at all\n" * 2000)  # garbage: its lines, bounded
    block = await summarizer.summarize("", [Message("user", "hi")], 400)
    assert text_tokens(block) <= 400 // 2


async def test_a_failing_or_slow_summarizer_leaves_the_turn_fine_and_catches_up(
        tmp_path: Path, db_url: str, sql: Any, fake_llm: Any) -> None:
    down = {"on": True}
    waiting, release = threading.Event(), threading.Event()

    def flaky(body: dict[str, Any]) -> str | None:
        if role_of(body) == "observer":
            if down["on"]:
                return None  # HTTP 500
            waiting.set()
            release.wait(10)  # a slow summarizer: answers when the test lets it
        return playing_model(body)

    funnel = funnel_file(tmp_path, observe_after=60)
    fake_llm.respond_with(flaky)
    engine = await Engine.open(funnel, db=db_url, model=MODEL, api_base=fake_llm.api_base)
    try:
        for turn in range(1, 7):
            result = await engine.handle("flaky", message(turn))
            await engine.drain()
            assert result.reply == "Noted, thanks!" and not result.fallback, result.error
        assert len(requests_of(fake_llm, "observer")) >= 2  # tried, and tried again
        assert summary_of(sql, "flaky") == ("", 0)
        # The summarizer is back but slow: the customer's turn does not wait for it.
        down["on"] = False
        result = await engine.handle("flaky", message(7))
        assert result.reply == "Noted, thanks!" and not result.fallback, result.error
        assert await asyncio.to_thread(waiting.wait, 10)
        assert summary_of(sql, "flaky") == ("", 0)  # the reply went out before the summary
        release.set()
        await engine.drain()
    finally:
        release.set()
        await engine.close()
    block, upto = summary_of(sql, "flaky")
    # The job caught up on everything the failed ones missed, turn 3 included.
    assert upto > 0 and f"My cat is called {PET}" in block


async def test_one_fold_of_a_session_at_a_time(
        tmp_path: Path, db_url: str, sql: Any, fake_llm: Any) -> None:
    waiting, release = threading.Event(), threading.Event()

    def slow(body: dict[str, Any]) -> str | None:
        if role_of(body) == "observer":
            waiting.set()
            release.wait(10)
        return playing_model(body)

    fake_llm.respond_with(slow)
    engine = await Engine.open(funnel_file(tmp_path, observe_after=60), db=db_url,
                               model=MODEL, api_base=fake_llm.api_base)
    try:
        turn = 1
        while not waiting.is_set() and turn < 10:  # until a fold is in flight
            await engine.handle("once", message(turn))
            turn += 1
            await asyncio.to_thread(waiting.wait, 1)
        assert waiting.is_set()
        # The next turn would fold the same messages: no second model call for them.
        result = await engine.handle("once", message(turn))
        assert not result.fallback, result.error
        release.set()
        await engine.drain()
    finally:
        release.set()
        await engine.close()
    assert len(requests_of(fake_llm, "observer")) == 1
    block, upto = summary_of(sql, "once")
    assert upto > 0 and block


async def test_a_real_model_is_the_default_summarizer_at_its_api_base(
        tmp_path: Path, db_url: str, fake_llm: Any) -> None:
    engine = await Engine.open(funnel_file(tmp_path), db=db_url, model=MODEL,
                               api_base=fake_llm.api_base)
    try:
        summarizer = engine.summary.summarizer
        assert isinstance(summarizer, ModelSummarizer)
        assert isinstance(summarizer.model, LiteLLMModel)
        assert summarizer.model.name == MODEL
        assert summarizer.model.api_base == fake_llm.api_base
        assert engine.summary.budget == engine.spec.memory.observation_budget
    finally:
        await engine.close()
    other = funnel_file(tmp_path, summarizer_api_base="http://127.0.0.1:9/v1")
    engine = await Engine.open(other, db=db_url, model=MODEL, api_base=fake_llm.api_base)
    try:
        summarizer = engine.summary.summarizer
        assert isinstance(summarizer, ModelSummarizer)
        assert summarizer.model.api_base == "http://127.0.0.1:9/v1"  # type: ignore[attr-defined]
    finally:
        await engine.close()


async def test_the_scripted_model_keeps_the_extractive_summary(
        puramur: Any, db_url: str, sql: Any) -> None:
    engine = await Engine.open(puramur, db=db_url,
                               model=ScriptedModel.from_data({"default": {"reply": "ok"}}))
    try:
        assert isinstance(engine.summary.summarizer, ExtractiveSummarizer)
        assert engine.summary.budget == puramur.spec.memory.summary_budget
        for i in range(6):
            await engine.handle("scripted", f"my cat detail {i}")
            await engine.drain()
    finally:
        await engine.close()
    summary, upto = summary_of(sql, "scripted")
    assert summary.startswith("Customer: my cat detail 0 | You: ok") and upto > 0


def test_memory_settings_are_validated_by_name(tmp_path: Path) -> None:
    path = funnel_file(tmp_path, observe_after=5, observation_budget="big")
    result = run_funnel("validate", str(path))
    text = result.stdout + result.stderr
    assert result.returncode != 0, text
    assert "`memory.observe_after`: 5 is less than the minimum of 20" in text
    assert "`memory.observation_budget`: 'big' is not of type 'integer'" in text


def test_validate_warns_when_observations_may_crowd_the_prompt(tmp_path: Path) -> None:
    _, diagnostics = check_file(funnel_file(tmp_path, observation_budget=600))
    warned = [d for d in diagnostics if d.code == "F207"]
    assert warned and all(d.severity == "warning" for d in warned)
    assert "observation_budget (600) is over half its prompt_budget (1000)" in warned[0].message
    _, diagnostics = check_file(funnel_file(tmp_path, observation_budget=500))
    assert not [d for d in diagnostics if d.code == "F207"]
