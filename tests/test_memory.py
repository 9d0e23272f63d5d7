"""Memory tiers: the window, the rolling summary, token budgets, and session isolation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine import Engine, ModelRequest, ScriptedModel
from engine.errors import MessageTooLong, PromptTooLarge
from engine.llm.models import Completion
from engine.memory.summary import ExtractiveSummarizer
from engine.records.messages import Message
from engine.turn.budget import Cut, Parts, fit, floor_tokens
from engine.turn.prompts import prompt_floor

ROOT = Path(__file__).resolve().parent.parent


class Recording:
    """The scripted model, keeping every request it was sent."""

    name = "scripted"

    def __init__(self, data: dict[str, Any]) -> None:
        self.inner = ScriptedModel.from_data(data)
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> Completion:
        self.requests.append(request)
        return await self.inner.complete(request)


async def _engine(puramur: Any, db_url: str, model: Any) -> Engine:
    return await Engine.open(puramur, db=db_url, model=model)


async def test_first_message_has_empty_history(puramur: Any, db_url: str) -> None:
    model = Recording({"default": {"reply": "Hello!"}})
    engine = await _engine(puramur, db_url, model)
    try:
        result = await engine.handle("first", "Hi")
    finally:
        await engine.close()
    assert result.reply == "Hello!"
    messages = model.requests[0].messages
    # The static prefix, the turn part (state), the message: no summary, no window yet.
    assert [m["role"] for m in messages] == ["system", "system", "user"]
    assert "Known facts (JSON)" in messages[1]["content"]
    assert messages[-1]["content"] == "Hi"


async def test_window_is_the_last_n_messages_in_order(puramur: Any, db_url: str) -> None:
    window = puramur.stage("discovery").spec.memory.window
    model = Recording({"default": {"reply": "noted"}})
    engine = await _engine(puramur, db_url, model)
    try:
        for i in range(8):
            await engine.handle("w", f"message {i}")
    finally:
        await engine.close()
    last = model.requests[-1].messages
    assert last[1]["content"].startswith("<data>")  # the summary, as data, first
    # Discovery's facts change every turn: its turn part follows the window.
    assert last[-2]["role"] == "system" and "Known facts" in last[-2]["content"]
    history = last[2:-2]
    assert len(history) == window
    # The last `window` messages before "message 7", oldest first, alternating roles.
    expected_users = [f"message {i}" for i in range(7 - window // 2, 7)]
    assert [m["content"] for m in history if m["role"] == "user"] == expected_users
    assert [m["role"] for m in history] == ["user", "assistant"] * (window // 2)
    assert last[-1]["content"] == "message 7"


async def test_summary_folds_messages_that_leave_the_window(puramur: Any, db_url: str,
                                                            sql: Any) -> None:
    model = Recording({"default": {"reply": "noted"}})
    engine = await _engine(puramur, db_url, model)
    try:
        for i in range(6):
            await engine.handle("sum", f"my cat detail number {i}")
            await engine.drain()
        summary, upto = sql("SELECT conversation_summary, summary_upto FROM "
                            "puramur_sessions_state WHERE session_id = 'sum'")[0]
        assert "my cat detail number 0" in summary  # left the window long ago
        assert upto > 0
        await engine.handle("sum", "and one more thing")
    finally:
        await engine.close()
    messages = model.requests[-1].messages
    # Customer-derived text never enters the system message: the summary travels in the
    # delimited data message that follows it.
    assert "my cat detail number 0" not in messages[0]["content"]
    assert "<data>" in messages[0]["content"]  # the rule that explains the data block
    assert messages[1]["role"] == "user" and messages[1]["content"].startswith("<data>")
    assert "my cat detail number 0" in messages[1]["content"]
    # The message window still carries only recent messages.
    assert all("number 0" not in m["content"] for m in messages[2:])


class Broken:
    async def summarize(self, previous: str, messages: Any, budget: int) -> str:
        raise RuntimeError("summarizer is down")


async def test_failing_summarizer_does_not_fail_the_turn(puramur: Any, db_url: str,
                                                         sql: Any) -> None:
    engine = await Engine.open(puramur, db=db_url, model=Recording({"default": {"reply": "ok"}}),
                               summarizer=Broken())
    try:
        for i in range(6):
            result = await engine.handle("broken", f"message {i}")
            await engine.drain()
            assert result.reply == "ok"
        assert sql("SELECT summary_upto FROM puramur_sessions_state "
                   "WHERE session_id = 'broken'") == [(0,)]
        # The summarizer comes back: the next job catches up on everything missed.
        engine.summary.summarizer = ExtractiveSummarizer()
        await engine.handle("broken", "message 6")
        await engine.drain()
    finally:
        await engine.close()
    summary, upto = sql("SELECT conversation_summary, summary_upto FROM puramur_sessions_state "
                        "WHERE session_id = 'broken'")[0]
    assert "message 0" in summary and upto > 0


async def test_sessions_never_see_each_others_messages(puramur: Any, db_url: str) -> None:
    model = Recording({"default": {"reply": "ok"}})
    engine = await _engine(puramur, db_url, model)
    try:
        for i in range(6):
            await engine.handle("alice", f"alice secret {i}")
            await engine.handle("bob", f"bob text {i}")
            await engine.drain()
    finally:
        await engine.close()
    for request in model.requests:
        text = " ".join(m["content"] for m in request.messages)
        other = "bob" if request.session_id == "alice" else "alice"
        assert other not in text.lower(), request.session_id


def test_budget_cuts_the_window_then_the_summary_then_the_notices_then_the_state() -> None:
    history = [Message("user", "x" * 400), Message("assistant", "y" * 400)]

    def render(level: int) -> Parts:
        return Parts("RULES", turn="s" * (200 // (level + 1)))

    def fitted_for(budget: int | None) -> Any:
        return fit("s", render, "S" * 400, ["N" * 100], history, "hi", budget)

    full = fitted_for(None)
    assert full.dropped_messages == 0 and full.cut == Cut(0, True, True, 2)
    assert fitted_for(full.tokens - 50).cut == Cut(0, True, True, 1)
    # static, summary, the window, turn part, notices: the oldest message went first
    assert [m["content"][:6] for m in full.messages] == ["RULES\n", "<data>", "x" * 6,
                                                          "y" * 6, "s" * 6, "<data>", "hi"]
    assert fitted_for(full.tokens - 50).messages[2]["content"] == "y" * 400
    no_window = fitted_for(full.tokens - 200).cut
    assert no_window == Cut(0, True, True, 0)
    assert fitted_for(full.tokens - 300).cut == Cut(0, True, False, 0)  # then the summary
    assert fitted_for(full.tokens - 360).cut == Cut(0, False, False, 0)  # then the notices
    smallest = fitted_for(floor_tokens(render) + 4)  # the floor and the message "hi"
    assert smallest.cut.level == 2 and smallest.messages[1]["content"] == render(2).turn
    assert smallest.messages[0]["content"].startswith("RULES")  # the static part is never cut
    with pytest.raises(MessageTooLong):  # only the message is too long: ask to shorten
        fit("discovery", render, "", [], [], "hi " * 500, floor_tokens(render) + 10)
    with pytest.raises(PromptTooLarge) as info:
        fit("discovery", render, "", [], [], "hi", 3)
    assert "discovery" in str(info.value) and "budget of 3" in str(info.value)
    assert not isinstance(info.value, MessageTooLong)


def test_fit_says_what_the_budget_trimmed() -> None:
    """What the studio's prompt panel shows: each part the cut gave up, in order."""
    history = [Message("user", "x" * 400), Message("assistant", "y" * 400)]

    def render(level: int) -> Parts:
        return Parts("RULES", turn="s" * (200 // (level + 1)))

    def trimmed(budget: int | None) -> tuple[str, ...]:
        return fit("s", render, "S" * 400, ["N" * 100], history, "hi", budget).trimmed

    full = fit("s", render, "S" * 400, ["N" * 100], history, "hi", None)
    assert trimmed(None) == () and trimmed(full.tokens) == ()
    assert trimmed(full.tokens - 50) == (
        "the 1 oldest message of the window left out (1 kept)",
        f"to fit the stage's prompt_budget of {full.tokens - 50} tokens")
    assert trimmed(full.tokens - 360)[:3] == (
        "the 2 oldest messages of the window left out (0 kept)",
        "the summary of older messages left out", "the notices of the last turn left out")
    smallest = trimmed(floor_tokens(render) + 4)
    assert "the state compacted to level 2 of 2 (strings to 30 characters, lists to 2 items, " \
        "objects to 10 keys)" in smallest


def test_the_floor_of_every_shipped_stage_fits_its_budget(puramur: Any) -> None:
    for stage in puramur.stages.values():
        floor = prompt_floor(puramur, stage)
        assert 100 < floor <= (stage.spec.memory.prompt_budget or floor), stage.spec.name


def test_validate_warns_when_a_template_alone_exceeds_its_budget(tmp_path: Path) -> None:
    from engine.validation import check_file

    text = (ROOT / "funnels" / "puramur.yaml").read_text()
    text = text.replace("prompt_budget: 1000", "prompt_budget: 60")
    text = text.replace("prompts: ../prompts/puramur", f"prompts: {ROOT / 'prompts/puramur'}")
    text = text.replace("catalog: puramur/catalog.yaml",
                        f"catalog: {ROOT / 'funnels/puramur/catalog.yaml'}")
    path = tmp_path / "small.yaml"
    path.write_text(text)
    _, diagnostics = check_file(path)
    codes = {(d.code, d.severity) for d in diagnostics}
    assert ("F204", "warning") in codes
