"""`funnel test`: the shipped scenario suites, failure reports (text, JUnit, GitHub), format
errors with their line, isolation from real sessions, and no litellm import."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import psycopg
import pytest
from conftest import CliResult, run_funnel

from engine.scenarios import discover, load_scenario
from engine.scenarios import run as scenario_run
from engine.store.connect import temporary_schema

ROOT = Path(__file__).resolve().parent.parent
BAD = "tests/scenarios_bad/failing.yaml"
SCHEMA_BAD = "tests/scenarios_bad/schema_error.yaml"
PASSING = "funnels/puramur/scenarios/complaint.yaml"


def funnel_test(*args: str, db: str | None = None) -> CliResult:
    return run_funnel("test", *args, *(["--db", db] if db is not None else []))


def marker_line(path: str, marker: str) -> int:
    """The 1-based line of ``path`` that carries the comment ``marker``."""
    lines = (ROOT / path).read_text("utf-8").splitlines()
    [number] = [i for i, line in enumerate(lines, start=1) if f"# {marker}" in line]
    return number


def bad_failures() -> list[str]:
    def at(marker: str, message: str) -> str:
        return (f"{BAD}:{marker_line(BAD, marker)}: FAIL deliberately-failing turn 2: "
                f"{message}")

    return [
        # The explanation: the exit towards the expected stage, and the values it read.
        at("FAIL-stage", 'expected stage "contact_collection", got "cart_building": '
           "`'confirm_cart' in actions and cart_item_count > 0` was false: "
           'actions=["add_to_cart"], cart_item_count=3'),
        at("FAIL-state", 'expected state cart.2.sku "PR251020", got "PR100999"'),
        at("FAIL-present", "expected state customer.phone present, got absent"),
        at("FAIL-regex", 'expected reply matching "^Done", got "Added."'),
        at("FAIL-refused", 'expected refused ["add_to_cart"], got []'),
        at("FAIL-notified", "expected notified true, got false"),
    ]


def test_shipped_suites_pass(db_url: str, server_dsn: str, sql: Any,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    files, missing = discover([ROOT / "funnels"])
    assert not missing
    assert len(files) >= 20
    assert {f.parent.name for f in files} >= {"scenarios", "malformed"}
    assert not any(f.name in ("demo.yaml", "catalog.yaml") for f in files)
    # The temporary schemas this run of `funnel test` makes (other tests, another xdist
    # worker's, make and drop their own meanwhile: only this run's are looked for).
    made: list[str] = []
    real = temporary_schema  # what engine.scenarios.run calls

    @contextlib.contextmanager
    def recording(url: str | None) -> Iterator[str]:
        with real(url) as schema_url:
            made.append(re.findall(r"search_path=(\w+)", schema_url)[-1])  # the last one is in force
            yield schema_url

    monkeypatch.setattr(scenario_run, "temporary_schema", recording)

    result = funnel_test("funnels/", db=db_url)

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == f"{len(files)} passed, 0 failed\n"
    assert result.stdout.splitlines()[-1] == f"{len(files)} passed, 0 failed"
    # Isolated: nothing in the schema the URL points at, the temporary schema is gone.
    assert sql("SELECT table_name FROM information_schema.tables "
               "WHERE table_schema = current_schema()") == []
    assert made and all(m.startswith("funnel_tmp_test_") for m in made)
    with psycopg.connect(server_dsn) as conn:
        left = conn.execute("SELECT schema_name FROM information_schema.schemata "
                            "WHERE schema_name = ANY(%s)", (made,)).fetchall()
    assert left == []


def test_failing_scenario_reports_file_line_expected_and_got(db_url: str) -> None:
    result = funnel_test(BAD, db=db_url)

    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines == [*bad_failures(), "0 passed, 1 failed"]
    assert "turn 3" not in result.stdout  # it stops at its first failing turn


def test_junit_report(db_url: str, tmp_path: Path) -> None:
    out = tmp_path / "report.xml"
    result = funnel_test(BAD, SCHEMA_BAD, PASSING, "--format", "junit", "--out", str(out),
                         db=db_url)

    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines()[-1] == "1 passed, 2 failed"
    root = ET.parse(out).getroot()
    [suite] = root.findall("testsuite")
    for element in (root, suite):
        assert element.get("tests") == "3"
        assert element.get("failures") == "1"
        assert element.get("errors") == "1"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert set(cases) == {"deliberately-failing", "schema-error", "complaint"}
    failure = cases["deliberately-failing"].find("failure")
    assert failure is not None and failure.text is not None
    assert failure.text.splitlines() == bad_failures()
    assert cases["deliberately-failing"].get("file") == BAD
    error = cases["schema-error"].find("error")
    assert error is not None and "unknown key 'stag'" in (error.text or "")
    assert list(cases["complaint"]) == []
    assert float(cases["complaint"].get("time") or "0") > 0


def test_junit_to_stdout(db_url: str) -> None:
    result = funnel_test(PASSING, "--format", "junit", db=db_url)

    assert result.returncode == 0, result.stderr
    root = ET.fromstring(result.stdout)
    assert root.get("tests") == "1" and root.get("failures") == "0"
    assert result.stderr.strip() == "1 passed, 0 failed"


def test_github_annotations(db_url: str) -> None:
    result = funnel_test(BAD, "--format", "github", db=db_url)

    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[-1] == "0 passed, 1 failed"
    assert len(lines) == 7
    stage = marker_line(BAD, "FAIL-stage")
    assert lines[0].startswith(
        f"::error file={BAD},line={stage},title=funnel test%3A deliberately-failing::"
        'deliberately-failing turn 2: expected stage "contact_collection", got "cart_building"'
        ": `'confirm_cart' in actions")
    assert all(line.startswith(f"::error file={BAD},line=") for line in lines[:-1])


def test_schema_error_reports_file_and_line(db_url: str) -> None:
    result = funnel_test(SCHEMA_BAD, db=db_url)

    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{SCHEMA_BAD}:{marker_line(SCHEMA_BAD, 'SCHEMA-unknown-key')}: ERROR schema-error: "
        "unknown key 'stag' in `turns.0.expect` (did you mean 'stage'?); expected one of: "
        "actions, claims, fallback, handoff, notified, prompt_contains, prompt_not_contains, refused, "
        "reply, reply_matches, stage, state, transitions",
        f"{SCHEMA_BAD}:{marker_line(SCHEMA_BAD, 'SCHEMA-duration')}: ERROR schema-error: "
        "`turns.1.after`: '7 hours' is not a duration (7h, 30m)",
        f"{SCHEMA_BAD}:{marker_line(SCHEMA_BAD, 'SCHEMA-llm')}: ERROR schema-error: "
        "`turns.1.llm`: give an output envelope with `reply`, a raw string (bad output), "
        "{output, repair} or {error}",
        "0 passed, 1 failed",
    ]


def test_names_checked_against_the_funnel(db_url: str, tmp_path: Path) -> None:
    scenario = tmp_path / "names.yaml"
    scenario.write_text(
        f"scenario: names\nfunnel: {ROOT / 'funnels' / 'puramur.yaml'}\n"
        "start:\n  stage: presentaton\n  pett: {type: cat}\n"
        "turns:\n  - customer: Hi\n    llm: {reply: Hello}\n    expect:\n"
        "      stage: dicovery\n      state: {cart_totl: 0}\n      actions: [add_to_kart]\n",
        "utf-8")

    result = funnel_test(str(scenario), db=db_url)

    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{scenario}:4: ERROR names: start.stage: funnel 'puramur' has no stage 'presentaton' "
        "(did you mean 'presentation'?)",
        f"{scenario}:5: ERROR names: start: 'pett' is not a state field of funnel 'puramur' "
        "(did you mean 'pet'?)",
        f"{scenario}:10: ERROR names: expect.stage: funnel 'puramur' has no stage 'dicovery' "
        "(did you mean 'discovery'?)",
        f"{scenario}:11: ERROR names: expect.state: 'cart_totl' is neither a state field nor an "
        "engine column of funnel 'puramur' (did you mean 'cart_total'?)",
        f"{scenario}:12: ERROR names: expect.actions: 'add_to_kart' is not an action of funnel "
        "'puramur' (did you mean 'add_to_cart'?)",
        "0 passed, 1 failed",
    ]


def test_a_typo_in_a_nested_expectation_is_an_error(tmp_path: Path) -> None:
    from engine.funnel.compiled import load_funnel
    from engine.scenarios.load import check_against

    scenario = tmp_path / "nested.yaml"
    scenario.write_text(
        f"scenario: nested\nfunnel: {ROOT / 'funnels' / 'puramur.yaml'}\n"
        "turns:\n  - customer: Hi\n    llm: {reply: Hello}\n    expect:\n"
        "      state:\n        pet.brede: absent\n        pet.breed: absent\n"
        "        cart.0.sku: PR251010\n        cart.0.skew: PR251010\n", "utf-8")
    loaded, problems = load_scenario(scenario)
    assert loaded is not None and problems == []
    found = [(f.line, f.message) for f in check_against(loaded, load_funnel(loaded.funnel))]
    # `cart` declares no item properties: any path under it may be meant.
    assert [line for line, _ in found] == [8], found
    assert "'pet.brede'" in found[0][1] and "did you mean 'breed'" in found[0][1]


def test_usage_errors(tmp_path: Path) -> None:
    missing = funnel_test("no/such/folder")
    assert missing.returncode == 2
    assert "no such file or folder: no/such/folder" in missing.stderr
    (tmp_path / "funnel.yaml").write_text("funnel: x\n", "utf-8")
    empty = funnel_test(str(tmp_path))
    assert empty.returncode == 2
    assert "no scenario files" in empty.stderr
    assert funnel_test(PASSING, "--format", "xml").returncode == 2


def test_loads_no_litellm_no_service_and_no_diagrams(db_url: str) -> None:
    code = ("import sys\nfrom engine.cli import main\n"
            f"rc = main(['test', {PASSING!r}, '--db', {db_url!r}])\n"
            "heavy = [m for m in sys.modules if m.startswith(('litellm', 'engine.service', "
            "'starlette', 'uvicorn', 'transitions.extensions.diagrams'))]\n"
            "print('heavy:', heavy)\nsys.exit(rc)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == ["1 passed, 0 failed", "heavy: []"]


def test_published_schema_matches_the_packaged_one() -> None:
    published = json.loads((ROOT / "schemas" / "scenario.schema.json").read_text("utf-8"))
    packaged = json.loads((ROOT / "engine" / "data" / "scenario.schema.json").read_text("utf-8"))
    assert published == packaged
    jsonschema.Draft202012Validator.check_schema(published)


def test_shipped_scenarios_load_cleanly() -> None:
    files, _ = discover([ROOT / "funnels"])
    for path in files:
        scenario, problems = load_scenario(path)
        assert scenario is not None and problems == [], problems
