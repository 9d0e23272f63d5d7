"""`funnel report FUNNEL --coverage`: the coverage of the declared machine by real
sessions (their turn records), beside the coverage by the funnel's scenarios; what real
traffic exercised that no scenario does is the list of scenarios to write next."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..funnel.compiled import CompiledFunnel, load_funnel
from ..store.turn_scan import scan_turns
from .coverage import CATEGORIES, Item, from_record, measure, percentages
from .coverage_report import message, shown_path
from .load import discover, load_scenario
from .run import LoadedScenario, run_all


def traffic_coverage(funnel: CompiledFunnel, records: Sequence[dict[str, Any]]) -> list[Item]:
    """The funnel's items as the turn records exercised them."""
    return measure(funnel, [from_record(funnel, r) for r in records])


def scenario_coverage(funnel: CompiledFunnel, paths: Sequence[str | Path], db: str | None
                      ) -> tuple[list[Item], int]:
    """The funnel's items as the scenarios under ``paths`` that run on it exercised them,
    and how many there were."""
    files, _ = discover(paths)
    loaded: list[LoadedScenario] = []
    for f in files:
        scenario, problems = load_scenario(f)
        if scenario is not None and scenario.funnel.resolve() == funnel.spec.path.resolve():
            loaded.append((f, scenario, problems))
    results = run_all(loaded, db) if loaded else []
    return measure(funnel, [o for r in results for o in r.observed]), len(loaded)


def build(funnel: CompiledFunnel, traffic: list[Item], scenarios: list[Item], *,
          sessions: int, turns: int, scenario_count: int, since: float) -> dict[str, Any]:
    """The report as data (the JSON output)."""
    file = shown_path(funnel.spec.path)
    t_pct, s_pct = percentages(traffic), percentages(scenarios)

    def listed(items: list[Item]) -> list[dict[str, Any]]:
        return [{**i.as_json(), "message": message(i).replace(" never ", " ", 1)} for i in items]

    pairs = list(zip(traffic, scenarios, strict=True))
    return {
        "funnel": funnel.spec.name, "file": file, "since_seconds": since,
        "sessions": sessions, "turns": turns, "scenarios": scenario_count,
        "categories": {c: {"traffic": {"covered": t_pct[c][0], "total": t_pct[c][1],
                                       "percent": round(t_pct[c][2], 1)},
                           "scenarios": {"covered": s_pct[c][0], "total": s_pct[c][1],
                                         "percent": round(s_pct[c][2], 1)}}
                       for c in CATEGORIES if t_pct[c][1]},
        "traffic_only": listed([t for t, s in pairs if t.hits and not s.hits]),
        "scenarios_only": listed([s for t, s in pairs if s.hits and not t.hits]),
        "neither": listed([t for t, s in pairs if not t.hits and not s.hits]),
        "not_in_records": ["gates", "idle"],
    }


def text(report: dict[str, Any]) -> str:
    lines = [f"coverage of {report['funnel']} ({report['file']}): real traffic "
             f"{report['sessions']} session(s), {report['turns']} turn(s); "
             f"{report['scenarios']} scenario(s)",
             f"  {'':<10} {'traffic':>16} {'scenarios':>16}"]
    for name, c in report["categories"].items():
        t, s = c["traffic"], c["scenarios"]
        lines.append(f"  {name:<10} {t['covered']:>5}/{t['total']:<4} {t['percent']:5.1f}% "
                     f"{s['covered']:>5}/{s['total']:<4} {s['percent']:5.1f}%")
    if report["traffic_only"]:
        lines.append("exercised by real traffic, by no scenario (scenarios to write):")
        lines += [f"  {report['file']}:{i['line']}: {i['message']} ({i['hits']} turn(s))"
                  for i in report["traffic_only"]]
    else:
        lines.append("real traffic exercised nothing that no scenario does")
    if report["scenarios_only"]:
        lines.append(f"exercised by scenarios only: {len(report['scenarios_only'])} item(s)")
    lines.append("(idle returns and approval gates are not kept in turn records: counted from "
                 "scenarios only)")
    return "\n".join(lines) + "\n"


def run_report_coverage(funnel_path: str, db: str | None, since: float, fmt: str,
                        out: str | None, scenarios: Sequence[str], include_playground: bool
                        ) -> int:
    """`funnel report --coverage`: 0 on a report, 2 when there is nothing to report on."""
    if fmt not in ("table", "json"):
        print("funnel report: error: --coverage writes a table or json, not " + fmt,
              file=sys.stderr)
        return 2
    funnel = load_funnel(funnel_path)
    records = asyncio.run(scan_turns(db, funnel.spec.name, since,
                                     include_playground=include_playground))
    if not records:
        print(f"funnel report: error: no turn records of funnel '{funnel.spec.name}' in the "
              "period; widen --since or point --db at the funnel's database", file=sys.stderr)
        return 2
    paths = list(scenarios) or [str(funnel.spec.path.with_suffix(""))]
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise ConfigError(f"--scenarios: no such file or folder: {', '.join(missing)}")
    found, count = scenario_coverage(funnel, paths, db)
    report = build(funnel, traffic_coverage(funnel, records), found,
                   sessions=len({r["session_id"] for r in records}), turns=len(records),
                   scenario_count=count, since=since)
    document = json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n" \
        if fmt == "json" else text(report)
    if out:
        Path(out).write_text(document, "utf-8")
    else:
        sys.stdout.write(document)
    return 0
