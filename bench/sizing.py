"""Sizing a deployment: what N conversations a day cost, from figures measured in this run.

    python bench/sizing.py [--db URL] [--daily 10000] [--conversations 40]
                           [--peak-share 0.15] [--model-seconds 1.5] [--retention-days 90]
                           [--utilisation 0.6] [--worker-pss 200]

Plays ``--conversations`` Puramur conversations in Ukrainian (bench/tokens.py's 12-turn
script: greeting, the pet, products, questions, the cart with its gift, the contact, the
hand-off) through the real engine and PostgreSQL with the scripted model, and measures
per turn and per conversation:

* the engine's client CPU (process time: what bounds a worker; the HTTP layer adds
  about 10% more, bench/api_overhead.py) and the turn's wall time without a model;
* WAL bytes and the database's growth (every table and index of the funnel's schema:
  the session row, the message log, the turn records, the outbox);
* input and output tokens, counted with gpt-4o-mini's tokenizer (litellm.token_counter),
  and their price from litellm's shipped price map; next to them, the baseline of the
  seed's window-buffer shape (one system prompt with every stage and the catalog, plus
  the last 10 messages) on the same conversations.

Then it sizes ``--daily`` conversations a day. The figures it cannot measure here are
parameters, printed with the result: the busiest hour's share of the day's turns
(``--peak-share``), the model's latency (``--model-seconds``: a turn holds no database
connection while the model thinks, so it sets only how many turns are in flight), the
CPU utilisation to plan for, the retention of personal data and rows, and a worker's
proportional memory (``--worker-pss``, MB: bench/start.py measures it; 193 MB there
with 2 workers forked from a preloaded master, the master 209 MB).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import psycopg  # noqa: E402
from _db import server_url, throwaway_schema  # noqa: E402
from prompt_growth import Recorder, baseline_system_prompt  # noqa: E402
from realistic_turn import db_counters  # noqa: E402
from tokens import conversation  # noqa: E402

from engine import Engine  # noqa: E402

MODEL = "gpt-4o-mini"
TURNS = 12  # the conversation's turns (bench/tokens.py's script)


async def play(url: str, n: int) -> dict[str, Any]:
    """Plays ``n`` conversations; what they cost the engine and the database."""
    script = conversation("uk", TURNS)
    system = baseline_system_prompt()
    baseline: list[list[dict[str, str]]] = []
    outputs: list[str] = []
    walls: list[float] = []
    cpu = 0.0
    model = Recorder(script * (n + 1))  # the conversations are played one after another
    engine = await Engine.open(ROOT / "funnels" / "puramur.yaml", db=url, model=model)
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            for c in range(n + 1):  # the first conversation warms up, and is not counted
                if c == 1:
                    await asyncio.sleep(1.1)  # the warm-up's transaction counts arrive first
                    _, wal0, wal_source = await db_counters(url)
                    size0 = await _schema_bytes(conn)
                history: list[dict[str, str]] = []
                for text, out in script:
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    result = await engine.handle(f"size-{c}", text)
                    await engine.drain()
                    if c:
                        cpu += time.process_time() - cpu0
                        walls.append((time.perf_counter() - wall0) * 1000)
                        baseline.append([{"role": "system", "content": system}, *history[-10:],
                                         {"role": "user", "content": text}])
                        outputs.append(str(out))
                    history += [{"role": "user", "content": text},
                                {"role": "assistant", "content": result.reply}]
            await asyncio.sleep(1.1)
            _, wal1, _ = await db_counters(url)
            size1 = await _schema_bytes(conn)
    finally:
        await engine.close()
    prompts = [m for _, m, _ in model.requests[TURNS:]]
    turns = n * TURNS
    return {"turns": turns, "cpu_ms": 1000 * cpu / turns, "wall_p50": statistics.median(walls),
            "wal": (wal1 - wal0) / turns, "wal_source": wal_source,
            "db_bytes": (size1 - size0) / n, "prompts": prompts, "baseline": baseline,
            "outputs": outputs}


async def _schema_bytes(conn: psycopg.AsyncConnection[Any]) -> int:
    """Every table's size with its indexes and TOAST, in the schema the URL searches."""
    row = await (await conn.execute(
        "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r' "
        "AND n.nspname = current_schema()")).fetchone()
    assert row is not None
    return int(row[0])


def tokens(measured: dict[str, Any]) -> dict[str, float]:
    """Input and output tokens per turn (gpt-4o-mini's tokenizer), engine and baseline."""
    import litellm

    def count(messages: list[dict[str, str]]) -> int:
        return int(litellm.token_counter(model=MODEL, messages=messages))

    turns = measured["turns"]
    return {"in": sum(map(count, measured["prompts"])) / turns,
            "baseline_in": sum(map(count, measured["baseline"])) / turns,
            "out": sum(int(litellm.token_counter(model=MODEL, text=o))
                       for o in measured["outputs"]) / turns}


def price() -> tuple[float, float]:
    """gpt-4o-mini's price per input and output token, from litellm's shipped map."""
    import litellm

    entry = litellm.model_cost[MODEL]
    return float(entry["input_cost_per_token"]), float(entry["output_cost_per_token"])


def fmt(n: float, unit: str = "") -> str:
    for step, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(n) >= step:
            return f"{n / step:,.1f}{suffix}{unit}"
    return f"{n:,.1f} {unit}".rstrip()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    ap.add_argument("--daily", type=int, default=10_000, help="conversations a day")
    ap.add_argument("--conversations", type=int, default=40, help="played to measure")
    ap.add_argument("--peak-share", type=float, default=0.15,
                    help="the busiest hour's share of the day's turns")
    ap.add_argument("--model-seconds", type=float, default=1.5)
    ap.add_argument("--retention-days", type=int, default=90)
    ap.add_argument("--utilisation", type=float, default=0.6, help="CPU to plan for, 0-1")
    ap.add_argument("--worker-pss", type=float, default=200.0, help="MB (bench/start.py)")
    args = ap.parse_args()
    logging.getLogger("funnel").setLevel(logging.ERROR)  # a hand-off alert per conversation
    with throwaway_schema(server_url(args.db)) as url:
        m = await play(url, args.conversations)
    t = tokens(m)
    p_in, p_out = price()

    print(f"Measured ({args.conversations} conversations x {TURNS} turns, Puramur in "
          "Ukrainian, the scripted model)\n")
    print("| per turn | engine | baseline (window buffer) |")
    print("|---|---|---|")
    print(f"| client CPU | {m['cpu_ms']:.2f} ms | |")
    print(f"| wall time without a model, p50 | {m['wall_p50']:.1f} ms | |")
    print(f"| WAL ({m['wal_source']}) | {m['wal']:,.0f} B | |")
    print(f"| input tokens ({MODEL}) | {t['in']:,.0f} | {t['baseline_in']:,.0f} "
          f"({t['in'] / t['baseline_in']:.2f}x) |")
    print(f"| output tokens | {t['out']:,.0f} | {t['out']:,.0f} |")
    print(f"| database growth per conversation | {fmt(m['db_bytes'], 'B')} | |")

    day_turns = args.daily * TURNS
    peak = day_turns * args.peak_share / 3600
    cores = peak * m["cpu_ms"] * 1.1 / 1000 / args.utilisation  # +10%: the HTTP layer
    workers = max(1, math.ceil(cores))
    in_flight = peak * (args.model_seconds + m["wall_p50"] / 1000)
    cost = day_turns * (t["in"] * p_in + t["out"] * p_out)
    base_cost = day_turns * (t["baseline_in"] * p_in + t["out"] * p_out)
    print(f"\nSized for {args.daily:,} conversations a day ({TURNS} turns each; the busiest "
          f"hour {args.peak_share:.0%} of the day; a model answering in "
          f"{args.model_seconds} s; CPU planned at {args.utilisation:.0%})\n")
    print("| what | figure |")
    print("|---|---|")
    print(f"| turns a day | {day_turns:,} |")
    print(f"| turns a second in the busiest hour (mean over the day) | {peak:.2f} "
          f"({day_turns / 86400:.2f}) |")
    print(f"| engine cores at that peak (CPU per turn + 10% HTTP, at "
          f"{args.utilisation:.0%}) | {cores:.2f} |")
    print(f"| cores the engine needs | {workers} (one worker per core) |")
    served = max(2, workers)  # two, so that one worker's restart is no outage
    print(f"| memory of `--workers {served}` (PSS {args.worker_pss:.0f} MB a worker, the "
          f"master about the same) | {fmt((served + 1) * args.worker_pss * 1e6, 'B')} |")
    print(f"| turns in flight at the peak (Little's law: rate x (model + turn)) | "
          f"{in_flight:.1f} (FUNNEL_TURN_POOL's default 500 per worker) |")
    print(f"| WAL a day | {fmt(day_turns * m['wal'], 'B')} |")
    print(f"| database growth a day / over {args.retention_days} days of retention | "
          f"{fmt(args.daily * m['db_bytes'], 'B')} / "
          f"{fmt(args.daily * m['db_bytes'] * args.retention_days, 'B')} |")
    print(f"| input tokens a day: engine / baseline | {fmt(day_turns * t['in'])} / "
          f"{fmt(day_turns * t['baseline_in'])} |")
    print(f"| {MODEL} a day (litellm's price map; no cache discount, these prompts are "
          f"under the 1,024-token minimum): engine / baseline | ${cost:,.2f} / "
          f"${base_cost:,.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
