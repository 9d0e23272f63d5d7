"""`funnel test`: find the scenario files, play them, write the report; with
``--coverage`` what they exercised of each funnel (engine.scenarios.coverage), with
``--snapshots`` whether the prompts and contracts are still the stored ones
(engine.scenarios.snapshot)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, FunnelError
from ..format import _yaml
from ..funnel.compiled import CompiledFunnel, load_funnel
from . import coverage_report as cov
from . import snapshot_command as snap
from .coverage import measure, parse_thresholds
from .load import discover, is_scenario, load_scenario
from .report import github, junit, summary, text
from .run import LoadedScenario, ScenarioResult, run_all


def run_command(paths: Sequence[str], db: str | None, fmt: str, out: str | None, *,
                coverage: bool = False, fail_under: str | None = None,
                snapshots: bool = False) -> int:
    """`funnel test`: run the scenarios under ``paths``; 0 all passed, 1 a failure (or
    coverage below ``fail_under``, or a snapshot that differs), 2 usage."""
    try:
        thresholds = parse_thresholds(fail_under)
    except ValueError as exc:
        print(f"funnel test: error: {exc}", file=sys.stderr)
        return 2
    coverage = coverage or bool(thresholds)
    files, missing = discover([funnel_folder(p) for p in paths])
    if missing:
        print(f"funnel test: error: no such file or folder: {', '.join(missing)}",
              file=sys.stderr)
        return 2
    if not files:
        print(f"funnel test: error: no scenario files in {', '.join(paths)} (YAML files with a "
              "top-level `scenario:` key)", file=sys.stderr)
        return 2
    loaded: list[LoadedScenario] = [(f, *load_scenario(f)) for f in files]
    fixtures: set[str] = set()
    if snapshots:
        try:
            extra = snap.fixture_scenarios(_funnels(loaded))
        except (ConfigError, OSError) as exc:
            print(f"funnel test: error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 2
        fixtures = {str(path) for path, _, _ in extra}
        loaded += extra
    ran = run_all(loaded, db)
    results = [r for r in ran if r.file not in fixtures or not r.passed]
    report = [_coverage(f, rs) for f, rs in _by_funnel(results).items()] if coverage else []
    below = cov.judge(report, thresholds)
    differences, stage_files = snap.check(ran) if snapshots else ([], {})
    write_reports(fmt, out, results, report, differences, stage_files, snapshots)
    failed = any(not r.passed for r in results) or below or differences
    return 1 if failed else 0


def funnel_folder(path: str) -> str:
    """A named funnel file stands for its folder (``funnels/puramur.yaml`` ->
    ``funnels/puramur``), where its scenarios live."""
    p = Path(path)
    if p.is_file() and p.suffix in (".yaml", ".yml") and p.with_suffix("").is_dir():
        try:
            data = _yaml.load(p.read_text("utf-8")).data
        except (OSError, UnicodeDecodeError, _yaml.YamlSyntaxError):
            return path
        if isinstance(data, dict) and "stages" in data and not is_scenario(
                p.read_text("utf-8")):
            return str(p.with_suffix(""))
    return path


def _funnels(loaded: Sequence[LoadedScenario]) -> list[CompiledFunnel]:
    paths = sorted({s.funnel.resolve() for _, s, _ in loaded if s is not None})
    out = []
    for p in paths:
        try:
            out.append(load_funnel(p))
        except FunnelError:  # the scenarios report it, each with its line
            continue
    return out


def _by_funnel(results: Sequence[ScenarioResult]) -> dict[Path, list[ScenarioResult]]:
    out: dict[Path, list[ScenarioResult]] = {}
    for r in results:
        if r.funnel is not None:
            out.setdefault(r.funnel.spec.path.resolve(), []).append(r)
    return out


def _coverage(_path: Path, results: Sequence[ScenarioResult]) -> cov.FunnelCoverage:
    funnel = results[0].funnel
    assert funnel is not None
    found = measure(funnel, [o for r in results for o in r.observed])
    return cov.FunnelCoverage(funnel.spec.name, cov.shown_path(funnel.spec.path), found,
                              sessions=len(results), turns=sum(len(r.observed) for r in results))


def write_reports(fmt: str, out: str | None, results: Sequence[ScenarioResult],
           report: Sequence[cov.FunnelCoverage], differences: Sequence[Any],
           stage_files: dict[str, int], snapshots: bool) -> None:
    """Without ``out`` the report goes to stdout (JUnit's summary to stderr); with it, the
    report goes to the file and stdout gets the text report."""
    parts = {
        "text": lambda: text(results) + (cov.text(report) if report else "")
        + (snap.text(differences, stage_files) if snapshots else ""),
        "github": lambda: github(results) + (cov.github(report) if report else "")
        + (snap.github(differences, stage_files) if snapshots else ""),
        "junit": lambda: junit(results, [*cov.junit_suites(report),
                                         *([snap.junit_suite(differences, stage_files)]
                                           if snapshots else [])]),
        "json": lambda: json.dumps({
            "tests": _tests_json(results),
            **({"coverage": cov.as_json(report)} if report else {}),
            **({"snapshots": snap.as_json(differences, stage_files)} if snapshots else {})},
            indent=2, sort_keys=True, ensure_ascii=False) + "\n",
    }
    document = parts[fmt]()
    if out:
        Path(out).write_text(document, "utf-8")
        sys.stdout.write(parts["text"]())
        return
    sys.stdout.write(document)
    if fmt == "junit":
        print(summary(results), file=sys.stderr)


def _tests_json(results: Sequence[ScenarioResult]) -> dict[str, Any]:
    return {"passed": sum(r.passed for r in results),
            "failed": sum(not r.passed for r in results),
            "scenarios": [{"file": r.file, "name": r.name, "line": r.line, "passed": r.passed,
                           "turns": r.turns,
                           "failures": [{"file": f.file, "line": f.line, "turn": f.turn,
                                         "message": f.message, "kind": f.kind}
                                        for f in r.failures]} for r in results]}


__all__ = ["funnel_folder", "run_command"]
