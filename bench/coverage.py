"""What `funnel test --coverage` and `--snapshots` cost over a plain `funnel test`.

Times, in this process (start-up and imports left out: they are the same for all), with
``--rounds`` alternating runs and their medians:

* `funnel test funnels/puramur` against `funnel test funnels/puramur --coverage`, and the
  coverage computation alone (measuring the suite's turns over the funnel's items);
* `funnel test funnels/` against `funnel test funnels/ --snapshots` (2 funnels), and
  `funnel snapshot` of each funnel (its scenarios played, its snapshots compared).

Run: ``python bench/coverage.py [--db URL] [--rounds 5]`` (the embedded PostgreSQL
without --db / FUNNEL_DB). The baseline is the plain `funnel test` of the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _db import server_url

from engine.cli import main
from engine.scenarios.coverage import measure
from engine.scenarios.load import discover, load_scenario
from engine.scenarios.run import run_all

ROOT = Path(__file__).resolve().parent.parent


def timed(args: list[str]) -> float:
    """Seconds `funnel ARGS` takes, its output swallowed; it must pass."""
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(args)
    seconds = time.perf_counter() - started
    if code != 0:
        sys.exit(f"funnel {' '.join(args)} exited {code}:\n{out.getvalue()[-2000:]}")
    return seconds


def medians(cases: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, run in cases.items():  # alternated: load changes hit every case alike
            times[name].append(run())
    return {name: statistics.median(t) for name, t in times.items()}


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    db = server_url(args.db)
    os.chdir(ROOT)
    puramur = "funnels/puramur"
    files, _ = discover([puramur])
    timed(["test", puramur, "--db", db])  # warm: templates compiled, catalog read

    got = medians({
        "plain": lambda: timed(["test", puramur, "--db", db]),
        "coverage": lambda: timed(["test", puramur, "--coverage", "--db", db]),
    }, args.rounds)
    results = run_all([(f, *load_scenario(f)) for f in files], db)
    funnel = results[0].funnel
    assert funnel is not None
    observed = [o for r in results for o in r.observed]
    started = time.perf_counter()
    for _ in range(100):
        measure(funnel, observed)
    alone = (time.perf_counter() - started) / 100
    print(f"funnel test {puramur} ({len(files)} scenarios, {len(observed)} turns), median of "
          f"{args.rounds}:")
    print(f"  plain (baseline)     {got['plain']:.2f} s")
    print(f"  --coverage           {got['coverage']:.2f} s "
          f"({(got['coverage'] / got['plain'] - 1) * 100:+.0f}%)")
    print(f"  coverage computed    {alone * 1000:.2f} ms of it")

    snaps = medians({
        "plain": lambda: timed(["test", "funnels/", "--db", db]),
        "snapshots": lambda: timed(["test", "funnels/", "--snapshots", "--db", db]),
        "puramur": lambda: timed(["snapshot", "funnels/puramur.yaml", "--db", db]),
        "b2b_demo": lambda: timed(["snapshot", "funnels/b2b_demo.yaml", "--db", db]),
    }, args.rounds)
    print(f"snapshots of 2 funnels (puramur, b2b_demo), median of {args.rounds}:")
    print(f"  funnel test funnels/ (baseline)     {snaps['plain']:.2f} s")
    print(f"  funnel test funnels/ --snapshots    {snaps['snapshots']:.2f} s "
          f"({(snaps['snapshots'] / snaps['plain'] - 1) * 100:+.0f}%)")
    print(f"  funnel snapshot puramur             {snaps['puramur']:.2f} s")
    print(f"  funnel snapshot b2b_demo            {snaps['b2b_demo']:.2f} s")


if __name__ == "__main__":
    main_()
