"""Every script in bench/ runs, at its smallest, in the normal suite: a bench cannot break
silently again (issue 40: `bench/experiment.py` copied a folder that no longer existed).

Each script runs as a real subprocess, as a person runs it, against the tests' PostgreSQL
(``FUNNEL_DB`` and ``FUNNEL_TEST_DSN`` set to it; each script makes its own throwaway
schema) with its smallest settings: tiny CLI arguments, or ``--smoke`` where a script's
sizes are fixed in its code. The figures printed are not checked (a smoke run measures
nothing); a script passes when it exits 0. The scripts run four at a time, started
together when the first test asks: about 70 s of wall time and 100 s of CPU on two cores
(most of it Python's and litellm's imports, a few seconds a script).

Nothing is skipped silently. The two callgrind scripts need valgrind, which CI lacks, and
minutes (the engine runs some 50 times slower under callgrind): each runs its ``--child``
instead, the very code callgrind would count, without valgrind. `bench/floor.py` and
`bench/floor_service.py` are modules, not scripts: the first runs in turn_instructions'
floor child, the second in serve_load's run (``--floor-service``). A script added to
bench/ without a line here fails :func:`test_every_bench_script_is_listed`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
PARALLEL = 4  # subprocesses at once: they wait on PostgreSQL, sockets and sleeps as much as they compute
TIMEOUT = 240  # seconds, one script; the whole file stays near a minute

pytestmark = pytest.mark.postgres

# Each script's smallest run: its arguments ("{db}" is the server's URL).
RUNS: dict[str, list[str]] = {
    "advise": ["--db", "{db}", "--sessions", "300", "--engine", "3"],
    "api_overhead": ["--conversations", "1", "--rounds", "1"],
    "claims": ["--rounds", "1", "--sessions", "1"],
    "concurrency": ["--turns", "1", "--levels", "1", "--sleep", "0.01"],
    "coverage": ["--db", "{db}", "--rounds", "1"],
    "erase_one": ["--db", "{db}", "--sessions", "200", "--samples", "2"],
    "experiment": ["--sizes", "10", "--concurrency", "2"],
    "fault_suite": ["--smoke"],
    "follow_up_due": ["--db", "{db}", "--sessions", "2000", "--samples", "2"],
    "hardening_classes": ["--smoke"],
    "knowledge": ["--chunks", "20", "--queries", "3"],
    "language": ["--repeat", "1", "--sessions", "1", "--rounds", "1"],
    # callgrind's child, without valgrind (see the module docstring)
    "language_instructions": ["--child", "en", "1"],
    "manager_overhead": ["--turns", "3"],
    "metrics": ["--turns", "100", "--ref", ""],  # no git history needed
    "observations": ["--turns", "3"],
    "prompt_growth": ["--smoke"],
    "realistic_turn": ["--sessions", "1", "--turns", "2", "--rounds", "1"],
    "recall": ["--db", "{db}", "--sessions", "1", "--turns", "2", "--smoke"],
    "reload_stall": ["--reloads", "2"],
    "replay": ["--sessions", "10", "--engine", "3", "--jobs", "1"],
    "report_scale": ["--sessions", "50", "--smoke"],
    # and the same load on bench/floor_service.py
    "serve_load": ["--conversations", "2", "--duration", "2", "--healthz-seconds", "0.5",
                   "--workers", "1", "--delay", "0.01", "--floor-service"],
    "sizing": ["--conversations", "1"],
    "start": ["--workers", "1", "--runs", "1", "--smoke"],
    "streaming": ["--turns", "1"],
    "stream_chunks": ["--smoke"],
    "studio": ["--saves", "1", "--turns", "1"],
    "studio_editor": ["--db", "{db}", "--n", "2"],
    "tokens": ["--turns", "15", "--smoke"],
    # callgrind's child, without valgrind; the floor child runs bench/floor.py
    "turn_instructions": ["--child", "floor", "--sessions", "1"],
    "turn_overhead": ["--sessions", "1", "--turns", "2", "--rounds", "1"],
    "validate_speed": ["--smoke"],
    "versions": ["--smoke"],
    "wal_breakdown": ["--sessions", "1", "--turns", "2"],
    "what_if": ["--sessions", "6", "--engine", "2"],
}
# Modules the scripts import, and where they run.
MODULES = {"_db": "every script's database", "floor": "turn_instructions' floor child",
           "floor_service": "serve_load --floor-service"}


@dataclass
class Ran:
    code: int | None  # None: timed out
    seconds: float
    output: str


def _run(script: str, args: list[str], db: str) -> Ran:
    env = {**os.environ, "FUNNEL_DB": db, "FUNNEL_TEST_DSN": db,
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(BENCH)])}
    for name in ("FUNNEL_MODEL", "PROMETHEUS_MULTIPROC_DIR"):
        env.pop(name, None)
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, str(BENCH / f"{script}.py"),
                               *(a.format(db=db) for a in args)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[-3000:], (exc.stderr or b"")[-3000:]
        return Ran(None, time.monotonic() - started, f"{out[0]!r}\n{out[1]!r}")
    return Ran(done.returncode, time.monotonic() - started,
               f"{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-3000:]}")


@pytest.fixture(scope="module")
def runs(server_dsn: str) -> Iterator[dict[str, Future[Ran]]]:
    """Every run, started at once on a pool of :data:`PARALLEL`; each test waits for its own."""
    # The longest first, so that the pool's tail is short.
    order = ["start", "streaming", "sizing", "observations", "realistic_turn", "studio",
             "tokens", "prompt_growth", "fault_suite"]
    ordered = sorted(RUNS, key=lambda c: (order.index(c) if c in order else len(order)))
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = {case: pool.submit(_run, case, RUNS[case], server_dsn) for case in ordered}
        yield futures
        for future in futures.values():
            future.cancel()


def test_every_bench_script_is_listed() -> None:
    found = {p.stem for p in BENCH.glob("*.py")}
    assert found == set(RUNS) | set(MODULES), \
        "list each bench script in tests/test_bench_smoke.py's RUNS (its smallest arguments)"


@pytest.mark.parametrize("case", RUNS)
def test_bench_script_runs(case: str, runs: dict[str, Future[Ran]]) -> None:
    if case == "studio" and not (shutil.which("chromium") or shutil.which("chromium-browser")):
        if os.environ.get("CI"):
            pytest.fail("bench/studio.py needs chromium and chromium-driver")
        pytest.skip("bench/studio.py drives the page in headless Chromium: apt-get install -y "
                    "chromium chromium-driver")
    ran = runs[case].result()
    assert ran.code is not None, f"{case} did not end within {TIMEOUT} s:\n{ran.output}"
    assert ran.code == 0, f"{case} exited {ran.code} after {ran.seconds:.1f} s:\n{ran.output}"
