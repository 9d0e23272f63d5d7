"""Versions on a real database (docs/versions.md): a session keeps the version it started
with until it ends, old versions come back from the version store, and `pin: false`
moves sessions at once through the declared migrations, recorded in the turn record.

The funnels are `funnel new` folders in ``tmp_path``: v1 as generated, v2 a copy whose
prompts say so and whose discovery stage goes straight to the hand-off.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import CliResult, run_funnel

from engine import Engine, ScriptedModel
from engine.errors import ConfigError, MigrationError, SchemaOutdated
from engine.format.settings import MigrationStep
from engine.funnel.compiled import load_funnel
from engine.llm.models import Completion
from engine.llm.request import ModelRequest
from engine.store import ddl
from engine.validation import validate_paths
from engine.versions import migrate_row
from engine.versions.bundle import Bundle, bundle_of, compile_bundle

TABLE = "shop_sessions_state"
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


class Recording(ScriptedModel):
    """The scripted model, remembering each call's prompt (the system and user text)."""

    prompts: list[str]

    async def complete(self, request: ModelRequest) -> Completion:
        self.prompts.append("\n".join(m["content"] for m in request.messages))
        return await super().complete(request)


def model() -> Recording:
    m = Recording.from_data({
        "match": [
            {"pattern": "website", "output": {"reply": "Noted.",
                                              "updates": {"need": "a website"}}},
            {"pattern": "Anna", "output": {"reply": "Thanks, Anna.", "updates": {
                "customer": {"name": "Anna", "phone": "+15551234567"}}}},
        ],
        "default": {"reply": "Hello! What do you need?"}})
    assert isinstance(m, Recording)
    m.prompts = []
    return m


def cli(*args: str) -> CliResult:
    return run_funnel(*args, env={"FUNNEL_DB": None})


def scaffold(tmp_path: Path, name: str, marker: str) -> Path:
    """`funnel new shop` in ``tmp_path/name``, every prompt ending with ``marker``."""
    folder = tmp_path / name
    made = cli("new", "shop", "--dir", str(folder))
    assert made.returncode == 0, made.stderr
    for prompt in (folder / "prompts").glob("*.j2"):
        prompt.write_text(prompt.read_text("utf-8") + f"\n{marker}\n", "utf-8")
    return folder / "funnel.yaml"


def edit(path: Path, change: Any) -> None:
    data = yaml.safe_load(path.read_text("utf-8"))
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")


def v2_rules(data: dict[str, Any]) -> None:
    """v2: discovery hands off as soon as the need is known (v1 asks for contacts first)."""
    data["version"] = 2
    data["session_ttl"] = "2h"
    data["state"]["budget"] = {"type": "integer", "default": 0}
    data["stages"]["discovery"]["transitions"] = [
        {"to": "done", "when": "need", "reason": "need_known"},
        {"to": "contact", "when": "turns > 50"}]


def make_v1(tmp_path: Path) -> Path:
    v1 = scaffold(tmp_path, "v1", "V1 PROMPT")
    edit(v1, lambda d: d.update(session_ttl="2h"))
    return v1


async def engine_on(funnel: Path, db_url: str, rec: Recording, clock: list[datetime]
                    ) -> Engine:
    return await Engine.open(funnel, db=db_url, model=rec, clock=lambda: clock[0], deploy=True)


def deploy(funnel: Path, db_url: str, *options: str) -> CliResult:
    done = cli("deploy", str(funnel), "--db", db_url, *options)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


# -- pinning ------------------------------------------------------------------------------
async def test_a_session_keeps_its_version_until_it_ends(tmp_path: Path, db_url: str,
                                                         sql: Any) -> None:
    v1 = make_v1(tmp_path)
    v2 = scaffold(tmp_path, "v2", "V2 PROMPT")
    edit(v2, v2_rules)
    rec, clock = model(), [T0]
    engine = await engine_on(v1, db_url, rec, clock)
    try:
        first = await engine.handle("a", "Hi")
        assert first.stage_after == "discovery" and first.state["funnel_version"] == 1
        assert "V1 PROMPT" in rec.prompts[-1]

        assert "stored v2" in deploy(v2, db_url).stdout
        await engine.deploy(load_funnel(v2))

        # A new session starts on v2, in the same engine.
        new = await engine.handle("b", "Hi")
        assert "V2 PROMPT" in rec.prompts[-1] and new.state["funnel_version"] == 2
        # The old one keeps v1's prompts and stage rules (v2 would hand off now).
        old = await engine.handle("a", "I need a website")
        assert "V1 PROMPT" in rec.prompts[-1] and "V2 PROMPT" not in rec.prompts[-1]
        assert old.stage_after == "contact" and old.state["funnel_version"] == 1
        # ... while v2's sessions follow v2's rules.
        moved = await engine.handle("b", "I need a website")
        assert moved.stage_after == "done"
        assert set(engine.loaded_versions()) == {1, 2}
    finally:
        await engine.close()
    assert sql(f"SELECT session_id, funnel_version FROM {TABLE} ORDER BY 1") == [
        ("a", 1), ("b", 2)]
    assert sql(f"SELECT funnel_version FROM {ddl.TURNS} WHERE session_id = 'a' ORDER BY id"
               ) == [(1,), (1,)]

    # A fresh engine of v2, with v1's files gone: v1 comes from the version store.
    shutil.rmtree(v1.parent)
    rec2 = model()
    engine = await engine_on(v2, db_url, rec2, clock)
    try:
        done = await engine.handle("a", "Anna, +15551234567")
        assert "V1 PROMPT" in rec2.prompts[-1]
        assert done.stage_after == "done" and done.state["funnel_version"] == 1
        assert set(engine.loaded_versions()) == {1, 2}
        # It reached v1's final stage: its next conversation runs on v2.
        after = await engine.handle("a", "One more question")
        assert "V2 PROMPT" in rec2.prompts[-1] and after.state["funnel_version"] == 2
    finally:
        await engine.close()


async def test_an_idle_session_past_session_ttl_moves_to_the_newest(tmp_path: Path,
                                                                   db_url: str) -> None:
    v1 = make_v1(tmp_path)
    v2 = scaffold(tmp_path, "v2", "V2 PROMPT")
    edit(v2, v2_rules)
    rec, clock = model(), [T0]
    engine = await engine_on(v1, db_url, rec, clock)
    try:
        await engine.handle("stays", "Hi")
        await engine.handle("leaves", "Hi")
        deploy(v2, db_url)
        await engine.deploy(load_funnel(v2))
        clock[0] = T0 + timedelta(hours=1)  # within v1's session_ttl (2h)
        stays = await engine.handle("stays", "Still there?")
        assert stays.state["funnel_version"] == 1 and "V1 PROMPT" in rec.prompts[-1]
        clock[0] = T0 + timedelta(hours=3)  # `leaves` idle 3h: its conversation ended
        leaves = await engine.handle("leaves", "Back again")
        assert leaves.state["funnel_version"] == 2 and "V2 PROMPT" in rec.prompts[-1]
    finally:
        await engine.close()


async def test_a_version_missing_from_the_store_runs_on_the_newest(tmp_path: Path,
                                                                  db_url: str,
                                                                  sql: Any) -> None:
    v1 = make_v1(tmp_path)
    v2 = scaffold(tmp_path, "v2", "V2 PROMPT")
    edit(v2, v2_rules)
    rec, clock = model(), [T0]
    engine = await engine_on(v1, db_url, rec, clock)
    try:
        await engine.handle("a", "Hi")
    finally:
        await engine.close()
    sql(f"DELETE FROM {ddl.VERSIONS}")
    deploy(v2, db_url)
    engine = await engine_on(v2, db_url, rec, clock)
    try:
        turn = await engine.handle("a", "Hi again")
        assert turn.state["funnel_version"] == 2 and not turn.fallback
    finally:
        await engine.close()


# -- pin: false and declared migrations ----------------------------------------------------
def rename_need(data: dict[str, Any]) -> None:
    data["version"] = 2
    data["pin"] = False
    data["state"]["request"] = data["state"].pop("need")
    data["completeness"]["rules"][0]["when"] = "request"
    data["stages"]["discovery"]["transitions"][0]["when"] = "request"
    data["migrations"] = [{"from": 1, "to": 2, "rename": {"need": "request"}}]
    for stage in data["stages"].values():  # the derived contracts follow the field's name
        if "updates" in stage:
            stage["updates"] = ["request" if u == "need" else u for u in stage["updates"]]


def v2_renamed(tmp_path: Path) -> Path:
    v2 = scaffold(tmp_path, "v2", "V2 PROMPT")
    edit(v2, rename_need)
    for prompt in (v2.parent / "prompts").glob("*.j2"):
        prompt.write_text(prompt.read_text("utf-8").replace("need", "request"), "utf-8")
    assert load_funnel(v2).spec.migrations
    return v2


async def test_pin_false_moves_a_session_at_once_and_records_the_migration(
        tmp_path: Path, db_url: str, sql: Any) -> None:
    v1 = make_v1(tmp_path)
    v2 = v2_renamed(tmp_path)
    rec, clock = model(), [T0]
    engine = await engine_on(v1, db_url, rec, clock)
    try:
        await engine.handle("p", "Hi")
        mid = await engine.handle("p", "I need a website")
        assert mid.stage_after == "contact" and mid.state["need"] == "a website"
        deploy(v2, db_url)
        await engine.deploy(load_funnel(v2))
        turn = await engine.handle("p", "Anna, +15551234567")
    finally:
        await engine.close()
    assert "V2 PROMPT" in rec.prompts[-1]
    assert turn.state["funnel_version"] == 2 and turn.state["request"] == "a website"
    assert "need" not in turn.state
    assert turn.state["score"] == 100 and turn.stage_after == "done"  # v2's rules read it
    records = sql(f"SELECT funnel_version, migration FROM {ddl.TURNS} WHERE session_id = 'p' "
                  "ORDER BY id")
    assert [r[0] for r in records] == [1, 1, 2]
    assert records[0][1] is None and records[1][1] is None
    assert records[2][1] == {"from": 1, "to": 2, "steps": [
        {"from": 1, "to": 2, "changes": ["renamed need -> request"]}]}
    assert sql(f"SELECT request, funnel_version FROM {TABLE}") == [("a website", 2)]


async def test_migrate_sessions_moves_them_eagerly(tmp_path: Path, db_url: str,
                                                   sql: Any) -> None:
    v1 = make_v1(tmp_path)
    v2 = v2_renamed(tmp_path)
    rec, clock = model(), [T0]
    engine = await engine_on(v1, db_url, rec, clock)
    try:
        await engine.handle("q", "I need a website")
        await engine.handle("r", "Hi")
    finally:
        await engine.close()
    out = deploy(v2, db_url, "--sessions").stdout
    assert "moved 2 session(s) to v2" in out
    assert sql(f"SELECT session_id, request, funnel_version FROM {TABLE} ORDER BY 1") == [
        ("q", "a website", 2), ("r", "", 2)]
    again = deploy(v2, db_url, "--sessions").stdout
    assert "moved 0 session(s)" in again


async def test_migrate_sessions_leaves_pinned_sessions_alone(tmp_path: Path, db_url: str,
                                                             sql: Any) -> None:
    v1 = make_v1(tmp_path)
    v2 = scaffold(tmp_path, "v2", "V2 PROMPT")
    edit(v2, v2_rules)
    # Open: its last message is recent (the command reads the real clock) and its stage
    # is not final; one idle past v1's session_ttl (2h) has ended, and moves.
    rec, clock = model(), [datetime.now(UTC)]
    engine = await engine_on(v1, db_url, rec, clock)
    try:
        await engine.handle("open", "Hi")
        clock[0] -= timedelta(hours=3)
        await engine.handle("ended", "Hi")
    finally:
        await engine.close()
    out = deploy(v2, db_url, "--sessions").stdout
    assert "moved 1 session(s)" in out and "1 session(s) stay pinned" in out
    assert sql(f"SELECT session_id, funnel_version FROM {TABLE} ORDER BY 1") == [
        ("ended", 2), ("open", 1)]


# -- the version store --------------------------------------------------------------------
async def test_deploy_stores_each_content_once_and_says_when_a_version_is_replaced(
        tmp_path: Path, db_url: str, sql: Any) -> None:
    v1 = make_v1(tmp_path)
    assert "stored v1" in deploy(v1, db_url).stdout
    assert "version store" not in deploy(v1, db_url).stdout  # nothing new
    prompt = v1.parent / "prompts" / "greeting.j2"
    prompt.write_text(prompt.read_text("utf-8") + "Be brief.\n", "utf-8")
    replaced = deploy(v1, db_url).stdout
    assert "replaced v1" in replaced and "bump `version:`" in replaced
    assert "changed: prompts/greeting.j2)" in replaced  # what the edit changed
    # Each stored edit of v1 has its own name in `funnel versions`.
    listed = cli("versions", str(v1), "--db", db_url).stdout.splitlines()
    assert [line.split()[0] for line in listed] == ["v1", "v1.2"]
    assert "(replaced)" in listed[0] and "without a `version:` bump" in listed[1]
    rows = sql(f"SELECT version, files->>'prompts/greeting.j2' FROM {ddl.VERSIONS} "
               "ORDER BY deployed_at")
    assert len(rows) == 2 and rows[-1][1].endswith("Be brief.\n")


def test_a_bundle_compiles_from_its_own_files_only(tmp_path: Path) -> None:
    v1 = make_v1(tmp_path)
    bundle = bundle_of(load_funnel(v1).spec)
    assert set(bundle.files) == {"funnel.yaml", *(f"prompts/{s}.j2" for s in (
        "greeting", "discovery", "contact", "done"))}  # the contracts are in funnel.yaml
    shutil.rmtree(v1.parent)
    loaded = compile_bundle(bundle)
    try:
        assert loaded.funnel.spec.version == 1
        assert Path(loaded.folder.name) in loaded.funnel.spec.path.parents  # type: ignore[union-attr]
    finally:
        loaded.folder.cleanup()  # type: ignore[union-attr]
    # A stored bundle that names a file outside itself is refused.
    evil = Bundle.make("shop", 1, "funnel.yaml", {**bundle.files, "../outside.j2": "x"})
    with pytest.raises(Exception, match="outside its bundle"):
        compile_bundle(evil)


# -- migrations, step by step -------------------------------------------------------------
def test_migrate_row_renames_moves_defaults_drops_and_renames_stages() -> None:
    steps = [
        MigrationStep(1, 2, rename=(("need", "request"),), stages=(("contact", "contacts"),)),
        MigrationStep(2, 3, move=(("customer.phone", "phone"),),
                      defaults=(("customer.country", "UA"), ("budget", 100)),
                      drop=("customer.name",)),
        MigrationStep(3, 4, rename=(("request", "wish"),)),  # beyond the target: not applied
    ]
    row = {"stage": "contact", "need": "a site", "customer": {"name": "A", "phone": "1"},
           "budget": None, "funnel_version": 1}
    moved, record = migrate_row(steps, row, 1, 3)
    assert moved == {"stage": "contacts", "request": "a site", "phone": "1",
                     "customer": {"country": "UA"}, "budget": 100, "funnel_version": 3}
    assert row["need"] == "a site"  # the input is left alone
    assert [s["to"] for s in record["steps"]] == [2, 3]
    with pytest.raises(MigrationError, match="'customer' holds str"):
        migrate_row([MigrationStep(1, 2, move=(("customer.phone", "phone"),))],
                    {"customer": "Anna"}, 1, 2)


# -- funnel validate ----------------------------------------------------------------------
def codes(path: Path) -> list[tuple[str, str]]:
    return [(d.code, d.message) for d in validate_paths([path]) if d.severity == "error"]


def test_validate_checks_the_declared_migrations(tmp_path: Path) -> None:
    v2 = v2_renamed(tmp_path)
    assert codes(v2) == []

    def unknown_stage(data: dict[str, Any]) -> None:
        data["migrations"][0]["stages"] = {"contact": "contacts"}
        data["migrations"].append({"from": 1, "to": 3})

    edit(v2, unknown_stage)
    found = codes(v2)
    assert any(c == "F801" and "version 2" in m for c, m in found), found
    assert any(c == "F802" and "'contacts'" in m for c, m in found), found


def test_validate_applies_every_step_to_every_scenario_state(tmp_path: Path) -> None:
    v2 = v2_renamed(tmp_path)
    scenario = v2.parent / "scenarios" / "happy_path.yaml"
    data = yaml.safe_load(scenario.read_text("utf-8"))
    data["start"] = {"stage": "contact", "customer": {"name": "Anna"}}
    scenario.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")

    def bad_move(d: dict[str, Any]) -> None:
        d["migrations"][0]["move"] = {"customer.name.first": "request"}

    edit(v2, bad_move)
    found = codes(v2)
    assert any(c == "F803" and "happy_path.yaml" in m and "'customer.name' holds str" in m
               for c, m in found), found
    # As JSON for the editor's problem list, the same finding.
    out = cli("validate", str(v2), "--format", "json")
    assert out.returncode == 1 and "F803" in json.dumps(json.loads(out.stdout))


async def test_a_worker_not_yet_restarted_runs_a_newer_session_from_the_store(
        tmp_path: Path, db_url: str) -> None:
    v1 = make_v1(tmp_path)
    v2 = scaffold(tmp_path, "v2", "V2 PROMPT")
    edit(v2, v2_rules)
    deploy(v2, db_url)
    rec, clock = model(), [T0]
    engine = await engine_on(v2, db_url, rec, clock)
    try:
        await engine.handle("s", "Hi")
    finally:
        await engine.close()
    old = await engine_on(v1, db_url, rec, clock)  # an old worker, in a rolling restart
    try:
        clock[0] = T0 + timedelta(days=1)  # ended (session_ttl 2h): still never moved back
        turn = await old.handle("s", "Hello again")
        assert "V2 PROMPT" in rec.prompts[-1] and turn.state["funnel_version"] == 2
        assert "budget" in turn.state  # v2's field, saved by v2's statements
    finally:
        await old.close()


async def test_migrate_leaves_the_stages_of_pinned_sessions_alone(tmp_path: Path,
                                                                  db_url: str,
                                                                  sql: Any) -> None:
    v1 = make_v1(tmp_path)
    v2 = scaffold(tmp_path, "v2", "V2 PROMPT")

    def no_contact(data: dict[str, Any]) -> None:
        v2_rules(data)
        del data["stages"]["contact"]
        data["stages"]["discovery"]["transitions"] = [{"to": "done", "when": "need"}]

    edit(v2, no_contact)
    rec, clock = model(), [datetime.now(UTC)]
    engine = await engine_on(v1, db_url, rec, clock)
    try:
        await engine.handle("c", "I need a website")  # greeting -> discovery -> contact
        assert (await engine.state("c") or {})["stage"] == "contact"
    finally:
        await engine.close()
    refused = cli("deploy", str(v2), "--db", db_url)
    assert refused.returncode == 1
    assert "error: 1 session(s) sit in stage 'contact' on older versions" in refused.stdout
    edit(v2, lambda d: d.update(removed_stages={"contact": "done"}))
    assert deploy(v2, db_url).returncode == 0
    assert sql(f"SELECT stage, funnel_version FROM {TABLE}") == [("contact", 1)]
    engine = await engine_on(v2, db_url, rec, clock)
    try:
        turn = await engine.handle("c", "Anna, +15551234567")  # still v1's contact stage
        assert turn.stage_before == "contact" and turn.state["funnel_version"] == 1
    finally:
        await engine.close()


# -- Engine.deploy ------------------------------------------------------------------------
class Held(Recording):
    """The recording model, holding each call until ``release`` is set."""

    started: asyncio.Event
    release: asyncio.Event

    async def complete(self, request: ModelRequest) -> Completion:
        self.started.set()
        await self.release.wait()
        return await super().complete(request)


async def test_a_turn_in_flight_keeps_its_version_across_a_deploy(tmp_path: Path,
                                                                  db_url: str) -> None:
    v1 = make_v1(tmp_path)
    v2 = scaffold(tmp_path, "v2", "V2 PROMPT")
    edit(v2, v2_rules)
    deploy(v2, db_url)  # the table has v2's columns; v1 is deployed again below
    deploy(v1, db_url)
    held = Held.from_data({"default": {"reply": "Hello!"}})
    assert isinstance(held, Held)
    held.prompts, held.started, held.release = [], asyncio.Event(), asyncio.Event()
    engine = await Engine.open(v1, db=db_url, model=held)
    try:
        in_flight = asyncio.create_task(engine.handle("early", "Hi"))
        await held.started.wait()  # the turn is asking the model: its version is chosen
        await engine.deploy(load_funnel(v2))
        held.release.set()
        early = await in_flight
        late = await engine.handle("late", "Hi")
    finally:
        await engine.close()
    assert early.state["funnel_version"] == 1 and "V1 PROMPT" in held.prompts[0]
    assert late.state["funnel_version"] == 2 and "V2 PROMPT" in held.prompts[1]


async def test_deploy_refuses_another_funnel_and_a_table_that_is_behind(
        tmp_path: Path, db_url: str) -> None:
    v1 = make_v1(tmp_path)
    v2 = scaffold(tmp_path, "v2", "V2 PROMPT")
    edit(v2, v2_rules)  # adds a field: its column does not exist yet
    other = scaffold(tmp_path, "other", "OTHER")
    edit(other, lambda d: d.update(funnel="other", table="other_sessions_state"))
    engine = await engine_on(v1, db_url, model(), [T0])
    try:
        with pytest.raises(ConfigError, match="cannot deploy funnel 'other'"):
            await engine.deploy(load_funnel(other))
        with pytest.raises(SchemaOutdated, match="budget"):
            await engine.deploy(load_funnel(v2))
        assert engine.loaded_versions() == {1: bundle_of(load_funnel(v1).spec).digest}
        turn = await engine.handle("a", "Hi")  # still v1
        assert turn.state["funnel_version"] == 1
    finally:
        await engine.close()


async def test_a_migration_that_cannot_apply_leaves_the_session_where_it_was(
        tmp_path: Path, db_url: str, sql: Any) -> None:
    v1 = make_v1(tmp_path)
    v2 = v2_renamed(tmp_path)

    def through_a_string(data: dict[str, Any]) -> None:
        data["migrations"][0] = {"from": 1, "to": 2, "move": {"need.text": "request"}}

    edit(v2, through_a_string)  # a v1 session's `need` holds a string
    rec, clock = model(), [T0]
    engine = await engine_on(v1, db_url, rec, clock)
    try:
        await engine.handle("m", "I need a website")
        deploy(v2, db_url)
        await engine.deploy(load_funnel(v2))
        turn = await engine.handle("m", "Anna, +15551234567")
    finally:
        await engine.close()
    assert turn.state["funnel_version"] == 1 and turn.state["need"] == "a website"
    assert "V1 PROMPT" in rec.prompts[-1]
    (record,) = sql(f"SELECT migration FROM {ddl.TURNS} WHERE session_id = 'm' AND "
                    "migration IS NOT NULL")
    assert record[0]["to"] == 1 and "'need' holds str" in record[0]["error"]


async def test_funnel_versions_lists_the_store_and_the_sessions(tmp_path: Path,
                                                                db_url: str) -> None:
    v1 = make_v1(tmp_path)
    assert "no version of funnel 'shop' is stored" in cli("versions", str(v1), "--db",
                                                          db_url).stdout
    v2 = scaffold(tmp_path, "v2", "V2 PROMPT")
    edit(v2, v2_rules)
    engine = await engine_on(v1, db_url, model(), [T0])
    try:
        await engine.handle("a", "Hi")
    finally:
        await engine.close()
    deploy(v2, db_url)
    out = cli("versions", str(v2), "--db", db_url)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("v1  ") and lines[0].endswith("1 session(s)")
    assert lines[1].startswith("v2  ") and lines[1].endswith("0 session(s)")


async def test_funnel_versions_counts_a_session_once_across_edits(tmp_path: Path,
                                                                  db_url: str) -> None:
    """A session on v1, then an edit without a bump (v1.2): it runs the edit at its next
    turn, and is listed there only, not under the replaced v1 too."""
    v1 = make_v1(tmp_path)
    engine = await engine_on(v1, db_url, model(), [T0])
    try:
        await engine.handle("a", "Hi")
    finally:
        await engine.close()
    prompt = v1.parent / "prompts" / "greeting.j2"
    prompt.write_text(prompt.read_text("utf-8") + "Be brief.\n", "utf-8")
    deploy(v1, db_url)
    lines = cli("versions", str(v1), "--db", db_url).stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["v1", "v1.2"]
    assert lines[0].endswith("0 session(s)  (replaced)")
    assert "1 session(s)  (files edited" in lines[1]


async def test_a_patch_without_a_version_bump_reaches_the_sessions_of_that_version(
        tmp_path: Path, db_url: str, sql: Any) -> None:
    v1 = make_v1(tmp_path)
    rec, clock = model(), [T0]
    engine = await engine_on(v1, db_url, rec, clock)
    try:
        await engine.handle("a", "Hi")
        before = engine.loaded_versions()
        prompt = v1.parent / "prompts" / "discovery.j2"
        prompt.write_text(prompt.read_text("utf-8") + "PATCHED\n", "utf-8")
        await engine.deploy(load_funnel(v1))
        after = engine.loaded_versions()
        await engine.handle("a", "Still here")
    finally:
        await engine.close()
    assert set(before) == set(after) == {1} and before[1] != after[1]
    assert "PATCHED" in rec.prompts[-1]
    assert sql(f"SELECT version, hash FROM {ddl.VERSIONS} ORDER BY deployed_at") == [
        (1, before[1]), (1, after[1])]
