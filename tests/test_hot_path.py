"""The turn's hot path (issue 19) does the same work, only cheaper.

The stage schema is checked by jsonschema-rs first and by jsonschema when that
rejects, with the same verdicts; the sandbox reads dict keys without a failed
attribute lookup, attributes still winning; the first round trip's commit is
asynchronous and only its own.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from conftest import ROOT

from engine.funnel.compiled import load_funnel
from engine.sandbox.expressions import compile_condition, make_environment
from engine.store.functions import TYPES, call
from engine.store.wire import Prepared, encode, run
from engine.turn.output import parse_output

FUNNELS = sorted((ROOT / "funnels").glob("*.yaml"))

ENVELOPES: list[Any] = [
    {"reply": "Hello!"},
    {"reply": "Hello!", "language": "en"},
    {"reply": "Hello!", "language": "english"},
    {"reply": ""},
    {"reply": "x" * 5000},
    {"reply": "Hi", "surprise": 1},
    {"reply": "Hi", "updates": {"pet": {"type": "cat", "breed": "Sphynx"}}},
    {"reply": "Hi", "updates": {"pet": {"type": "parrot"}}},
    {"reply": "Hi", "updates": {"pet": {"age_years": -1}}},
    {"reply": "Hi", "updates": {"customer": {"name": "Anna", "phone": "066 123 45 67"}}},
    {"reply": "Hi", "actions": [{"type": "present_products", "skus": ["PR251010"]}]},
    {"reply": "Hi", "actions": [{"type": "add_to_cart", "sku": "PR251010", "qty": 1}]},
    {"reply": "Hi", "actions": [{"type": "add_to_cart", "sku": "PR251010", "qty": "one"}]},
    {"reply": "Hi", "actions": [{"type": "launch_rockets"}]},
    {"reply": "Hi", "actions": [{"type": "confirm_cart"}] * 20},
    {"updates": {}},
]


@pytest.mark.parametrize("path", FUNNELS, ids=lambda p: p.stem)
def test_the_fast_check_gives_jsonschemas_verdict_on_every_shipped_stage(path: Path) -> None:
    funnel = load_funnel(path)
    for stage in funnel.stages.values():
        assert stage.fast_validator is not None, f"{path.name} {stage.spec.name}"
        verdicts = set()
        for envelope in ENVELOPES:
            parsed, problem = parse_output(stage, orjson.dumps(envelope).decode())
            valid = stage.validator.is_valid(envelope)
            assert (parsed == envelope) if valid else (parsed is None and "at $" in problem), \
                (path.name, stage.spec.name, envelope, problem)
            verdicts.add(valid)
        assert verdicts == {True, False}  # the corpus has both for every stage


def test_a_stage_given_another_validator_is_checked_by_that_one(puramur: Any) -> None:
    stage = puramur.stage("greeting")
    bad = {"reply": "Hi", "surprise": 1}
    assert parse_output(stage, orjson.dumps(bad).decode())[0] is None
    loose = dataclasses.replace(
        stage, validator=jsonschema.Draft202012Validator({"type": "object"}))
    assert parse_output(loose, orjson.dumps(bad).decode())[0] == bad
    strict = dataclasses.replace(stage, validator=jsonschema.Draft202012Validator(
        {"type": "object", "required": ["reply", "language"]}))
    envelope, problem = parse_output(strict, '{"reply": "Hi"}')
    assert envelope is None and "language" in problem


def test_a_schema_jsonschema_rs_cannot_build_leaves_only_jsonschema(puramur: Any) -> None:
    stage = puramur.stage("greeting")
    dangling = dataclasses.replace(stage, validator=jsonschema.Draft202012Validator(
        {"type": "object", "properties": {"reply": {"$ref": "#/$defs/missing"}}}))
    assert dangling.fast_validator is None
    envelope, problem = parse_output(dangling, '{"reply": "Hi"}')
    assert envelope is None and "cannot be evaluated" in problem


def test_dict_keys_read_directly_and_dict_attributes_still_win() -> None:
    env = make_environment()
    template = env.from_string("{{ p.sku }}|{{ p['items'] }}|{{ p.items is callable }}")
    assert template.render(p={"sku": "PR1", "items": 3}) == "PR1|3|True"
    with pytest.raises(Exception, match="no attribute 'name'"):
        env.from_string("{{ p.name }}").render(p={"sku": "PR1"})
    # Conditions read state the same way.
    assert compile_condition("pet.type == 'cat' and pet.age_years is none")(
        {"pet": {"type": "cat", "age_years": None}})
    with pytest.raises(Exception, match="__class__"):
        env.from_string("{{ p.__class__.__mro__ }}").render(p={})


@pytest.mark.postgres
async def test_the_first_commit_alone_is_asynchronous(store: Any, puramur: Any, sql: Any
                                                      ) -> None:
    await store.ensure_schema(puramur.spec)
    statement = Prepared(call(puramur.spec), TYPES)
    args = ("puramur", "s1", "Hi, a dog", "greeting", "puramur/s1", "h1", 6.0, 4, 0, False,
            None, None, True)
    async with store._conn() as conn:
        async with conn.transaction():
            await run(conn, statement, [encode(a) for a in args])
            inside = await (await conn.execute("SHOW synchronous_commit")).fetchone()
        after = await (await conn.execute("SHOW synchronous_commit")).fetchone()
    assert inside == ("off",) and after == ("on",)
    # The message committed all the same, with its lease.
    assert sql("SELECT role, content FROM funnel_messages") == [("user", "Hi, a dog")]
    assert sql("SELECT holder FROM funnel_leases") == [("h1",)]


@pytest.mark.parametrize("path", FUNNELS, ids=lambda p: p.stem)
def test_state_fields_are_judged_as_jsonschema_judges_them(path: Path) -> None:
    rules = load_funnel(path).rules
    values: list[Any] = [None, "", "x" * 400, 0, -1, 1.5, 10**20, True, [], {}, ["a"],
                         {"type": "cat"}, {"type": "parrot"}, {"name": "Anna", "phone": 1},
                         [{"sku": "PR251010", "qty": 1}], [{"qty": "two"}], "2026-01-01"]
    for name, validator in rules.validators.items():
        assert rules.fast_validators[name] is not None
        verdicts = [rules.invalid(name, value) is None for value in values]
        assert verdicts == [validator.is_valid(value) for value in values], name


HAPPY: list[dict[str, Any]] = [
    {"reply": "Hello! Is your pet a cat or a dog?", "language": "en"},
    {"reply": "Sphynx skin needs gentle care.",
     "updates": {"pet": {"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"]}}},
    {"reply": "For Murka: Exotic Spa.", "updates": {"pet": {"age_years": 3, "name": "Murka"}},
     "actions": [{"type": "present_products", "skus": ["PR251010", "PR251020"]}]},
    {"reply": "I understand.", "actions": [{"type": "record_objection", "objection": "price"}]},
]


@pytest.mark.postgres
async def test_a_turn_record_explains_what_the_turn_did_from_its_compact_form(
        store: Any, puramur: Any, sql: Any) -> None:
    from engine import Engine, ScriptedModel
    from engine.funnel.state import plain

    engine = await Engine.open(puramur, store=store,
                               model=ScriptedModel.from_data({"turns": HAPPY}))
    results = [await engine.handle("why", f"message {i}") for i in range(len(HAPPY))]
    records = await store.turn_records(puramur.spec, "why")
    # Every explanation reads back as the turn gave it: exits, conditions, verdicts,
    # values and the completeness rules behind a derived value.
    assert [r["explain"] for r in records] == [plain(r.explain) for r in results]
    assert any(t.get("derived") for r in results for s in r.explain for t in s["transitions"])
    # The record itself keeps what the turn found; each stage's exits are stored once.
    stored = sql("SELECT explain FROM funnel_turns ORDER BY id")
    assert all("transitions" not in step and "when" not in str(step)
               for (steps,) in stored for step in steps)
    cited = {step["exits"] for (steps,) in stored for step in steps}
    assert sql("SELECT count(*) FROM funnel_exits") == [(len(cited),)]
    await engine.close()


def test_an_explanation_written_in_full_or_with_unknown_exits_still_reads() -> None:
    from engine.records.explanation import compact, expand
    from engine.turn.explain import describe

    full = [{"stage": "discovery", "fired": None, "transitions": [
        {"to": "handoff", "when": "handoff_requested == 'complaint'", "global": True,
         "held": False, "values": {"handoff_requested": None}},
        {"to": "presentation", "when": "discovery_completeness >= 60", "held": None,
         "error": "boom", "values": {"discovery_completeness": 50},
         "derived": {"discovery_completeness": "pet.type 25 + pet.problems 25"}},
        {"to": "thanks", "when": None, "held": True}],
        "iterations": {"count": 2, "limit": 4, "to": "handoff"}}]
    assert expand(full, {}) == full  # a record written before compaction
    stored = compact(full)
    assert expand(stored, {stored[0]["exits"]: [
        ["handoff", "handoff_requested == 'complaint'", True],
        ["presentation", "discovery_completeness >= 60", False],
        ["thanks", None, False]]}) == full
    unknown = expand(stored, {})
    assert unknown is not None
    assert [t["to"] for t in unknown[0]["transitions"]] == ["?", "?", "?"]
    assert len(describe(unknown)) == 4


@pytest.mark.postgres
async def test_a_save_leaves_the_large_values_it_did_not_change_where_they_are(
        store: Any, puramur: Any, sql: Any) -> None:
    import hashlib
    import json

    from engine import Engine, ScriptedModel

    engine = await Engine.open(puramur, store=store,
                               model=ScriptedModel.from_data({"default": {"reply": "OK."}}))
    await engine.handle("big", "Hi")
    assert sql("SELECT reloptions FROM pg_class WHERE oid = 'puramur_sessions_state'::regclass"
               ) == [(["toast_tuple_target=800"],)]
    # A value too large to stay in the row (and that does not compress away).
    notes = " ".join(hashlib.sha1(str(i).encode()).hexdigest() for i in range(80))
    objections = [{"objection": "price", "note": notes}]
    sql("UPDATE puramur_sessions_state SET objections_raised = %s::jsonb",
        (json.dumps(objections),))
    toast = sql("SELECT reltoastrelid::regclass::text FROM pg_class "
                "WHERE oid = 'puramur_sessions_state'::regclass")[0][0]
    before = sql(f"SELECT DISTINCT chunk_id FROM {toast}")
    assert before
    result = await engine.handle("big", "I have a cat")
    assert result.state["turns"] == 2
    # The turn changed the row but not the objections: their stored value was kept, not
    # written again (the WAL carries a pointer, not 3 KB).
    assert sql(f"SELECT DISTINCT chunk_id FROM {toast}") == before
    assert sql("SELECT objections_raised, turns FROM puramur_sessions_state") == [
        (objections, 2)]
    await engine.close()


def test_the_machine_takes_the_explanations_verdicts_instead_of_evaluating_again(
        puramur: Any) -> None:
    machine = puramur.machine
    ctx = {"discovery_completeness": 75, "handoff_requested": None}
    # Evaluated on its own, the exit holds...
    assert [f.dest for f in machine.fire("discovery", "advance", ctx).fired] == ["presentation"]
    # ... and the verdicts the turn's explanation found are used as they are.
    known = {"discovery_completeness >= 60": False}
    assert machine.fire("discovery", "advance", ctx, known).fired == []
    known = {"discovery_completeness >= 60": True}
    moved = machine.fire("discovery", "advance", {**ctx, "discovery_completeness": 0}, known)
    assert [f.dest for f in moved.fired] == ["presentation"] and not moved.errors


@pytest.mark.postgres
async def test_a_turn_is_two_round_trips(store: Any, puramur: Any) -> None:
    from engine import Engine, ScriptedModel

    engine = await Engine.open(puramur, store=store,
                               model=ScriptedModel.from_data({"default": {"reply": "OK."}}))
    await engine.handle("rt", "Hi")  # a new session; it moves on to discovery
    checkouts = 0
    connect = store._conn

    def counted() -> Any:
        nonlocal checkouts
        checkouts += 1
        return connect()

    store._conn = counted
    for text in ("I have a cat", "She is three"):
        result = await engine.handle("rt", text)
        assert result.stage_after == "discovery" and not result.fallback
    # Per turn: the message, lease, row, window and whether a manager holds the session
    # (engine.turn.manager, under the lease) in one call; state, reply, turn record,
    # explanation and the lease's release in the second.
    assert checkouts == 4
    await engine.close()
