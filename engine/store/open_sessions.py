"""How many sessions of a funnel are open, by the funnel version they last ran on.

Open means: not in a final stage, a message within ``ttl`` seconds, and not a
studio's playground session (engine.store.playground). One
``GROUP BY`` over the funnel's table; the service caches it for a few seconds
(engine.service.reload), so ``/readyz`` and ``/metrics`` scrapes stay cheap.
"""

from __future__ import annotations

from psycopg import sql

from ..format.spec import FunnelSpec
from .base import Store
from .playground import real_session
from .postgres import PostgresStore

_COUNT = ("SELECT funnel_version, COUNT(*) FROM {table} t WHERE stage <> ALL(%(final)s) "
          "AND last_message_at > NOW() - %(ttl)s * INTERVAL '1 second' AND {real} "
          "GROUP BY funnel_version")


async def open_sessions(store: Store, spec: FunnelSpec, ttl: float) -> dict[int, int]:
    """{funnel version: open sessions} of ``spec``'s table (empty for another store).

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    if not isinstance(store, PostgresStore):
        return {}
    query = sql.SQL(_COUNT).format(table=sql.Identifier(spec.table), real=real_session(
        sql.Placeholder("funnel"), sql.SQL("t.session_id")))
    # The store's own checkout: its timeout, and its errors turned into StoreUnavailable.
    async with store._conn() as conn:
        rows = await (await conn.execute(query, {"final": spec.final_stages(), "ttl": ttl,
                                                "funnel": spec.name})).fetchall()
    return {int(version): int(count) for version, count in rows}


_IN_STAGES = "SELECT stage, COUNT(*) FROM {table} WHERE stage = ANY(%(stages)s) GROUP BY stage"


async def sessions_in_stages(store: Store, spec: FunnelSpec, stages: list[str]
                             ) -> dict[str, int]:
    """{stage: sessions in it} of ``spec``'s table, for ``stages`` (empty for another
    store): what a reload that removes those stages would strand.

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    if not isinstance(store, PostgresStore) or not stages:
        return {}
    query = sql.SQL(_IN_STAGES).format(table=sql.Identifier(spec.table))
    async with store._conn() as conn:
        rows = await (await conn.execute(query, {"stages": stages})).fetchall()
    return {str(stage): int(count) for stage, count in rows}
