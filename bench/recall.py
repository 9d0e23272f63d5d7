"""The cost of semantic recall per turn, next to the same turn without it.

Puramur conversations with the offline scripted model (so that the model's own time
hides nothing), played twice on the same messages: recall off, and recall on with
the embedder ``openai/fake-embed`` through litellm's real HTTP path to the loopback
fake embeddings server of tests/fake_embeddings.py (a hashed bag of words, 256
dimensions). Per configuration: the turn's latency (p50, p99 of ``engine.handle``),
the client's CPU per turn (process time, the background embedding jobs included), and
the prompt's tokens (the documented estimate); with recall, how many turns recalled
something and the tokens that added. Each turn's background embedding job is waited
for after it, outside its latency (a quiet service), inside the CPU figure.

Then the search alone, per session size: pgvector's ``<=>`` against the ``real[]``
fallback (the dot product in SQL), on one session's embeddings, 256 and 1536
dimensions (random unit vectors).

    python bench/recall.py [--db URL] [--sessions 6] [--turns 30]

Without --db it uses the embedded PostgreSQL (it has pgvector); a server without
pgvector measures the fallback only. Compare within one run, never across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the fake embedder, as the tests run it
os.environ.setdefault("FUNNEL_ROOT", str(ROOT))  # the funnel copies read the repository's prompts

import psycopg  # noqa: E402
import yaml  # noqa: E402
from _db import server_url, throwaway_schema  # noqa: E402
from fake_embeddings import FakeEmbeddings  # noqa: E402

from engine import Engine, ScriptedModel  # noqa: E402
from engine.llm.embed import unit  # noqa: E402
from engine.memory.summary import ExtractiveSummarizer  # noqa: E402
from engine.store import recall as recall_sql  # noqa: E402
from engine.store.base import VectorSupport  # noqa: E402
from engine.store.migrate import apply_shared  # noqa: E402

FACTS = ["My dog Biscuit is allergic to chicken.", "We live in Lviv, delivery there please.",
         "Biscuit is a 3 year old beagle with itchy skin.", "My budget is about 800 hryvnias."]
ASKS = ["What was my dog allergic to again?", "Can you deliver to where we live?",
        "Which shampoo for his itchy skin?", "Does that fit my budget?"]


def message(turn: int) -> str:
    if turn < len(FACTS):
        return FACTS[turn]
    if turn % 5 == 0:
        return ASKS[(turn // 5) % len(ASKS)]
    return f"Question {turn}: which shampoo suits a long coat in winter, and how often?"


def funnel_file(folder: Path, api_base: str | None) -> Path:
    data: dict[str, Any] = yaml.safe_load((ROOT / "funnels" / "puramur.yaml").read_text())
    data["prompts"] = str(ROOT / "prompts" / "puramur")
    data["catalog"] = str(ROOT / "funnels" / "puramur" / "catalog.yaml")
    data["knowledge"]["folder"] = str(ROOT / "funnels" / "puramur" / "knowledge")
    if api_base:
        data["memory"]["recall"] = {"embedder": "openai/fake-embed", "api_base": api_base}
    path = folder / ("recall_on.yaml" if api_base else "recall_off.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    return path


async def play(path: Path, url: str, sessions: int, turns: int) -> dict[str, Any]:
    model = ScriptedModel.from_data({"default": {"reply": "Noted, thanks!"}})
    engine = await Engine.open(path, db=url, model=model, summarizer=ExtractiveSummarizer())
    latencies, tokens, recalled, mode = [], [], 0, "off"
    async with engine:
        if engine.recall is not None and engine.recall.vectors is not None:
            mode = engine.recall.vectors.mode
        await engine.handle("warm-up", "hello")  # litellm's first call builds its types
        await engine.drain()
        cpu = time.process_time()
        for t in range(turns):  # round-major: every turn reloads its row
            for s in range(sessions):
                started = time.perf_counter()
                result = await engine.handle(f"s{s}", message(t))
                latencies.append((time.perf_counter() - started) * 1000)
                tokens.append(result.prompt_tokens)
                recalled += bool(result.recalled)
                # The embedding job after the reply: in the CPU figure, not in the next
                # turn's latency (a quiet service; under load it shares the loop).
                await engine.drain()
        cpu = (time.process_time() - cpu) * 1000 / (turns * sessions)
    q = statistics.quantiles(latencies, n=100)
    return {"mode": mode, "p50": q[49], "p99": q[98], "cpu": cpu,
            "tokens": statistics.mean(tokens), "max_tokens": max(tokens),
            "recalled": recalled, "turns": len(latencies)}


async def search_times(url: str, sizes: list[int], dims: int, pgvector: bool
                       ) -> dict[int, float]:
    """ms per search of one session with ``size`` embedded messages."""
    out: dict[int, float] = {}
    rng = random.Random(7)
    with throwaway_schema(url) as schema_url:
        async with await psycopg.AsyncConnection.connect(schema_url, autocommit=True) as conn:
            await apply_shared(conn)
            vs = await recall_sql.prepare(conn) if pgvector else VectorSupport("array")
            for size in sizes:
                session = f"n{size}"
                rows = await (await conn.execute(
                    "INSERT INTO funnel_messages (funnel, session_id, role, content) SELECT "
                    "'bench', %s, CASE WHEN g %% 2 = 0 THEN 'user' ELSE 'assistant' END, "
                    "'message ' || g FROM generate_series(1, %s) g RETURNING id",
                    (session, size))).fetchall()
                vectors = [(int(r[0]), unit([rng.gauss(0, 1) for _ in range(dims)]))
                           for r in rows]
                await recall_sql.save(conn, "bench", "m", vectors)
                await conn.execute("ANALYZE funnel_embeddings")
                query = unit([rng.gauss(0, 1) for _ in range(dims)])
                upto = max(i for i, _ in vectors) - 8

                async def one(q: list[float] = query, s: str = session, u: int = upto) -> None:
                    await recall_sql.search(conn, vs, "bench", s, "m", q, upto=u, top_k=5,
                                            before=2, after=1, min_similarity=-1)

                await one()
                started = time.perf_counter()
                for _ in range(20):
                    await one()
                out[size] = (time.perf_counter() - started) * 1000 / 20
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run (tests/test_bench_smoke.py): one search size")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    url = server_url(args.db)
    with FakeEmbeddings() as fake, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        results = {}
        for name, base in (("off", None), ("on", fake.api_base)):
            with throwaway_schema(url) as schema_url:
                results[name] = await play(funnel_file(folder, base), schema_url,
                                           args.sessions, args.turns)
        calls = len(fake.requests)
    off, on = results["off"], results["on"]
    print(f"{on['turns']} turns each ({args.sessions} sessions x {args.turns}), scripted "
          f"model, fake embedder on loopback; recall on uses {on['mode']}")
    print("            p50 ms   p99 ms   CPU ms/turn   prompt tokens (mean, max)")
    for name, r in (("recall off", off), ("recall on", on)):
        print(f"{name:<11} {r['p50']:7.2f}  {r['p99']:7.2f}  {r['cpu']:11.2f}   "
              f"{r['tokens']:7.1f}  {r['max_tokens']:5d}")
    print(f"added: p50 {on['p50'] - off['p50']:+.2f} ms, p99 {on['p99'] - off['p99']:+.2f} ms,"
          f" CPU {on['cpu'] - off['cpu']:+.2f} ms/turn, prompt {on['tokens'] - off['tokens']:+.1f}"
          f" tokens/turn on average ({on['recalled']} of {on['turns']} turns recalled "
          f"something); embedding requests: {calls} ({calls / on['turns']:.2f} a turn)")
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        has_pgvector = (await recall_sql.support(conn))[1]
    sizes = [50] if args.smoke else [50, 200, 1000, 5000]
    print("\nsearch of one session (top 5, 2 before, 1 after), ms per search:")
    print("dims  messages  " + ("pgvector  " if has_pgvector else "") + "real[] fallback")
    for dims in (256,) if args.smoke else (256, 1536):
        fallback = await search_times(url, sizes, dims, pgvector=False)
        native = await search_times(url, sizes, dims, pgvector=True) if has_pgvector else {}
        for size in sizes:
            row = f"{dims:4d}  {size:8d}  "
            if has_pgvector:
                row += f"{native[size]:8.2f}  "
            print(row + f"{fallback[size]:8.2f}")


if __name__ == "__main__":
    asyncio.run(main())
