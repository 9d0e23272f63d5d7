"""Streamed turns on the real litellm HTTP path: every route that streams, and each event
sequence (normal, repaired, fallback, a provider that fails mid-stream).

The fake servers (tests/fake_providers.py, tests/fake_stream.py) answer a request that
streams in their provider's own wire format: OpenAI's chunk stream (content or
``tool_calls`` deltas), Anthropic's event stream (``text_delta`` or
``input_json_delta``), Gemini's ``alt=sse``, Ollama's NDJSON. The turn is asked to
stream (``Engine.handle(..., stream=listener)``); the test reads the events the
listener got and what the turn saved.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import PURAMUR
from fake_providers import FakeProvider
from fake_stream import Stream
from test_litellm_path import close_litellm_clients, loopback_only  # noqa: F401
from test_providers import KEYS, happy_turns, open_engine

from engine.llm.models import ScriptedModel
from engine.turn.engine import Engine

pytestmark = pytest.mark.postgres

SESSION = "st-1"
# The greeting's fallback as a new session gets it: "Hi!" tells no language, so the
# session's is Puramur's default, Ukrainian.
GREETING = "Вітаю! Я консультант Puramur. Скажіть, у вас кішка чи собака?"


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from engine.llm import strategy, stream

    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    strategy.forget()
    stream.forget()
    yield
    strategy.forget()
    stream.forget()


@dataclass
class Route:
    wire: str
    model: str
    structured_output: str | None = None
    one_piece: bool = False  # litellm hands this route's answer over whole


ROUTES = {
    "openai-json_schema": Route("openai", "openai/gpt-4o-mini"),
    "openai-tool": Route("openai", "openai/gpt-4o-mini", "tool"),
    "openai-json_object": Route("openai", "openai/gpt-4o-mini", "json_object"),
    "openai-prompt": Route("openai", "openai/gpt-4o-mini", "prompt"),
    "azure": Route("azure", "azure/gpt-4o"),
    "anthropic-output_format": Route("anthropic", "anthropic/claude-sonnet-4-5"),
    "anthropic-tool": Route("anthropic", "anthropic/claude-3-5-sonnet-20241022"),
    "gemini": Route("gemini", "gemini/gemini-2.0-flash"),
    "ollama-chat": Route("ollama", "ollama_chat/llama3.2"),
    # litellm collects Ollama's /api/generate stream with `format` into one chunk.
    "ollama-generate": Route("ollama", "ollama/llama3", one_piece=True),
    "llamacpp-json_object_schema": Route("llamacpp", "openai/smollm2"),
}


class Events(list[tuple[str, str]]):
    """What a listener got, and the text it shows."""

    def __call__(self, kind: str, text: str) -> None:
        self.append((kind, text))

    @property
    def shown(self) -> str:
        text = ""
        for kind, piece in self:
            text = text + piece if kind == "delta" else piece
        return text

    @property
    def kinds(self) -> list[str]:
        return [k for k, _ in self]


def turns(sql: Any, session: str = SESSION) -> list[dict[str, Any]]:
    cols = ("repaired", "fallback", "attempts", "validation_failures", "error")
    rows = sql(f"SELECT {', '.join(cols)} FROM funnel_turns WHERE session_id = %s ORDER BY id",
               (session,))
    return [dict(zip(cols, r, strict=True)) for r in rows]


@pytest.mark.parametrize("name", list(ROUTES))
async def test_every_route_streams_the_reply(name: str, db_url: str, sql: Any) -> None:
    route = ROUTES[name]
    with FakeProvider(route.wire) as fake:
        engine = await open_engine(PURAMUR, db_url, route.model, fake.api_base,
                                   route.structured_output)
        try:
            for text, output in happy_turns(2):
                events = Events()
                fake.reply(json.dumps(output), prompt_tokens=400, completion_tokens=40)
                result = await engine.handle(SESSION, text, stream=events)
                assert not result.fallback, result.error
                assert events.shown == result.reply == output["reply"]
                assert set(events.kinds) == {"delta"}
                if not route.one_piece:  # the reply arrived in pieces, as it was written
                    assert len(events) >= 3, events
            state = await engine.state(SESSION)
        finally:
            await engine.close()
        body = fake.requests[-1]
        assert body.get("stream") is True or fake.paths[-1].endswith(":streamGenerateContent")
    # Updates were applied once the whole answer validated, as in a turn that does not stream.
    assert state is not None and state["stage"] == "presentation"
    assert state["pet"]["breed"] == "Sphynx"
    records = turns(sql)
    assert len(records) == 2 and not any(r["fallback"] or r["error"] for r in records)


async def test_a_repaired_answer_replaces_what_was_streamed(db_url: str, sql: Any) -> None:
    with FakeProvider("openai") as fake:
        engine = await open_engine(PURAMUR, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            fake.reply(json.dumps({"reply": "A first try that breaks the contract",
                                   "actions": "not a list"}))
            fake.reply(json.dumps({"reply": "Hello! Is your pet a cat or a dog?"}))
            events = Events()
            result = await engine.handle(SESSION, "Hi!", stream=events)
        finally:
            await engine.close()
    assert result.repaired and not result.fallback
    first = events.kinds.index("replace")
    # The rejected answer's reply was streamed, then the repair's replaced it and grew.
    assert first > 0 and set(events.kinds[:first]) == {"delta"}
    assert "".join(t for _, t in events[:first]).startswith("A first try")
    assert events.kinds.count("replace") == 1
    assert events.shown == result.reply == "Hello! Is your pet a cat or a dog?"
    assert [r["repaired"] for r in turns(sql)] == [True]


async def test_the_fallback_replaces_what_was_streamed(db_url: str, sql: Any) -> None:
    with FakeProvider("openai") as fake:
        engine = await open_engine(PURAMUR, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            for _ in range(2):
                fake.reply(json.dumps({"reply": "Never shown for good", "actions": 7,
                                       "updates": {"pet": {"type": "cat"}}}))
            events = Events()
            result = await engine.handle(SESSION, "Hi!", stream=events)
            state = await engine.state(SESSION)
        finally:
            await engine.close()
    assert result.fallback and result.reply == GREETING
    assert events[-1] == ("replace", GREETING) and events.shown == GREETING
    assert state is not None and not (state["pet"] or {}).get("type")  # nothing applied
    assert [(r["fallback"], r["validation_failures"]) for r in turns(sql)] == [(True, 2)]


async def test_a_provider_that_fails_mid_stream(db_url: str, sql: Any) -> None:
    """The connection breaks after a few characters: the engine retries (a new attempt,
    whose reply replaces what the broken one showed), and the turn is recorded once."""
    with FakeProvider("openai") as fake:
        engine = await open_engine(PURAMUR, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            fake.reply(json.dumps({"reply": "Broken halfway through"}),
                       stream=Stream(piece=4, cut_after=20))
            fake.reply(json.dumps({"reply": "Hello! Is your pet a cat or a dog?",
                                   "language": "en"}))
            events = Events()
            result = await engine.handle(SESSION, "Hi!", stream=events)
        finally:
            await engine.close()
    assert not result.fallback, result.error
    assert events.kinds[0] == "delta" and "replace" in events.kinds
    assert events.shown == result.reply == "Hello! Is your pet a cat or a dog?"
    assert [r["attempts"] for r in turns(sql)] == [2]


async def test_a_provider_that_keeps_failing_mid_stream_ends_in_the_fallback(
        db_url: str, sql: Any, tmp_path: Any) -> None:
    with FakeProvider("anthropic") as fake:
        engine = await open_engine(PURAMUR, db_url, "anthropic/claude-sonnet-4-5",
                                   fake.api_base)
        try:
            for _ in range(4):
                fake.reply(json.dumps({"reply": "Broken again and again"}),
                           stream=Stream(piece=4, cut_after=20))
            events = Events()
            result = await engine.handle(SESSION, "Hi!", stream=events)
        finally:
            await engine.close()
    assert result.fallback and result.error
    assert events[-1] == ("replace", GREETING)
    assert len(turns(sql)) == 1


async def test_a_listener_that_fails_does_not_fail_the_turn(db_url: str, sql: Any) -> None:
    """The customer went away (the listener raises): the turn completes, once."""
    def gone(kind: str, text: str) -> None:
        raise ConnectionResetError("the client went away")

    with FakeProvider("openai") as fake:
        engine = await open_engine(PURAMUR, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            output = happy_turns(1)[0][1]
            fake.reply(json.dumps(output))
            result = await engine.handle(SESSION, "Hi!", stream=gone)
        finally:
            await engine.close()
    assert not result.fallback and result.stage_after == "discovery"
    assert len(turns(sql)) == 1


async def test_the_scripted_model_streams(db_url: str) -> None:
    script = ScriptedModel.from_data({"default": {"reply": "Streamed offline, piece by piece"}})
    async with await Engine.open(PURAMUR, db=db_url, model=script) as engine:
        events = Events()
        result = await engine.handle(SESSION, "Hi!", stream=events)
    assert len(events) >= 3 and set(events.kinds) == {"delta"}
    assert events.shown == result.reply == "Streamed offline, piece by piece"


async def test_a_server_that_refuses_to_stream_answers_in_one_event(db_url: str) -> None:
    from engine.llm import stream

    with FakeProvider("openai") as fake:
        engine = await open_engine(PURAMUR, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            stream.stop_streaming("openai/gpt-4o-mini", fake.api_base, "test")
            output = happy_turns(1)[0][1]
            fake.reply(json.dumps(output))
            events = Events()
            result = await engine.handle(SESSION, "Hi!", stream=events)
        finally:
            await engine.close()
        assert "stream" not in fake.requests[-1]
    assert events == [("delta", result.reply)]


def long_answer(chars: int, reply: str) -> str:
    """An envelope of ``chars`` characters: ``reply``, then the JSON's own whitespace."""
    head = json.dumps({"reply": reply, "language": "en"})
    return head[:-1] + " " * max(0, chars - len(head)) + "}"


LONG_REPLY = ("Our oatmeal shampoo suits a long coat in winter; rinse twice, dry well. " * 20
              ).strip()[:1400]


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_stream_of_many_tiny_chunks_adds_up_to_the_reply(wire: str, db_url: str,
                                                                 sql: Any) -> None:
    """20,000 characters a character a chunk (4,000 through litellm's chunk objects): the
    events are the reply, exactly, and the tokens those the stream's usage said."""
    model = "openai/gpt-4o-mini" if wire == "openai" else "anthropic/claude-sonnet-4-5"
    chars = 20_000 if wire == "openai" else 4_000  # litellm's chunks cost ~0.5 ms each
    with FakeProvider(wire) as fake:
        engine = await open_engine(PURAMUR, db_url, model, fake.api_base)
        try:
            fake.reply(long_answer(chars, LONG_REPLY), prompt_tokens=400,
                       completion_tokens=5000, stream=Stream(piece=1, lean=True))
            events = Events()
            result = await engine.handle(SESSION, "Hi!", stream=events)
        finally:
            await engine.close()
    assert not result.fallback, result.error
    assert events.shown == result.reply == LONG_REPLY
    assert set(events.kinds) == {"delta"} and len(events) > 100
    row = sql("SELECT prompt_tokens, completion_tokens FROM funnel_turns "
              "WHERE session_id = %s", (SESSION,))
    assert row == [(400, 5000)]


async def test_reading_a_stream_gives_the_loop_its_turns() -> None:
    """A stream whose chunks are all there already never makes its reader wait: the read
    itself gives the event loop a turn, so a ticker beside it keeps ticking."""
    from types import SimpleNamespace

    from engine.llm import stream

    def chunk(text: str) -> Any:
        delta = SimpleNamespace(content=text, tool_calls=None, role=None)
        return SimpleNamespace(choices=[SimpleNamespace(delta=delta, finish_reason=None)],
                               usage=None)

    async def arrived() -> Any:  # never suspends: every chunk is in the buffer
        for i in range(30_000):
            yield chunk("x" if i else '{"reply": "')

    ticks: list[int] = [0]
    during: list[int] = []

    async def ticker() -> None:
        while True:
            await asyncio.sleep(0.001)
            ticks[0] += 1

    built: list[Any] = []

    def builder(chunks: list[Any], messages: Any) -> str:
        built.extend(chunks)
        return "built"

    shown: list[str] = []
    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.005)
    try:
        start = ticks[0]
        answer = await stream.consume(SimpleNamespace(stream_chunk_builder=builder),
                                      arrived(), [], shown.append, "m")
        during.append(ticks[0] - start)
    finally:
        task.cancel()
    assert answer == "built" and "".join(shown) == '{"reply": "' + "x" * 29_999
    assert during[0] >= 3, during  # progress while the stream was read, not only after
    # The builder got the chunks it needs: the run of text-only chunks merged into one.
    assert len(built) == 1 and built[0].choices[0].delta.content == "".join(shown)


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_stream_past_the_chunk_cap_ends_in_the_fallback(
        wire: str, db_url: str, sql: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.llm import stream

    monkeypatch.setattr(stream, "MAX_CHUNKS", 300)
    model = "openai/gpt-4o-mini" if wire == "openai" else "anthropic/claude-sonnet-4-5"
    with FakeProvider(wire) as fake:
        engine = await open_engine(PURAMUR, db_url, model, fake.api_base)
        try:
            fake.reply(long_answer(1_000, "Hello! Is your pet a cat or a dog?"),
                       stream=Stream(piece=1, lean=True))
            events = Events()
            result = await engine.handle(SESSION, "Hi!", stream=events)
        finally:
            await engine.close()
        calls = fake.calls
    assert result.fallback and result.reply == GREETING
    assert result.error is not None and "past 300 chunks" in result.error, result.error
    assert calls == 1  # refused, not retried: the same server would send it again
    assert events.shown == GREETING
    [record] = turns(sql)
    assert record["fallback"] and "past 300 chunks" in record["error"]


# -- the pieces, without a model ------------------------------------------------------


@pytest.mark.parametrize(("text", "reply"), [
    ('', None), ('{"rep', None), ('{"updates": {"a": 1}', None), ('[1, 2', None),
    ('{"reply": "', ""), ('{"reply": "Hel', "Hel"), ('{"reply": "a\\', "a"),
    ('{"reply": "a\\u00', "a"), ('{"reply": "a\\ud83d', "a"), ('{"reply": "a\\ud83d\\ude00', "a😀"),
    ('```json\n{"reply": "fenced', "fenced"), ('{"reply": "done", "upd', "done"),
    ('{"updates": {}, "reply": "late', "late"), ('{"reply": 7', None),
    ('{"reply": "bidi \u202e trick', "bidi \ufffd trick"),
])
def test_partial_reply(text: str, reply: str | None) -> None:
    from engine.boundary.partial import partial_reply

    assert partial_reply(text) == reply


def test_the_reply_stream_keeps_the_listener_in_step() -> None:
    from engine.turn.stream import ReplyStream

    events = Events()
    stream = ReplyStream(events)
    for piece in ('{"reply": "He', 'llo'):
        stream.text(piece)
    stream.text("")  # a retry begins, and writes again what was shown
    for piece in ('{"reply": "He', 'l', 'lo there"}'):
        stream.text(piece)
    assert events == [("delta", "He"), ("delta", "llo"), ("delta", " there")]
    stream.rejected()
    stream.text("")  # the repair: its first bytes show nothing
    stream.text('{"reply": "')
    stream.text('Hi')
    stream.finish("Hi!")
    assert events[3:] == [("replace", "Hi"), ("delta", "!")]
    assert events.shown == "Hi!"
    stream.text("")  # a retry that writes another reply replaces what was shown
    stream.text('{"reply": " ')  # its leading spaces are not shown, as they are not saved
    stream.text(' Ho')
    assert events[5:] == [("replace", "Ho")]


def test_the_partial_reply_reads_each_piece_once_to_the_same_reply() -> None:
    """A character at a time or whole, with keys before the reply holding braces, quotes
    and escapes, an escape cut anywhere: the same reply."""
    from engine.boundary.partial import PartialReply, partial_reply

    envelope = json.dumps({"updates": {"pet": {"name": 'Bi"s}c\\uit', "x": [1, {"y": "]"}]}},
                           "a\\b": "{", "reply": "Hi 😀 \"there\"\n\u00e9!", "language": "en"},
                          ensure_ascii=True)
    whole = partial_reply(envelope)
    assert whole == "Hi 😀 \"there\"\n\u00e9!"
    reader = PartialReply()
    shown = "".join(reader.feed(c) for c in envelope)
    assert shown == reader.text == whole and reader.ended


def test_openai_event_streams_are_read_strictly() -> None:
    from engine.errors import ResponseRefused
    from engine.llm.sse import ChunkReader, ErrorEvent

    def chunk(content: str) -> bytes:
        return json.dumps({"choices": [{"index": 0, "delta": {"content": content}}]}).encode()

    reader = ChunkReader("m")
    body = (b": a comment\r\nevent: message\r\ndata: " + chunk("He") + b"\r\n\r\ndata: "
            + chunk("llo") + b"\n\ndata: {\"choices\": [], \"usage\": {\"prompt_tokens\": 7, "
            b"\"completion_tokens\": \"x\"}}\n\ndata: [DONE]\n\n")
    pieces = [p for i in range(len(body)) for p in reader.feed(body[i:i + 1])]  # byte by byte
    assert pieces == [("He", ""), ("llo", "")] and reader.done
    assert reader.response("Hello", "")["usage"] == {"prompt_tokens": 7}
    for bad, why in [(b"data: {nope\n\n", "not JSON"), (b"data: [1]\n\n", "not a JSON object"),
                     (b'data: {"choices": {"0": {}}}\n\n', "not a list"),
                     (b'data: {"choices": [{"delta": {"content": 5}}]}\n\n', "not a string")]:
        with pytest.raises(ResponseRefused, match=why):
            ChunkReader("m").feed(bad)
    with pytest.raises(ErrorEvent, match="overloaded"):
        ChunkReader("m").feed(b'data: {"error": {"message": "overloaded"}}\n\n')
    capped = ChunkReader("m", limit=2)
    with pytest.raises(ResponseRefused, match="past 2 chunks"):
        capped.feed(b"".join(b"data: " + chunk("x") + b"\n\n" for _ in range(3)))
