"""Throughput, p99 latency and lost updates under concurrency, two worker processes.

Two processes serve the same sessions at once (as two service workers behind
a load balancer would): each runs, for every one of C sessions, T turns in a
row, with a scripted model that sleeps 200 ms per call, so every session gets
two concurrent streams of messages. Printed side by side, from the same run:

* ``naive``  -- the seed's LOAD -> model -> UPSERT with raw psycopg and no lock;
* ``engine`` -- the funnel engine (per-session advisory lock, version check).

Lost updates are counted from the database: each turn increments a counter,
so a session must end at 2*T; anything less was overwritten by a stale save.

    python bench/concurrency.py [--db URL] [--turns 5] [--levels 1,8,32,128] [--sleep 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
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

NAIVE_DDL = ("CREATE TABLE IF NOT EXISTS naive_state (session_id TEXT PRIMARY KEY, "
             "turns INT NOT NULL, pet JSONB NOT NULL)")
NAIVE_UPSERT = ("INSERT INTO naive_state (session_id, turns, pet) VALUES (%s, %s, %s) "
                "ON CONFLICT (session_id) DO UPDATE SET turns = EXCLUDED.turns, pet = EXCLUDED.pet")


async def worker_naive(url: str, sessions: list[str], turns: int, sleep: float,
                       pool_size: int) -> list[float]:
    latencies: list[float] = []
    async with AsyncConnectionPool(url, min_size=1, max_size=pool_size,
                                   kwargs={"autocommit": True}) as pool:
        async def session(sid: str) -> None:
            for _ in range(turns):
                t0 = time.perf_counter()
                async with pool.connection() as conn:
                    row = await (await conn.execute(
                        "SELECT turns FROM naive_state WHERE session_id = %s", (sid,))).fetchone()
                await asyncio.sleep(sleep)  # the model thinks
                async with pool.connection() as conn:
                    await conn.execute(NAIVE_UPSERT, (sid, (row[0] if row else 0) + 1,
                                                      Jsonb({"type": "cat"})))
                latencies.append((time.perf_counter() - t0) * 1000)

        await asyncio.gather(*(session(s) for s in sessions))
    return latencies


class SleepyModel:
    name = "scripted-sleep"

    def __init__(self, sleep: float) -> None:
        from engine import ScriptedModel

        self.sleep = sleep
        self.inner = ScriptedModel.from_data({"default": {"reply": "Tell me more."}})

    async def complete(self, request: Any) -> Any:
        await asyncio.sleep(self.sleep)
        return await self.inner.complete(request)


async def worker_engine(url: str, sessions: list[str], turns: int, sleep: float,
                        pool_size: int) -> list[float]:
    from engine import Engine, load_funnel
    from engine.store import open_store

    store = await open_store(url, max_connections=4, max_turns=pool_size)
    engine = await Engine.open(load_funnel(ROOT / "funnels" / "puramur.yaml"),
                               model=SleepyModel(sleep), store=store)
    latencies: list[float] = []

    async def session(sid: str) -> None:
        for _ in range(turns):
            t0 = time.perf_counter()
            await engine.handle(sid, "My cat has dry skin")
            latencies.append((time.perf_counter() - t0) * 1000)

    try:
        await asyncio.gather(*(session(s) for s in sessions))
    finally:
        await engine.close()  # waits for background work; the store is ours to close
        await store.close()
    return latencies


def run_worker(args: argparse.Namespace) -> None:
    sessions = [f"{args.tag}-{i}" for i in range(args.sessions)]
    fn = worker_engine if args.worker == "engine" else worker_naive
    t0 = time.perf_counter()
    lat = asyncio.run(fn(args.db, sessions, args.turns, args.sleep, args.pool))
    print(json.dumps({"latencies": lat, "elapsed": time.perf_counter() - t0}))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(kind: str, url: str, sessions: int, turns: int, sleep: float, pool: int,
            tag: str) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--worker", kind, "--db", url, "--sessions", str(sessions),
           "--turns", str(turns), "--sleep", str(sleep), "--pool", str(pool), "--tag", tag]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    wall = time.perf_counter() - t0
    if any(p.returncode for p in procs):
        raise SystemExit(f"a {kind} worker failed")
    lat = [x for o in outs for x in o["latencies"]]
    elapsed = max(o["elapsed"] for o in outs)
    with psycopg.connect(url, autocommit=True) as conn:
        if kind == "engine":
            q = "SELECT COALESCE(SUM(turns), 0) FROM puramur_sessions_state WHERE session_id LIKE %s"
        else:
            q = "SELECT COALESCE(SUM(turns), 0) FROM naive_state WHERE session_id LIKE %s"
        saved = conn.execute(q, (f"{tag}-%",)).fetchone()[0]  # type: ignore[index]
    return {"tps": len(lat) / elapsed, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99),
            "lost": 2 * sessions * turns - int(saved), "turns": len(lat), "wall": wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--levels", default="1,8,32,128")
    ap.add_argument("--sleep", type=float, default=0.2)
    ap.add_argument("--pool", type=int, default=40, help="turns in flight per worker (max_turns)")
    ap.add_argument("--worker", choices=["engine", "naive"])
    ap.add_argument("--sessions", type=int, default=1)
    ap.add_argument("--tag", default="x")
    args = ap.parse_args()
    if args.worker:
        run_worker(args)
        return
    with throwaway_schema(server_url(args.db)) as url_s:
        run_levels(args, url_s)


def run_levels(args: argparse.Namespace, url_s: str) -> None:
    with psycopg.connect(url_s, autocommit=True) as conn:
        conn.execute(NAIVE_DDL.encode())
        max_conn = conn.execute("SHOW max_connections").fetchone()[0]  # type: ignore[index]
    asyncio.run(_prepare(url_s))
    print(f"2 worker processes; model sleeps {args.sleep * 1000:.0f} ms per call; each worker "
          f"runs {args.turns} turns per session, so every session gets 2 concurrent streams; "
          f"turns in flight per worker at most {args.pool}; server max_connections={max_conn}")
    print(f"{'sessions':>8} | {'naive t/s':>9} {'p99 ms':>8} {'lost':>5} | "
          f"{'engine t/s':>10} {'p99 ms':>8} {'lost':>5}")
    for level in [int(x) for x in args.levels.split(",")]:
        tag = f"c{level}"
        n = measure("naive", url_s, level, args.turns, args.sleep, args.pool, tag)
        e = measure("engine", url_s, level, args.turns, args.sleep, args.pool, tag)
        print(f"{level:8d} | {n['tps']:9.1f} {n['p99']:8.0f} {n['lost']:5d} | "
              f"{e['tps']:10.1f} {e['p99']:8.0f} {e['lost']:5d}", flush=True)


async def _prepare(url: str) -> None:
    from engine import Engine, ScriptedModel

    engine = await Engine.open(ROOT / "funnels" / "puramur.yaml", db=url,
                               model=ScriptedModel.from_data({"default": {"reply": "x"}}))
    await engine.close()


if __name__ == "__main__":
    main()
