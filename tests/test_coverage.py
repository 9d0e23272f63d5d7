"""`funnel test --coverage`, `funnel report --coverage`, `funnel snapshot` and `funnel test
--snapshots` (docs/evidence.md, "Coverage" and "Snapshots"), on a copy of Puramur with
its scenarios and snapshots: the repository's funnels are never edited here."""

from __future__ import annotations

import asyncio
import json
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

import pytest
from conftest import ROOT, run_funnel
from projects import copy_puramur

from engine.funnel.compiled import load_funnel
from engine.scenarios.command import funnel_folder
from engine.scenarios.command import write_reports as write_report
from engine.scenarios.coverage import Item, measure, percentages
from engine.scenarios.coverage_report import FunnelCoverage, as_json, text
from engine.scenarios.fixtures import load_fixtures
from engine.scenarios.load import discover, load_scenario
from engine.scenarios.run import Runner, ScenarioResult, run_all
from engine.scenarios.snapshot import cause, compare, entries, render_stage, write
from engine.scenarios.snapshot_command import check
from engine.store import open_store
from engine.store.connect import temporary_schema


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of Puramur with its scenarios and committed snapshots; returns its funnel."""
    funnel = copy_puramur(tmp_path_factory.mktemp("cover"))
    for part in ("scenarios", "snapshots"):
        shutil.copytree(ROOT / "funnels" / "puramur" / part, funnel.with_suffix("") / part)
    return funnel


@pytest.fixture(scope="module")
def played(project: Path, server_dsn: str) -> list[ScenarioResult]:
    """Every scenario of the copy, played once for the module."""
    files, _ = discover([project.with_suffix("")])
    return run_all([(f, *load_scenario(f)) for f in files], server_dsn)


def scenario(project: Path, name: str) -> str:
    return str(project.with_suffix("") / "scenarios" / name)


def exit_line(funnel: Path, stage: str, to: str) -> int:
    """The line of ``- to: <to>`` among ``stage``'s transitions."""
    lines = funnel.read_text("utf-8").splitlines()
    start = lines.index(f"  {stage}:")
    return next(i for i, line in enumerate(lines[start:], start=start + 1)
                if line.strip() == f"- to: {to}")


def covered(results: Iterable[ScenarioResult], *leave_out: str) -> list[Item]:
    kept = [r for r in results if Path(r.file).name not in leave_out]
    funnel = kept[0].funnel
    assert funnel is not None
    return measure(funnel, [o for r in kept for o in r.observed])


def find(items: list[Item], label: str) -> Item:
    [item] = [i for i in items if i.label == label]
    return item


def test_an_untaken_exit_is_reported_with_its_line_and_fails_under(
        project: Path, server_dsn: str, tmp_path: Path) -> None:
    line = exit_line(project, "objection_handling", "presentation")
    out = tmp_path / "coverage.github"
    result = run_funnel("test", scenario(project, "objections.yaml"), "--coverage",
                        "--fail-under", "exits=100", "--format", "github", "--out", str(out),
                        "--db", server_dsn)

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"    {project}:{line}: exit objection_handling -> presentation never held" \
        in result.stdout.splitlines()  # the text report on stdout
    assert "1 passed, 0 failed" in result.stdout  # the scenario passed; coverage failed
    github = out.read_text("utf-8").splitlines()
    assert (f"::warning file={project},line={line},title=funnel coverage::exit "
            "objection_handling -> presentation never held") in github
    assert any(a.startswith(f"::error file={project},title=funnel coverage::puramur: exits "
                            "coverage ") and a.endswith("is below --fail-under exits=100")
               for a in github)


def test_a_scenario_that_takes_the_exit_covers_it(played: list[ScenarioResult], project: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # `funnel test FUNNEL.yaml` plays the scenarios of the funnel's folder.
    assert funnel_folder(str(project)) == str(project.with_suffix(""))
    assert funnel_folder(scenario(project, "alternative.yaml")).endswith("alternative.yaml")
    [alternative] = [r for r in played if r.file.endswith("alternative.yaml")]
    funnel = alternative.funnel
    assert funnel is not None
    alone = as_json([FunnelCoverage("puramur", "f", measure(funnel, alternative.observed))])
    taken = [i for i in alone["funnels"][0]["items"]
             if i["name"] == "objection_handling -> presentation"]
    # Held on turn 2; not held on turn 1, when the session entered objection handling.
    assert {i["outcome"]: i["hits"] for i in taken} == {"held": 1, "not held": 1}

    # `--format json`: the scenarios and the coverage in one document.
    report = FunnelCoverage("puramur", "f", covered(played))
    write_report("json", None, played, [report], [], {}, False)
    document = json.loads(capsys.readouterr().out)
    assert document["tests"]["failed"] == 0 and document["tests"]["passed"] == len(played)
    assert document["coverage"]["funnels"][0]["categories"]["exits"] == {
        "covered": 19, "total": 19, "percent": 100.0}

    # Over the whole suite every exit holds and fails to hold somewhere: exits=100 passes.
    assert find(covered(played), "objection_handling -> presentation: held").hits == 1
    assert percentages(covered(played))["exits"][2] == 100.0
    assert find(covered(played, "alternative.yaml"),
                "objection_handling -> presentation: held").hits == 0


def test_removing_the_objection_scenario_reports_what_only_it_exercised(
        played: list[ScenarioResult]) -> None:
    full, without = covered(played), covered(played, "objections.yaml")
    lost = {a.label for a, b in zip(full, without, strict=True) if a.hits and not b.hits}

    # Its exits are all taken by other scenarios too (happy_path, alternative and the
    # malformed objection_handling one evaluate them); its cap and actions are its own.
    assert lost == {"objection_handling: reached 3", "objection_handling: record_objection: "
                    "accepted", "objection_handling: request_handoff: accepted"}
    report = FunnelCoverage("puramur", "funnels/puramur.yaml", without)
    shown = text([report])
    line = find(without, "objection_handling: reached 3").line
    assert f"funnels/puramur.yaml:{line}: iteration cap of stage objection_handling (3 turns) " \
        "never reached" in shown


def test_coverage_junit_and_a_bad_fail_under_name(project: Path, server_dsn: str) -> None:
    result = run_funnel("test", scenario(project, "complaint.yaml"), "--coverage", "--format",
                        "junit", "--db", server_dsn)
    root = ET.fromstring(result.stdout)
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert set(suites) == {"funnel test", "funnel coverage: puramur"}
    assert int(suites["funnel coverage: puramur"].get("skipped") or 0) > 0

    bad = run_funnel("test", scenario(project, "complaint.yaml"), "--fail-under", "exitz=100")
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.splitlines() == [bad.stderr.strip()]
    assert "unknown name 'exitz' (did you mean 'exits'?)" in bad.stderr


def test_the_committed_snapshots_match(played: list[ScenarioResult], project: Path) -> None:
    differences, files = check(played)
    assert [d.diff for d in differences] == []
    assert files == {"puramur": 7}
    funnel = played[0].funnel
    assert funnel is not None
    found = entries(funnel, played)
    assert compare(funnel, found) == []  # every source ran: nothing stored is left over

    stale = project.with_suffix("") / "snapshots" / "quotation.txt"  # a stage since removed
    stale.write_text("# gone\n", "utf-8")
    assert [(d.stage, d.status) for d in compare(funnel, found)] == [("quotation", "stale")]
    assert write(funnel, found) == [str(stale)]  # --update removes it, changes nothing else
    assert not stale.exists() and compare(funnel, found) == []

    # A contract change is put on the stage's line in the funnel file.
    now = render_stage(funnel, "greeting", found)
    before = now.replace('"maxLength": 1500', '"maxLength": 1400')
    assert before != now
    stage_line = project.read_text("utf-8").splitlines().index("  greeting:") + 1
    assert cause(funnel, "greeting", before, now) == (str(project), stage_line)


def test_a_whitespace_change_in_a_template_fails_with_a_diff(project: Path,
                                                            server_dsn: str) -> None:
    args = ("test", scenario(project, "change_mind.yaml"), "--snapshots", "--db", server_dsn)
    template = project.parent.parent / "prompts" / "puramur" / "cart_building.j2"
    original = template.read_text("utf-8")
    lines = original.splitlines()
    line = next(i for i, text in enumerate(lines, start=1) if text.startswith("Total: "))
    template.write_text(original.replace("Total: {{", "Total:  {{"), "utf-8")
    try:
        changed = run_funnel(*args, "--format", "github")
    finally:
        template.write_text(original, "utf-8")

    assert changed.returncode == 1
    out = changed.stdout.splitlines()
    assert f"::error file={template},line={line},title=funnel snapshot::the prompt or " \
        "contract of stage cart_building changed (changed); see " \
        f"{project.with_suffix('') / 'snapshots' / 'cart_building.txt'}" in out
    assert "-Total: 277 UAH." in out and "+Total:  277 UAH." in out
    assert "snapshots: 1 of 7 stage file(s) differ" in out


def test_a_fixtures_file_renders_its_state_and_a_mismatch_is_rc_2(
        project: Path, server_dsn: str) -> None:
    path = project.with_suffix("") / "snapshots" / "fixtures.yaml"
    path.write_text("fixtures:\n"
                    "  - name: cart_near_gift\n"
                    "    stage: cart_building\n"
                    "    state:\n"
                    "      cart: [{sku: PR251010, qty: 3}]\n"
                    "      colour: red\n", "utf-8")
    try:
        bad = run_funnel("snapshot", str(project))
        path.write_text(path.read_text("utf-8").replace("      colour: red\n", ""), "utf-8")
        funnel = load_funnel(project)
        fixtures = load_fixtures(path, funnel)
    finally:
        path.unlink()
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1
    assert bad.stderr.startswith(f"funnel snapshot: error: {path}:6: fixture 'cart_near_gift': "
                                 "state: 'colour' is not a state field of funnel 'puramur'")

    results = run_all([(path, s, []) for s in fixtures], server_dsn)
    [entry] = entries(funnel, results)
    assert (entry.stage, entry.label) == ("cart_building", "snapshots/fixtures.yaml "
                                          "cart_near_gift")
    assert "- PR251010 Exotic Spa shampoo x3 = 831 UAH" in entry.text


def test_report_coverage_names_what_traffic_took_that_no_scenario_does(
        project: Path, server_dsn: str) -> None:
    async def record(url: str) -> None:
        store = await open_store(url)
        try:
            played, problems = load_scenario(Path(scenario(project, "alternative.yaml")))
            assert played is not None and not problems
            assert (await Runner(store, "real").run(played)).passed
        finally:
            await store.close()

    with temporary_schema(server_dsn, "t") as url:
        empty = run_funnel("report", str(project), "--coverage", "--db", url)
        asyncio.run(record(url))
        result = run_funnel("report", str(project), "--coverage", "--since", "3650d", "--db",
                            url, "--scenarios", scenario(project, "objections.yaml"),
                            "--format", "json")
    assert empty.returncode == 2 and empty.stderr.count("\n") == 1
    assert "no turn records of funnel 'puramur'" in empty.stderr

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    # Three turn records: the scenario's `start:` seed, then its two turns.
    assert (report["sessions"], report["turns"], report["scenarios"]) == (1, 3, 1)
    only = {i["message"] for i in report["traffic_only"]}
    assert "exit objection_handling -> presentation held" in only
    assert "exit presentation -> objection_handling held" not in only  # objections takes it
