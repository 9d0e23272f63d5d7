"""`funnel report` at scale: 1,000,000 Puramur sessions and ~2.3 M turn records.

Everything is generated in SQL (INSERT ... SELECT FROM generate_series), in a
throwaway schema that is dropped at the end:

* sessions: created_at spread evenly over 60 days (inserted in time order, as
  a live table fills up); paths through the funnel with the proportions below;
  stage_history with entered_at/exited_at; 1-3 presented products (a few
  popular SKUs); a cart for sessions that reached cart building; hand-offs
  (cart_confirmed, explicit_request, complaint) with their time and channel;
* funnel_turns: one record per stage a session answered in (not counting the
  greeting and the final stage), about 2.3 per session: priced tokens, 3 %
  validation failures, 1 % fallbacks.

Then VACUUM ANALYZE (what autovacuum does to a live table), and each report
section is timed: the median of 3 runs of the exact query `funnel report`
sends (default window 7 days), plus the whole report, plus EXPLAIN (ANALYZE,
BUFFERS) of the slowest section.

    python bench/report_scale.py [--db URL] [--sessions 1000000] [--html FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from engine.funnel.compiled import load_funnel  # noqa: E402
from engine.store.analytics_sql import REPORT_SETTINGS, section_queries  # noqa: E402
from engine.store.connect import temporary_schema, with_search_path  # noqa: E402

PURAMUR = ROOT / "funnels" / "puramur.yaml"
TABLE = "puramur_sessions_state"
SKUS = ["PR251010", "PR243587", "PR260100", "PR251020", "PR270300", "PR243487", "PR260200",
        "PR270400", "PR290600", "PR280500"]

STAGES = ["greeting", "discovery", "presentation", "objection_handling", "cart_building",
          "contact_collection", "handoff"]
SCALE = [0, 700, 1500, 900, 500, 300, 0]  # seconds: how long a visit of each stage can last

# (share of sessions, path, hand-off reason)
PATHS = [
    (0.30, ["greeting", "discovery"], None),
    (0.18, ["greeting", "discovery", "presentation"], None),
    (0.06, ["greeting", "discovery", "presentation", "objection_handling"], None),
    (0.08, ["greeting", "discovery", "presentation", "cart_building"], None),
    (0.05, ["greeting", "discovery", "presentation", "cart_building", "contact_collection"], None),
    (0.20, ["greeting", "discovery", "presentation", "cart_building", "contact_collection",
            "handoff"], "cart_confirmed"),
    (0.06, ["greeting", "discovery", "presentation", "handoff"], "explicit_request"),
    (0.03, ["greeting", "discovery", "handoff"], "complaint"),
    (0.04, ["greeting", "discovery", "handoff"], "explicit_request"),
]


def _path_case() -> str:
    """SQL: the path and reason of a session from its random draw ``r``."""
    arms, reasons, edge = [], [], 0.0
    for share, path, reason in PATHS:
        edge += share
        arms.append(f"WHEN r < {edge:.4f} THEN ARRAY{path!r}::text[]")
        reasons.append(f"WHEN r < {edge:.4f} THEN {repr(reason) if reason else 'NULL'}")
    return (f"CASE {' '.join(arms[:-1])} ELSE ARRAY{PATHS[-1][1]!r}::text[] END AS path, "
            f"CASE {' '.join(reasons[:-1])} ELSE {PATHS[-1][2]!r} END AS reason")


SESSIONS_SQL = f"""
INSERT INTO {TABLE} (session_id, stage, stage_iteration, stage_history, customer, pet,
    discovery_completeness, presented_products, cart, cart_item_count, cart_total,
    handoff_channel, handoff_triggered_at, handoff_reason, turns, created_at, updated_at,
    last_message_at)
SELECT 'bench-' || b.g, b.path[cardinality(b.path)], 0, h.hist,
    CASE WHEN 'contact_collection' = ANY(b.path)
         THEN jsonb_build_object('name', 'Customer ' || b.g, 'phone', '+38066' || lpad(b.g::text, 7, '0'))
         ELSE '{{}}'::jsonb END,
    '{{"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"], "age_years": 3}}'::jsonb,
    75,
    CASE WHEN 'presentation' = ANY(b.path) THEN (
        SELECT jsonb_agg(jsonb_build_object('sku', (%(skus)s::text[])[1 + (b.pop + j) %% 10],
                                            'presented_at', h.first_at, 'stage_iteration', j))
        FROM generate_series(0, b.g %% 3) j) ELSE '[]'::jsonb END,
    CASE WHEN 'cart_building' = ANY(b.path) THEN jsonb_build_array(jsonb_build_object(
        'sku', 'PR290600', 'name', 'Professional grooming kit', 'price', b.cart, 'qty', 1,
        'line_total', b.cart, 'added_at', h.first_at)) ELSE '[]'::jsonb END,
    CASE WHEN 'cart_building' = ANY(b.path) THEN 1 ELSE 0 END,
    CASE WHEN 'cart_building' = ANY(b.path) THEN b.cart ELSE 0 END,
    CASE WHEN b.reason IS NOT NULL THEN 'telegram' END,
    CASE WHEN b.reason IS NOT NULL THEN h.last_at END,
    b.reason,
    2 * cardinality(b.path),
    b.t0, h.last_at + b.tail, h.last_at + b.tail
FROM (
    SELECT g, r, {_path_case()},
        now() - INTERVAL '60 days' + (g::float8 / %(n)s) * INTERVAL '60 days' AS t0,
        floor(power(random(), 2) * 10)::int AS pop,
        round((200 + random() * 2300)::numeric, 2) AS cart,
        random() * INTERVAL '10 minutes' AS tail
    FROM (SELECT g, random() AS r FROM generate_series(1, %(n)s) g) s
) b
CROSS JOIN LATERAL (
    SELECT jsonb_agg(CASE WHEN z.k < cardinality(b.path)
                          THEN jsonb_build_object('stage', z.s, 'entered_at', z.e, 'exited_at', z.x)
                          ELSE jsonb_build_object('stage', z.s, 'entered_at', z.e) END
                     ORDER BY z.k) AS hist,
           max(z.e) AS last_at, min(z.e) FILTER (WHERE z.s = 'presentation') AS first_at
    FROM (SELECT d.s, d.k, b.t0 + sum(d.dur) OVER w - d.dur AS e, b.t0 + sum(d.dur) OVER w AS x
          FROM (SELECT u.s, u.k,  -- random() in a derived table: drawn for every visit
                       CASE WHEN u.s = 'greeting' THEN INTERVAL '0'
                            ELSE (10 + random() * random() * (%(scale)s::int[])[
                                      array_position(%(stages)s::text[], u.s)]) * INTERVAL '1 s'
                       END AS dur
                FROM unnest(b.path) WITH ORDINALITY u(s, k)) d
          WINDOW w AS (ORDER BY d.k)) z
) h
"""

# One turn per stage a session answered in, besides the greeting and the final stage.
TURNS_SQL = f"""
INSERT INTO funnel_turns (funnel, funnel_version, session_id, stage_before, stage_after,
    validation_failures, repaired, fallback, llm_ms, turn_ms, prompt_tokens, completion_tokens,
    cost, model, created_at)
SELECT 'puramur', 1, v.session_id, v.stage, v.next_stage, v.failures, v.failures = 1,
    v.failures = 2 OR (v.failures = 0 AND v.x < 0.01), v.llm, v.llm + 40, v.pt, v.ct,
    (v.pt * 0.15 + v.ct * 0.6) / 1000000.0, 'gpt-4o-mini', v.at
FROM (  -- random() in a derived table's target list: drawn for every row
    SELECT t.session_id, e.h->>'stage' AS stage,
        COALESCE(t.stage_history->(e.k::int)->>'stage', e.h->>'stage') AS next_stage,
        COALESCE((e.h->>'exited_at')::timestamptz,
                 (e.h->>'entered_at')::timestamptz + INTERVAL '30 s') AS at,
        CASE WHEN random() < 0.03 THEN 1 + (random() < 0.3)::int ELSE 0 END AS failures,
        random() AS x, 300 + (random() * 2500)::int AS llm,
        700 + (random() * 900)::int AS pt, 40 + (random() * 160)::int AS ct
    FROM {TABLE} t CROSS JOIN LATERAL jsonb_array_elements(t.stage_history) WITH ORDINALITY e(h, k)
    WHERE e.h->>'stage' NOT IN ('greeting', 'handoff')
) v
ORDER BY v.at
"""


def timed(conn: psycopg.Connection, query: str, params: dict[str, object], runs: int = 3
          ) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(runs):
        started = time.perf_counter()
        rows = len(conn.execute(query, params).fetchall())
        times.append(time.perf_counter() - started)
    return statistics.median(times), rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", default=os.environ.get("FUNNEL_DB",
                                                   "postgresql://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--sessions", type=int, default=1_000_000)
    ap.add_argument("--since", type=float, default=7 * 86400, help="report window, seconds")
    ap.add_argument("--html", default=None, metavar="FILE", help="also write the HTML report")
    ap.add_argument("--keep", default=None, metavar="SCHEMA",
                    help="use this schema and keep it (data generated once), to experiment")
    ap.add_argument("--smoke", action="store_true", help="the smallest run "
                    "(tests/test_bench_smoke.py): exits 0 whatever the timings")
    args = ap.parse_args()

    spec = load_funnel(PURAMUR).spec
    if not args.keep:
        with temporary_schema(args.db, "bench_report") as url:
            return run(url, spec, args)
    with psycopg.connect(args.db, autocommit=True) as admin:  # kept, to experiment on
        admin.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(args.keep)))
    return run(with_search_path(args.db, args.keep), spec, args)


def run(url: str, spec: object, args: argparse.Namespace) -> int:
    from engine.store import open_store

    async def migrate() -> list[str]:
        store = await open_store(url)
        try:
            return await store.migrate(spec)  # type: ignore[arg-type]
        finally:
            await store.close()

    print("funnel migrate:", ", ".join(asyncio.run(migrate())))
    with psycopg.connect(url, autocommit=True) as conn:
        server = conn.execute("SELECT version()").fetchone()
        print(f"server: {server[0] if server else '?'}; {os.cpu_count()} CPUs")
        if args.keep and conn.execute(f"SELECT 1 FROM {TABLE} LIMIT 1").fetchone():
            return report(conn, url, spec, args)
        started = time.perf_counter()
        conn.execute(SESSIONS_SQL, {"n": args.sessions, "skus": SKUS, "stages": STAGES,
                                    "scale": SCALE})
        print(f"generated {args.sessions:,} sessions in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        conn.execute(TURNS_SQL)
        [(turns,)] = conn.execute("SELECT count(*) FROM funnel_turns").fetchall()
        print(f"generated {turns:,} turn records in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        # Its own two tables only: the whole database may hold other schemas' data.
        conn.execute(sql.SQL("VACUUM ANALYZE {}, funnel_turns").format(sql.Identifier(TABLE)))
        print(f"VACUUM ANALYZE in {time.perf_counter() - started:.1f} s")
        for name in (TABLE, "funnel_turns"):
            [(size,)] = conn.execute("SELECT pg_size_pretty(pg_total_relation_size(%s))",
                                     (name,)).fetchall()
            print(f"  {name}: {size} with indexes")
        return report(conn, url, spec, args)


def report(conn: psycopg.Connection, url: str, spec: object, args: argparse.Namespace) -> int:
    for name, value in REPORT_SETTINGS.items():  # what `funnel report` sets in its transaction
        conn.execute("SELECT set_config(%s, %s, false)", (name, value))
    queries = section_queries(spec, args.since)  # type: ignore[arg-type]
    print(f"\nreport sections, window {args.since / 86400:g} days, median of 3 runs "
          f"({', '.join(f'{k}={v}' for k, v in REPORT_SETTINGS.items())}):")
    results = {}
    for name, (query, params, _) in queries.items():
        seconds, rows = timed(conn, query.as_string(conn), params)
        results[name] = seconds
        print(f"  {name:<20} {seconds * 1000:8.1f} ms  ({rows} rows)")
    slowest = max(results, key=lambda k: results[k])
    query, params, _ = queries[slowest]
    print(f"\nEXPLAIN (ANALYZE, BUFFERS) of the slowest section, {slowest}:")
    plan = conn.execute(b"EXPLAIN (ANALYZE, BUFFERS) " + query.as_string(conn).encode(),
                        params).fetchall()
    print("\n".join("  " + r[0] for r in plan))

    from engine.report import build_report

    totals = []
    for _ in range(3):
        started = time.perf_counter()
        whole = asyncio.run(build_report(PURAMUR, db=url, since=args.since))
        totals.append(time.perf_counter() - started)
    print(f"\nthe whole report (build_report: one read-only snapshot, every section): "
          f"{statistics.median(totals) * 1000:.0f} ms (median of 3)")
    if args.html:
        from engine.report import render_html

        Path(args.html).write_text(render_html(whole), "utf-8")
        print(f"wrote {args.html}")
    worst = results[slowest]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"slowest section: {slowest} {worst * 1000:.0f} ms "
          f"({'under' if worst < 1 else 'OVER'} the 1 s target); load average {load}")
    return 0 if worst < 1 or args.smoke else 1  # a smoke run measures nothing


if __name__ == "__main__":
    sys.exit(main())
