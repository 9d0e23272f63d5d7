"""What a provider's response may cost the worker: its decoded size and its token counts.

On the real litellm HTTP path against the loopback fakes:

- a gzip bomb (about 200 KB on the wire, 200 MB decoded, ``Content-Encoding: gzip``) is
  read up to :data:`engine.llm.bounded.MAX_RESPONSE_BYTES` and no further: the turn takes
  the stage's fallback, its record names the bound, it is not retried, the process's peak
  resident memory grows by far less than the bomb, and the next turn is answered. Through
  the OpenAI SDK's client (litellm's ``openai/`` route), streamed and not, and through
  litellm's own handler (the ``anthropic/`` route);
- usage figures no provider could mean (3e9 tokens, negative counts) keep the valid answer;
  the turn records them clamped to ``[0, MAX_CALL_TOKENS]`` and ``funnel_tokens_total``
  never decreases.

The peak is the kernel's ``VmHWM``, reset before the turn through ``/proc/self/clear_refs``
(Linux): a figure of memory, not of time.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import puramur_data, said
from fake_providers import FakeProvider
from test_litellm_path import close_litellm_clients, loopback_only  # noqa: F401
from test_providers import KEYS, happy_turns, open_engine

from engine.boundary.sanitize import MAX_CALL_TOKENS
from engine.llm.bounded import MAX_RESPONSE_BYTES
from engine.llm.sse import MAX_LINE_BYTES
from engine.service.metrics import Metrics

pytestmark = pytest.mark.postgres

SESSION = "rb-1"
BOMB_BYTES = 200 * 1024 * 1024
GROWTH_BOUND_KB = 50 * 1024  # what the bomb may add to the peak: a quarter of its size


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


@pytest.fixture(scope="module")
def retrying(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Puramur with two retries a call: a refused body must not use them."""
    data = puramur_data()
    data["model"].update(timeout=10, retries=2)
    path = tmp_path_factory.mktemp("bounds") / "puramur_retrying.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    return path


def gzip_bomb(prefix: bytes, suffix: bytes, size: int = BOMB_BYTES) -> bytes:
    """``prefix``, ``size`` spaces, ``suffix``, gzip-compressed (about 1,000 to 1)."""
    z = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = b" " * (1024 * 1024)
    parts = [z.compress(prefix)]
    parts += [z.compress(block) for _ in range(size // len(block))]
    parts += [z.compress(suffix), z.flush()]
    return b"".join(parts)


OPENAI_BOMB = (b'{"id":"chatcmpl-bomb","object":"chat.completion","created":0,"model":"m",'
               b'"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant",'
               b'"content":"{\\"reply\\": \\"', b'\\"}"}}],"usage":{"prompt_tokens":1,'
               b'"completion_tokens":1,"total_tokens":2}}')
ANTHROPIC_BOMB = (b'{"id":"msg_bomb","type":"message","role":"assistant","model":"m",'
                  b'"content":[{"type":"text","text":"', b'"}],"stop_reason":"end_turn",'
                  b'"usage":{"input_tokens":1,"output_tokens":1}}')
SSE_BOMB = (b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m",'
            b'"choices":[{"index":0,"delta":{"content":"', b'"}}]}\n\ndata: [DONE]\n\n')


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])  # kB
    raise AssertionError(f"no {key} in /proc/self/status")


def reset_peak() -> int:
    """Reset the process's peak RSS to its current RSS; return it (kB)."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status("VmRSS")


def turn_rows(sql: Any) -> list[dict[str, Any]]:
    cols = ("fallback", "attempts", "error", "prompt_tokens", "completion_tokens")
    rows = sql(f"SELECT {', '.join(cols)} FROM funnel_turns WHERE session_id = %s ORDER BY id",
               (SESSION,))
    return [dict(zip(cols, r, strict=True)) for r in rows]


class Events(list[tuple[str, str]]):
    def __call__(self, kind: str, text: str) -> None:
        self.append((kind, text))


CASES = {
    "openai": ("openai", "openai/gpt-4o-mini", OPENAI_BOMB, "application/json", False),
    "openai-streamed": ("openai", "openai/gpt-4o-mini", SSE_BOMB, "text/event-stream", True),
    "anthropic": ("anthropic", "anthropic/claude-sonnet-4-5", ANTHROPIC_BOMB,
                  "application/json", False),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_gzip_bomb_is_read_to_its_bound_and_no_further(
        case: str, retrying: Path, db_url: str, sql: Any) -> None:
    """Turn 1 is answered; turn 2 gets brotli, which the engine did not offer (only
    ``gzip, deflate``) and cannot decode under its bound: refused (and the failure path is
    warm: its first run imports and builds litellm's error types); turn 3 gets the bomb;
    turn 4 is answered."""
    wire, model, (prefix, suffix), content_type, streamed = CASES[case]
    bomb = gzip_bomb(prefix, suffix)
    assert len(bomb) < 300 * 1024  # about 200 KB on the wire
    (first, first_out), (second, second_out) = happy_turns(2)
    with FakeProvider(wire) as fake:
        engine = await open_engine(retrying, db_url, model, fake.api_base)
        try:
            # Every turn streams or none: litellm's first streamed call loads tiktoken's
            # encodings (about 100 MB), which is not the bomb's doing.
            listen = Events if streamed else lambda: None
            fake.reply(json.dumps(first_out))
            assert not (await engine.handle(SESSION, first, stream=listen())).fallback
            before = await engine.state(SESSION)
            fake.raw(b"\x1b\x00\x00", {"Content-Type": content_type, "Content-Encoding": "br"})
            brotli = await engine.handle(SESSION, second, stream=listen())
            fake.raw(bomb, {"Content-Type": content_type, "Content-Encoding": "gzip"})
            base = reset_peak()
            result = await engine.handle(SESSION, second, stream=listen())
            growth = _status("VmHWM") - base
            after = await engine.state(SESSION)
            calls = fake.calls
            # The next turn is answered as if nothing had happened.
            fake.reply(json.dumps(second_out))
            again = await engine.handle(SESSION, second, stream=listen())
        finally:
            await engine.close()
    assert before is not None and after is not None and after["stage"] == before["stage"]
    fallback = said(engine.funnel.stage(before["stage"]).spec.fallback, result.state)
    assert brotli.fallback and "Content-Encoding br" in (brotli.error or "")
    assert result.fallback and result.reply == fallback
    # A streamed bomb is one line: the event stream's bound on a line (1 MiB) stops it first.
    bound = MAX_LINE_BYTES if streamed else MAX_RESPONSE_BYTES
    assert "ResponseRefused" in (result.error or "") and f"{bound:,}" in (result.error or "")
    assert calls == 3  # one call a turn: the retries were not spent on refused bodies
    assert all(h.get("accept-encoding") == "gzip, deflate" for h in fake.headers)
    assert growth < GROWTH_BOUND_KB, f"peak RSS grew by {growth} kB"
    assert not again.fallback, again.error
    records = turn_rows(sql)
    assert [r["fallback"] for r in records] == [False, True, True, False]
    assert ("a line longer than" if streamed else "decoded past the engine's bound"
            ) in records[2]["error"]
    if streamed:
        assert fake.requests[2].get("stream") is True


async def test_a_compressed_answer_within_the_bound_is_read(
        retrying: Path, db_url: str, sql: Any) -> None:
    """The bound decodes what httpx would: a gzip answer of ordinary size is the answer."""
    (first, first_out), _ = happy_turns(1) * 2
    answer = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
              "choices": [{"index": 0, "finish_reason": "stop", "message": {
                  "role": "assistant", "content": json.dumps(first_out)}}],
              "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
    z = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    body = z.compress(json.dumps(answer).encode()) + z.flush()
    with FakeProvider("openai") as fake:
        engine = await open_engine(retrying, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            fake.raw(body, {"Content-Type": "application/json", "Content-Encoding": "gzip"})
            result = await engine.handle(SESSION, first)
        finally:
            await engine.close()
    assert not result.fallback, result.error
    assert result.reply == first_out["reply"]
    assert turn_rows(sql)[0]["prompt_tokens"] == 10


async def test_usage_no_provider_could_mean_keeps_the_answer_and_is_clamped(
        retrying: Path, db_url: str, sql: Any) -> None:
    """3e9 prompt tokens and a negative completion count: the answer is applied, the
    record holds [0, MAX_CALL_TOKENS], and funnel_tokens_total only grows."""
    turns = happy_turns(3)
    usages = [(3_000_000_000, -5), (-7, 3_000_000_000), (120, 30)]
    metrics = Metrics()
    totals: list[tuple[float, float]] = []
    with FakeProvider("openai") as fake:
        engine = await open_engine(retrying, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            for (text, output), (prompt, completion) in zip(turns, usages, strict=True):
                fake.reply(json.dumps(output), prompt_tokens=prompt,
                           completion_tokens=completion)
                result = await engine.handle(SESSION, text)
                assert not result.fallback, result.error
                assert result.reply == output["reply"]
                metrics.turn("puramur", result, 0.1)
                totals.append((  # (completion, prompt)
                    metrics.value("funnel_tokens_total", funnel="puramur", kind="completion"),
                    metrics.value("funnel_tokens_total", funnel="puramur", kind="prompt")))
        finally:
            await engine.close()
    records = turn_rows(sql)
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in records] == [
        (MAX_CALL_TOKENS, 0), (0, MAX_CALL_TOKENS), (120, 30)]
    assert all(not r["fallback"] for r in records)
    for earlier, later in zip(totals, totals[1:], strict=False):
        assert all(b >= a for a, b in zip(earlier, later, strict=True)), totals
    assert totals[-1] == (float(MAX_CALL_TOKENS + 30), float(MAX_CALL_TOKENS + 120))
