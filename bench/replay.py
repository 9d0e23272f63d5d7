"""`funnel replay` at pull-request scale: 10,000 recorded sessions of 10 turns.

The population is the engine's own: ``--engine`` Puramur sessions of 10 turns each are
played through the real engine (the scripted model, PostgreSQL, turn records, orders;
tests/replay_population.py), then copied in SQL under new session ids until there are
``--sessions`` of them (the copies are the same conversations: the replay does not
know, and does the whole work for every one). Then, in the same run:

* baseline: reading the population (turn records, messages, orders) as the replay does;
* the replay of the unedited funnel (every session the same);
* the replay of an edit (the discovery threshold 60 -> 50), with --jobs processes.

    python bench/replay.py [--db URL] [--sessions 10000] [--engine 100] [--jobs 2]
    python bench/replay.py --sessions 2000 --profile 25   # cProfile of the edit's replay

With ``--profile N`` the edit is replayed once more in this process (jobs 1) under
cProfile, and the N functions with the most time of their own are printed.

Without --db it uses $FUNNEL_DB, else the embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import psycopg  # noqa: E402
from _db import server_url, throwaway_schema  # noqa: E402
from psycopg import sql  # noqa: E402
from replay_population import PURAMUR, record  # noqa: E402

from engine.evidence.records import read_bundle, read_population  # noqa: E402
from engine.evidence.replay import base_from, replay  # noqa: E402
from engine.format.names import CONVERSIONS, MESSAGES, TURNS  # noqa: E402
from engine.funnel.compiled import load_funnel  # noqa: E402


def multiply(url: str, copies: int) -> None:
    """Copy every session's turn records, messages and orders ``copies`` times."""
    with psycopg.connect(url, autocommit=True) as conn:
        for table, key in ((TURNS, None), (MESSAGES, None), (CONVERSIONS, "order_id")):
            cols = [r[0] for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                "AND table_schema = current_schema() ORDER BY ordinal_position",
                (table,)).fetchall() if r[0] != "id"]
            picked = [sql.SQL("t.{} || '~' || g").format(sql.Identifier(c))
                      if c in ("session_id", key) else sql.SQL("t.{}").format(sql.Identifier(c))
                      for c in cols]
            conn.execute(sql.SQL("INSERT INTO {t} ({cols}) SELECT {picked} FROM "
                                 "(SELECT * FROM {t} ORDER BY {order}) t, "
                                 "generate_series(1, %s) g").format(
                t=sql.Identifier(table), cols=sql.SQL(", ").join(map(sql.Identifier, cols)),
                picked=sql.SQL(", ").join(picked),
                order=sql.SQL("order_id") if key else sql.Identifier("id")), (copies,))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--engine", type=int, default=100, help="sessions played by the engine")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile the edit's replay (jobs 1); print the top N")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the hand-off alerts of the recorded sessions
    with throwaway_schema(server_url(args.db)) as url:
        started = time.perf_counter()
        asyncio.run(record(url, n=args.engine, seed=3, turns=10, full=True))
        engine_seconds = time.perf_counter() - started
        recorded = args.engine + 3  # and the three shipped scenarios
        copies = max(0, -(-args.sessions // recorded) - 1)
        multiply(url, copies)

        started, cpu = time.perf_counter(), time.process_time()
        population = read_population(url, "puramur")
        read, read_cpu = time.perf_counter() - started, time.process_time() - cpu
        sessions = len(population.sessions)
        turns = sum(len(s.turns) for s in population.sessions)
        resolve, loaded, _ = base_from(lambda v: read_bundle(url, "puramur", v), "puramur",
                                       None)
        print(f"population: {sessions} sessions, {turns} turns ({args.engine} + 3 played by "
              f"the engine in {engine_seconds:.1f} s, copied {copies} times)")
        print(f"baseline, reading the records:       {read:6.2f} s  (CPU {read_cpu:.2f} s "
              "here, PostgreSQL's apart)")
        print(f"machine load before the replays: {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores")
        unedited = replay(load_funnel(PURAMUR), population, resolve, jobs=args.jobs)
        print(f"replay, unedited funnel (jobs {args.jobs}):   {unedited.seconds:6.2f} s  "
              f"(CPU {unedited.cpu_seconds:.2f} s; {unedited.counts()['same']} same)")
        with tempfile.TemporaryDirectory() as tmp:
            for folder in ("funnels", "prompts", "schemas"):
                shutil.copytree(ROOT / folder, Path(tmp) / folder)
            (Path(tmp) / "pyproject.toml").write_text("", "utf-8")
            edited_path = Path(tmp) / "funnels" / "puramur.yaml"
            edited_path.write_text(PURAMUR.read_text("utf-8").replace(
                "discovery_completeness >= 60", "discovery_completeness >= 50"), "utf-8")
            edited = replay(load_funnel(edited_path), population, resolve, jobs=args.jobs)
            if args.profile:
                profiler = cProfile.Profile()
                profiler.enable()
                replay(load_funnel(edited_path), population, resolve, jobs=1)
                profiler.disable()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
        c = edited.counts()
        print(f"replay, threshold 60 -> 50 (jobs {args.jobs}): {edited.seconds:6.2f} s  "
              f"(CPU {edited.cpu_seconds:.2f} s; {c['changed']} change: {c['different']} "
              f"different, {c['needs_model']} need the model)")
        total = read + edited.seconds
        print(f"read + replay of the edit: {total:.2f} s for {sessions} sessions "
              f"({turns / total:,.0f} turns/s); {turns / 2 / max(unedited.seconds, 1e-9):,.0f}"
              " turns/s per play of the unedited funnel")
        for version in loaded:
            if version.folder is not None:
                version.folder.cleanup()


if __name__ == "__main__":
    main()
