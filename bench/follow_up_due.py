"""Finding the sessions whose follow-up is due (issue 42, docs/follow-ups.md) among
1,000,000 sessions of which 1% are due.

Seeded in SQL (INSERT ... SELECT FROM generate_series) in a throwaway schema dropped at
the end: ``funnel_follow_ups`` as the engine creates it (its migrations), one row per
session: 1% due in the past hour, 49% due in the coming days, 50% with nothing due
(``due_at`` NULL: a reply cancelled it, a stage without follow-ups). Then VACUUM ANALYZE,
and, in the same run, each ``--samples`` times (the median and p95 printed, ms):

* engine: the scheduler's one query (engine.store.follow_ups.DUE: ``funnel = $1 AND
  due_at <= $2 ORDER BY due_at LIMIT $3``), a batch of ``--limit`` sessions, with its
  EXPLAIN plan (an index scan of the partial index, not a sequential scan);
* baseline, point: one row by its primary key (the cheapest read there is);
* baseline, scan: the same due set counted with index scans turned off (what a
  scheduler without the partial index pays: the whole table read each pass).

    python bench/follow_up_due.py [--db URL] [--sessions 1000000] [--limit 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bench._db import server_url, throwaway_schema  # noqa: E402
from engine.store import ddl  # noqa: E402
from engine.store.follow_ups import DUE  # noqa: E402

# One row per session; ids are "s<n>". n % 100 = 0: due in the past hour; odd n: due in
# the coming 1 to 5 days; the rest: nothing due.
SEED = """
INSERT INTO funnel_follow_ups (funnel, session_id, stage, step, anchor_at, anchor_id,
                               due_at, sent)
SELECT 'puramur', 's' || n, 'cart_building', 0, NOW() - INTERVAL '1 day', n,
       CASE WHEN n % 100 = 0 THEN NOW() - (n % 3600) * INTERVAL '1 s'
            WHEN n % 2 = 1 THEN NOW() + INTERVAL '1 day' + (n % 345600) * INTERVAL '1 s'
            END,
       '{}'::jsonb
FROM generate_series(1, %s) AS n
"""


def timed(run: Callable[[], Any], samples: int) -> tuple[float, float]:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.95))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", default=None, help="PostgreSQL URL (default: the embedded one)")
    p.add_argument("--sessions", type=int, default=1_000_000)
    p.add_argument("--limit", type=int, default=100, help="sessions per scheduler pass")
    p.add_argument("--samples", type=int, default=50)
    args = p.parse_args()
    with throwaway_schema(server_url(args.db)) as url, psycopg.connect(
            url, autocommit=True) as conn:
        for statement in ddl.SHARED_MIGRATIONS:
            conn.execute(statement.encode())
        start = time.perf_counter()
        conn.execute(SEED.replace("%s", str(int(args.sessions))).encode())
        conn.execute(b"VACUUM ANALYZE funnel_follow_ups")
        seeded = time.perf_counter() - start
        now = datetime.now(UTC)
        due = conn.execute(b"SELECT count(*) FROM funnel_follow_ups WHERE due_at <= NOW()"
                           ).fetchone()
        print(f"{args.sessions:,} sessions, {due[0] if due else 0:,} due; seeded and "
              f"analyzed in {seeded:.1f} s")

        def engine() -> None:
            conn.execute(DUE, ("puramur", now, args.limit)).fetchall()

        def point() -> None:
            conn.execute(b"SELECT due_at FROM funnel_follow_ups WHERE funnel = 'puramur' "
                         b"AND session_id = 's4242'").fetchall()

        # Its own connection, index scans off for good: the baseline pays no SET per run.
        seq = psycopg.connect(url, autocommit=True)
        seq.execute(b"SET enable_indexscan = off")
        seq.execute(b"SET enable_bitmapscan = off")
        seq.execute(b"SET enable_indexonlyscan = off")

        def scan() -> None:
            seq.execute(b"SELECT count(*) FROM funnel_follow_ups WHERE funnel = 'puramur' "
                        b"AND due_at <= NOW()").fetchall()

        plan = "\n".join(r[0] for r in conn.execute(
            b"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + DUE.as_bytes(conn),
            ("puramur", now, args.limit)).fetchall())
        print("the scheduler's query plan:\n  " + plan.replace("\n", "\n  "))
        if "Index" not in plan or "Seq Scan" in plan:
            print("WARNING: the due query is not an index scan", file=sys.stderr)
        for name, run in (("engine: due query (a pass)", engine),
                          ("baseline: one row by its key", point),
                          ("baseline: the due set by a full scan", scan)):
            med, p95 = timed(run, args.samples)
            print(f"{name:40s} median {med:8.3f} ms   p95 {p95:8.3f} ms")
        seq.close()


if __name__ == "__main__":
    main()
