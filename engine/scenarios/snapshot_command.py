"""`funnel snapshot FUNNEL [--update]` and the snapshot part of `funnel test --snapshots`:
play the funnel's fixture states, compare or store the snapshots, report the differences
(text with unified diffs, GitHub annotations on the template line that caused them,
JSON, a JUnit suite)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError
from ..funnel.compiled import CompiledFunnel, load_funnel
from . import snapshot as snap
from .coverage_report import data, prop, shown_path
from .fixtures import fixtures_file, load_fixtures
from .load import discover, load_scenario
from .run import LoadedScenario, ScenarioResult, run_all


def fixture_scenarios(funnels: Sequence[CompiledFunnel]) -> list[LoadedScenario]:
    """The declared fixtures of each funnel, as scenarios to play.

    Raises:
        ConfigError: a fixtures file that does not match its funnel.
    """
    out: list[LoadedScenario] = []
    for funnel in funnels:
        path = fixtures_file(funnel)
        if path is not None:
            out += [(path, s, []) for s in load_fixtures(path, funnel)]
    return out


def check(results: Sequence[ScenarioResult]) -> tuple[list[snap.Difference], dict[str, int]]:
    """Compare each funnel's snapshots with what its played sources render now; return
    the differences and the number of stage files by funnel."""
    funnels: dict[str, CompiledFunnel] = {}
    for r in results:
        if r.funnel is not None:
            funnels.setdefault(str(r.funnel.spec.path.resolve()), r.funnel)
    out: list[snap.Difference] = []
    for key in sorted(funnels):
        funnel = funnels[key]
        mine = [r for r in results if r.funnel is funnel]
        played = {snap.source_of(funnel, r.file) for r in mine}
        out += snap.compare(funnel, snap.entries(funnel, mine), played)
    return out, {f.spec.name: len(f.spec.stages) for f in funnels.values()}


def text(differences: Sequence[snap.Difference], files: dict[str, int]) -> str:
    lines = []
    for d in differences:
        where = f" (from {d.cause[0]}:{d.cause[1]})" if d.cause else ""
        what = {"changed": "differs from what the funnel renders now",
                "missing": "is not stored yet",
                "stale": "is of a stage the funnel no longer has"}[d.status]
        lines.append(f"{d.file}: snapshot of stage {d.stage} {what}{where}")
        if d.diff:
            lines.append(d.diff.rstrip("\n"))
    if differences:
        lines.append("run `funnel snapshot FUNNEL --update` when the change is intended, and "
                     "commit the snapshots")
    lines.append(snap.summary(differences, files))
    return "\n".join(lines) + "\n"


def github(differences: Sequence[snap.Difference], files: dict[str, int]) -> str:
    """An ``::error`` per differing stage, on the template line that caused it when known
    (else on the snapshot file), then the diffs and the summary."""
    lines = []
    for d in differences:
        file, line = d.cause or (d.file, 1)
        what = f"the prompt or contract of stage {d.stage} changed ({d.status}); see {d.file}"
        lines.append(f"::error file={prop(file)},line={line},title=funnel snapshot::"
                     f"{data(what)}")
    return "\n".join(lines) + ("\n" if lines else "") + text(differences, files)


def as_json(differences: Sequence[snap.Difference], files: dict[str, int]) -> dict[str, Any]:
    return {"stage_files": files, "differences": [
        {"file": d.file, "stage": d.stage, "status": d.status, "diff": d.diff,
         "cause": {"file": d.cause[0], "line": d.cause[1]} if d.cause else None}
        for d in differences]}


def junit_suite(differences: Sequence[snap.Difference], files: dict[str, int]) -> ET.Element:
    total = sum(files.values())
    suite = ET.Element("testsuite", {"name": "funnel snapshots", "tests": str(total),
                                     "failures": str(len(differences)), "errors": "0",
                                     "skipped": "0", "time": "0"})
    for d in differences:
        case = ET.SubElement(suite, "testcase", {"classname": "snapshots", "name": d.file})
        ET.SubElement(case, "failure", {"message": f"snapshot of stage {d.stage} {d.status}",
                                        "type": "SnapshotDiffers"}).text = d.diff
    return suite


def run_snapshot(funnel_path: str, db: str | None, update: bool, fmt: str) -> int:
    """`funnel snapshot`: 0 the snapshots match (or were written), 1 they differ, 2 usage."""
    try:
        funnel = load_funnel(funnel_path)
        files, _ = discover([funnel.spec.path.with_suffix("")])
        loaded: list[LoadedScenario] = []
        for f in files:
            scenario, problems = load_scenario(f)
            if scenario is not None and scenario.funnel.resolve() == funnel.spec.path.resolve():
                loaded.append((f, scenario, problems))
        loaded += fixture_scenarios([funnel])
    except (ConfigError, OSError) as exc:
        print(f"funnel snapshot: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    results = run_all(loaded, db) if loaded else []
    for r in (r for r in results if not r.passed):
        print(f"funnel snapshot: note: {r.failures[0].format()} (its later turns are not in "
              "the snapshots)", file=sys.stderr)
    entries = snap.entries(funnel, results)
    if update:
        written = snap.write(funnel, entries)
        print(f"funnel snapshot: {len(written)} file(s) written or removed in "
              f"{shown_path(snap.folder(funnel))}" if written
              else "funnel snapshot: the snapshots are up to date")
        return 0
    differences = snap.compare(funnel, entries)
    missing = [d for d in differences if d.status == "missing"]
    if missing:  # a first snapshot is stored, not reported
        snap.write(funnel, entries, only={d.stage for d in missing})
        differences = [d for d in differences if d.status != "missing"]
        print(f"funnel snapshot: {len(missing)} new file(s) written in "
              f"{shown_path(snap.folder(funnel))}", file=sys.stderr)
    files_count = {funnel.spec.name: len(funnel.spec.stages)}
    sys.stdout.write({"json": lambda: json.dumps(as_json(differences, files_count), indent=2,
                                                 sort_keys=True) + "\n",
                      "github": lambda: github(differences, files_count)}.get(
        fmt, lambda: text(differences, files_count))())
    return 1 if differences else 0
