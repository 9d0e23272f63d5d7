"""Personas mined from 10,000 recorded sessions, and the threshold advisor over 10,000.

Two populations, each beside the same baseline, a plain `funnel report` over the same
database, measured in the same run:

* **recorded**: ``--engine`` Puramur sessions played through the real engine (the
  scripted model; tests/replay_population.py: paths, objections, languages, products,
  customer messages, turn records, orders), copied in SQL (``INSERT ... SELECT`` with
  ``generate_series``: the session table, the turn records, the messages and the
  orders) under new ids until there are ``--sessions``. Timed: mining the personas
  (``--personas-from-db``, ``--k 8``), and the advisor with the replay of its
  suggestions over the 500 most recent sessions (its default cap) and without it;
* **generated**: ``--sessions`` sessions with a known best discovery threshold (50;
  tests/advise_population.py), written with COPY. Timed: the advisor; printed: what it
  suggests.

    python bench/advise.py [--db URL] [--sessions 10000] [--engine 100]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import psycopg  # noqa: E402
from _db import server_url, throwaway_schema  # noqa: E402
from advise_population import synthetic  # noqa: E402
from psycopg import sql  # noqa: E402
from replay_population import PURAMUR, record  # noqa: E402

from engine.evidence.advise import advise  # noqa: E402
from engine.evidence.mining import mine  # noqa: E402
from engine.format.names import CONVERSIONS, MESSAGES, TURNS  # noqa: E402
from engine.funnel.compiled import CompiledFunnel, load_funnel  # noqa: E402
from engine.report import build_report  # noqa: E402

MONTH = 30 * 86400.0


def multiply(url: str, table: str, copies: int) -> None:
    """Copy every session (its row, turn records, messages and orders) ``copies`` times."""
    with psycopg.connect(url, autocommit=True) as conn:
        for name, key in ((table, None), (TURNS, None), (MESSAGES, None),
                          (CONVERSIONS, "order_id")):
            cols = [r[0] for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                "AND table_schema = current_schema() ORDER BY ordinal_position",
                (name,)).fetchall() if r[0] != "id"]
            # A copy's last message is g minutes before its original's: the most recent
            # sessions (what the advisor replays) are every original and its first copies.
            picked = [sql.SQL("t.{} || '~' || g").format(sql.Identifier(c))
                      if c in ("session_id", key) else
                      sql.SQL("t.{} - g * interval '1 minute'").format(sql.Identifier(c))
                      if name == table and c == "last_message_at" else
                      sql.SQL("t.{}").format(sql.Identifier(c)) for c in cols]
            # In id order: a copied session's turns and messages keep their order.
            conn.execute(sql.SQL("INSERT INTO {t} ({cols}) SELECT {picked} FROM (SELECT * "
                                 "FROM {t} ORDER BY {order}) t, generate_series(1, %s) g "
                                 "ORDER BY g, {order}").format(
                t=sql.Identifier(name), cols=sql.SQL(", ").join(map(sql.Identifier, cols)),
                picked=sql.SQL(", ").join(picked),
                order=sql.Identifier("session_id" if name == table else
                                     "order_id" if key else "id")), (copies,))
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))


def timed(label: str, seconds: float, baseline: float, note: str = "") -> None:
    print(f"  {label:44} {seconds:7.2f} s  ({seconds / baseline:5.1f}x the report){note}")


def report_seconds(funnel: CompiledFunnel, url: str) -> float:
    started = time.perf_counter()
    asyncio.run(build_report(funnel, db=url, since=MONTH, include_playground=False))
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--engine", type=int, default=100, help="sessions played by the engine")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the hand-off alerts of the recorded sessions
    funnel = load_funnel(PURAMUR)
    print(f"machine load at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with throwaway_schema(server_url(args.db)) as url:
        started = time.perf_counter()
        ids = asyncio.run(record(url, n=args.engine, seed=3, turns=10))
        played = time.perf_counter() - started
        started = time.perf_counter()
        multiply(url, funnel.spec.table, max(0, -(-args.sessions // len(ids)) - 1))
        copied = time.perf_counter() - started
        with psycopg.connect(url) as conn:
            row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                sql.Identifier(funnel.spec.table))).fetchone()
        print(f"recorded: {row[0] if row else 0:,} sessions ({len(ids)} played by the engine in "
              f"{played:.1f} s, copied in SQL in {copied:.1f} s)")
        base = report_seconds(funnel, url)
        print(f"  {'baseline: funnel report (--since 30d)':44} {base:7.2f} s")
        mined = mine(url, funnel.spec, since=MONTH, k=8)
        timed("mining personas (--personas-from-db --k 8)", mined.seconds, base,
              f"; {len(mined.personas)} personas of {mined.sessions:,} sessions")
        _, facts = advise(funnel, url, since=MONTH, replay_cap=0)
        timed("advisor, no replay (--advise-sessions 0)", facts["seconds"], base)
        advice, facts = advise(funnel, url, since=MONTH, replay_cap=500)
        replays = [a.replay for a in advice if a.replay]
        timed("advisor, replaying 500 (the default)", facts["seconds"], base,
              f"; replay {facts['seconds_replay']:.2f} s of it, "
              + "; ".join(f"`{r['condition']}`: {r['changed']} of {r['sessions']} change"
                          for r in replays))
    with throwaway_schema(server_url(args.db)) as url:
        started = time.perf_counter()
        synthetic(url, args.sessions, then=40, best=50)
        print(f"generated: {args.sessions:,} sessions with a known best threshold (50), "
              f"COPY in {time.perf_counter() - started:.2f} s")
        base = report_seconds(funnel, url)
        print(f"  {'baseline: funnel report (--since 30d)':44} {base:7.2f} s")
        advice, facts = advise(funnel, url, since=MONTH, replay_cap=500)
        (a,) = [x for x in advice if x.threshold.field == "discovery_completeness"]
        timed("advisor (no turn records: nothing replays)", facts["seconds"], base,
              f"; suggests {a.suggested:g}, interval {a.interval}")
    print(f"machine load at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
