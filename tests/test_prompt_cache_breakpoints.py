"""Claude's second cache breakpoint: the end of the conversation the next turn repeats.

The engine marks two blocks for Claude (engine.llm.cache.mark_static_prefix): the
static prefix, and the last message the next turn repeats (engine.turn.budget's
``Fitted.stable``: the last window message, else the state part, else the summary).
Never the turn part, the notices or the customer's message. Each route is checked on
the wire, against the recording fakes of tests/fake_providers.py, with the chats
engine.turn.budget.assemble builds: the marks are exactly those two, in litellm's form for
the route, and where litellm turns a system message after a user turn into a user turn
("Operator note") the mark stays on the state part's block, not on the turn part's.
The tokens written to the cache are read from every usage shape.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fake_providers import FakeProvider
from test_litellm_path import close_litellm_clients, loopback_only  # noqa: F401
from test_prompt_cache_routes import (  # noqa: F401
    BEDROCK_CLAUDE,
    BEDROCK_NO_CACHE,
    _found,
    _sequence,
    aws,
)
from test_providers import fresh_strategies  # noqa: F401

from engine.llm import cache
from engine.records.messages import Message
from engine.turn.budget import Parts, fit

SCHEMA = {"type": "object", "properties": {"reply": {"type": "string"}},
          "required": ["reply"]}
HISTORY = [Message("user", "EARLIER QUESTION"), Message("assistant", "EARLIER ANSWER"),
           Message("user", "LAST QUESTION"), Message("assistant", "LAST ANSWER")]


def _fit(summary: str, parts: Parts, history: list[Message], notices: list[str]) -> Any:
    return fit("s", lambda level: parts, summary, notices, history, "NOW", None)


# -- where the stable conversation ends (engine.turn.budget) ---------------------------------


@pytest.mark.parametrize(("summary", "parts", "history", "last_stable"), [
    ("SUMMARY", Parts("STATIC", "STATE", "TURN"), HISTORY, "LAST ANSWER"),
    ("", Parts("STATIC", "", "TURN"), HISTORY, "LAST ANSWER"),
    ("SUMMARY", Parts("STATIC", "STATE", "TURN"), [], "STATE"),  # no window: the state
    ("SUMMARY", Parts("STATIC", "", "TURN"), [], "<data>"),  # nor state: the summary
    ("", Parts("STATIC", "", "TURN"), [], "STATIC"),  # the static prefix alone
])
def test_fit_says_how_many_leading_messages_the_next_turn_repeats(
        summary: str, parts: Parts, history: list[Message], last_stable: str) -> None:
    fitted = _fit(summary, parts, history, ["REFUSED"])
    stable, rest = fitted.messages[:fitted.stable], fitted.messages[fitted.stable:]
    assert stable[-1]["content"].startswith(last_stable)
    # What follows changes every turn: the turn part, the notices, the message.
    assert [m["content"][:6] for m in rest] == ["TURN", "<data>", "NOW"]
    # The next turn (two more window messages, other notices and message) repeats it.
    if history:
        later = _fit(summary, parts, [*history, Message("user", "NOW"),
                                      Message("assistant", "OK")], [])
        assert later.messages[:fitted.stable] == stable
        assert later.stable == fitted.stable + 2


def test_the_marks_are_the_static_prefix_and_the_last_stable_message() -> None:
    chat = _fit("SUMMARY", Parts("STATIC", "STATE", "TURN"), HISTORY, ["REFUSED"])
    marked = cache.mark_static_prefix(chat.messages, chat.stable)
    flagged = [i for i, m in enumerate(marked) if isinstance(m["content"], list)]
    assert flagged == [0, chat.stable - 1]
    assert marked[chat.stable - 1]["content"] == [
        {"type": "text", "text": "LAST ANSWER", "cache_control": {"type": "ephemeral"}}]
    assert chat.messages[0]["content"].startswith("STATIC")  # the input is not changed
    # No stable end past the static prefix (or not said): the static prefix alone.
    for stable in (0, 1):
        assert [isinstance(m["content"], list)
                for m in cache.mark_static_prefix(chat.messages, stable)].count(True) == 1
    # Never the customer's message, even if asked.
    last = cache.mark_static_prefix(chat.messages, len(chat.messages))
    assert last[-1] == chat.messages[-1]
    assert cache.mark_static_prefix([{"role": "user", "content": "hi"}], 1) == \
        [{"role": "user", "content": "hi"}]


# -- on the wire, route by route ---------------------------------------------------------


async def _send(fake: FakeProvider, model: str, chat: Any) -> dict[str, Any]:
    import litellm

    from engine.format.settings import ModelSettings
    from engine.llm.client import Caller
    from engine.llm.request import ModelRequest

    fake.reply(json.dumps({"reply": "ok"}))
    request = ModelRequest(messages=chat.messages, schema=SCHEMA, stage="s",
                           settings=ModelSettings(name=model, retries=0), session_id="s",
                           turn=1, user_text="NOW", stable=chat.stable)
    await Caller(litellm, model, api_base=fake.api_base).complete(request)
    return fake.requests[-1]


ROUTES = [  # (wire, model, the marks' total in the body)
    ("anthropic", "anthropic/claude-sonnet-4-5", 2),  # system after a user turn: converted
    ("anthropic", "anthropic/claude-opus-4-8", 2),  # kept as a mid-conversation system
    ("bedrock", BEDROCK_CLAUDE, 2),  # Converse: cachePoint blocks
    ("bedrock", "bedrock/invoke/anthropic.claude-sonnet-4-5-20250929-v1:0", 2),
    ("bedrock", "bedrock/invoke/amazon.nova-pro-v1:0", 2),  # cachePoint keys
    ("openai", "openrouter/anthropic/claude-sonnet-4.5", 2),
    ("openai", "openai/gpt-4o-mini", 0),
    ("bedrock", BEDROCK_NO_CACHE, 0),
]


@pytest.mark.parametrize(("wire", "model", "marks"), ROUTES)
async def test_each_route_carries_the_two_breakpoints(wire: str, model: str, marks: int,
                                                      aws: None) -> None:  # noqa: F811
    with FakeProvider(wire) as fake:
        window = await _send(fake, model, _fit("SUMMARY", Parts("STATIC", "STATE", "TURN"),
                                               HISTORY, ["REFUSED"]))
        # No window: the state part, a system message after the summary's user turn, is
        # the end; litellm moves or converts it, and the turn part after it.
        state = await _send(fake, model, _fit("SUMMARY", Parts("STATIC", "STATE", "TURN"),
                                              [], ["REFUSED"]))
    for body, end in ((window, "LAST ANSWER"), (state, "STATE")):
        total = len(_found(body, "cache_control")) + len(_found(body, "cachePoint"))
        assert total == marks, body
        sequence = _sequence(body)
        texts = [text for text, _ in sequence]
        assert texts[-1].endswith("NOW") or "NOW" in texts  # the message is there...
        marked = [text for text, flag in sequence if flag]
        if not marks:
            assert marked == []
            continue
        assert len(marked) == 2 and marked[0].startswith("STATIC") and marked[1] == end, \
            sequence
        # ... and nothing of the turn is marked: the turn part, the notices, the message.
        assert not any(flag for text, flag in sequence
                       if text in ("TURN", "NOW") or "REFUSED" in text)


async def test_a_converted_turn_part_does_not_carry_the_mark(aws: None) -> None:  # noqa: F811
    """Claude Sonnet 4.5 takes no system message mid-conversation: litellm turns the state
    and turn parts into user turns headed by its "Operator note", each keeping only its
    own blocks' marks; Opus 4.8 takes them, merged into one system message."""
    from litellm.litellm_core_utils.prompt_templates.mid_conversation_system import (
        CONVERTED_SYSTEM_NOTE,
    )

    chat = _fit("SUMMARY", Parts("STATIC", "STATE", "TURN"), [], ["REFUSED"])
    with FakeProvider("anthropic") as fake:
        converted = await _send(fake, "anthropic/claude-sonnet-4-5", chat)
        kept = await _send(fake, "anthropic/claude-opus-4-8", chat)
    [turn] = converted["messages"]  # the summary, the parts, the notices, the message
    blocks = turn["content"]
    notes = [i for i, b in enumerate(blocks) if b["text"] == CONVERTED_SYSTEM_NOTE]
    assert [blocks[i + 1]["text"] for i in notes] == ["STATE", "TURN"]
    assert [b["text"] for b in blocks if "cache_control" in b] == ["STATE"]
    assert all("cache_control" not in blocks[i] for i in notes)
    system = [m for m in kept["messages"] if m["role"] == "system"]
    assert [[(b["text"], "cache_control" in b) for b in m["content"]] for m in system] == \
        [[("STATE", True), ("TURN", False)]]


# -- the tokens written to the cache ---------------------------------------------------


def test_cache_write_tokens_are_read_from_every_usage_shape() -> None:
    from litellm.types.utils import Usage

    assert cache.cache_write_tokens(Usage(prompt_tokens=1500, completion_tokens=4,
                                          cache_creation_input_tokens=300)) == 300
    assert cache.cache_write_tokens(Usage(
        prompt_tokens=1500, completion_tokens=4,
        prompt_tokens_details={"cache_write_tokens": 250})) == 250
    assert cache.cache_write_tokens({"cacheWriteInputTokens": 200}) == 200  # Converse
    assert cache.cache_write_tokens({"cacheWriteInputTokenCount": 150}) == 150  # Invoke
    assert cache.cache_write_tokens({"cache_creation_input_tokens": 100}) == 100
    for nothing in (None, {}, Usage(prompt_tokens=10, completion_tokens=1),
                    {"cache_creation_input_tokens": True}, {"prompt_tokens_details": None}):
        assert cache.cache_write_tokens(nothing) == 0
    # Reads and writes are told apart.
    usage = Usage(prompt_tokens=1500, completion_tokens=4, cache_read_input_tokens=1000,
                  cache_creation_input_tokens=300)
    assert (cache.cached_tokens(usage), cache.cache_write_tokens(usage)) == (1000, 300)
