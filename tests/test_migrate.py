"""`funnel migrate` on a real database: create, up to date, add, keep or drop, move stages.

The command runs as an operator runs it (``funnel migrate``, in-process: see
``conftest.run_funnel``); the funnel variants are copies of Puramur written to
``tmp_path`` with absolute prompts/schemas/catalog paths.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import CliResult, run_funnel

from engine import Engine, ScriptedModel
from engine.errors import SchemaOutdated
from engine.funnel.compiled import load_funnel
from engine.store import ddl, functions

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
TABLE = "puramur_sessions_state"
NEW_INDEX = "idx_sessions_loyalty"

Edit = Callable[[dict[str, Any]], None]


def migrate(funnel: Path, db_url: str, *options: str) -> CliResult:
    return run_funnel("migrate", str(funnel), "--db", db_url, *options, env={"FUNNEL_DB": None})


def variant(tmp_path: Path, name: str, *edits: Edit) -> Path:
    """A copy of Puramur with ``edits`` applied, written to ``tmp_path/<name>.yaml``."""
    data = yaml.safe_load(PURAMUR.read_text("utf-8"))
    for key in ("prompts", "schemas", "catalog"):
        if key in data:  # Puramur derives its contracts: no schemas folder
            data[key] = str((PURAMUR.parent / data[key]).resolve())
    data.pop("knowledge")  # a funnel reads knowledge only from its own folder
    for stage in data["stages"].values():
        stage.pop("knowledge", None)
    for edit in edits:
        edit(data)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), "utf-8")
    load_funnel(path)  # the variant is a valid funnel
    return path


def add_loyalty(data: dict[str, Any]) -> None:
    data["version"] = 2
    data["state"]["loyalty_tier"] = {"type": "string", "default": "bronze"}
    data["indexes"].append({"name": NEW_INDEX, "column": "loyalty_tier"})


def drop_objection_stage(data: dict[str, Any]) -> None:
    data["version"] = 3
    del data["stages"]["objection_handling"]
    presentation = data["stages"]["presentation"]
    presentation["transitions"] = [t for t in presentation["transitions"]
                                   if t["to"] != "objection_handling"]


def columns(sql: Any) -> list[str]:
    return [r[0] for r in sql("SELECT column_name FROM information_schema.columns WHERE "
                              "table_schema = current_schema() AND table_name = %s "
                              "ORDER BY ordinal_position", (TABLE,))]


def indexes(sql: Any) -> set[str]:
    return {r[0] for r in sql("SELECT indexname FROM pg_indexes WHERE schemaname = "
                              "current_schema() AND tablename = %s", (TABLE,))}


def recorded(sql: Any) -> list[tuple[Any, ...]]:
    return sql(f"SELECT funnel, version, description FROM {ddl.MIGRATIONS} ORDER BY 1, 2")


def schema_objects(sql: Any) -> list[tuple[Any, ...]]:
    return sql("SELECT relname, relkind FROM pg_class WHERE relnamespace = "
               "current_schema()::regnamespace ORDER BY 1")


def snapshot(sql: Any) -> list[Any]:
    """Everything `migrate --check` must leave alone."""
    return [schema_objects(sql), columns(sql), recorded(sql),
            sql(f"SELECT * FROM {TABLE} ORDER BY session_id")]


async def a_turn(funnel: Path, db_url: str, session_id: str) -> dict[str, Any]:
    """One customer message through the engine; returns the session's state."""
    model = ScriptedModel.from_data({"default": {"reply": "Hello! Cat or dog?"}})
    engine = await Engine.open(funnel, db=db_url, model=model)
    try:
        await engine.handle(session_id, "Hi")
        state = await engine.state(session_id)
    finally:
        await engine.close()
    assert state is not None
    return state


# -- create, then nothing to do -----------------------------------------------------------
def test_migrate_creates_the_table_then_is_up_to_date(db_url: str, sql: Any) -> None:
    first = migrate(PURAMUR, db_url)
    assert first.returncode == 0, first.stderr
    assert f"create table {TABLE}" in first.stdout
    assert columns(sql) == [name for name, _ in ddl.column_defs(load_funnel(PURAMUR).spec)]
    assert {"idx_sessions_stage", "idx_sessions_last_msg", "idx_sessions_handoff"} <= indexes(sql)
    rows = recorded(sql)
    assert (TABLE, 1, f"v1: create table {TABLE}") in rows

    again = migrate(PURAMUR, db_url)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"table {TABLE} is up to date"
    assert recorded(sql) == rows


def test_migrate_check_on_an_empty_database_changes_nothing(db_url: str, sql: Any) -> None:
    done = migrate(PURAMUR, db_url, "--check")
    assert done.returncode == 1, done.stderr
    assert f"would create table {TABLE}" in done.stdout
    assert schema_objects(sql) == []  # not even the shared tables


# -- a new field and a new index -----------------------------------------------------------
async def test_a_new_field_and_index(tmp_path: Path, db_url: str, sql: Any) -> None:
    assert migrate(PURAMUR, db_url).returncode == 0
    await a_turn(PURAMUR, db_url, "before-v2")
    sql(f"INSERT INTO {TABLE} (session_id) VALUES ('plain-sql')")
    v2 = variant(tmp_path, "loyalty", add_loyalty)

    # the engine refuses a table that is behind the funnel
    with pytest.raises(SchemaOutdated) as info:
        await Engine.open(v2, db=db_url, model=ScriptedModel.from_data({"default": {
            "reply": "x"}}))
    assert "funnel migrate" in str(info.value) and "loyalty_tier" in str(info.value)

    before = snapshot(sql)
    check = migrate(v2, db_url, "--check")
    assert check.returncode == 1, check.stderr
    assert "would add column loyalty_tier" in check.stdout
    assert f"would create index {NEW_INDEX}" in check.stdout
    assert snapshot(sql) == before  # --check changes nothing

    done = migrate(v2, db_url)
    assert done.returncode == 0, done.stderr
    assert "add column loyalty_tier" in done.stdout and f"create index {NEW_INDEX}" in done.stdout
    assert "loyalty_tier" in columns(sql) and NEW_INDEX in indexes(sql)
    assert sql(f"SELECT session_id, loyalty_tier FROM {TABLE} ORDER BY 1") == [
        ("before-v2", "bronze"), ("plain-sql", "bronze")]  # existing rows get the default
    [(nullable, default)] = sql("SELECT is_nullable, column_default FROM information_schema."
                                "columns WHERE table_schema = current_schema() AND "
                                "table_name = %s AND column_name = 'loyalty_tier'", (TABLE,))
    assert nullable == "NO" and "bronze" in default
    descriptions = [d for f, _, d in recorded(sql) if f == TABLE]
    assert "v2: add column loyalty_tier" in descriptions
    assert f"v2: create index {NEW_INDEX}" in descriptions
    versions = [v for f, v, _ in recorded(sql) if f == TABLE]
    assert versions == list(range(1, len(versions) + 1))

    again = migrate(v2, db_url)
    assert again.returncode == 0 and "is up to date" in again.stdout
    state = await a_turn(v2, db_url, "after-v2")  # the engine runs on the migrated table
    assert state["loyalty_tier"] == "bronze"
    assert (await a_turn(v2, db_url, "before-v2"))["turns"] == 2


# -- a removed field ----------------------------------------------------------------------
async def test_a_removed_field_is_kept_unless_dropped(tmp_path: Path, db_url: str,
                                                      sql: Any) -> None:
    v2 = variant(tmp_path, "loyalty", add_loyalty)
    assert migrate(v2, db_url).returncode == 0
    await a_turn(v2, db_url, "s1")
    rows = recorded(sql)

    kept = migrate(PURAMUR, db_url)  # the original funnel no longer declares the field
    assert kept.returncode == 0, kept.stderr
    assert "column loyalty_tier is no longer declared; kept (use --drop to remove it)" in \
        kept.stdout
    assert "loyalty_tier" in columns(sql) and recorded(sql) == rows
    assert sql(f"SELECT loyalty_tier FROM {TABLE}") == [("bronze",)]
    state = await a_turn(PURAMUR, db_url, "s2")  # an extra column does not stop the engine
    assert state["stage"] == "discovery" and state["loyalty_tier"] == "bronze"  # its default

    before = snapshot(sql)
    check = migrate(PURAMUR, db_url, "--drop", "--check")
    assert check.returncode == 1 and "would drop column loyalty_tier" in check.stdout
    assert snapshot(sql) == before

    dropped = migrate(PURAMUR, db_url, "--drop")
    assert dropped.returncode == 0, dropped.stderr
    assert "drop column loyalty_tier" in dropped.stdout
    assert "loyalty_tier" not in columns(sql) and NEW_INDEX not in indexes(sql)
    assert "v1: drop column loyalty_tier" in [d for f, _, d in recorded(sql) if f == TABLE]
    assert sql(f"SELECT session_id FROM {TABLE} ORDER BY 1") == [("s1",), ("s2",)]
    assert migrate(PURAMUR, db_url).stdout.strip() == f"table {TABLE} is up to date"


# -- a removed stage ----------------------------------------------------------------------
async def test_sessions_in_a_removed_stage(tmp_path: Path, db_url: str, sql: Any) -> None:
    assert migrate(PURAMUR, db_url).returncode == 0
    await a_turn(PURAMUR, db_url, "moving-on")  # now in discovery
    sql(f"INSERT INTO {TABLE} (session_id, stage, stage_iteration) VALUES "
        "('doubts-1', 'objection_handling', 2), ('doubts-2', 'objection_handling', 1)")
    stages = f"SELECT session_id, stage, stage_iteration, row_version FROM {TABLE} ORDER BY 1"
    assert sql(stages) == [("doubts-1", "objection_handling", 2, 1),
                           ("doubts-2", "objection_handling", 1, 1),
                           ("moving-on", "discovery", 0, 1)]

    gone = variant(tmp_path, "no-objections", drop_objection_stage)
    before = snapshot(sql)
    check = migrate(gone, db_url, "--check")
    assert check.returncode == 1, check.stderr
    assert "objection_handling" in check.stdout and "2 session(s)" in check.stdout
    assert "removed_stages" in check.stdout
    assert snapshot(sql) == before

    refused = migrate(gone, db_url)
    assert refused.returncode == 1
    assert "error: 2 session(s) sit in stage 'objection_handling'" in refused.stdout
    assert sql(stages) == [("doubts-1", "objection_handling", 2, 1),
                           ("doubts-2", "objection_handling", 1, 1),
                           ("moving-on", "discovery", 0, 1)]  # nobody was moved

    def declare(data: dict[str, Any]) -> None:
        data["removed_stages"] = {"objection_handling": "presentation"}
        # Moved now: pinned (the default), these v1 sessions would stay on v1 until they
        # end, and move then (tests/test_versions.py).
        data["pin"] = False

    mapped = variant(tmp_path, "mapped", drop_objection_stage, declare)
    before = snapshot(sql)
    check = migrate(mapped, db_url, "--check")
    assert check.returncode == 1
    assert "2 session(s) in removed stage 'objection_handling' will move to 'presentation'" in \
        check.stdout
    assert snapshot(sql) == before

    moved = migrate(mapped, db_url)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert "2 session(s) in removed stage 'objection_handling' moved to 'presentation'" in \
        moved.stdout
    assert sql(stages) == [("doubts-1", "presentation", 0, 2), ("doubts-2", "presentation", 0, 2),
                           ("moving-on", "discovery", 0, 1)]
    # The move is in their history, so the seed's queries see them in presentation.
    assert [h["stage"] for h in sql(f"SELECT stage_history FROM {TABLE} WHERE session_id = "
                                     "'doubts-1'")[0][0]] == ["presentation"]
    after = migrate(mapped, db_url)
    assert after.returncode == 0 and "is up to date" in after.stdout


# -- the turn function ---------------------------------------------------------------------
def turn_function(sql: Any) -> list[tuple[Any, ...]]:
    return sql("SELECT p.proname, obj_description(p.oid, 'pg_proc') FROM pg_proc p WHERE "
               "p.pronamespace = current_schema()::regnamespace AND p.proname = %s",
               (functions.begin_function_name(TABLE),))


async def test_the_turn_function_is_made_with_the_table_and_remade_when_it_changes(
        db_url: str, sql: Any) -> None:
    done = migrate(PURAMUR, db_url)
    assert done.returncode == 0, done.stderr
    name, _, comment = functions.begin_function(load_funnel(PURAMUR).spec)
    assert f"create function {name}" in done.stdout
    assert turn_function(sql) == [(name, comment)]
    assert recorded(sql) == [r for r in recorded(sql) if "function" not in r[2]]  # derived

    # a table made by an older engine (no function), or an older function: the engine
    # makes the one it needs when it opens, and its turns run
    sql(f"DROP FUNCTION {name}")
    assert (await a_turn(PURAMUR, db_url, "no-function"))["turns"] == 1
    assert turn_function(sql) == [(name, comment)]
    sql(f"COMMENT ON FUNCTION {name} IS 'funnel turn function 0000'")
    check = migrate(PURAMUR, db_url, "--check")
    assert check.returncode == 1 and f"would replace function {name}" in check.stdout
    assert turn_function(sql) == [(name, "funnel turn function 0000")]  # --check: untouched
    assert (await a_turn(PURAMUR, db_url, "old-function"))["turns"] == 1
    assert turn_function(sql) == [(name, comment)]


def test_a_long_table_name_gets_a_short_function_name() -> None:
    long_a, long_b = "t" * 60 + "_a", "t" * 60 + "_b"
    a, b = functions.begin_function_name(long_a), functions.begin_function_name(long_b)
    assert a != b and len(a.encode()) <= 63 and len(b.encode()) <= 63
    assert functions.begin_function_name("short") == "funnel_turn_short"
