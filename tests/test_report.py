"""`funnel report` and the analysts' views, on conversations the engine really ran.

One module-wide database is filled by running Puramur conversations through
:class:`engine.turn.engine.Engine` with the scripted model (priced, so turns have a
cost) and a clock the test moves: every number in the report is then checked
against what those conversations did. The seed's five observability queries
(``tests/seed_queries.sql``, verbatim) run on the same rows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from conftest import CliResult, run_funnel, seed_queries, sql_runner, temporary_schema

from engine.funnel.compiled import load_funnel
from engine.llm.models import Completion, ModelRequest, ScriptedModel
from engine.report import SECTIONS, build_report, render_html, render_table
from engine.store.analytics_sql import section_queries
from engine.store.analytics_views import view_name
from engine.turn.engine import Engine

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
B2B = ROOT / "funnels" / "b2b_demo.yaml"
TABLE = "puramur_sessions_state"
COST = 0.001  # dollars per answered model call

pytestmark = pytest.mark.postgres

# -- the scripted model: one output per kind of customer message ------------------------
CONTACT = "contact: I am Anna, 066 123 45 67"
OUTPUTS: list[tuple[str, Any]] = [
    ("hello", {"reply": "Hello! Is your pet a cat or a dog?"}),
    ("sphynx", {"reply": "Sphynx skin needs gentle care.",
                "updates": {"pet": {"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"]}}}),
    ("show", {"reply": "Exotic Spa shampoo and lotion.",
              "actions": [{"type": "present_products", "skus": ["PR251010", "PR251020"]}]}),
    ("other", {"reply": "Calm Skin shampoo.",
               "actions": [{"type": "present_products", "skus": ["PR260100"]}]}),
    ("add shampoo", {"reply": "Added.", "actions": [{"type": "add_to_cart", "sku": "PR251010"}]}),
    ("add kit", {"reply": "Added.", "actions": [{"type": "add_to_cart", "sku": "PR290600"}]}),
    ("confirm", {"reply": "Your name and phone?", "actions": [{"type": "confirm_cart"}]}),
    # the customer gives the name and phone the model writes (grounded facts)
    (CONTACT, {"reply": "Thank you!",
               "updates": {"customer": {"name": "Anna", "phone": "066 123 45 67"}}}),
    ("operator", {"reply": "Connecting you.",
                  "actions": [{"type": "request_handoff", "reason": "explicit_request"}]}),
    ("complain", {"reply": "I am sorry.",
                  "actions": [{"type": "request_handoff", "reason": "complaint"}]}),
    ("expensive", {"reply": "I understand.",
                   "actions": [{"type": "record_objection", "objection": "price"}]}),
    ("garbage", {"output": "not json at all", "repair": "still not json"}),  # -> fallback
    ("fix", {"output": "{broken", "repair": {"reply": "Tell me more about your pet."}}),
    ("down", {"error": "the model timed out"}),  # -> fallback, no call answered
]

# Each session: (message, seconds on the clock since the previous message).
CONVERSATIONS: dict[str, list[tuple[str, int]]] = {
    # cart confirmed: 277 UAH, handed off 345 s in
    "A": [("hello", 0), ("sphynx", 60), ("show", 120), ("add shampoo", 30), ("confirm", 90),
          (CONTACT, 45)],
    # cart confirmed: the 1250 UAH kit (and the gift), handed off 205 s in
    "B": [("hello", 0), ("sphynx", 30), ("show", 60), ("add kit", 60), ("confirm", 30),
          (CONTACT, 25)],
    # asks for a human during the presentation, 70 s in
    "C": [("hello", 0), ("sphynx", 20), ("show", 40), ("operator", 10)],
    # objects to the price; the model then fails: still in objection handling
    "D": [("hello", 0), ("sphynx", 40), ("other", 20), ("expensive", 100), ("down", 15)],
    # the model's answer is invalid twice: fallback reply, still in discovery
    "E": [("hello", 0), ("garbage", 30)],
    # complains in discovery, 35 s in
    "F": [("hello", 0), ("complain", 35)],
    # the answer is repaired; still in discovery
    "G": [("hello", 0), ("fix", 10)],
    # started 10 days ago: outside the 7-day window, inside a 30-day one
    "H": [("hello", 0), ("sphynx", 50), ("show", 10)],
}
OLD = "H"
# What was bought: (session, order id, amount, currency, the one SKU of the order).
ORDERS = [("A", "A-1", "277.00", "UAH", "PR251010"),
          ("B", "B-1", "1250.00", "UAH", "PR290600"),   # the kit, never presented
          ("B", "B-2", "20.00", "EUR", "PR251020"),
          ("H", "H-1", "100.00", "UAH", "PR251010")]    # outside the window


class Clock:
    """The engine's clock: a fixed start per session plus the seconds the test adds."""

    def __init__(self) -> None:
        self.base = datetime.now(UTC)
        self.offset = timedelta(0)

    def restart(self) -> None:
        self.base, self.offset = datetime.now(UTC), timedelta(0)

    def __call__(self) -> datetime:
        return self.base + self.offset


class PricedModel:
    """The scripted model, priced: every answered call costs COST; counts calls per turn."""

    def __init__(self) -> None:
        self.inner = ScriptedModel.from_data(
            {"match": [{"pattern": f"^{text}$", "output": out} for text, out in OUTPUTS]})
        self.name = "scripted-priced"
        self.calls: Counter[tuple[str, str]] = Counter()

    async def complete(self, request: ModelRequest) -> Completion:
        completion = await self.inner.complete(request)
        self.calls[(request.session_id, request.stage)] += 1
        return dataclasses.replace(completion, cost=COST)


@dataclasses.dataclass
class Filled:
    url: str
    turns: list[tuple[str, Any]]  # (session, TurnResult) in order
    calls: Counter[tuple[str, str]]
    sql: Any


@pytest.fixture(scope="module")
async def filled(server_dsn: str) -> AsyncIterator[Filled]:
    with temporary_schema(server_dsn, "r") as url, sql_runner(url) as run:
        model, clock = PricedModel(), Clock()
        engine = await Engine.open(PURAMUR, db=url, model=model, clock=clock)
        turns = []
        try:
            for session, messages in CONVERSATIONS.items():
                clock.restart()
                for text, step in messages:
                    clock.offset += timedelta(seconds=step)
                    turns.append((session, await engine.handle(session, text, channel="test")))
            for session, order_id, amount, currency, sku in ORDERS:
                await engine.record_conversion(session, order_id, amount, currency,
                                               [{"sku": sku, "qty": 1, "price": amount}])
        finally:
            await engine.close()
        # H happened ten days ago: its row and its turn records.
        run(f"UPDATE {TABLE} SET created_at = created_at - INTERVAL '10 days', "
            "last_message_at = last_message_at - INTERVAL '10 days' WHERE session_id = %s",
            (OLD,))
        run("UPDATE funnel_turns SET created_at = created_at - INTERVAL '10 days' "
            "WHERE session_id = %s", (OLD,))
        yield Filled(url, turns, model.calls, run)


@pytest.fixture(scope="module")
async def report(filled: Filled) -> dict[str, Any]:
    return await build_report(PURAMUR, db=filled.url)


def by(rows: list[dict[str, Any]], key: str = "stage") -> dict[str, dict[str, Any]]:
    return {r[key]: r for r in rows}


# -- the conversations did what the test says --------------------------------------------
def test_the_conversations_went_where_expected(filled: Filled) -> None:
    rows = dict(filled.sql(f"SELECT session_id, stage FROM {TABLE}"))
    assert rows == {"A": "handoff", "B": "handoff", "C": "handoff", "D": "objection_handling",
                    "E": "discovery", "F": "handoff", "G": "discovery", "H": "presentation"}
    reasons = dict(filled.sql(f"SELECT session_id, handoff_reason FROM {TABLE} "
                              "WHERE handoff_reason IS NOT NULL"))
    assert reasons == {"A": "cart_confirmed", "B": "cart_confirmed", "C": "explicit_request",
                       "F": "complaint"}
    results = {(s, r.stage_before, r.fallback, r.validation_failures, r.repaired)
               for s, r in filled.turns if r.fallback or r.validation_failures}
    assert results == {("D", "objection_handling", True, 0, False),
                       ("E", "discovery", True, 2, False), ("G", "discovery", False, 1, True)}


# -- every section, against the conversations ------------------------------------------
def test_trends_this_period_against_the_previous_one(report: dict[str, Any]) -> None:
    t = report["trends"]
    # Every calendar day (UTC) the 7-day window touches: the first and today partial.
    today = datetime.now(UTC).date()
    assert [d["day"] for d in t["days"]] == [
        str(today - timedelta(days=n)) for n in range(7, -1, -1)]
    assert sum(d["sessions"] for d in t["days"]) == t["sessions"] == 7
    assert t["days"][-1] == {"day": str(today), "sessions": 7, "conversions": 4}
    # H started ten days ago: in the previous seven days. Every order was placed today
    # (H's too: a conversion counts on the day it was placed).
    assert (t["previous_sessions"], t["sessions_change_pct"]) == (1, 600.0)
    assert (t["conversions"], t["previous_conversions"], t["conversions_change_pct"]) == (
        4, 0, None)


def test_active_sessions_by_stage(report: dict[str, Any]) -> None:
    # D, E and G are neither handed off nor older than a day; H wrote 10 days ago.
    a = report["active_by_stage"]
    assert a["rows"] == [{"stage": "discovery", "sessions": 2},
                         {"stage": "objection_handling", "sessions": 1}]
    assert a["total"] == 3


def test_the_funnel_main_path_first_then_its_side_branches(report: dict[str, Any]) -> None:
    f = report["stage_funnel"]
    assert f["sessions"] == 7  # H started before the window
    assert [(s["stage"], s["sessions"], s["pct_of_first"], s["stopped_here"], s["branch"])
            for s in f["stages"]] == [
        ("greeting", 7, 100.0, 0, False),
        ("discovery", 7, 100.0, 2, False),             # E and G stop there
        ("presentation", 4, 57.1, 1, False),           # A B C D; D went no further
        ("cart_building", 2, 28.6, 0, False),          # A B
        ("contact_collection", 2, 28.6, 0, False),
        ("handoff", 4, 57.1, 4, False),                # A B C F
        # Objection handling leaves the main path and comes back: a side branch, never
        # a step between presentation and cart building.
        ("objection_handling", 1, 14.3, 0, True),      # D
    ]
    side = by(f["stages"])["objection_handling"]
    assert (side["branch_from"], side["ended_here"]) == ("presentation", 1)  # D is in it
    assert f["biggest_drop_off"] == {"stage": "discovery", "stopped": 2, "reached": 7,
                                     "pct": 28.6}


def test_time_in_each_stage(report: dict[str, Any]) -> None:
    # Completed visits of the 7 recent sessions (the clock moved exactly these seconds).
    t = by(report["stage_time"])
    assert list(t) == list(load_funnel(PURAMUR).spec.stages)
    want = {"greeting": (7, 0, 0),                 # greeting -> discovery after the first turn
            "discovery": (5, 37, 35),              # A60 B30 C20 D40 F35
            "presentation": (4, 110, 120),         # A150 B120 C50 D120
            "objection_handling": (0, None, None),  # D is still there
            "cart_building": (2, 60, 60),          # A90 B30
            "contact_collection": (2, 35, 35),     # A45 B25
            "handoff": (0, None, None)}
    assert {k: (v["samples"], v["avg_seconds"], v["median_seconds"]) for k, v in t.items()} == want


def test_most_presented_products(report: dict[str, Any]) -> None:
    assert report["products"] == [
        {"sku": "PR251010", "presented": 3, "converted": 3, "conversion_pct": 100,
         "name": "Exotic Spa shampoo"},                        # A B C
        {"sku": "PR251020", "presented": 3, "converted": 3, "conversion_pct": 100,
         "name": "Exotic Spa moisturising lotion"},
        {"sku": "PR260100", "presented": 1, "converted": 0, "conversion_pct": 0,
         "name": "Calm Skin hypoallergenic shampoo"},          # D
    ]


def test_purchases_and_revenue(report: dict[str, Any]) -> None:
    # A and B bought (3 orders); H's order belongs to a session before the window.
    assert report["purchases"] == {
        "sessions": 7, "orders": 3, "buyers": 2, "purchase_pct": 28.6,
        "revenue": [  # never added up across currencies
            {"currency": "UAH", "orders": 2, "buyers": 2, "revenue": 1527, "avg_order": 763.5,
             "revenue_per_session": 218.14},
            {"currency": "EUR", "orders": 1, "buyers": 1, "revenue": 20, "avg_order": 20,
             "revenue_per_session": 2.86}]}
    page = render_html(report)
    assert 'id="purchases"' in page and 'id="presented_vs_bought"' in page
    assert "<b>2 (29%)</b><span>bought (orders recorded)</span>" in page


def test_presented_vs_bought(report: dict[str, Any]) -> None:
    rows = {p["sku"]: (p["presented"], p["bought_when_presented"], p["bought"], p["units"],
                       p["bought_pct"]) for p in report["presented_vs_bought"]}
    assert rows == {"PR251010": (3, 1, 1, 1, 33.3),   # presented to A B C, bought by A
                    "PR251020": (3, 1, 1, 1, 33.3),   # bought by B
                    "PR260100": (1, 0, 0, 0, 0),      # presented to D only
                    "PR290600": (0, 0, 1, 1, None)}   # B's kit: bought, never presented
    assert report["presented_vs_bought"][-1]["name"] is not None  # from the catalog


def test_handoff_reasons(report: dict[str, Any]) -> None:
    h = by(report["handoff_reasons"], "reason")
    assert list(h) == ["cart_confirmed", "complaint", "explicit_request"]
    assert {k: (v["handoffs"], v["avg_cart_total"]) for k, v in h.items()} == {
        "cart_confirmed": (2, 763.5), "complaint": (1, 0), "explicit_request": (1, 0)}
    # From the session's created_at to the hand-off: the seconds the clock moved (to within a
    # second, should created_at ever come from the database's clock instead of the engine's).
    for reason, seconds in {"cart_confirmed": (345 + 205) / 2, "complaint": 35,
                            "explicit_request": 70}.items():
        assert abs(h[reason]["avg_seconds_to_handoff"] - seconds) < 1, reason


def test_cost_tokens_and_quality_per_conversation_and_stage(report: dict[str, Any],
                                                            filled: Filled) -> None:
    recent = [(s, r) for s, r in filled.turns if s != OLD]
    conv = report["costs"]["conversations"]
    calls = sum(n for (s, _), n in filled.calls.items() if s != OLD)
    assert calls == 28  # one per turn, two for E's and G's repairs, none for D's failed call
    assert conv["conversations"] == 7 and conv["turns"] == len(recent) == 27
    assert conv["prompt_tokens"] == sum(r.prompt_tokens for _, r in recent)
    assert conv["completion_tokens"] == sum(r.completion_tokens for _, r in recent)
    assert conv["cost"] == pytest.approx(calls * COST)
    assert conv["avg_cost"] == pytest.approx(calls * COST / 7)
    assert conv["median_cost"] == pytest.approx(4 * COST)  # 2 2 3 3 4 6 6 calls
    assert conv["avg_turns"] == pytest.approx(27 / 7, abs=0.005)

    stages = by(report["costs"]["stages"])
    assert list(stages) == ["greeting", "discovery", "presentation", "objection_handling",
                            "cart_building", "contact_collection"]
    turns = Counter(r.stage_before for _, r in recent)
    assert {k: v["turns"] for k, v in stages.items()} == turns
    assert turns == {"greeting": 7, "discovery": 7, "presentation": 8, "objection_handling": 1,
                     "cart_building": 2, "contact_collection": 2}
    for stage, row in stages.items():
        mine = [r for _, r in recent if r.stage_before == stage]
        assert row["prompt_tokens"] == sum(r.prompt_tokens for r in mine)
        assert row["completion_tokens"] == sum(r.completion_tokens for r in mine)
        stage_calls = sum(n for (s, st), n in filled.calls.items() if st == stage and s != OLD)
        sessions = {s for s, r in recent if r.stage_before == stage}
        assert row["sessions"] == len(sessions)
        if not stage_calls:  # D's only turn there: the call failed, nothing was priced
            assert (stage, row["cost"], row["cost_per_conversation"]) == (
                "objection_handling", None, None)
            continue
        assert row["cost"] == pytest.approx(stage_calls * COST)
        assert row["cost_per_conversation"] == pytest.approx(stage_calls * COST / len(sessions),
                                                             abs=1e-6)
    # E's two invalid answers and G's repaired one; E's and D's fallback replies.
    assert (stages["discovery"]["validation_failed_turns"],
            stages["discovery"]["validation_failure_pct"]) == (2, 28.6)
    assert (stages["discovery"]["fallback_turns"], stages["discovery"]["fallback_pct"]) == (1, 14.3)
    assert (stages["objection_handling"]["fallback_turns"],
            stages["objection_handling"]["fallback_pct"]) == (1, 100)
    assert sum(s["validation_failed_turns"] for s in stages.values()) == 2
    assert sum(s["fallback_turns"] for s in stages.values()) == 2


async def test_a_wider_window_takes_the_older_session_in(filled: Filled) -> None:
    wide = await build_report(PURAMUR, db=filled.url, since=30 * 86400)
    f = by(wide["stage_funnel"]["stages"])
    assert (f["greeting"]["sessions"], f["presentation"]["sessions"]) == (8, 5)
    assert wide["costs"]["conversations"]["turns"] == 30
    assert by(wide["products"], "sku")["PR251010"]["presented"] == 4
    # The last 24 hours do not depend on the window.
    assert wide["active_by_stage"]["rows"] == (await build_report(
        PURAMUR, db=filled.url))["active_by_stage"]["rows"]


# -- the seed's five queries, verbatim, on the same rows --------------------------------
def test_the_seed_queries_agree(filled: Filled, report: dict[str, Any]) -> None:
    q, run = seed_queries(), filled.sql
    assert run(q["active_sessions_by_stage"]) == [("discovery", 2), ("objection_handling", 1)]
    f = by(report["stage_funnel"]["stages"])
    assert run(q["sales_funnel_7_days"]) == [(7, 7, 4, 2, 4)] == [(
        f["greeting"]["sessions"], f["discovery"]["sessions"], f["presentation"]["sessions"],
        f["cart_building"]["sessions"], f["handoff"]["sessions"])]
    # All time (H too): a stage's exit minus the previous stage's exit, rounded.
    assert run(q["average_time_per_stage"]) == [
        ("presentation", 110, 4), ("cart_building", 60, 2), ("discovery", 39, 6),
        ("contact_collection", 35, 2)]
    # 30 days: H's two products too.
    assert sorted(run(q["most_presented_products"])) == [
        ("PR251010", 4, 3), ("PR251020", 4, 3), ("PR260100", 1, 0)]
    assert sorted(run(q["handoff_reasons"])) == [
        ("cart_confirmed", 2, Decimal("764"), 275), ("complaint", 1, Decimal("0"), 35),
        ("explicit_request", 1, Decimal("0"), 70)]


# -- views -----------------------------------------------------------------------------
def test_the_views_give_the_report_numbers(filled: Filled, report: dict[str, Any]) -> None:
    spec = load_funnel(PURAMUR).spec
    run = filled.sql
    names = [view_name(spec, s) for s in section_queries(spec, 1)]
    assert names == [f"{TABLE}_v_{s}" for s in (
        "active_by_stage", "stage_funnel", "stage_time", "products", "handoff_reasons",
        "conversation_costs", "stage_costs", "reply_claims", "purchases", "revenue",
        "presented_vs_bought", "trend_days", "trend_totals")]
    assert run(f"SELECT stage, sessions FROM {TABLE}_v_active_by_stage") == [
        ("discovery", 2), ("objection_handling", 1)]
    assert [r[0] for r in run(f"SELECT sessions FROM {TABLE}_v_stage_funnel")] == [
        s["sessions"] for s in report["stage_funnel"]["stages"]]
    assert run(f"SELECT sku, presented, converted FROM {TABLE}_v_products") == [
        ("PR251010", 3, 3), ("PR251020", 3, 3), ("PR260100", 1, 0)]
    assert run(f"SELECT reason, handoffs FROM {TABLE}_v_handoff_reasons") == [
        ("cart_confirmed", 2), ("complaint", 1), ("explicit_request", 1)]
    assert run(f"SELECT stage, turns FROM {TABLE}_v_stage_costs") == [
        (s["stage"], s["turns"]) for s in report["costs"]["stages"]]
    assert run(f"SELECT conversations, turns FROM {TABLE}_v_conversation_costs") == [(7, 27)]
    assert run(f"SELECT orders, buyers FROM {TABLE}_v_purchases") == [(3, 2)]
    assert run(f"SELECT currency, revenue FROM {TABLE}_v_revenue") == [
        ("UAH", Decimal("1527.00")), ("EUR", Decimal("20.00"))]
    # The window is a setting: 30 days takes H in.
    run("SET funnel.since = '30 days'")
    try:
        assert run(f"SELECT conversations, turns FROM {TABLE}_v_conversation_costs") == [(8, 30)]
        assert run(f"SELECT sessions FROM {TABLE}_v_stage_funnel WHERE stage = 'greeting'") == [
            (8,)]
    finally:
        run("RESET funnel.since")


def test_migrate_creates_the_views_once(filled: Filled) -> None:
    # Engine.open created the table and the views; a migrate has nothing left to do.
    out = cli("migrate", str(PURAMUR), "--check", db=filled.url)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "up to date" in out.stdout
    [(n,)] = filled.sql("SELECT count(*) FROM pg_views WHERE schemaname = current_schema() "
                        "AND viewname LIKE %s", (f"{TABLE}_v_%",))
    assert n == 13


def test_migrate_keeps_the_views_in_step_with_the_funnel(db_url: str, sql: Any,
                                                        tmp_path: Path) -> None:
    assert cli("migrate", str(PURAMUR), db=db_url).returncode == 0
    sql(f"CREATE VIEW {TABLE}_v_mine AS SELECT stage FROM {TABLE}")  # an analyst's own view
    # A view whose definition changed is replaced; a missing one is created.
    sql(f"COMMENT ON VIEW {TABLE}_v_stage_time IS 'funnel analytics view 0000'")
    sql(f"DROP VIEW {TABLE}_v_products")
    check = cli("migrate", str(PURAMUR), "--check", db=db_url)
    assert check.returncode == 1
    assert check.stdout.splitlines() == [f"would replace view {TABLE}_v_stage_time",
                                         f"would create view {TABLE}_v_products"]
    done = cli("migrate", str(PURAMUR), db=db_url)
    assert done.stdout.splitlines() == [f"replace view {TABLE}_v_stage_time",
                                        f"create view {TABLE}_v_products"]
    assert "up to date" in cli("migrate", str(PURAMUR), db=db_url).stdout
    assert not sql("SELECT 1 FROM funnel_migrations WHERE description LIKE '%view%'")

    # The funnel stops recording the hand-off reason: `--drop` drops the column the
    # view read, so the views are dropped first and created again after.
    data = yaml.safe_load(PURAMUR.read_text("utf-8"))
    for key in ("prompts", "schemas", "catalog"):
        if key in data:  # a funnel's output contracts are derived: it may name no schemas
            data[key] = str((PURAMUR.parent / data[key]).resolve())
    data.pop("knowledge")  # a funnel reads knowledge only from its own folder
    for stage in data["stages"].values():
        stage.pop("knowledge", None)
    del data["handoff"]["reason"], data["state"]["handoff_reason"]
    # The claim that read the field reads what is left (else F402 names the field).
    data["claims"]["promises"]["order_confirmed"] = "cart_item_count > 0 and handoff_triggered_at"
    variant = tmp_path / "puramur.yaml"
    variant.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    out = cli("migrate", str(variant), "--drop", db=db_url)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines.index(f"drop view {TABLE}_v_handoff_reasons") < lines.index(
        "drop column handoff_reason") < lines.index(f"create view {TABLE}_v_handoff_reasons")
    assert sql(f"SELECT * FROM {TABLE}_v_handoff_reasons") == []
    assert sql(f"SELECT count(*) FROM {TABLE}_v_mine") == [(0,)]  # never touched
    assert "up to date" in cli("migrate", str(variant), db=db_url).stdout


# -- the command -----------------------------------------------------------------------
def cli(*args: str, db: str) -> CliResult:
    return run_funnel(*args, env={"FUNNEL_DB": db})


def test_json_output_parses_and_matches(filled: Filled, report: dict[str, Any]) -> None:
    out = cli("report", str(PURAMUR), "--format", "json", db=filled.url)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {k: data[k] for k in ("stage_funnel", "stage_time", "products", "costs")} == \
        {k: report[k] for k in ("stage_funnel", "stage_time", "products", "costs")}
    assert data["since"] == "7d" and data["since_seconds"] == 604800


def test_table_output(filled: Filled) -> None:
    out = cli("report", str(PURAMUR), "--since", "7d", db=filled.url)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for title in ("Active sessions by stage", "Funnel", "Time in each stage",
                  "Most presented products", "Hand-off reasons", "Cost, tokens and quality"):
        assert title in text
    assert "biggest drop-off: discovery: 2 of 7 sessions (28.6%) went no further" in text
    funnel = text.split("Funnel: sessions that reached each stage")[1].split("\n\n")[0]
    rows = [ln for ln in funnel.splitlines() if re.search(r"\d%", ln) and "drop-off" not in ln]
    assert [r.split()[:3] for r in rows][2] == ["presentation", "4", "57.1%"]
    # Columns line up: numbers are right-aligned under their headers.
    assert len({r.index("%") for r in rows}) == 1 and len(rows) == 6
    # The side branch is listed apart from the main path, with where it leaves it.
    side = text.split("side branches (off the main path):")[1].split("\n\n")[0]
    assert [ln.split() for ln in side.splitlines()[3:]] == [
        ["objection_handling", "presentation", "1", "14.3%", "1"]]
    trends = text.split("Trends: sessions and conversions a day")[1]
    assert re.search(r"sessions\s+7\s+1\s+\+600\.0%", trends), trends
    assert "PR251010  Exotic Spa shampoo" in text
    assert "3 orders from 2 of 7 sessions (28.6% bought)" in text
    purchases = text.split("Purchases and revenue")[1].split("Presented vs bought")[0]
    assert [ln.split()[:4] for ln in purchases.splitlines() if ln.strip().startswith(
        ("UAH", "EUR"))] == [["UAH", "2", "2", "1,527.00"], ["EUR", "1", "1", "20.00"]]
    assert re.search(r"PR290600 +\S.* +0 +0 +1 +1 +-", text)  # bought, never presented


def test_bad_period_is_a_usage_error(filled: Filled) -> None:
    out = cli("report", str(PURAMUR), "--since", "a week", db=filled.url)
    assert out.returncode == 2 and "not a duration" in out.stderr


# -- an empty database -----------------------------------------------------------------
@pytest.mark.parametrize("funnel", [PURAMUR, B2B], ids=["puramur", "b2b"])
async def test_an_empty_database(db_url: str, funnel: Path) -> None:
    # No table at all: nothing is created, every section is empty.
    report = await build_report(funnel, db=db_url)
    assert report["notes"] and report["stage_funnel"]["sessions"] == 0
    assert report["stage_funnel"]["biggest_drop_off"] is None
    assert report["costs"]["conversations"]["conversations"] == 0
    assert "(no data)" in render_table(report) and "No sessions started" in render_html(report)
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relnamespace = "
                            "current_schema()::regnamespace").fetchone() == (0,)
    # Tables without rows.
    engine = await Engine.open(funnel, db=db_url, model=PricedModel())
    await engine.close()
    report = await build_report(funnel, db=db_url)
    assert not report["notes"] and report["active_by_stage"]["rows"] == []
    assert all(s["sessions"] == 0 and s["pct_of_first"] is None
               for s in report["stage_funnel"]["stages"])
    assert report["products"] in ([], None) and not report["handoff_reasons"]
    assert "No sessions started" in render_html(report)
    out = cli("report", str(funnel), "--format", "json", db=db_url)
    assert out.returncode == 0 and json.loads(out.stdout)["costs"]["stages"] == []


# -- the HTML page in a real browser ---------------------------------------------------
def chromium() -> str:
    # As the widget's browser test (test_service.py): required in CI, skipped elsewhere.
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        message = "chromium is needed: apt-get install -y chromium"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def browse(html: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", f"--user-data-dir={profile}", *extra, f"file://{html}"],
            capture_output=True, text=True, timeout=120)


def test_html_report_in_headless_chromium(filled: Filled, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    out = cli("report", str(PURAMUR), "--format", "html", "--out", str(page), db=filled.url)
    assert out.returncode == 0, out.stderr
    html = page.read_text("utf-8")
    # Self-contained: no scripts, no external resources.
    assert "<script" not in html and not re.search(r"(src|href)=\"?(https?:)?//", html)
    assert html.count("<svg") >= 4

    shot = tmp_path / "report.png"
    browse(page, f"--screenshot={shot}", "--window-size=1200,1600")
    assert shot.exists() and shot.stat().st_size > 20_000
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("FUNNEL_REPORT_SCREENSHOT"):
        shutil.copy(shot, os.environ["FUNNEL_REPORT_SCREENSHOT"])

    dom = browse(page, "--dump-dom").stdout
    for _, title in SECTIONS:
        assert f">{title}</h2>" in dom.replace("&amp;", "&"), title
    assert "Biggest drop-off: discovery." in dom
    # The side branch is drawn apart from the main path's bars; no number is a link
    # outside the studio.
    branches = re.search(r'<svg[^>]*data-testid="report-branches".*?</svg>', dom, re.S)
    funnel = re.search(r'<svg[^>]*data-testid="report-funnel".*?</svg>', dom, re.S)
    assert branches and funnel
    assert "objection handling" in branches.group(0) and "from presentation" in branches.group(0)
    assert "objection handling" not in funnel.group(0) and "cart building" in funnel.group(0)
    assert "<a " not in dom
    trend = re.search(r'<svg[^>]*data-testid="report-trend".*?</svg>', dom, re.S)
    assert trend and len(re.findall(r'<g class="day"', trend.group(0))) == 8
    assert "Exotic Spa shampoo" in dom and "cart_confirmed" in dom
