"""The studio's what-if for 200 sessions: a clean save until the page has its count.

The population is the engine's own (tests/replay_population.py: ``--engine`` Puramur
sessions of 10 turns through the real engine with the scripted model), copied in SQL
under new ids until there are ``--sessions`` (bench/replay.py's way). The studio is
opened on a copy of the funnel (in this process, as ``funnel studio`` runs it, with no
settle delay); the copy's discovery threshold is edited 60 -> 50 on disk. In the same
run:

* the what-if: from the save taken to its result (its ``seconds``), and from the write
  of the file to the result (the watcher's polling included);
* the event loop's lag while it runs: how late a 10 ms sleep wakes (what a page request
  waits at worst: the replay runs in a worker thread);
* baseline: the plain ``funnel replay EDITED --since 7d --format json`` over the same
  sessions, in this process (its interpreter start-up left out), and its counts, which
  the what-if's must equal.

    python bench/what_if.py [--db URL] [--sessions 200] [--engine 50]

Without --db it uses $FUNNEL_DB, else the embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import psycopg  # noqa: E402
from _db import server_url, throwaway_schema  # noqa: E402
from psycopg import sql  # noqa: E402
from replay import multiply  # noqa: E402
from replay_population import PURAMUR, record  # noqa: E402

from engine.cli import main as funnel  # noqa: E402
from engine.format.names import CONVERSIONS, MESSAGES, TURNS  # noqa: E402
from engine.studio import Studio  # noqa: E402
from engine.studio.whatif import WhatIfSettings  # noqa: E402


def edited_copy(root: Path) -> Path:
    for folder in ("funnels", "prompts", "schemas"):
        shutil.copytree(ROOT / folder, root / folder)
    (root / "pyproject.toml").write_text("", "utf-8")
    return root / "funnels" / "puramur.yaml"


async def what_if(url: str, path: Path, sessions: int) -> tuple[dict[str, Any], float, list[float]]:
    """The what-if's run after the edit, the seconds from the write to its result, and
    the event loop's lag (seconds) while it ran."""
    studio = await Studio.open([path], db=url,
                               what_if=WhatIfSettings(settle=0.0, max_sessions=sessions))
    try:
        text = path.read_text("utf-8")
        written = time.perf_counter()
        path.write_text(text.replace("discovery_completeness >= 60",
                                     "discovery_completeness >= 50"), "utf-8")
        lags: list[float] = []
        while True:
            run = studio.whatif.status("puramur")["run"]
            if run is not None and run["status"] != "running":
                return run, time.perf_counter() - written, lags
            asked = time.perf_counter()
            await asyncio.sleep(0.01)
            if run is not None:
                lags.append(time.perf_counter() - asked - 0.01)
    finally:
        await studio.close()


def trim(url: str, sessions: int) -> int:
    """Keep ``sessions`` of the population (the what-if and the baseline replay the same
    ones); how many there are."""
    with psycopg.connect(url, autocommit=True) as conn:
        kept = [r[0] for r in conn.execute(sql.SQL(
            "SELECT DISTINCT session_id FROM {} ORDER BY session_id LIMIT %s").format(
                sql.Identifier(TURNS)), (sessions,)).fetchall()]
        for table in (TURNS, MESSAGES, CONVERSIONS):
            conn.execute(sql.SQL("DELETE FROM {} WHERE NOT session_id = ANY(%s)").format(
                sql.Identifier(table)), (kept,))
    return len(kept)


def baseline(url: str, path: Path) -> tuple[dict[str, Any], float]:
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = funnel(["replay", str(path), "--db", url, "--since", "7d", "--jobs", "1",
                       "--format", "json"])
    seconds = time.perf_counter() - started
    assert code == 0, out.getvalue()
    found: dict[str, Any] = json.loads(out.getvalue())
    return found, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--engine", type=int, default=50, help="sessions played by the engine")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the hand-off alerts of the recorded sessions
    with throwaway_schema(server_url(args.db)) as url, tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        asyncio.run(record(url, n=args.engine, seed=3, turns=10, full=True))
        recorded = args.engine + 3  # and the three shipped scenarios
        copies = max(0, -(-args.sessions // recorded) - 1)
        multiply(url, copies)
        n = trim(url, args.sessions)
        print(f"population: {n} sessions ({recorded} played by the engine in "
              f"{time.perf_counter() - started:.1f} s, copied {copies} times)")
        print(f"machine load: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        path = edited_copy(Path(tmp))
        assert PURAMUR.read_text("utf-8") == path.read_text("utf-8")
        run, wall, lags = asyncio.run(what_if(url, path, args.sessions))
        assert run["status"] == "done", run
        report, plain = baseline(url, path)  # the same sessions: all are in the period
        same = run["counts"] == report["counts"]
        c = run["counts"]
        print(f"what-if, save taken -> result:     {run['seconds']:6.2f} s  for {c['sessions']} "
              f"sessions ({c['changed']} change, {c['needs_model']} need the model)")
        print(f"what-if, file written -> result:   {wall:6.2f} s  (the watcher's polling "
              "included)")
        print(f"baseline, funnel replay --format json: {plain:6.2f} s  for "
              f"{report['counts']['sessions']} sessions (in this process)")
        if lags:
            print(f"event loop while it ran: a 10 ms sleep woke {statistics.median(lags) * 1000:.1f}"
                  f" ms late (median), {max(lags) * 1000:.1f} ms at worst ({len(lags)} looks)")
        print(f"counts equal to funnel replay's: {same}")
        print(f"sentence: {run['sentence']}")


if __name__ == "__main__":
    main()
