"""Load on `funnel serve`: N concurrent conversations against a model that takes D seconds.

    python3 bench/serve_load.py --db postgresql://postgres@127.0.0.1:5432/test

starts `funnel serve funnels/puramur.yaml --workers 2` on 127.0.0.1 (in a
throwaway schema) with the scripted model slowed to ``--delay`` seconds a call
(the script's ``delay:`` key), then, in one run:

(a) the two workers' capacity on a no-op endpoint (``GET /healthz``) at the
    same client concurrency: the most requests a second that HTTP alone allows;
(b) the engine's throughput over ``--duration`` seconds: each of
    ``--conversations`` clients sends its next message when the previous reply
    arrives (a new session every ``--session-turns`` messages), against the
    ideal conversations / delay, which can be no higher than (a) (a turn holds
    no database connection while the model thinks, so connections are no bound);
(c) p50 / p99 latency as the client sees it and the p99 added over the model's
    delay, and from ``funnel_turns`` the engine's own ``turn_ms`` / ``llm_ms``;
(d) errors (any answer but 200, or a broken connection).

The conversations' first messages are spread over one model delay, as real
conversations start at different times; ``--lockstep`` starts them all at the
same instant, and with a model that always takes exactly ``--delay`` they then
stay in waves of 100 requests a worker, which the tail latency shows.

The client is a small keep-alive HTTP/1.1 client on asyncio (one connection per
conversation), chosen to cost the server's cores as little as possible: it
runs on the same machine as the service and PostgreSQL and shares its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench._db import server_url, throwaway_schema  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# The copies live in a temporary folder and read the repository's prompts: let them.
os.environ.setdefault("FUNNEL_ROOT", str(ROOT))
FUNNEL = ROOT / "funnels" / "puramur.yaml"
KEY = "bench-converse-key-0123456789"
MESSAGES = ["Hi!", "I have a cat", "her skin is dry", "what would you recommend?",
            "is it expensive?", "ok", "thanks"]


class Connection:
    """One keep-alive HTTP/1.1 connection (answers must carry Content-Length)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes | None = None
                      ) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nX-API-Key: {KEY}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + (body or b""))
        status_line = await self.reader.readuntil(b"\r\n")
        length = 0
        while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        data = await self.reader.readexactly(length)
        return int(status_line.split()[1]), data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds(pids: list[int] | None = None) -> dict[int, float]:
    """User + system CPU seconds by process: ``pids`` and their descendants, or every
    PostgreSQL process of the machine (``None``)."""
    procs: list[psutil.Process] = []
    if pids is None:
        procs = [p for p in psutil.process_iter(["name"]) if p.info["name"] == "postgres"]
    else:
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                top = psutil.Process(pid)
                procs += [top, *top.children(recursive=True)]
    out: dict[int, float] = {}
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            out[proc.pid] = times.user + times.system
    return out


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two :func:`cpu_seconds` (a process that exited in between is
    left out: its last figures are gone)."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


async def floor_rate(db: str, sessions: int = 200, turns: int = 10, tasks: int = 8
                     ) -> dict[str, float]:
    """The same work's floor (bench/floor.py, as bench/realistic_turn.py plays it): turns per
    second of one process, and the CPU per turn of that client and of PostgreSQL (measured
    while its connections are open: a backend's figures go with it)."""
    import realistic_turn

    async with realistic_turn.floor_turns(db, turns, tasks) as turn:
        pg0, cpu0 = cpu_seconds(), time.process_time()
        out = await realistic_turn.play(turn, [f"floor-{i}" for i in range(sessions)], turns,
                                        tasks)
        client, pg = time.process_time() - cpu0, spent(pg0, cpu_seconds())
    n = sessions * turns
    return {"tps": out["tps"], "client_ms": client * 1000 / n, "pg_ms": pg * 1000 / n}


async def healthz(port: int, clients: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal errors
        conn = Connection("127.0.0.1", port)
        try:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                try:
                    status, _ = await conn.request("GET", "/healthz")
                except (OSError, asyncio.IncompleteReadError):
                    errors += 1
                    conn.close()
                    continue
                latencies.append(time.perf_counter() - t)
                if status != 200:
                    errors += 1
        finally:
            conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    return {"rps": len(latencies) / elapsed, "p50": pct(latencies, .5),
            "p99": pct(latencies, .99), "errors": errors, "requests": len(latencies)}


async def conversations(port: int, clients: int, seconds: float, session_turns: int,
                        run: str, stagger: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors: dict[str, int] = {}
    stop = time.perf_counter() + seconds

    async def client(n: int) -> None:
        conn = Connection("127.0.0.1", port)
        turn = 0
        # Conversations do not all start in the same millisecond: spread the first
        # messages over one model delay, or every client stays in one lockstep wave.
        await asyncio.sleep(stagger * n / clients)
        try:
            while time.perf_counter() < stop:
                session = f"{run}-{n}-{turn // session_turns}"
                text = MESSAGES[turn % session_turns % len(MESSAGES)]
                body = json.dumps({"text": text}).encode()
                t = time.perf_counter()
                try:
                    status, data = await conn.request(
                        "POST", f"/v1/funnels/puramur/sessions/{session}/messages", body)
                except (OSError, asyncio.IncompleteReadError) as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    conn.close()
                    await asyncio.sleep(0.1)
                    continue
                if status == 200:
                    latencies.append(time.perf_counter() - t)
                else:
                    key = f"HTTP {status} {json.loads(data or b'{}').get('error', '')}".strip()
                    errors[key] = errors.get(key, 0) + 1
                turn += 1
        finally:
            conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(client(n) for n in range(clients)))
    elapsed = time.perf_counter() - started
    return {"tps": len(latencies) / elapsed, "turns": len(latencies), "elapsed": elapsed,
            "p50": pct(latencies, .5), "p99": pct(latencies, .99),
            "mean": statistics.fmean(latencies) if latencies else float("nan"),
            "errors": errors}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    import urllib.request

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"funnel serve exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"funnel serve was not ready in 90 s:\n{log.read_text()[-3000:]}")


def measured_load(port: int, pid: int, args: argparse.Namespace, run: str
                  ) -> tuple[dict[str, Any], dict[str, float]]:
    """The conversations' load on the service at ``port``, and the CPU seconds it cost the
    service (``pid`` and its workers), PostgreSQL and this client."""
    svc0, pg0, me0 = cpu_seconds([pid]), cpu_seconds(), time.process_time()
    c = asyncio.run(conversations(port, args.conversations, args.duration, args.session_turns,
                                  f"{run}{int(time.time())}",
                                  0.0 if args.lockstep else args.delay))
    return c, {"service": spent(svc0, cpu_seconds([pid])), "postgres": spent(pg0, cpu_seconds()),
               "client": time.process_time() - me0}


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT (uvicorn's graceful stop) to the service's process group, SIGKILL after 30 s."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def floor_service(db: str, args: argparse.Namespace, tmp: Path
                  ) -> tuple[dict[str, Any], dict[str, float]]:
    """The same load on bench/floor_service.py: its conversations and CPU by process."""
    import pickle

    import floor
    import realistic_turn

    recording = asyncio.run(floor.record(db, realistic_turn.HAPPY, MESSAGES))
    (tmp / "recording.pickle").write_bytes(pickle.dumps(recording))
    port = free_port()
    log = tmp / "floor_service.log"
    env = {**os.environ, "FLOOR_RECORDING": str(tmp / "recording.pickle"), "FLOOR_DB": db,
           "FLOOR_DELAY": str(args.delay), "FLOOR_DB_POOL": str(args.db_pool)}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "floor_service:app", "--app-dir",
             str(ROOT / "bench"), "--port", str(port), "--workers", str(args.workers),
             "--loop", "uvloop", "--http", "httptools", "--no-access-log",
             "--log-level", "warning"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(port, proc, log)
        c, cpu = measured_load(port, proc.pid, args, "f")
    finally:
        stop(proc)
    if "Traceback" in log.read_text():
        print(f"floor service log:\n{log.read_text()[-3000:]}")
    return c, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    ap.add_argument("--conversations", type=int, default=200)
    ap.add_argument("--delay", type=float, default=0.3, help="seconds per model call")
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--healthz-seconds", type=float, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--session-turns", type=int, default=7,
                    help="messages per session before a conversation starts a new one")
    ap.add_argument("--turn-pool", type=int, default=None,
                    help="FUNNEL_TURN_POOL per worker (default: every conversation)")
    ap.add_argument("--db-pool", type=int, default=8)
    ap.add_argument("--floor", action="store_true",
                    help="also run the same work's floor (bench/floor.py) and print the CPU "
                         "each costs per turn and the turns a core can carry")
    ap.add_argument("--floor-service", action="store_true",
                    help="also run the same load on bench/floor_service.py (the floor's "
                         "statements and the model's delay behind the same HTTP stack) and "
                         "print its throughput and added latency: what the machine adds "
                         "without the engine")
    ap.add_argument("--lockstep", action="store_true",
                    help="start every conversation at the same instant (by default the first "
                         "messages are spread over one model delay)")
    args = ap.parse_args()

    url = server_url(args.db)
    with psycopg.connect(url) as conn:
        max_conn = int(conn.execute("SHOW max_connections").fetchone()[0])  # type: ignore[index]
    # A turn holds no connection while the model thinks (a lease on its session), so
    # every conversation can be in flight; each worker only needs a few connections.
    turn_pool = args.turn_pool or args.conversations
    print(f"machine: {os.cpu_count()} cores, shared by the load client, {args.workers} "
          f"workers and PostgreSQL")
    print(f"PostgreSQL: max_connections={max_conn}; FUNNEL_TURN_POOL={turn_pool}, "
          f"FUNNEL_DB_POOL={args.db_pool} per worker ({args.workers * args.db_pool} "
          "connections in all)")

    with throwaway_schema(url) as db, tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.json"
        script.write_text(json.dumps({"delay": args.delay, "default": {
            "reply": "Thank you! Tell me more about your pet."}}))
        port = free_port()
        log = Path(tmp) / "serve.log"
        env = {**os.environ, "FUNNEL_API_KEYS": f"{KEY}:converse",
               "FUNNEL_SECRET": "bench-secret-0123456789abcdef", "FUNNEL_LOG_LEVEL": "warning",
               "FUNNEL_RATE_LIMIT": "100000000/60", "FUNNEL_TURN_POOL": str(turn_pool),
               "FUNNEL_DB_POOL": str(args.db_pool)}
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "engine.cli", "serve", str(FUNNEL), "--db", db,
                 "--port", str(port), "--workers", str(args.workers),
                 "--model", f"scripted:{script}"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(port, proc, log)
            h = asyncio.run(healthz(port, args.conversations, args.healthz_seconds))
            c, cpu = measured_load(port, proc.pid, args, "r")
        finally:
            stop(proc)
        with psycopg.connect(db) as conn:
            turn_ms, llm_ms = zip(*conn.execute(
                "SELECT turn_ms, llm_ms FROM funnel_turns").fetchall(), strict=True)
        if "Traceback" in log.read_text():
            print(f"service log:\n{log.read_text()[-3000:]}")
        f = asyncio.run(floor_rate(db)) if args.floor else None
        fs = floor_service(db, args, Path(tmp)) if args.floor_service else None

    ideal = args.conversations / args.delay
    bound = min(ideal, h["rps"])
    delay_ms = args.delay * 1000
    print(f"\n(a) no-op capacity, GET /healthz, {args.conversations} clients, "
          f"{args.healthz_seconds:g} s: {h['rps']:.0f} req/s (p50 {h['p50'] * 1000:.1f} ms, "
          f"p99 {h['p99'] * 1000:.1f} ms, errors {h['errors']})")
    start = "all at once (--lockstep)" if args.lockstep else \
        f"first messages spread over {args.delay:g} s"
    print(f"(b) throughput, {args.conversations} conversations ({start}), "
          f"{c['elapsed']:.0f} s: {c['tps']:.0f} turns/s ({c['turns']} turns)")
    print(f"    ideal {args.conversations}/{args.delay:g} s = {ideal:.0f} turns/s; "
          f"bounded by (a) {h['rps']:.0f}: {bound:.0f} turns/s")
    print(f"    = {c['tps'] / ideal:.2f} x the ideal, {c['tps'] / bound:.2f} x the bound "
          f"(target >= 0.95)")
    print(f"(c) client latency p50 {c['p50'] * 1000:.0f} ms, p99 {c['p99'] * 1000:.0f} ms "
          f"(mean {c['mean'] * 1000:.0f} ms); added p99 over the model's {delay_ms:.0f} ms: "
          f"{c['p99'] * 1000 - delay_ms:.0f} ms (target < 30 ms)")
    print(f"    engine turn_ms p50 {pct(list(turn_ms), .5):.0f} / p99 {pct(list(turn_ms), .99):.0f}"
          f" ms, llm_ms p50 {pct(list(llm_ms), .5):.0f} / p99 {pct(list(llm_ms), .99):.0f} ms "
          f"(turn_ms: from Engine.handle's start, the wait for a slot and the session's lease "
          f"included, to just before the save)")
    # A closed loop of N conversations with no think time but the model's: by Little's
    # law the mean time a turn spends in the system is N / X. What the latency adds over
    # the model is then the queue's, as long as the measured mean stays near N / X.
    little = args.conversations / c["tps"]
    print(f"    Little's law: {args.conversations} conversations / {c['tps']:.0f} turns/s = "
          f"{little * 1000:.0f} ms mean in the system; measured mean {c['mean'] * 1000:.0f} ms "
          f"({c['mean'] / little:.2f} x): the latency is {'' if c['mean'] <= little * 1.1 else 'not '}"
          f"what the queue explains")
    per_turn = {k: v * 1000 / c["turns"] for k, v in cpu.items()}
    total = sum(per_turn.values())
    print(f"(e) CPU per turn: service {per_turn['service']:.2f} ms, PostgreSQL "
          f"{per_turn['postgres']:.2f} ms, load client {per_turn['client']:.2f} ms = "
          f"{total:.2f} ms; {c['tps'] / os.cpu_count():.0f} turns/s per core "
          f"({1000 / total:.0f} turns per CPU-second)")
    if f is not None:
        floor_total = f["client_ms"] + f["pg_ms"]
        print(f"    the same work's floor (bench/floor.py, plain psycopg, 8 tasks): client "
              f"{f['client_ms']:.2f} ms + PostgreSQL {f['pg_ms']:.2f} ms = {floor_total:.2f} ms "
              f"a turn, {1000 / floor_total:.0f} turns per CPU-second ({f['tps']:.0f} turns/s "
              f"from one process); the service carries {floor_total / total:.2f} x the floor's "
              "turns per CPU-second")
    if fs is not None:
        fc, fcpu = fs
        fper = {k: v * 1000 / max(1, fc["turns"]) for k, v in fcpu.items()}
        print(f"(f) the floor service (bench/floor_service.py: the same statements and the "
              f"model's delay, behind uvicorn and starlette, {args.workers} workers), the same "
              f"load: {fc['tps']:.0f} turns/s = {fc['tps'] / ideal:.2f} x the ideal; p50 "
              f"{fc['p50'] * 1000:.0f} ms, p99 {fc['p99'] * 1000:.0f} ms, added p99 "
              f"{fc['p99'] * 1000 - delay_ms:.0f} ms (the engine's: "
              f"{c['p99'] * 1000 - delay_ms:.0f} ms); CPU per turn: service "
              f"{fper['service']:.2f} ms, PostgreSQL {fper['postgres']:.2f} ms, load client "
              f"{fper['client']:.2f} ms; errors {sum(fc['errors'].values())}")
    print(f"(d) errors: {sum(c['errors'].values())} {c['errors'] or ''}".rstrip())
    print("the load client ran on the same machine, on the same cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
