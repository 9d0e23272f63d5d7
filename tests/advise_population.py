"""A synthetic population of Puramur sessions with a known best discovery threshold,
written in bulk (COPY) for `funnel report --advise` (tests/test_advise.py and
bench/advise.py).

Every session entered discovery with a completeness drawn from 0 to 100; those at or
above ``then`` (the threshold the sessions ran on) moved to presentation, the others
stayed. Of those that moved, a session with a completeness below ``best`` hands off with
probability ``low``, from ``best`` on with ``high``: ``best`` is where conversion steps
up, the value the advisor should find.
"""

from __future__ import annotations

import asyncio
import json
import random
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg import sql
from replay_population import PURAMUR

from engine.funnel.compiled import load_funnel
from engine.store import open_store


async def _migrate(url: str) -> str:
    funnel = load_funnel(PURAMUR)
    store = await open_store(url)
    try:
        await store.migrate(funnel.spec)
    finally:
        await store.close()
    return funnel.spec.table


def synthetic(url: str, n: int, *, then: int = 40, best: int = 50, low: float = 0.1,
              high: float = 0.6, seed: int = 5) -> None:
    """Write ``n`` sessions (ids ``syn-<i>``) into the database at ``url``."""
    table = asyncio.run(_migrate(url))
    rng = random.Random(seed)
    now = datetime.now(UTC)
    with psycopg.connect(url) as conn, conn.cursor() as cur, cur.copy(sql.SQL(
            "COPY {} (session_id, stage, stage_history, discovery_completeness, "
            "handoff_triggered_at, handoff_reason, turns, last_message_at) FROM STDIN").format(
                sql.Identifier(table))) as copy:
        for i in range(n):
            score = rng.randint(0, 100)
            path = ["greeting", "discovery"]
            handoff = None
            if score >= then:
                path.append("presentation")
                if rng.random() < (high if score >= best else low):
                    path += ["cart_building", "contact_collection", "handoff"]
                    handoff = now
            at = now - timedelta(minutes=i)
            history = [{"stage": s, "entered_at": at.isoformat()} for s in path]
            copy.write_row((f"syn-{i}", path[-1], json.dumps(history), score, handoff,
                            "cart_confirmed" if handoff else None, len(path) * 2, at))
