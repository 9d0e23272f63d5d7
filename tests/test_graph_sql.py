"""`funnel graph` and `funnel sql`: the diagram shows the machine, the DDL is the seed's table.

The seed is /work/shared/seeds/000_fc3b6e52e3ee73d1.txt: its section 05 (the
production ``puramur_sessions_state`` DDL) is copied verbatim into
``tests/seed_ddl.sql`` and its section 08 (five observability queries) into
``tests/seed_queries.sql``. The table `funnel sql funnels/puramur.yaml` creates
must have every seed column with the same type, nullability and default, the
same three indexes, and the seed's queries must run on it unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from conftest import run_funnel, seed_queries, sql_runner, temporary_schema

from engine.format.spec import ENGINE_COLUMNS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
TABLE = "puramur_sessions_state"
STAGES = [
    "greeting",
    "discovery",
    "presentation",
    "objection_handling",
    "cart_building",
    "contact_collection",
    "handoff",
]


def cli(*args: str) -> str:
    r = run_funnel(*args)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    return r.stdout


# --- graph ---------------------------------------------------------------------------------

EDGE = re.compile(r"^    (\[\*\]|\w+) --> (\[\*\]|\w+)(?:: (.+))?$")


def mermaid_edges(text: str) -> list[tuple[str, str, str | None]]:
    lines = text.splitlines()
    assert lines[0] == "stateDiagram-v2"
    edges = []
    for line in lines[1:]:
        if line.startswith("    state "):  # a declared node (the "any open stage" one)
            continue
        m = EDGE.match(line)
        assert m, f"not a mermaid edge: {line!r}"
        edges.append((m[1], m[2], m[3]))
    return edges


def dot_edges(text: str) -> list[tuple[str, str, str]]:
    return re.findall(r'^    "(\w+)" -> "(\w+)" \[label="((?:[^"\\]|\\.)*)"\];$', text, re.M)


def test_graph_mermaid() -> None:
    out = cli("graph", str(PURAMUR))
    edges = mermaid_edges(out)
    nodes = {n for s, d, _ in edges for n in (s, d)} - {"[*]"}
    assert nodes == set(STAGES) | {"any_open_stage"}
    assert '    state "any open stage" as any_open_stage' in out.splitlines()
    assert ("[*]", "greeting", None) in edges
    assert ("handoff", "[*]", None) in edges
    assert "    discovery --> presentation: discovery_completeness >= 60" in out.splitlines()
    assert ("greeting", "discovery", None) in edges  # unconditional: no label
    assert ("contact_collection", "handoff", "customer.name and customer.phone") in edges
    # The global transitions are interrupts from every open stage, drawn once from the
    # "any open stage" node; none leaves the final one.
    assert ("any_open_stage", "handoff", "handoff_requested == 'complaint'") in edges
    assert ("any_open_stage", "handoff", "handoff_requested == 'explicit_request'") in edges
    assert not [e for e in edges if e[0] in STAGES and e[2] and "handoff_requested" in e[2]]
    assert not [e for e in edges if e[0] == "handoff" and e[1] != "[*]"]
    # Edge labels never carry a raw ':' (it would end the label in Mermaid).
    assert all(":" not in (label or "") for _, _, label in edges)


def test_graph_dot_matches_mermaid() -> None:
    out = cli("graph", "--format", "dot", str(PURAMUR))
    assert out.startswith('digraph "puramur" {\n') and out.endswith("}\n")
    assert '"handoff" [peripheries=2];' in out
    assert '"__start" -> "greeting";' in out
    edges = dot_edges(out)
    assert ("discovery", "presentation", "discovery_completeness >= 60") in edges
    for stage in STAGES:
        assert f'"{stage}"' in out
    assert '"any_open_stage" [label="any open stage", style=dashed];' in out
    body = [x for x in out.splitlines()[1:-1] if "->" in x and "__start" not in x]
    assert len(body) == len(edges)  # every edge line parsed
    mermaid = {(s, d, label or "") for s, d, label in mermaid_edges(cli("graph", str(PURAMUR)))
               if "[*]" not in (s, d)}
    assert {(s, d, label.replace("\\\"", '"')) for s, d, label in edges} == mermaid


def test_graph_escapes_colons_and_quotes(tmp_path: Path) -> None:
    base = HERE / "corpus" / "_base"
    text = (base / "funnel.yaml").read_text("utf-8")
    text = text.replace("../_base/", f"{base.as_posix()}/")
    when = """score >= 50 and 'a:b;c' not in notes and "x" not in notes"""
    text = text.replace("when: score >= 50", f"when: {when}")
    funnel = tmp_path / "colon.yaml"
    funnel.write_text(text, "utf-8")
    out = cli("graph", str(funnel))
    label = "score >= 50 and 'a#58;b#59;c' not in notes and #quot;x#quot; not in notes"
    assert f"    middle --> done: {label}" in out.splitlines()
    mermaid_edges(out)  # still one edge per line, label free of ':'
    dot = cli("graph", "--format", "dot", str(funnel))
    edge = ('"middle" -> "done" [label="score >= 50 and '
            "'a:b;c' not in notes and "
            r'\"x\" not in notes"];')
    assert f"    {edge}" in dot.splitlines()


# --- sql -----------------------------------------------------------------------------------


@pytest.fixture
def seed_schema(sql: Any, server_dsn: str) -> Iterator[tuple[str, str]]:
    """(test schema, seed schema): the seed DDL runs in a second fresh schema.

    Index names are unique per schema, so the seed's table cannot live beside ours.
    """
    ours = sql("SELECT current_schema()")[0][0]
    with temporary_schema(server_dsn, "seed") as url, sql_runner(url) as seed_sql:
        seed_sql((HERE / "seed_ddl.sql").read_text("utf-8"))
        yield ours, seed_sql("SELECT current_schema()")[0][0]


def columns(sql: Any, schema: str) -> dict[str, tuple[Any, ...]]:
    rows = sql(
        "SELECT column_name, data_type, numeric_precision, numeric_scale, is_nullable, "
        "column_default FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (schema, TABLE),
    )
    return {r[0]: tuple(r[1:]) for r in rows}


def indexes(sql: Any, schema: str) -> dict[str, str]:
    rows = sql("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s AND "
               "tablename = %s", (schema, TABLE))
    return {name: d.replace(f"{schema}.", "").replace(f'"{schema}".', "") for name, d in rows}


@pytest.mark.postgres
def test_sql_creates_the_seed_table(sql: Any, seed_schema: tuple[str, str]) -> None:
    ours, seed = seed_schema
    ddl = cli("sql", str(PURAMUR))
    assert ddl.count("CREATE TABLE") == 1 and ddl.count("CREATE INDEX") == 4
    sql(ddl)
    mine, theirs = columns(sql, ours), columns(sql, seed)
    assert len(theirs) == 23
    for name, want in theirs.items():
        assert name in mine, f"column {name} missing from `funnel sql`"
        assert mine[name] == want, f"column {name}: ours {mine[name]}, seed {want}"
    # The only additions are the engine's own bookkeeping columns (turns, row_version, ...).
    extra = set(mine) - set(theirs)
    assert {"turns", "funnel_version", "row_version", "notices"} <= extra <= set(ENGINE_COLUMNS)
    # Same primary key.
    pk = ("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
          "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary")
    assert sql(pk, (f'"{ours}".{TABLE}',)) == sql(pk, (f'"{seed}".{TABLE}',)) == [("session_id",)]
    # Same three indexes (plus the primary key's), definition for definition.
    mine_ix, theirs_ix = indexes(sql, ours), indexes(sql, seed)
    assert set(theirs_ix) == {"idx_sessions_stage", "idx_sessions_last_msg",
                              "idx_sessions_handoff", f"{TABLE}_pkey"}
    # Plus one for `funnel report`'s time windows (docs/analytics.md).
    assert mine_ix.pop("idx_puramur_created") == (
        f"CREATE INDEX idx_puramur_created ON {TABLE} USING btree (created_at)")
    assert mine_ix == theirs_ix
    # Running it twice is harmless (IF NOT EXISTS), as `funnel sql | psql` may be.
    sql(ddl)


def _history(start: datetime, *stages: tuple[str, int | None]) -> str:
    """stage_history as the engine writes it: entered_at, and exited_at once left."""
    out, entered = [], start
    for stage, exit_after in stages:
        item = {"stage": stage, "entered_at": entered.isoformat()}
        if exit_after is not None:
            exited = start + timedelta(seconds=exit_after)
            item["exited_at"] = exited.isoformat()
            entered = exited
        out.append(item)
    return json.dumps(out)


def _presented(at: datetime, *skus: str) -> str:
    return json.dumps([{"sku": s, "presented_at": at.isoformat(), "stage_iteration": 1}
                       for s in skus])


@pytest.mark.postgres
def test_seed_observability_queries_run_on_our_table(sql: Any) -> None:
    sql(cli("sql", str(PURAMUR)))
    now = datetime.now(UTC).replace(microsecond=0)
    t1, t2, t3 = now - timedelta(hours=2), now - timedelta(minutes=10), now - timedelta(hours=1)
    insert = (f"INSERT INTO {TABLE} (session_id, stage, stage_history, presented_products, "
              "cart_total, handoff_triggered_at, handoff_reason, handoff_channel, created_at, "
              "last_message_at) VALUES (%s, %s, %s::jsonb, %s::jsonb, %s, %s, %s, %s, %s, %s)")
    # s1: the whole funnel, cart confirmed, handed off 450 s after it started.
    sql(insert, ("s1", "handoff",
                 _history(t1, ("greeting", 30), ("discovery", 150), ("presentation", 270),
                          ("cart_building", 390), ("contact_collection", 450), ("handoff", None)),
                 _presented(t1, "PR251010", "PR251020"), Decimal("697.00"),
                 t1 + timedelta(seconds=450), "cart_confirmed", "log", t1,
                 t1 + timedelta(minutes=20)))
    # s2: still in discovery, active.
    sql(insert, ("s2", "discovery", _history(t2, ("greeting", 20), ("discovery", None)),
                 "[]", 0, None, None, None, t2, now - timedelta(minutes=5)))
    # s3: asked for a human during the presentation, 100 s in.
    sql(insert, ("s3", "handoff",
                 _history(t3, ("greeting", 10), ("discovery", 70), ("presentation", 100),
                          ("handoff", None)),
                 _presented(t3, "PR251010"), 0, t3 + timedelta(seconds=100), "explicit_request",
                 "log", t3, t3 + timedelta(seconds=100)))

    q = seed_queries()
    assert sql(q["active_sessions_by_stage"]) == [("discovery", 1)]
    assert sql(q["sales_funnel_7_days"]) == [(3, 3, 2, 1, 2)]
    # Time in a stage = its exit minus the previous stage's exit.
    assert sql(q["average_time_per_stage"]) == [
        ("cart_building", 120, 1),
        ("discovery", 90, 2),
        ("presentation", 75, 2),
        ("contact_collection", 60, 1),
    ]
    assert sql(q["most_presented_products"]) == [("PR251010", 2, 2), ("PR251020", 1, 1)]
    assert sorted(sql(q["handoff_reasons"])) == [
        ("cart_confirmed", 1, Decimal("697"), 450),
        ("explicit_request", 1, Decimal("0"), 100),
    ]
