"""Time to the first streamed character of a reply, next to the model's own first token.

The Puramur funnel's greeting turn runs with ``Engine.handle(..., stream=listener)`` on
the real litellm HTTP path against the loopback fake OpenAI server
(tests/fake_openai.py), which streams its answer as OpenAI's chunks
(tests/fake_stream.py, 6 characters a chunk). Per turn, three clocks on one process:

* ``model first token``: when the fake wrote the first chunk that carries reply text
  (the model's own time to first token, from the turn's start);
* ``first streamed char``: when the listener got its first ``delta`` (from the turn's
  start: the turn's load and prompt, litellm, the partial-JSON read);
* ``difference``: the second minus the first: what streaming adds after the model
  wrote its first token (issue 32's target: within 30 ms).

Baseline from the same run: a bare ``litellm.acompletion(stream=True)`` to the same
server, request to its first content chunk (no engine at all).

    python bench/streaming.py [--db URL] [--turns 30]
    python bench/streaming.py --api-base http://127.0.0.1:8090/v1 --model openai/smollm2

With ``--api-base`` the turns go to a real OpenAI-compatible server (a local
llama.cpp: ``python -m llama_cpp.server --model SmolLM2-135M-Instruct.Q4_1.gguf
--model_alias smollm2 --port 8090``) through a loopback timing proxy
(:class:`TimingProxy`) that passes every byte on and notes when the server's first
chunk carrying reply text came through it: the model's own first token, on the
same turn. The baseline is then the same request (the engine's last prompt, schema
and settings, as the proxy saw it) sent raw, streamed, straight to the server
(stdlib ``http.client``: no litellm, no engine), to its first reply character.

Without --db it uses $FUNNEL_DB, else the embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from _db import server_url, throwaway_schema  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402
from fake_stream import Stream  # noqa: E402

from engine.llm.models import LiteLLMModel  # noqa: E402
from engine.turn.engine import Engine  # noqa: E402

ENVELOPE = {"reply": "Hello! I'm the Puramur consultant. Is your pet a cat or a dog? "
            "Tell me a little about them.", "language": "en"}
REPLY_STARTS = len('{"reply": "')  # the text before the first reply character


def ms(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(values) * 1000:7.2f} ms   p95 {p95 * 1000:7.2f} ms"


async def bare(fake: FakeOpenAI, model: LiteLLMModel, turns: int) -> list[float]:
    litellm = model._litellm
    found = []
    for _ in range(turns):
        fake.reply(json.dumps(ENVELOPE))
        started = time.perf_counter()
        first = None
        stream = await litellm.acompletion(
            model="openai/gpt-4o-mini", api_base=fake.api_base, api_key="sk-bench",
            messages=[{"role": "user", "content": "Hi!"}], stream=True)
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - started
        found.append(first if first is not None else float("nan"))
    return found


async def run(url: str, turns: int) -> None:
    os.environ.setdefault("OPENAI_API_KEY", "sk-bench")
    with FakeOpenAI() as fake:
        model = LiteLLMModel("openai/gpt-4o-mini", api_base=fake.api_base)
        engine = await Engine.open(ROOT / "funnels" / "puramur.yaml", db=url, model=model)
        model_first, engine_first, gap = [], [], []
        try:
            for i in range(turns + 3):  # 3 warm-up turns (imports, first connections)
                marks: list[tuple[float, int]] = []
                fake.reply(json.dumps(ENVELOPE), stream=Stream(marks=marks))
                seen: list[float] = []
                started = time.perf_counter()
                await engine.handle(f"bench-stream-{i}", "Hi!",
                                    stream=lambda kind, text, seen=seen: seen.append(
                                        time.perf_counter()))
                token = next(t for t, sent in marks if sent > REPLY_STARTS)
                if i >= 3:
                    model_first.append(token - started)
                    engine_first.append(seen[0] - started)
                    gap.append(seen[0] - token)
            baseline = await bare(fake, model, turns)
        finally:
            await engine.close()
            await model.aclose()
    print(f"streamed greeting turns on the loopback fake OpenAI server, {turns} turns")
    print(f"  model first token (from the turn's start)     {ms(model_first)}")
    print(f"  first streamed char (from the turn's start)   {ms(engine_first)}")
    print(f"  difference (first char - model first token)   {ms(gap)}")
    print(f"  baseline: bare litellm stream, first content  {ms(baseline)}")


def reply_started(events: list[bytes]) -> bool:
    """Whether the SSE lines so far carry the first character of the envelope's reply."""
    text = ""
    for line in events:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        try:
            chunk = json.loads(line[6:])
        except ValueError:
            continue
        for choice in chunk.get("choices") or []:
            text += (choice.get("delta") or {}).get("content") or ""
    at = text.find('"reply"')
    if at < 0:
        return False
    rest = text[at + len('"reply"'):].lstrip()
    return rest.startswith(":") and len(rest[1:].lstrip()) > 1  # the quote and a character


class TimingProxy:
    """A loopback HTTP proxy to ``upstream`` that streams every response on as it comes,
    and notes when the first reply character of each streamed answer passed through."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.first_token: list[float] = []  # per streamed request, perf_counter()
        self.last_body: dict[str, Any] | None = None
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the body ends when the connection closes

            def log_message(self, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                self._forward(None)

            def do_POST(self) -> None:
                self._forward(self.rfile.read(int(self.headers.get("Content-Length", 0))))

            def _forward(self, body: bytes | None) -> None:
                upstream = http.client.HTTPConnection(proxy.host, proxy.port, timeout=600)
                path = proxy.prefix + self.path.removeprefix("/v1")
                headers = {"Content-Type": "application/json"}
                upstream.request(self.command, path, body=body, headers=headers)
                answer = upstream.getresponse()
                streamed = False
                if body:
                    sent = json.loads(body)
                    streamed = bool(sent.get("stream"))
                    if streamed:
                        proxy.last_body = sent
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.end_headers()
                lines: list[bytes] = []
                noted = False
                while True:
                    line = answer.readline()
                    if not line:
                        break
                    if streamed and not noted:
                        lines.append(line)
                        if reply_started(lines):
                            proxy.first_token.append(time.perf_counter())
                            noted = True
                    try:
                        self.wfile.write(line)
                        self.wfile.flush()
                    except BrokenPipeError:  # the client gave up (its deadline)
                        break
                upstream.close()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.api_base = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> TimingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def raw_first_char(api_base: str, body: dict[str, Any]) -> float:
    """The engine's request sent raw, streamed, to the server: seconds to the first
    reply character (the model's own time to first token, no client library)."""
    parts = urlsplit(api_base)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80,
                                      timeout=600)
    started = time.perf_counter()
    conn.request("POST", parts.path.rstrip("/") + "/chat/completions",
                 body=json.dumps({**body, "stream": True}),
                 headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    lines: list[bytes] = []
    first = float("nan")
    while True:
        line = answer.readline()
        if not line:
            break
        lines.append(line)
        if reply_started(lines):
            first = time.perf_counter() - started
            break
    conn.close()
    return first


async def run_upstream(url: str, turns: int, api_base: str, name: str, funnel: Path
                       ) -> None:
    """The greeting turn streamed from a real server, through :class:`TimingProxy`."""
    os.environ.setdefault("OPENAI_API_KEY", "sk-local")  # a local server needs none
    with TimingProxy(api_base) as proxy:
        model = LiteLLMModel(name, api_base=proxy.api_base)
        engine = await Engine.open(funnel, db=url, model=model)
        model_first, engine_first, gap, raw = [], [], [], []
        try:
            for i in range(turns + 1):  # 1 warm-up turn (imports, the strategy probe)
                seen: list[float] = []
                proxy.first_token.clear()
                started = time.perf_counter()
                result = await engine.handle(f"bench-stream-{i}", "Hi!",
                                             stream=lambda kind, text, seen=seen: seen.append(
                                                 time.perf_counter()))
                if i == 0 or not seen or not proxy.first_token:
                    if i:
                        print(f"  turn {i}: nothing streamed (fallback {result.fallback}, "
                              f"{result.error})")
                    continue
                token = proxy.first_token[-1]  # a repair streams again: the last answer's
                model_first.append(token - started)
                engine_first.append(seen[0] - started)
                gap.append(seen[0] - token)
                assert proxy.last_body is not None
                raw.append(await asyncio.to_thread(raw_first_char, api_base, proxy.last_body))
        finally:
            await engine.close()
            await model.aclose()
    print(f"streamed greeting turns, {name} at {api_base} (through a loopback timing "
          f"proxy), {len(gap)} of {turns} turns streamed")
    if gap:
        print(f"  model first token (from the turn's start)     {ms(model_first)}")
        print(f"  first streamed char (from the turn's start)   {ms(engine_first)}")
        print(f"  difference (first char - model first token)   {ms(gap)}")
        print(f"  baseline: the same request raw, first char    {ms(raw)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--api-base", default=None, metavar="URL",
                        help="a real OpenAI-compatible server (default: the loopback fake)")
    parser.add_argument("--model", default="openai/smollm2",
                        help="with --api-base: the litellm model string")
    parser.add_argument("--funnel", default=str(ROOT / "funnels" / "puramur.yaml"),
                        help="with --api-base: the funnel (a slow local model needs a "
                        "longer `model.deadline` than Puramur's 20 s)")
    args = parser.parse_args()
    with throwaway_schema(server_url(args.db)) as url:
        if args.api_base:
            asyncio.run(run_upstream(url, args.turns, args.api_base, args.model,
                                     Path(args.funnel)))
        else:
            asyncio.run(run(url, args.turns))


if __name__ == "__main__":
    main()
