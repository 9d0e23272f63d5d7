"""The service's metrics: CPU a turn costs to record, and a ``/metrics`` scrape, with
``prometheus_client`` (engine.service.metrics) next to the hand-written module it replaced
(``git show <ref>:engine/service/metrics.py``, loaded from the same checkout's history).

    python bench/metrics.py [--turns 20000] [--ref 560b71c]

Each figure runs in a process of its own (prometheus_client picks its multiprocess mode
when imported). One funnel of 12 stages is declared, as the service does at start;
a "turn" is :meth:`Metrics.turn` with one transition and tokens. The scrape renders after
the turns; with 2 workers, two processes record (half the turns each) into one folder and
a third renders, as under ``funnel serve --workers 2``. The hand-written module's workers
shared a JSON file each, written at most once a second: its per-turn figure has no file
write in it, and its scrape reads and adds up the other worker's file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STAGES = [f"stage_{i}" for i in range(12)]

# One measuring process: record `turns` turns, then render `scrapes` times; print JSON.
_CHILD = r"""
import importlib.util, json, os, sys, time
sys.path.insert(0, os.environ["ROOT"])
from engine.turn.engine import TurnResult
if os.environ.get("OLD_METRICS"):
    spec = importlib.util.spec_from_file_location("engine.service._handwritten_metrics",
                                                  os.environ["OLD_METRICS"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    Metrics = module.Metrics
else:
    from engine.service.metrics import Metrics
stages = json.loads(os.environ["STAGES"])
folder = os.environ.get("FOLDER") or None
m = Metrics(folder)
m.declare("puramur", stages, telegram=True)
m.version("puramur", [1])
results = [TurnResult(session_id="s", reply="r", stage_before=stages[i % len(stages)],
                      stage_after=stages[(i + 1) % len(stages)], state={},
                      transitions=[{"from": stages[i % len(stages)],
                                    "to": stages[(i + 1) % len(stages)]}],
                      prompt_tokens=900, completion_tokens=60, model_seconds=0.4)
           for i in range(len(stages))]
turns, scrapes = int(sys.argv[1]), int(sys.argv[2])
start = time.process_time()
new = hasattr(m, "in_flight")
for i in range(turns):  # as engine.service.core does around a turn
    if new:
        m.in_flight(+1)
    else:
        m.turns_in_flight += 1
    m.turn("puramur", results[i % len(results)], 0.3 + (i % 7) / 10)
    if new:
        m.in_flight(-1)
    else:
        m.turns_in_flight -= 1
turn_cpu = (time.process_time() - start) / max(turns, 1)
if hasattr(m, "save") and folder:
    m.save()  # the old module's once-a-second write, so the scraper sees these counts
text, scrape_cpu = "", 0.0
if scrapes:
    start = time.process_time()
    for _ in range(scrapes):
        text = m.render()
    scrape_cpu = (time.process_time() - start) / scrapes
print(json.dumps({"turn_us": turn_cpu * 1e6, "scrape_ms": scrape_cpu * 1e3,
                  "series": sum(1 for line in text.splitlines() if line and line[0] != "#"),
                  "turns_seen": sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                                    if line.startswith("funnel_turns_total{"))}))
"""


def _run(turns: int, scrapes: int, old: str | None, folder: str | None) -> dict[str, float]:
    env = {**os.environ, "ROOT": str(ROOT), "STAGES": json.dumps(STAGES)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if old:
        env["OLD_METRICS"] = old
    if folder:
        env["FOLDER"] = folder
        if not old:
            env["PROMETHEUS_MULTIPROC_DIR"] = folder
    out = subprocess.run([sys.executable, "-c", _CHILD, str(turns), str(scrapes)], env=env,
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out)
    return result


def _figures(turns: int, old: str | None) -> dict[str, dict[str, float]]:
    one = _run(turns, 200, old, None)
    with tempfile.TemporaryDirectory() as folder:
        a = _run(turns // 2, 0, old, folder)
        b = _run(turns // 2, 0, old, folder)
        scrape = _run(0, 200, old, folder)
    return {"one": one, "workers": {"turn_us": (a["turn_us"] + b["turn_us"]) / 2,
                                    "scrape_ms": scrape["scrape_ms"],
                                    "series": scrape["series"],
                                    "turns_seen": scrape["turns_seen"]}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20000)
    parser.add_argument("--ref", default="560b71c", help="commit of the hand-written module "
                        "('': prometheus_client alone, as a shallow checkout must)")
    args = parser.parse_args()
    old: dict[str, dict[str, float]] | None = None
    if args.ref:
        found = subprocess.run(["git", "show", f"{args.ref}:engine/service/metrics.py"],
                               cwd=ROOT, capture_output=True, text=True)
        if found.returncode != 0:
            raise SystemExit(f"git show {args.ref}: {found.stderr.strip()} (a shallow "
                             "checkout? `git fetch --unshallow`, or --ref '' to skip the "
                             "hand-written module)")
        with tempfile.TemporaryDirectory() as tmp:
            old_path = Path(tmp) / "handwritten_metrics.py"
            old_path.write_text(found.stdout.replace("from ..turn.engine",
                                                     "from engine.turn.engine"), "utf-8")
            old = _figures(args.turns, str(old_path))
    new = _figures(args.turns, None)
    print(f"{args.turns} turns, 1 funnel of {len(STAGES)} stages; CPU time per call "
          f"(time.process_time)\n")
    print(f"{'':44} {'hand-written':>14} {'prometheus_client':>18}")
    rows = (("record a turn (us)", "turn_us", 1), ("scrape /metrics (ms)", "scrape_ms", 2),
            ("series in the scrape", "series", 0), ("turns the scrape shows", "turns_seen", 0))
    for mode, label in (("one", "1 process"), ("workers", "2 workers, 1 folder")):
        for what, key, digits in rows:
            before = f"{old[mode][key]:14.{digits}f}" if old else f"{'-':>14}"
            print(f"{label + ': ' + what:44} {before} {new[mode][key]:18.{digits}f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
