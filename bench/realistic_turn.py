"""The cost of a realistic turn, next to a raw psycopg SELECT + UPSERT measured in the same run.

The engine plays a whole Puramur conversation per session, the configuration of the
peer harness (``../shared/peers/bench_funnel.py``, issue 19): the happy-path scenario's
8 turns (greeting -> discovery -> presentation -> objection -> cart with gift ->
contact -> handoff -> thanks) and then chit-chat, with the offline scripted model,
through the public API (``Engine.open`` + ``engine.handle``). So a turn here does what a
real turn does: the message log, the window, knowledge, the prompt, schema validation,
updates, catalog actions, transitions, the summary, the state, the turn record, once
the outbox. Sessions are played round-major (every turn really reloads its row), one
at a time or 8 concurrent asyncio tasks (sessions partitioned among them).

The baseline is what a hand-written turn costs at the least, the harness's raw
psycopg peer: in one transaction, a ``SELECT`` of a ~2 KB JSONB row and an ``INSERT
... ON CONFLICT DO UPDATE`` of it, on the same event loop and database. Per
configuration it prints p50 and p99 latency, turns per second, the client's CPU per
turn (process time: what bounds a worker), and from PostgreSQL's statistics the
transactions and WAL bytes per turn (WAL from ``pg_stat_statements`` when the server
loads it, else from the server's WAL position, which counts other databases' work too).

    python bench/realistic_turn.py [--db URL] [--sessions 200] [--turns 10] [--rounds 3]
                                   [--uvloop]

``--uvloop`` runs both on uvloop's event loop instead of asyncio's (as `funnel serve`
and ``SyncEngine`` do when it is installed).

Without --db it uses $FUNNEL_TEST_DSN, then $FUNNEL_DB, else the embedded PostgreSQL.
Compare ratios within one run, never absolute times across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import floor  # noqa: E402  (bench/floor.py)
import psycopg  # noqa: E402
from _db import server_url, throwaway_schema  # noqa: E402
from psycopg import sql  # noqa: E402
from psycopg.types.json import Jsonb  # noqa: E402

from engine import Engine, ScriptedModel, load_funnel  # noqa: E402
from engine.store import open_store  # noqa: E402

# The peer harness's script: Puramur's happy path, then chit-chat ("OK.").
HAPPY: list[dict[str, Any]] = [
    {"reply": "Hello! Is your pet a cat or a dog?", "language": "en"},
    {"reply": "Sphynx skin needs gentle care. How old is she?",
     "updates": {"pet": {"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"]}}},
    {"reply": "For Murka: Exotic Spa shampoo and lotion.",
     "updates": {"pet": {"age_years": 3, "name": "Murka"}},
     "actions": [{"type": "present_products", "skus": ["PR251010", "PR251020"]}]},
    {"reply": "I understand. The shampoo lasts three months.",
     "actions": [{"type": "record_objection", "objection": "price"}]},
    {"reply": "Done, and a gift!",
     "actions": [{"type": "add_to_cart", "sku": "PR251010", "qty": 1},
                 {"type": "add_to_cart", "sku": "PR251020", "qty": 2}]},
    {"reply": "Your name and phone, please?", "actions": [{"type": "confirm_cart"}]},
    # No promise of a call: the bench's messages do not give the contacts, so the
    # hand-off does not happen and the claims check would refuse one (engine.claims).
    {"reply": "Thank you, Anna!",
     "updates": {"customer": {"name": "Anna", "phone": "066 123 45 67"}}},
    {"reply": "You're welcome!"},
    {"reply": "Anything else?"},
    {"reply": "Have a nice day!"},
]

RAW_DDL = ("CREATE TABLE IF NOT EXISTS bench_raw_turn (session_id TEXT PRIMARY KEY, "
           "state JSONB NOT NULL, updated_at TIMESTAMPTZ NOT NULL DEFAULT NOW())")
RAW_UPSERT = ("INSERT INTO bench_raw_turn (session_id, state) VALUES (%s, %s) "
              "ON CONFLICT (session_id) DO UPDATE SET state = EXCLUDED.state, updated_at = NOW()")

Turn = Callable[[str, int], Awaitable[Any]]


def message(t: int) -> str:
    return f"turn {t}: I have a dog, what toy would you suggest?"


def raw_state(sid: str) -> dict[str, Any]:
    """About 2 KB of JSON, like the harness's peers keep per session."""
    return {"session_id": sid, "turn_count": 0, "stage": "greeting", "last_reply": "",
            "pet": {"type": None, "name": None, "age_years": None},
            "presented_products": [{"sku": f"SKU-{i:02d}", "name": f"Product {i}",
                                    "price": 9.5 + i} for i in range(3)],
            "profile": {"customer_id": f"cust-{sid}", "locale": "en-US",
                        "notes": "Asked about durable toys and grain-free food. " * 8},
            "cart": [{"sku": "SKU-FOOD-07", "qty": 1, "price": 34.0}],
            "slots": {f"slot_{i}": f"value-{i}-" + "x" * 24 for i in range(12)}}


# WAL of this database's statements (pg_stat_statements, when the server loads it: exact
# on a shared server, commit records left out), else the server's WAL position (all of
# the server's work, other databases' too).
_PGSS_SCHEMA = ("SELECT extnamespace::regnamespace::text FROM pg_extension "
                "WHERE extname = 'pg_stat_statements'")
# Top-level statements only: with `pg_stat_statements.track = all`, a function's
# statements are counted on their own too.
_WAL_STATEMENTS = ("SELECT COALESCE(sum(wal_bytes), 0)::bigint FROM {}.pg_stat_statements "
                   "WHERE toplevel AND dbid = "
                   "(SELECT oid FROM pg_database WHERE datname = current_database())")
_WAL_SERVER = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"


async def db_counters(url: str) -> tuple[int, int, str]:
    """(transactions of this database so far, WAL bytes so far, where those come from)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        row = await (await conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()")).fetchone()
        assert row is not None
        # The extension's view is outside the benchmark's own schema (its search_path).
        schema = await (await conn.execute(_PGSS_SCHEMA)).fetchone()
        wal, source = None, "server-wide WAL position"
        if schema is not None:
            try:
                wal = await (await conn.execute(sql.SQL(_WAL_STATEMENTS).format(
                    sql.Identifier(schema[0])))).fetchone()
                source = "pg_stat_statements"
            except psycopg.Error:  # installed but not loaded (shared_preload_libraries)
                pass
        if wal is None:
            wal = await (await conn.execute(_WAL_SERVER)).fetchone()
    assert wal is not None
    return int(row[0]), int(wal[0]), source


async def play(turn: Turn, sessions: list[str], turns: int, tasks: int) -> dict[str, float]:
    """Round-major turns over ``sessions``, partitioned among ``tasks`` coroutines."""
    parts = [sessions[i::tasks] for i in range(tasks)]
    latencies: list[float] = []

    async def body(mine: list[str]) -> None:
        for t in range(turns):
            for sid in mine:
                t0 = time.perf_counter()
                await turn(sid, t)
                latencies.append((time.perf_counter() - t0) * 1000)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(body(p) for p in parts))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    latencies.sort()
    n = len(latencies)
    return {"p50": statistics.median(latencies), "p99": latencies[min(n - 1, int(0.99 * n))],
            "tps": n / wall, "cpu": 1000 * cpu / n}


class Counters:
    """Transactions and WAL bytes per turn between :meth:`start` and :meth:`stop`.

    ``stop`` runs after the measured connections are closed: a backend reports its
    transaction counts when it exits (or about once a second)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.xact0 = self.wal0 = 0

    async def start(self) -> None:
        await asyncio.sleep(1.1)  # let the warm-up's counts arrive first
        self.xact0, self.wal0, _ = await db_counters(self.url)

    async def stop(self, out: dict[str, float], n: int) -> dict[str, float]:
        await asyncio.sleep(1.1)
        xact, wal, _ = await db_counters(self.url)
        out["xacts"] = (xact - self.xact0 - 1) / n  # minus the first counter query
        out["wal"] = (wal - self.wal0) / n
        return out


async def run_raw(url: str, sessions: list[str], turns: int, tasks: int) -> dict[str, float]:
    conns = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(tasks)]
    counters = Counters(url)
    try:
        await conns[0].execute(RAW_DDL)
        free = list(conns)

        async def turn(sid: str, t: int) -> None:
            conn = free.pop()
            try:
                async with conn.transaction():
                    row = await (await conn.execute(
                        "SELECT state FROM bench_raw_turn WHERE session_id = %s", (sid,))
                    ).fetchone()
                    state = row[0] if row else raw_state(sid)
                    state["turn_count"] += 1
                    state["last_reply"] = HAPPY[min(t, len(HAPPY) - 1)]["reply"]
                    await conn.execute(RAW_UPSERT, (sid, Jsonb(state)))
            finally:
                free.append(conn)

        await play(turn, [f"warm-{s}" for s in sessions[:8]], turns, 1)
        await counters.start()
        out = await play(turn, sessions, turns, tasks)
    finally:
        for conn in conns:
            await conn.close()
    return await counters.stop(out, len(sessions) * turns)


async def run_engine(url: str, sessions: list[str], turns: int, tasks: int) -> dict[str, float]:
    funnel = load_funnel(ROOT / "funnels" / "puramur.yaml")
    model = ScriptedModel.from_data({"turns": HAPPY, "default": {"reply": "OK."}})
    store = await open_store(url, max_connections=max(2, tasks), max_turns=max(2, tasks))
    engine = await Engine.open(funnel, model=model, store=store)
    counters = Counters(url)

    async def turn(sid: str, t: int) -> None:
        await engine.handle(sid, message(t))

    try:
        # Warm up (prepared statements, the language detector's models) on sessions of
        # its own, as the harness does.
        await play(turn, [f"warm-{s}" for s in sessions[:8]], turns, 1)
        await counters.start()
        out = await play(turn, sessions, turns, tasks)
        await engine.drain()
    finally:
        await engine.close()
        await store.close()
    return await counters.stop(out, len(sessions) * turns)


@contextlib.asynccontextmanager
async def floor_turns(url: str, turns: int, tasks: int) -> AsyncIterator[Turn]:
    """The same work's floor's turn (bench/floor.py): the statements the engine's turn
    sent, with their parameters, on ``tasks`` plain psycopg connections; warmed up."""
    recording = await floor.record(url, HAPPY, [message(t) for t in range(turns)])
    conns = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(tasks)]
    free = list(conns)

    async def turn(sid: str, t: int) -> None:
        conn = free.pop()
        try:
            await floor.replay_turn(conn, recording, t, sid)
        finally:
            free.append(conn)

    try:
        await play(turn, [f"floor-warm-{i}" for i in range(8)], turns, 1)
        yield turn
    finally:
        for conn in conns:
            await conn.close()


async def run_floor(url: str, sessions: list[str], turns: int, tasks: int) -> dict[str, float]:
    """The same work's floor (bench/floor.py) on ``sessions``: latency, rate, CPU."""
    counters = Counters(url)
    async with floor_turns(url, turns, tasks) as turn:
        await counters.start()
        out = await play(turn, sessions, turns, tasks)
    return await counters.stop(out, len(sessions) * turns)


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=os.environ.get("FUNNEL_TEST_DSN") or os.environ.get("FUNNEL_DB"))
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--uvloop", action="store_true", help="run on uvloop's event loop")
    return ap.parse_args()


async def main(args: argparse.Namespace) -> None:
    # The handoff notifier logs each alert as a warning: keep them out of the table.
    logging.getLogger("funnel").setLevel(logging.ERROR)
    with throwaway_schema(server_url(args.db)) as url:
        print(f"{args.sessions} sessions x {args.turns} turns per run, medians of "
              f"{args.rounds} rounds, configurations interleaved round by round, on "
              f"{'uvloop' if args.uvloop else 'asyncio'}'s event loop")
        header = (f"| config | p50 ms | x raw | p99 ms | turns/s | x raw | client CPU ms/turn "
                  f"| CPU x floor | transactions/turn | WAL bytes/turn |\n|{'---|' * 10}")
        print(header)
        for tasks in (1, 8):
            results: dict[str, list[dict[str, float]]] = {"raw": [], "floor": [], "engine": []}
            for r in range(args.rounds):
                sessions = [f"r{r}t{tasks}-{i:04d}" for i in range(args.sessions)]
                results["raw"].append(await run_raw(url, sessions, args.turns, tasks))
                results["floor"].append(await run_floor(url, [f"f{s}" for s in sessions],
                                                        args.turns, tasks))
                results["engine"].append(await run_engine(url, sessions, args.turns, tasks))
            med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]}
                   for k, v in results.items()}
            base = med["raw"]
            if tasks == 1:
                print(f"(WAL from {(await db_counters(url))[2]})")
            for key, label in (("raw", "raw psycopg SELECT + UPSERT"),
                               ("floor", "the same work's floor (bench/floor.py)"),
                               ("engine", "funnel")):
                m = med[key]
                print(f"| {label}, {tasks} {'task' if tasks == 1 else 'tasks'} | "
                      f"{m['p50']:.2f} | {m['p50'] / base['p50']:.2f} | {m['p99']:.2f} | "
                      f"{m['tps']:,.0f} | {m['tps'] / base['tps']:.2f} | {m['cpu']:.2f} | "
                      f"{m['cpu'] / med['floor']['cpu']:.2f} | "
                      f"{m['xacts']:.2f} | {m['wal']:,.0f} |")


if __name__ == "__main__":
    options = arguments()
    if options.uvloop:
        import uvloop  # uvicorn[standard] brings it

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main(options))
    else:
        asyncio.run(main(options))
