"""The studio's reads: the sessions list and a transcript's pages, on the store's pool.

Read-only queries on the funnel's session table and the shared turn and message
tables; names through ``psycopg.sql.Identifier``, values as parameters. A transcript
is read a page of turn records at a time (``LIMIT``/``OFFSET`` on the session's
index), so a 200-turn session opens as fast as a 3-turn one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from ..errors import StoreUnavailable
from ..format.main_path import stage_paths
from ..format.names import CONVERSIONS, EXITS, TURNS
from ..format.spec import FunnelSpec
from ..records.explanation import expand
from ..store.analytics_sql import furthest_main_stage
from ..store.base import Store
from ..store.playground import real_session
from ..store.turns import TURN_MESSAGES

__all__ = ["SessionFilter", "live_sessions", "sessions", "transcript"]

PAGE = 50  # sessions, or turns, per page
_TURN_COLUMNS = ("id", "stage_before", "stage_after", "transitions", "actions", "refused",
                 "validation_failures", "repaired", "fallback", "llm_ms", "turn_ms",
                 "prompt_tokens", "completion_tokens", "cached_prompt_tokens", "cost",
                 "model", "error", "explain", "raw_output", "variant", "claims", "created_at",
                 "follow_up")  # a follow-up's record: {stage, step, due} (engine.turn.follow_up)


@asynccontextmanager
async def _connect(store: Store) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    pool = getattr(store, "pool", None)
    if pool is None:
        raise StoreUnavailable("the studio reads sessions from PostgreSQL; this store has no pool")
    try:
        async with pool.connection() as conn:
            yield conn
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"PostgreSQL did not answer: {str(exc).splitlines()[0]}") from None


async def live_sessions(store: Store, spec: FunnelSpec, ids: list[str]) -> set[str]:
    """The sessions of ``ids`` the funnel still has, not anonymized (`funnel purge`)."""
    async with _connect(store) as conn:
        rows = await (await conn.execute(sql.SQL(
            "SELECT session_id FROM {} WHERE session_id = ANY(%s) AND NOT "
            "(notices @> '[\"anonymized\"]')").format(sql.Identifier(spec.table)), (ids,))
        ).fetchall()
    return {str(r[0]) for r in rows}


class SessionFilter:
    """The list's filters, each optional: stage, handed off, period, variant, fallbacks;
    and the report's (its numbers link here, each to exactly the sessions it counts):
    ``started`` (seconds: created in that window), ``reached`` (a stage in the history),
    ``stopped`` (the furthest main-path stage reached), ``bought`` (an order recorded),
    ``fell_back`` (seconds: a turn in that window fell back, in ``fallback_stage`` if
    given); ``playground``: the studio's own sessions too (customers' only by default,
    as the report counts)."""

    def __init__(self, *, stage: str | None = None, handoff: bool | None = None,
                 since_seconds: float | None = None, variant: str | None = None,
                 fallback: bool | None = None, search: str | None = None,
                 offset: int = 0, started: float | None = None, reached: str | None = None,
                 stopped: str | None = None, bought: bool | None = None,
                 fell_back: float | None = None, fallback_stage: str | None = None,
                 playground: bool = False) -> None:
        self.stage, self.handoff, self.since = stage, handoff, since_seconds
        self.playground = playground
        self.variant, self.fallback, self.search = variant, fallback, search
        self.offset = max(0, offset)
        self.started, self.reached, self.stopped = started, reached, stopped
        self.bought, self.fell_back, self.fallback_stage = bought, fell_back, fallback_stage


def _report_filters(spec: FunnelSpec, f: SessionFilter, where: list[sql.Composable],
                    params: list[Any]) -> None:
    """The report's conditions on ``s``, written as the report's queries count
    (``engine.store.analytics_sql``): the same window, the same furthest stage."""
    if f.started:
        where.append(sql.SQL("s.created_at > NOW() - make_interval(secs => %s::float8)"))
        params.append(f.started)
    if f.reached:
        where.append(sql.SQL("EXISTS (SELECT 1 FROM jsonb_array_elements(s.stage_history) h "
                             "WHERE h->>'stage' = %s)"))
        params.append(f.reached)
    if f.stopped:
        main = list(stage_paths(spec).main)
        where.append(sql.SQL("{} = %s").format(furthest_main_stage(
            main, sql.SQL("s.stage_history"), sql.Placeholder())))
        params += [main, main.index(f.stopped) + 1 if f.stopped in main else 0]
    if f.bought is not None:
        where.append(sql.SQL("{} EXISTS (SELECT 1 FROM {} c WHERE c.funnel = %s AND "
                             "c.session_id = s.session_id)").format(
                                 sql.SQL("" if f.bought else "NOT"),
                                 sql.Identifier(CONVERSIONS)))
        params.append(spec.name)
    if f.fell_back or f.fallback_stage:
        where.append(sql.SQL(
            "EXISTS (SELECT 1 FROM {} tr WHERE tr.funnel = %s AND tr.session_id = s.session_id "
            "AND tr.fallback AND tr.created_at > NOW() - make_interval(secs => %s::float8) "
            "AND (%s::text IS NULL OR tr.stage_before = %s::text))").format(sql.Identifier(TURNS)))
        params += [spec.name, f.fell_back or 10 * 365 * 86400.0, f.fallback_stage,
                   f.fallback_stage]


async def sessions(store: Store, spec: FunnelSpec, f: SessionFilter) -> dict[str, Any]:
    """A page of sessions, newest message first, with their fallback count."""
    t = sql.Identifier(spec.table)
    where: list[sql.Composable] = [sql.SQL("TRUE")]
    params: list[Any] = [spec.name]
    if f.stage:
        where.append(sql.SQL("s.stage = %s"))
        params.append(f.stage)
    handoff = spec.handoff.triggered_at if spec.handoff else None
    if f.handoff is not None and handoff:
        where.append(sql.SQL("s.{} IS {} NULL").format(sql.Identifier(handoff),
                                                       sql.SQL("NOT" if f.handoff else "")))
    if f.since:
        where.append(sql.SQL("s.last_message_at >= NOW() - make_interval(secs => %s)"))
        params.append(f.since)
    if f.variant:
        where.append(sql.SQL("s.variant = %s"))
        params.append(f.variant)
    if f.search:
        where.append(sql.SQL("strpos(s.session_id, %s) > 0"))
        params.append(f.search)
    _report_filters(spec, f, where, params)
    if not f.playground:
        where.append(real_session(sql.Literal(spec.name), sql.SQL("s.session_id")))
    having: sql.Composable = sql.SQL("")
    if f.fallback is not None:
        having = sql.SQL("WHERE fallbacks {} 0").format(sql.SQL(">" if f.fallback else "="))
    q = sql.SQL(
        "SELECT * FROM (SELECT s.session_id, s.stage, s.turns, s.variant, s.created_at, "
        "s.last_message_at, {handoff} AS handed_off, NOT {real} AS playground, "
        "(SELECT count(*) FROM {turns} tr WHERE tr.funnel = %s AND tr.session_id = s.session_id "
        " AND tr.fallback) AS fallbacks FROM {t} s WHERE {where}) x {having} "
        "ORDER BY last_message_at DESC, session_id LIMIT %s OFFSET %s"
    ).format(handoff=sql.SQL("s.{} IS NOT NULL").format(sql.Identifier(handoff)) if handoff
             else sql.SQL("FALSE"), turns=sql.Identifier(TURNS), t=t,
             real=real_session(sql.Literal(spec.name), sql.SQL("s.session_id")),
             where=sql.SQL(" AND ").join(where), having=having)
    async with _connect(store) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(q, (*params, PAGE + 1, f.offset))
        rows = await cur.fetchall()
    return {"sessions": rows[:PAGE], "more": len(rows) > PAGE, "offset": f.offset}


async def transcript(store: Store, spec: FunnelSpec, session_id: str, offset: int = 0,
                     limit: int = PAGE, *, last: bool = False) -> dict[str, Any]:
    """One page of a session's turns, oldest first: each with its customer message and
    reply, and its record (state change, explanation, raw output, timings, cost).
    ``last``: only the newest turn (numbered as the session's last)."""
    limit = 1 if last else max(1, min(limit, 200))
    q = sql.SQL(
        "SELECT {cols}, "
        "{turn_messages}, count(*) OVER () AS total "
        "FROM {t} t WHERE t.funnel = %s AND t.session_id = %s ORDER BY t.id {order} "
        "LIMIT %s OFFSET %s"
    ).format(order=sql.SQL("DESC" if last else ""),
             cols=sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(c))
                                     for c in _TURN_COLUMNS),
             turn_messages=TURN_MESSAGES, t=sql.Identifier(TURNS))
    async with _connect(store) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(q, (spec.name, session_id, limit, max(0, offset)))
        records = await cur.fetchall()
        cited = sorted({step["exits"] for r in records for step in r["explain"] or ()
                        if isinstance(step, dict) and "exits" in step})
        exits: dict[str, Any] = {}
        if cited:
            await cur.execute(sql.SQL("SELECT digest, exits FROM {} WHERE digest = ANY(%s)")
                              .format(sql.Identifier(EXITS)), (cited,))
            exits = {r["digest"]: r["exits"] for r in await cur.fetchall()}
        if not records and offset:
            await cur.execute(sql.SQL("SELECT count(*) AS n FROM {} WHERE funnel = %s AND "
                                      "session_id = %s").format(sql.Identifier(TURNS)),
                              (spec.name, session_id))
            total = (await cur.fetchone() or {"n": 0})["n"]
        else:
            total = records[0]["total"] if records else 0
    if last:
        offset = max(0, total - 1)
    for number, r in enumerate(records, start=offset + 1):
        r["explain"] = expand(r["explain"], exits)
        r["number"] = number
        r.pop("total", None)
    return {"turns": records, "total": total, "offset": offset, "limit": limit}
