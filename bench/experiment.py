"""An A/B experiment simulated end to end: scripted conversations through the engine.

Two variants of the Puramur funnel share the traffic 50/50 (the engine assigns each
new session by the hash of the experiment's name and its id). Each session is one
scripted customer: it greets, then either asks for a manager (the goal: a hand-off)
or says goodbye. Customers of variant A convert with probability 20%, those of B
with 24% (a seeded draw per session, made after the engine told it its variant).
Every turn is a real engine turn (the scripted model, PostgreSQL, turn records);
then `funnel report --by variant` is computed on the rows, for 1,000 conversations
and for 10,000, each in a throwaway schema. Printed: the assignment shares, each
variant's goal rate with its Wilson 95% interval, the z-test's p-value, and
whether the difference is significant (p < 0.05), which it should be at 10,000
(power about 99.9%) and mostly not at 1,000 (power about 30%).

    python bench/experiment.py [--db URL] [--sizes 1000,10000] [--concurrency 8] [--seed 16]
        [--html FILE]

Without --db it uses $FUNNEL_DB, else the embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("FUNNEL_ROOT", str(ROOT))  # the copied funnel reads the repo's files

import yaml  # noqa: E402
from _db import server_url, throwaway_schema  # noqa: E402

from engine.experiments.router import assign, load_experiment  # noqa: E402
from engine.experiments.stats import Z95  # noqa: E402
from engine.funnel.compiled import load_funnel  # noqa: E402
from engine.llm.models import ScriptedModel  # noqa: E402
from engine.report.variants import (  # noqa: E402
    build_variant_report,
    render_variant_html,
    render_variant_table,
)
from engine.turn.engine import Engine  # noqa: E402

RATES = {"A": 0.20, "B": 0.24}
EXPERIMENT = {"name": "bench-gift-threshold", "goal": "handoff",
              "variants": [{"name": "A", "weight": 50},
                           {"name": "B", "weight": 50, "thresholds": {"gift": 800}}]}
SCRIPT = {
    "match": [{"pattern": "manager", "output": {
        "reply": "Of course, a manager will call you.",
        "actions": [{"type": "request_handoff", "reason": "explicit_request"}]}}],
    "default": {"reply": "Hello! Is your pet a cat or a dog?"},
}


def funnel_copy(folder: Path) -> Path:
    """Puramur with the experiment, in a folder of its own."""
    shutil.copytree(ROOT / "prompts" / "puramur", folder / "prompts")
    data = yaml.safe_load((ROOT / "funnels" / "puramur.yaml").read_text("utf-8"))
    data.update(prompts="prompts",
                catalog=str(ROOT / "funnels" / "puramur" / "catalog.yaml"),
                experiment=EXPERIMENT)
    data["knowledge"]["folder"] = str(ROOT / "funnels" / "puramur" / "knowledge")
    path = folder / "puramur.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    return path


async def simulate(path: Path, url: str, sessions: int, concurrency: int, seed: int
                   ) -> dict[str, Any]:
    engine = await Engine.open(load_funnel(path), db=url,
                               model=ScriptedModel.from_data(SCRIPT))
    queue = iter(range(sessions))
    assigned = {"A": 0, "B": 0}
    turns = 0

    async def customer() -> None:
        nonlocal turns
        for i in queue:
            sid = f"sim-{seed}-{i}"
            first = await engine.handle(sid, "Hi, I need a shampoo")
            variant = first.state["variant"]
            assigned[variant] += 1
            converts = random.Random(f"{seed}:{sid}").random() < RATES[variant]
            await engine.handle(sid, "Please have a manager call me" if converts
                                else "Thanks, I'll think about it")
            turns += 2

    started = time.perf_counter()
    try:
        await asyncio.gather(*(customer() for _ in range(concurrency)))
        await engine.drain()
    finally:
        await engine.close()
    elapsed = time.perf_counter() - started
    report = await build_variant_report(path, db=url, since=86400)
    return {"report": report, "assigned": assigned, "seconds": elapsed, "turns": turns}


def power(n_per_arm: int, p1: float, p2: float) -> float:
    """The z-test's power to detect p1 vs p2 at alpha 0.05 (normal approximation)."""
    se = math.sqrt(p1 * (1 - p1) / n_per_arm + p2 * (1 - p2) / n_per_arm)
    z = abs(p2 - p1) / se - Z95
    return 0.5 * math.erfc(-z / math.sqrt(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--html", default=None, metavar="FILE",
                        help="write the last size's report as the HTML page")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("funnel").setLevel(logging.ERROR)  # 2,400 hand-off log lines
    url = server_url(args.db)
    with tempfile.TemporaryDirectory() as tmp:
        path = funnel_copy(Path(tmp))
        experiment = load_experiment(path)
        assert experiment is not None
        ids = 100_000
        counts = {v: 0 for v in experiment.names}
        for i in range(ids):
            counts[assign(experiment, f"id-{i}")] += 1
        print(f"assignment of {ids:,} session ids by the hash: " + ", ".join(
            f"{v}: {100 * n / ids:.2f}% (weight 50%)" for v, n in counts.items()) + "\n")
        for size in (int(s) for s in args.sizes.split(",")):
            with throwaway_schema(url) as schema_url:
                out = asyncio.run(simulate(path, schema_url, size, args.concurrency, args.seed))
            r, assigned = out["report"], out["assigned"]
            print(f"=== {size:,} scripted conversations ({out['turns']:,} engine turns in "
                  f"{out['seconds']:.1f}s, {out['turns'] / out['seconds']:.0f} turns/s) ===")
            shares = ", ".join(f"{v}: {n:,} ({100 * n / size:.2f}%, weight 50%, off by "
                               f"{abs(100 * n / size - 50):.2f} pts)" for v, n in assigned.items())
            print(f"assignment: {shares}")
            print(render_variant_table(r), end="")
            b = r["variants"][1]
            cmp = b["vs_control"]
            print(f"RESULT n={size:,}: A {100 * r['variants'][0]['rate']:.2f}% vs B "
                  f"{100 * b['rate']:.2f}%, z = {cmp['z']:.2f}, p = {cmp['p_value']:.3g} -> "
                  f"{'SIGNIFICANT' if cmp['significant'] else 'not significant'} at 0.05 "
                  f"(the test's power for 20% vs 24% at this size: "
                  f"{100 * power(size // 2, 0.20, 0.24):.1f}%)\n")
            if args.html:
                Path(args.html).write_text(render_variant_html(r), "utf-8")


if __name__ == "__main__":
    main()
