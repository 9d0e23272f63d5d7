"""Knowledge search on 10,000 chunks: the engine's full-text search vs. a plain indexed SELECT.

Indexes 10,000 synthetic care-note chunks (breeds x problems x topics, about
60-120 tokens each, the shape of Puramur's knowledge folder) for one funnel in a
throwaway schema, then runs, from the same run and the same pooled store:

* ``search``   -- `Store.knowledge_search`, what a stage with `knowledge` runs
  once a turn: the customer's message and the known facts ORed into a tsquery
  under the funnel's text search configuration, ranked with ``ts_rank_cd``;
* ``baseline`` -- a plain SELECT of one chunk by its primary key (the cheapest
  round trip the table allows).

Prints p50/p95 in milliseconds for both. Target: search p95 under 20 ms on the
embedded PostgreSQL (the default; ``--db URL`` or $FUNNEL_DB for another server).

    python bench/knowledge.py [--db URL] [--chunks 10000] [--queries 500]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _db import server_url, throwaway_schema  # noqa: E402

from engine.knowledge.chunks import estimate  # noqa: E402
from engine.records.chunks import Chunk  # noqa: E402
from engine.store import open_store  # noqa: E402
from engine.store.postgres import PostgresStore  # noqa: E402

BREEDS = ["Sphynx", "Persian", "Maine Coon", "British Shorthair", "Siamese", "Ragdoll",
          "Bengal", "Yorkshire Terrier", "Maltipoo", "Pomeranian", "Golden Retriever",
          "French Bulldog", "Poodle", "Husky", "Dachshund", "Beagle", "Corgi", "Shih Tzu",
          "Chihuahua", "Labrador"]
PROBLEMS = ["dry skin", "sensitive skin", "dull coat", "shedding", "tangles", "odor",
            "dandruff", "light coat", "itching", "oily skin"]
TOPICS = ["bathing", "brushing", "drying", "diet", "seasons", "puppies and kittens",
          "products", "when to see a vet"]
WORDS = ("gentle lukewarm water rinse shampoo conditioner lotion spray comb brush undercoat "
         "weekly monthly daily towel dryer fragrance natural formula flakes redness mats "
         "knots shine oil moisture winter summer indoor outdoor patch test").split()
QUERIES = ["my {b} has {p}", "what helps with {p}?", "{b} {p} what shampoo",
           "how often to bathe a {b}", "is it ok for {p} in winter",
           "recommend something for {p} please", "{b}"]


def synthetic(n: int, rng: random.Random) -> list[Chunk]:
    out = []
    for i in range(n):
        b, p, t = BREEDS[i % len(BREEDS)], rng.choice(PROBLEMS), rng.choice(TOPICS)
        body = (f"For a {b} with {p}, {t}: "
                + " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 90))) + ".")
        title = f"{b} > {p} > {t}"
        out.append(Chunk(f"synthetic/{i:05d}#{p.replace(' ', '-')}", "synthetic.md", title,
                         body, estimate(title + body)))
    return out


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1]


async def run(url: str, chunks: int, queries: int) -> None:
    rng = random.Random(17)
    store = await open_store(url)
    assert isinstance(store, PostgresStore)
    try:
        await store.ensure_schema(_spec())
        data = synthetic(chunks, rng)
        start = time.perf_counter()
        config = await store.knowledge_replace("bench", data, "bench", "en")
        print(f"indexed {len(data)} chunks in {time.perf_counter() - start:.1f} s "
              f"(configuration {config})")
        async with store._conn() as conn:  # planner statistics, as autovacuum would
            await conn.execute("ANALYZE funnel_knowledge")
        texts = [rng.choice(QUERIES).format(b=rng.choice(BREEDS), p=rng.choice(PROBLEMS))
                 + " " + rng.choice(BREEDS) + " " + rng.choice(PROBLEMS)  # + the facts
                 for _ in range(queries)]
        ids = [rng.choice(data).id for _ in range(queries)]
        search, baseline, hits = [], [], 0
        for _ in range(20):  # warm the pool and the caches
            await store.knowledge_search("bench", texts[0], 12)
        for text, key in zip(texts, ids, strict=True):
            t0 = time.perf_counter()
            found = await store.knowledge_search("bench", text, 12)
            t1 = time.perf_counter()
            async with store._conn() as conn:
                await (await conn.execute(
                    "SELECT id, title, body, tokens FROM funnel_knowledge "
                    "WHERE funnel = %s AND id = %s", ("bench", key))).fetchone()
            t2 = time.perf_counter()
            search.append((t1 - t0) * 1000)
            baseline.append((t2 - t1) * 1000)
            hits += bool(found)
        print(f"{queries} queries, {hits} with results")
        print(f"{'':10}{'p50 ms':>9}{'p95 ms':>9}")
        for name, values in (("search", search), ("baseline", baseline)):
            print(f"{name:10}{statistics.median(values):>9.2f}{pct(values, 95):>9.2f}")
        verdict = "ok" if pct(search, 95) < 20 else "OVER the 20 ms target"
        print(f"search p95 {pct(search, 95):.2f} ms: {verdict}")
    finally:
        await store.close()


def _spec():  # type: ignore[no-untyped-def]
    from engine.funnel.compiled import load_funnel

    return load_funnel(ROOT / "funnels" / "puramur.yaml").spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=500)
    args = parser.parse_args()
    with throwaway_schema(server_url(args.db)) as url:
        asyncio.run(run(url, args.chunks, args.queries))


if __name__ == "__main__":
    main()
