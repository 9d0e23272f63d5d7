"""Per-turn engine overhead on PostgreSQL, next to raw psycopg baselines measured in the same run.

The engine runs the Puramur funnel's full turn with a zero-latency scripted
model: the user's message committed first (with the session's lease), then the
state UPSERT, the assistant message and the turn record in a second commit
(plus the window query, prompt rendering, schema validation and the stage
machine). Two baselines do one SELECT and one UPSERT of a comparable JSONB row
per turn:

* ``raw autocommit``: the SELECT and the UPSERT as two autocommit statements
  (two round trips, one commit; the read and the write are not atomic, so two
  concurrent turns of one session can lose an update);
* ``raw transaction``: the same read-modify-write done safely, ``SELECT ... FOR
  UPDATE`` and the UPSERT in one transaction (BEGIN, SELECT, UPSERT, COMMIT:
  four round trips, one commit), which is what a hand-written turn needs.

    python bench/turn_overhead.py [--db URL] [--sessions 200] [--turns 10] [--rounds 5]

Without --db it uses $FUNNEL_DB, else the embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from _db import server_url, throwaway_schema  # noqa: E402
from psycopg.types.json import Jsonb  # noqa: E402
from psycopg_pool import AsyncConnectionPool  # noqa: E402

from engine import Engine, ScriptedModel, load_funnel  # noqa: E402
from engine.store import open_store  # noqa: E402

BASELINE_DDL = """
CREATE TABLE IF NOT EXISTS bench_raw_state (
    session_id TEXT PRIMARY KEY, stage TEXT NOT NULL, stage_iteration INT NOT NULL,
    stage_history JSONB NOT NULL, customer JSONB NOT NULL, pet JSONB NOT NULL,
    cart JSONB NOT NULL, cart_total NUMERIC(10,2) NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT NOW())
"""
UPSERT = """
INSERT INTO bench_raw_state (session_id, stage, stage_iteration, stage_history, customer, pet,
                             cart, cart_total)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (session_id) DO UPDATE SET stage = EXCLUDED.stage,
  stage_iteration = EXCLUDED.stage_iteration, stage_history = EXCLUDED.stage_history,
  customer = EXCLUDED.customer, pet = EXCLUDED.pet, cart = EXCLUDED.cart,
  cart_total = EXCLUDED.cart_total, updated_at = NOW()
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def baseline_turn(pool: AsyncConnectionPool, sid: str) -> None:
    async with pool.connection() as conn:
        row = await (await conn.execute("SELECT * FROM bench_raw_state WHERE session_id = %s",
                                        (sid,))).fetchone()
        it = (row[2] + 1) if row else 0
        await conn.execute(UPSERT, (sid, "discovery", it, Jsonb([{"stage": "greeting"}]),
                                    Jsonb({"name": "Anna"}), Jsonb({"type": "cat"}), Jsonb([]), 0))


async def baseline_tx_turn(pool: AsyncConnectionPool, sid: str) -> None:
    async with pool.connection() as conn, conn.transaction():
        row = await (await conn.execute(
            "SELECT * FROM bench_raw_state WHERE session_id = %s FOR UPDATE", (sid,))).fetchone()
        it = (row[2] + 1) if row else 0
        await conn.execute(UPSERT, (sid, "discovery", it, Jsonb([{"stage": "greeting"}]),
                                    Jsonb({"name": "Anna"}), Jsonb({"type": "cat"}), Jsonb([]), 0))


async def run_baseline(url: str, sessions: list[str], turns: int, workers: int,
                       transaction: bool = False) -> tuple[list[float], float]:
    async with AsyncConnectionPool(url, min_size=workers, max_size=workers,
                                   kwargs={"autocommit": True}) as pool:
        async with pool.connection() as conn:
            await conn.execute(BASELINE_DDL)
            await conn.execute("TRUNCATE bench_raw_state")
        turn = baseline_tx_turn if transaction else baseline_turn
        return await drive(lambda sid: turn(pool, sid), sessions, turns, workers)


async def drive(turn: Any, sessions: list[str], turns: int, workers: int
                ) -> tuple[list[float], float]:
    """Run `turns` turns for every session with `workers` concurrent sessions at a time."""
    latencies: list[float] = []
    queue: asyncio.Queue[str] = asyncio.Queue()
    for s in sessions:
        queue.put_nowait(s)

    async def worker() -> None:
        while not queue.empty():
            sid = queue.get_nowait()
            for _ in range(turns):
                t0 = time.perf_counter()
                await turn(sid)
                latencies.append((time.perf_counter() - t0) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return latencies, len(latencies) / (time.perf_counter() - started)


async def run_engine(url: str, sessions: list[str], turns: int, workers: int
                     ) -> tuple[list[float], float]:
    funnel = load_funnel(ROOT / "funnels" / "puramur.yaml")
    model = ScriptedModel.from_data({"default": {"reply": "Tell me more about your pet."}})
    store = await open_store(url, max_connections=max(2, workers), max_turns=workers)
    engine = await Engine.open(funnel, model=model, store=store)
    try:
        return await drive(lambda sid: engine.handle(sid, "My cat has dry skin"), sessions,
                           turns, workers)
    finally:
        await engine.close()  # waits for background work; the store is ours to close
        await store.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    url = server_url(args.db)
    with throwaway_schema(url) as url_s:
        await measure(args, url, url_s)


async def measure(args: argparse.Namespace, url: str, url_s: str) -> None:
    print(f"PostgreSQL: {psycopg.conninfo.conninfo_to_dict(url).get('host')}; "
          f"{args.sessions} sessions x {args.turns} turns = {args.sessions * args.turns} turns "
          f"per measurement; median of {args.rounds} rounds")
    names = {"autocommit": "raw autocommit", "transaction": "raw transaction",
             "engine": "engine"}
    for workers in (1, 8):
        results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in names}
        for r in range(args.rounds):
            tag = f"r{r}w{workers}"
            sessions = [f"{tag}-{i}" for i in range(args.sessions)]
            lat, tps = await run_baseline(url_s, sessions, args.turns, workers)
            results["autocommit"].append((pct(lat, 0.5), pct(lat, 0.99), tps))
            lat, tps = await run_baseline(url_s, sessions, args.turns, workers, transaction=True)
            results["transaction"].append((pct(lat, 0.5), pct(lat, 0.99), tps))
            lat, tps = await run_engine(url_s, sessions, args.turns, workers)
            results["engine"].append((pct(lat, 0.5), pct(lat, 0.99), tps))
        print(f"\n{workers} concurrent session(s):")
        print(f"  {'':16} {'p50 ms':>8} {'p99 ms':>8} {'turns/s':>9}")
        med = {}
        for key, rows in results.items():
            med[key] = tuple(statistics.median(x[i] for x in rows) for i in range(3))
            p50, p99, tps = med[key]
            print(f"  {names[key]:16} {p50:8.2f} {p99:8.2f} {tps:9.0f}")
        for key in ("autocommit", "transaction"):
            ratio_p50 = med["engine"][0] / med[key][0]
            ratio_tps = med["engine"][2] / med[key][2]
            print(f"  engine / {names[key]}: p50 x{ratio_p50:.2f}, throughput x{ratio_tps:.2f}")
    print("\ntargets: p50 at most x2.00 with one session; throughput at least x0.50 "
          "with 8 concurrent sessions")


if __name__ == "__main__":
    asyncio.run(main())
