"""The time to erase one customer (`funnel forget`) among 100,000 Puramur sessions.

Seeded in SQL (INSERT ... SELECT FROM generate_series) in a throwaway schema that
is dropped at the end: per session a state row, 6 messages, 3 turn records, a
delivery key and 2 embeddings; one session in 10 has an outbox alert and an order,
one in 20 a manager's control event. Then VACUUM ANALYZE, and, in the same run:

* baseline: ``DELETE FROM puramur_sessions_state WHERE session_id = %s`` of one row
  by its primary key (autocommit), for ``--samples`` sessions;
* erase: ``store.erase_session`` (engine.store.erasure) of ``--samples`` other
  sessions: the lease, every table's rows, the audit event, one transaction.

Each prints its median and p95 in milliseconds.

    python bench/erase_one.py [--db URL] [--sessions 100000] [--samples 50]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bench._db import server_url, throwaway_schema  # noqa: E402
from engine.funnel.compiled import load_funnel  # noqa: E402
from engine.store import open_store  # noqa: E402

PURAMUR = ROOT / "funnels" / "puramur.yaml"
TABLE = "puramur_sessions_state"

SEED = [
    f"INSERT INTO {TABLE} (session_id, customer) SELECT 's-' || g, jsonb_build_object("
    "'name', 'Customer ' || g) FROM generate_series(1, %(n)s) g",
    "INSERT INTO funnel_messages (funnel, session_id, role, content, stage) SELECT "
    "'puramur', 's-' || g, CASE WHEN k %% 2 = 0 THEN 'user' ELSE 'assistant' END, "
    "'message ' || k || ' of session ' || g, 'discovery' FROM generate_series(1, %(n)s) g, "
    "generate_series(0, 5) k",
    "INSERT INTO funnel_turns (funnel, funnel_version, session_id, stage_before, stage_after, "
    "raw_output) SELECT 'puramur', 1, 's-' || g, 'greeting', 'discovery', "
    "jsonb_build_array('{\"reply\": \"hello ' || g || '\"}') FROM generate_series(1, %(n)s) g, "
    "generate_series(1, 3) k",
    "INSERT INTO funnel_inbound (funnel, channel, key, session_id, response) SELECT 'puramur', "
    "'api', 'key-' || g, 's-' || g, '{\"reply\": \"hi\"}' FROM generate_series(1, %(n)s) g",
    "INSERT INTO funnel_embeddings (message_id, funnel, session_id, model, embedding) SELECT "
    "id, funnel, session_id, 'bench', ARRAY[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]::real[] "
    "FROM funnel_messages WHERE id %% 3 = 0",
    "INSERT INTO funnel_outbox (idempotency_key, funnel, session_id, kind, payload, "
    "delivered_at) SELECT 'reply-' || g || '-' || k, 'puramur', 's-' || g, 'reply', "
    "jsonb_build_object('text', 'reply ' || k), NOW() FROM generate_series(1, %(n)s) g, "
    "generate_series(1, 3) k",
    "INSERT INTO funnel_outbox (idempotency_key, funnel, session_id, kind, payload) SELECT "
    "'handoff-' || g, 'puramur', 's-' || g, 'handoff', jsonb_build_object('customer', "
    "'Customer ' || g) FROM generate_series(1, %(n)s, 10) g",
    "INSERT INTO funnel_conversions (funnel, order_id, session_id, amount, currency, "
    "ordered_at) SELECT 'puramur', 'o-' || g, 's-' || g, 10, 'UAH', NOW() "
    "FROM generate_series(1, %(n)s, 10) g",
    "INSERT INTO funnel_control_events (funnel, session_id, event, manager) SELECT "
    "'puramur', 's-' || g, 'takeover', 'Olena' FROM generate_series(1, %(n)s, 20) g",
]


def _stats(label: str, ms: list[float]) -> str:
    ms = sorted(ms)
    p95 = ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]
    return f"{label:<44} median {statistics.median(ms):7.2f} ms   p95 {p95:7.2f} ms"


async def run(url: str, sessions: int, samples: int) -> None:
    spec = load_funnel(PURAMUR).spec
    store = await open_store(url)
    try:
        await store.ensure_schema(spec)
        started = time.perf_counter()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            for statement in SEED:
                await conn.execute(statement, {"n": sessions})  # type: ignore[arg-type]
            for table in (TABLE, "funnel_messages", "funnel_turns", "funnel_inbound",
                          "funnel_embeddings", "funnel_outbox", "funnel_conversions",
                          "funnel_control_events"):
                await conn.execute(f"VACUUM ANALYZE {table}")  # type: ignore[arg-type]
            counts = {}
            for table in (TABLE, "funnel_messages", "funnel_turns", "funnel_embeddings",
                          "funnel_outbox"):
                row = await (await conn.execute(
                    f"SELECT count(*) FROM {table}")).fetchone()  # type: ignore[arg-type]
                counts[table] = row[0] if row else 0
            print(f"seeded in {time.perf_counter() - started:.1f} s: "
                  + ", ".join(f"{t} {n:,}" for t, n in counts.items()))
            picks = random.Random(7).sample(range(1, sessions + 1), 2 * samples)
            # Sessions 1, 11, 21...: with an alert and an order, the fullest erasure.
            base, erased = picks[:samples], [(p // 10) * 10 + 1 for p in picks[samples:]]
            plain = []
            for n in base:
                t0 = time.perf_counter()
                await conn.execute(f"DELETE FROM {TABLE} WHERE session_id = %s",  # type: ignore[arg-type]
                                   (f"s-{n}",))
                plain.append((time.perf_counter() - t0) * 1000)
        erase, rows = [], []
        for n in dict.fromkeys(erased):
            t0 = time.perf_counter()
            receipt = await store.erase_session(spec, f"s-{n}", by="bench")
            erase.append((time.perf_counter() - t0) * 1000)
            rows.append(receipt["total"])
        print(_stats("baseline: DELETE of one row by primary key", plain))
        print(_stats(f"erase one customer ({statistics.median(rows):.0f} rows, 10 tables)",
                     erase))
        print(f"ratio of medians: {statistics.median(erase) / statistics.median(plain):.1f}x")
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="PostgreSQL URL (default: embedded)")
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=50)
    args = parser.parse_args()
    with throwaway_schema(server_url(args.db)) as url:
        asyncio.run(run(url, args.sessions, args.samples))


if __name__ == "__main__":
    main()
