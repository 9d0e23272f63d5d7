"""Start and memory of `funnel serve`, against `import litellm` measured in the same run.

    python3 bench/start.py --db postgresql://postgres@127.0.0.1:5432/test [--workers 2] [--runs 3]

Each run starts ``funnel serve funnels/puramur.yaml`` (a throwaway schema) with a real
litellm model (``openai/gpt-4o-mini`` at a local fake OpenAI server, so litellm is
imported as in production) and measures, from the process's start:

- ``/healthz`` answering 200, and ``/readyz`` answering ready;
- the resident memory of each worker once ready (RSS), its proportional share (PSS:
  pages shared with the master and the other workers divided among them), its own
  pages (USS: what one more worker adds), and the whole service's PSS (what the
  processes together cost the machine);
- the first customer's turn and the second's (another session), so that what a lazy
  load would move out of the start into the first turn shows.

The baseline, in the same run: ``python -c "import litellm"`` (wall time and RSS), and
``python -c "pass"`` for the interpreter alone. Medians over ``--runs``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fake_openai import FakeOpenAI  # noqa: E402

from engine.store.connect import temporary_schema  # noqa: E402

KEY = "bench-start-key-8c1f"
REPLY = json.dumps({"reply": "Hello! Which pet do you have?", "updates": {}, "actions": []})


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def baseline(code: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of ``python -c code``."""
    start = time.perf_counter()
    proc = psutil.Popen([sys.executable, "-c", code + "\nimport resource, sys\n"
                         "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"],
                        stdout=subprocess.PIPE, text=True,
                        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    out, _ = proc.communicate()
    wall = time.perf_counter() - start
    return wall, int(out.split()[-1]) / 1024


def _get(url: str, timeout: float = 1.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def _post(url: str, body: dict[str, Any]) -> float:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()
    return time.perf_counter() - start


def one_run(db: str, workers: int, fake: FakeOpenAI) -> dict[str, float]:
    port = _free_port()
    env = {**os.environ, "FUNNEL_DB": db, "FUNNEL_API_KEYS": f"{KEY}:converse",
           "FUNNEL_SECRET": "s" * 32, "FUNNEL_LOG_LEVEL": "warning", "OPENAI_API_KEY": "sk-fake",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "FUNNEL_RELOAD": "0"}
    base = f"http://127.0.0.1:{port}"
    start = time.perf_counter()
    proc = psutil.Popen([sys.executable, "-m", "engine.cli", "serve", str(ROOT / "funnels/puramur.yaml"),
                         "--port", str(port), "--workers", str(workers),
                         "--model", "openai/gpt-4o-mini", "--api-base", fake.api_base],
                        env=env, cwd=ROOT, stderr=subprocess.DEVNULL)
    healthz = readyz = 0.0
    try:
        while time.perf_counter() - start < 180:
            if not healthz and _get(base + "/healthz", 0.5)[0] == 200:
                healthz = time.perf_counter() - start
            if healthz:
                if _get(base + "/readyz", 2.0)[0] == 200:  # 503 until ready
                    readyz = time.perf_counter() - start
                    break
            time.sleep(0.02)
        if not readyz:
            raise SystemExit("funnel serve did not become ready in 180 s")
        time.sleep(0.5)  # let the workers settle before reading their memory
        procs = [proc, *proc.children(recursive=True)]
        full = {p.pid: p.memory_full_info() for p in procs}
        pss_each = {pid: m.pss / 2**20 for pid, m in full.items()}
        pss = sum(pss_each.values())
        # With one worker the process is the worker; with more, the master is not one.
        workers_mem = [m for pid, m in full.items() if pid != proc.pid or workers == 1]
        workers_rss = [m.rss / 2**20 for m in workers_mem]
        workers_pss = [m.pss / 2**20 for m in workers_mem]
        workers_uss = [m.uss / 2**20 for m in workers_mem]
        url = f"{base}/v1/funnels/puramur/sessions/%s/messages"
        first = _post(url % f"first-{port}", {"text": "Hi"})
        second = _post(url % f"second-{port}", {"text": "Hi"})
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except psutil.TimeoutExpired:
            proc.kill()
    return {"healthz": healthz, "readyz": readyz, "rss_max": max(workers_rss), "pss": pss,
            "pss_worker": max(workers_pss), "uss_worker": max(workers_uss),
            "pss_master": pss_each[proc.pid] if workers > 1 else 0.0,
            "first_turn": first, "second_turn": second}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", default=os.environ.get("FUNNEL_TEST_DSN"), required=False)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="the smallest run "
                    "(tests/test_bench_smoke.py): the service only, without the baselines")
    args = ap.parse_args()
    if not args.db:
        raise SystemExit("give --db (or FUNNEL_TEST_DSN)")
    fake = FakeOpenAI().start()
    fake.respond_with(lambda body: REPLY)
    rows: list[dict[str, float]] = []
    base_lite: list[tuple[float, float]] = []
    base_py: list[tuple[float, float]] = []
    with temporary_schema(args.db, prefix="bench_start") as url:
        with psycopg.connect(url, autocommit=True):
            pass
        for _ in range(args.runs):  # interleaved, so that the machine's drift hits both
            if not args.smoke:
                base_py.append(baseline("pass"))
                base_lite.append(baseline("import litellm"))
            rows.append(one_run(url, args.workers, fake))
    fake.stop()

    def med(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    lite = med([w for w, _ in base_lite])
    print(f"funnel serve, {args.workers} worker(s), {args.runs} runs (medians)\n")
    print("| what | seconds | × import litellm |")
    print("|---|---|---|")
    print(f"| python -c pass | {med([w for w, _ in base_py]):.2f} | "
          f"{med([w for w, _ in base_py]) / lite:.2f} |")
    print(f"| python -c 'import litellm' (baseline) | {lite:.2f} | 1.00 |")
    for key in ("healthz", "readyz"):
        v = med([r[key] for r in rows])
        print(f"| funnel serve: /{key} answers | {v:.2f} | {v / lite:.2f} |")
    print("\n| memory | MB |\n|---|---|")
    print(f"| python -c 'import litellm', peak RSS | {med([m for _, m in base_lite]):.0f} |")
    print(f"| a worker's RSS once ready (max over workers) | {med([r['rss_max'] for r in rows]):.0f} |")
    print(f"| a worker's PSS once ready (max over workers) | "
          f"{med([r['pss_worker'] for r in rows]):.0f} |")
    print(f"| a worker's USS once ready (its own pages: what each further worker costs) | "
          f"{med([r['uss_worker'] for r in rows]):.0f} |")
    if args.workers > 1:
        print(f"| the master's PSS | {med([r['pss_master'] for r in rows]):.0f} |")
    print(f"| the whole service's PSS (master + workers) | {med([r['pss'] for r in rows]):.0f} |")
    print("\n| turn | ms |\n|---|---|")
    print(f"| the first customer's turn | {med([r['first_turn'] for r in rows]) * 1000:.0f} |")
    print(f"| the second customer's turn | {med([r['second_turn'] for r in rows]) * 1000:.0f} |")
    print(f"\nload average at the end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
