"""Where a realistic turn's WAL goes: bytes per turn by relation and record type.

Plays the configuration of ``bench/realistic_turn.py`` (Puramur's happy path, then
chit-chat, one session at a time) and reads the WAL it wrote back with
``pg_walinspect`` (PostgreSQL 15+, a superuser), keeping only the records of this
database's relations and of the transactions that wrote them: exact on a shared
server, where the WAL position counts everybody's work. Full-page images (their
number depends on when the last checkpoint ran) are shown apart.

    python bench/wal_breakdown.py [--db URL] [--sessions 100] [--turns 10]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from _db import server_url, throwaway_schema  # noqa: E402
from psycopg import sql  # noqa: E402
from realistic_turn import HAPPY, message  # noqa: E402

from engine import Engine, ScriptedModel, load_funnel  # noqa: E402
from engine.store import open_store  # noqa: E402

_BLOCK = re.compile(r"rel (\d+)/(\d+)/(\d+)")


async def play(url: str, sessions: int, turns: int, setup: list[str], path: Path
               ) -> tuple[str, str]:
    """Run the turns; (WAL position before, after)."""
    funnel = load_funnel(path)
    model = ScriptedModel.from_data({"turns": HAPPY, "default": {"reply": "OK."}})
    store = await open_store(url, max_connections=2, max_turns=2)
    engine = await Engine.open(funnel, model=model, store=store)
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            for stmt in setup:  # an experiment's change to the schema
                await conn.execute(stmt.encode())
        for t in range(turns):  # warm-up: prepared statements, the detector's models
            await engine.handle("warm", message(t))
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            start = await (await conn.execute("SELECT pg_current_wal_lsn()::text")).fetchone()
            for t in range(turns):
                for s in range(sessions):
                    await engine.handle(f"s{s:04d}", message(t))
            await engine.drain()
            end = await (await conn.execute("SELECT pg_current_wal_lsn()::text")).fetchone()
    finally:
        await engine.close()
        await store.close()
    assert start is not None and end is not None
    return start[0], end[0]


async def breakdown(url: str, start: str, end: str, n: int) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect SCHEMA public")
        db = await (await conn.execute(
            "SELECT oid FROM pg_database WHERE datname = current_database()")).fetchone()
        assert db is not None
        names = {str(r[0]): r[1] for r in await (await conn.execute(
            "SELECT pg_relation_filenode(oid), relname FROM pg_class "
            "WHERE pg_relation_filenode(oid) IS NOT NULL")).fetchall()}
        rows = await (await conn.execute(
            "SELECT xid::text::bigint, resource_manager, record_type, record_length, "
            "fpi_length, block_ref FROM public.pg_get_wal_records_info(%s, %s)",
            (start, end))).fetchall()
    ours: set[int] = set()
    kept = []
    for xid, rmgr, rtype, length, fpi, blocks in rows:
        m = _BLOCK.search(blocks or "")
        if m and m.group(2) == str(db[0]):
            ours.add(xid)
            kept.append((names.get(m.group(3), m.group(3)), rmgr, rtype, length, fpi))
    for xid, rmgr, rtype, length, fpi, blocks in rows:
        if not _BLOCK.search(blocks or "") and xid in ours and xid != 0:
            kept.append(("(no relation)", rmgr, rtype, length, fpi))
    total: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0, 0])
    for rel, rmgr, rtype, length, fpi in kept:
        entry = total[rel, rmgr, rtype.split()[0]]
        entry[0] += 1
        entry[1] += length - fpi
        entry[2] += fpi
    print(f"{n} turns; per turn: records, bytes without full-page images, FPI bytes")
    print("| relation | rmgr | record | records/turn | bytes/turn | FPI bytes/turn |")
    print("|---|---|---|---|---|---|")
    for (rel, rmgr, rtype), (count, size, fpi) in sorted(total.items(), key=lambda kv: -kv[1][1]):
        print(f"| {rel} | {rmgr} | {rtype} | {count / n:.2f} | {size / n:,.0f} | {fpi / n:,.0f} |")
    size = sum(v[1] for v in total.values()) / n
    fpi = sum(v[2] for v in total.values()) / n
    print(f"| **total** | | | | **{size:,.0f}** | {fpi:,.0f} |")
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for table in ("puramur_sessions_state", "funnel_turns", "funnel_messages"):
            cols = [r[0] for r in await (await conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                "AND table_schema = current_schema() ORDER BY ordinal_position", (table,))
            ).fetchall()]
            sizes = await (await conn.execute(sql.SQL("SELECT avg(pg_column_size(t.*)), {} FROM {} t")
                .format(sql.SQL(", ").join(sql.SQL("avg(pg_column_size({}))").format(
                    sql.Identifier(c)) for c in cols), sql.Identifier(table)))).fetchone()
            assert sizes is not None
            print(f"\n{table}: row {float(sizes[0]):,.0f} B on average; by column: " + ", ".join(
                f"{c} {float(v or 0):,.0f}" for c, v in zip(cols, sizes[1:], strict=True)))


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=os.environ.get("FUNNEL_TEST_DSN") or os.environ.get("FUNNEL_DB"))
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--funnel", type=Path, default=ROOT / "funnels" / "puramur.yaml",
                    help="a copy of Puramur's funnel with other settings (an experiment)")
    ap.add_argument("--sql", action="append", default=[],
                    help="a statement to run after the tables exist (an experiment)")
    args = ap.parse_args()
    logging.getLogger("funnel").setLevel(logging.ERROR)
    with throwaway_schema(server_url(args.db)) as url:
        start, end = await play(url, args.sessions, args.turns, args.sql, args.funnel)
        await breakdown(url, start, end, args.sessions * args.turns)


if __name__ == "__main__":
    asyncio.run(main())
