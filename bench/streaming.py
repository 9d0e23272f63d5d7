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

Without --db it uses $FUNNEL_DB, else the embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    parser.add_argument("--turns", type=int, default=30)
    args = parser.parse_args()
    with throwaway_schema(server_url(args.db)) as url:
        asyncio.run(run(url, args.turns))


if __name__ == "__main__":
    main()
