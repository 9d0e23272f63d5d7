"""What a manager's control costs a turn the bot answers: the control read (one indexed
SELECT on ``funnel_control`` under the session's lease; folded into the turn's first
call since, so it costs no round trip), next to the whole turn, and the round trips a
turn makes (connection checkouts: 2 with the read folded in, 3 before).

Runs Puramur's full turn with a zero-latency scripted model, sequentially, on a
throwaway schema, and prints the median turn time and the median time of the control
read alone (the turn's one extra statement). Run it on a branch without the control
read to compare (``PYTHONPATH=/path/to/that/checkout``):

    python bench/manager_overhead.py [--db URL] [--turns 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from _db import server_url, throwaway_schema  # noqa: E402

from engine import Engine  # noqa: E402

PURAMUR = ROOT / "funnels" / "puramur.yaml"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    ap.add_argument("--turns", type=int, default=300)
    args = ap.parse_args()
    script = Path("/tmp/manager_overhead_script.yaml")
    script.write_text(yaml.safe_dump({"default": {"reply": "ok"}}))
    with throwaway_schema(server_url(args.db)) as url:
        engine = await Engine.open(PURAMUR, db=url, model=f"scripted:{script}")
        try:
            for n in range(20):  # warm: prepared statements, caches
                await engine.handle(f"warm-{n}", "hi")
            times = []
            checkouts = 0
            connect = engine.store._conn

            def counted() -> object:
                nonlocal checkouts
                checkouts += 1
                return connect()

            engine.store._conn = counted
            for n in range(args.turns):
                started = time.perf_counter()
                await engine.handle(f"s-{n % 50}", "hi")
                times.append((time.perf_counter() - started) * 1000)
            engine.store._conn = connect
            reads = []
            control = getattr(engine.store, "control", None)
            if control is not None:
                for n in range(args.turns):
                    started = time.perf_counter()
                    await control("puramur", f"s-{n % 50}")
                    reads.append((time.perf_counter() - started) * 1000)
        finally:
            await engine.close()
    print(f"turn median        {statistics.median(times):.3f} ms ({args.turns} turns)")
    print(f"round trips/turn   {checkouts / args.turns:.2f} (connection checkouts)")
    if reads:
        print(f"control read       {statistics.median(reads):.3f} ms median")


if __name__ == "__main__":
    asyncio.run(main())
