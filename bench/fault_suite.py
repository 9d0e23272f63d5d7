"""The edge's fault suite, counted: for each case, messages tried, lost and duplicated.

Runs the fault tests (re-delivered Telegram updates on two workers, one HTTP
Idempotency-Key sent five times at once and again after, Bot API 429 / 500 / 403,
kill -9 during the model call and during the handoff webhook POST, a worker dying
after acknowledging, a retry after a 503 that followed the log, `funnel migrate`
under a running server, PostgreSQL stopped with ``-m immediate`` under load) with
``FUNNEL_FAULT_REPORT`` set, and prints what each case counted next to what it must
be (nothing lost; a duplicate only where delivery is at least once by design: a
kill during the webhook POST, which the receiver de-duplicates by Idempotency-Key).

    python bench/fault_suite.py [--db URL] [--smoke]   # URL: FUNNEL_TEST_DSN, else embedded
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
TESTS = ["tests/test_telegram.py", "tests/test_idempotency.py", "tests/test_heartbeat.py",
         "tests/test_operations.py", "tests/test_database_stop.py"]
# `--smoke`: one quick case that writes its row.
SMOKE = "tests/test_idempotency.py::test_a_key_reused_with_another_message_is_refused"
# Cases where a duplicate is the documented outcome (at least once, one stable key).
AT_LEAST_ONCE = ("kill -9 during the handoff webhook POST",)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=os.environ.get("FUNNEL_TEST_DSN"))
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run (tests/test_bench_smoke.py): one case, in process")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "faults.jsonl"
        env = {**os.environ, "FUNNEL_FAULT_REPORT": str(report),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                           os.environ.get("PYTHONPATH")]))}
        if args.db:
            env["FUNNEL_TEST_DSN"] = args.db
        missing = [t for t in TESTS if not (ROOT / t).exists()]
        if missing:  # a renamed test file would silently shrink the suite
            raise SystemExit(f"the fault tests {', '.join(missing)} are gone; update TESTS")
        tests = [SMOKE, "-n", "0", "--reruns", "0"] if args.smoke else TESTS
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              *tests], cwd=ROOT, env=env, capture_output=True, text=True)
        rows = [json.loads(line) for line in report.read_text("utf-8").splitlines()] \
            if report.exists() else []
    print(f"{'case':<62} {'tried':>5} {'lost':>5} {'dup':>5}  {'expected':<14} extra")
    bad = 0
    for row in rows:
        expected = "lost 0, dup 1" if row["case"] in AT_LEAST_ONCE else "lost 0, dup 0"
        ok = row["lost"] == 0 and (row["duplicated"] == (1 if row["case"] in AT_LEAST_ONCE
                                                          else 0))
        bad += not ok
        extra = ", ".join(f"{k}={v}" for k, v in row.items()
                          if k not in ("case", "tried", "lost", "duplicated"))
        print(f"{row['case'][:62]:<62} {row['tried']:>5} {row['lost']:>5} "
              f"{row['duplicated']:>5}  {expected:<14} {extra}{'' if ok else '  <-- !'}")
    totals = {k: sum(r[k] for r in rows) for k in ("tried", "lost", "duplicated")}
    print(f"{'total (' + str(len(rows)) + ' cases)':<62} {totals['tried']:>5} "
          f"{totals['lost']:>5} {totals['duplicated']:>5}")
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-500:]
    print(f"pytest: {summary}")
    return 1 if bad or run.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
