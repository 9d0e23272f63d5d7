"""`funnel test --coverage` output: text, JSON, GitHub annotations, JUnit XML; and the
``--fail-under`` verdict. The figures come from :mod:`engine.scenarios.coverage`."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .coverage import CATEGORIES, Item, percentages

# How an uncovered item reads: "exit discovery -> presentation never held".
_NEVER = {"held": "never held", "not held": "never evaluated without holding",
          "accepted": "never accepted", "refused": "never refused"}
_PHRASE = {"stages": "stage {name} never entered",
           "fallbacks": "fallback of stage {name} never sent",
           "gates": "approval gate of stage {name} never held a move",
           "idle": "idle return ({name}) never taken",
           "handoffs": "hand-off reason {name} never given"}


@dataclass
class FunnelCoverage:
    """One funnel's items, measured over ``sessions`` scenarios (or sessions) of ``turns``."""

    name: str
    file: str
    items: list[Item]
    sessions: int = 0
    turns: int = 0
    below: list[str] = field(default_factory=list)  # filled by :func:`judge`

    @property
    def uncovered(self) -> list[Item]:
        return [i for i in self.items if not i.hits]


def shown_path(path: Path | str) -> str:
    """A path as annotations want it: relative to the working folder when inside it."""
    p = Path(path)
    try:
        return Path(os.path.relpath(p.resolve(), Path.cwd())).as_posix() \
            if p.resolve().is_relative_to(Path.cwd()) else p.as_posix()
    except ValueError:  # another drive
        return p.as_posix()


def message(item: Item) -> str:
    """``exit objection_handling -> presentation never held``."""
    if item.category == "caps":
        return f"iteration cap of stage {item.name} ({item.outcome.split()[-1]} turns) never " \
            "reached"
    if item.category in _PHRASE:
        return _PHRASE[item.category].format(name=item.name)
    what = "exit" if item.category == "exits" else "action"
    return f"{what} {item.name} {_NEVER[item.outcome]}"


def judge(report: Sequence[FunnelCoverage], thresholds: Mapping[str, float]) -> list[str]:
    """The thresholds each funnel misses, as sentences (also kept on each funnel)."""
    out: list[str] = []
    for fc in report:
        pct = percentages(fc.items)
        fc.below = [f"{fc.name}: {name} coverage {pct[name][2]:.1f}% is below "
                    f"--fail-under {name}={want:g}"
                    for name, want in thresholds.items() if pct[name][2] + 1e-9 < want]
        out += fc.below
    return out


def text(report: Sequence[FunnelCoverage]) -> str:
    lines: list[str] = []
    for fc in report:
        lines.append(f"coverage of {fc.name} ({fc.file}) over {fc.sessions} "
                     f"scenario(s), {fc.turns} turn(s):")
        for name, (n, total, pct) in percentages(fc.items).items():
            if total:
                lines.append(f"  {name:<10} {n:>4}/{total:<4} {pct:6.1f}%  {CATEGORIES[name]}")
        if fc.uncovered:
            lines.append("  not covered:")
            lines += [f"    {fc.file}:{i.line}: {message(i)}" for i in fc.uncovered]
        lines += [f"  FAIL {b}" for b in fc.below]
    return "\n".join(lines) + "\n"


def as_json(report: Sequence[FunnelCoverage]) -> dict[str, Any]:
    return {"funnels": [{
        "funnel": fc.name, "file": fc.file, "scenarios": fc.sessions, "turns": fc.turns,
        "categories": {name: {"covered": n, "total": total, "percent": round(pct, 1)}
                       for name, (n, total, pct) in percentages(fc.items).items()},
        "uncovered": [{**i.as_json(), "message": message(i)} for i in fc.uncovered],
        "items": [i.as_json() for i in fc.items], "below": fc.below} for fc in report]}


def github(report: Sequence[FunnelCoverage]) -> str:
    """A ``::warning`` on each uncovered item's line, an ``::error`` per missed threshold,
    and the text summary."""
    lines: list[str] = []
    for fc in report:
        lines += [f"::warning file={prop(fc.file)},line={i.line},title=funnel coverage::"
                  f"{data(message(i))}" for i in fc.uncovered]
        lines += [f"::error file={prop(fc.file)},title=funnel coverage::{data(b)}"
                  for b in fc.below]
        for name, (n, total, pct) in percentages(fc.items).items():
            if total:
                lines.append(f"{fc.name} {name}: {n}/{total} ({pct:.1f}%)")
    return "\n".join(lines) + "\n"


def junit_suites(report: Sequence[FunnelCoverage]) -> list[ET.Element]:
    """One testsuite per funnel: a testcase per item (uncovered ones ``<skipped>``) and
    one per missed threshold (``<failure>``)."""
    suites = []
    for fc in report:
        uncovered = len(fc.uncovered)
        suite = ET.Element("testsuite", {
            "name": f"funnel coverage: {fc.name}", "tests": str(len(fc.items) + len(fc.below)),
            "failures": str(len(fc.below)), "errors": "0", "skipped": str(uncovered),
            "time": "0"})
        for i in fc.items:
            case = ET.SubElement(suite, "testcase", {
                "classname": f"coverage.{fc.name}.{i.category}", "name": i.label,
                "file": fc.file, "line": str(i.line)})
            if not i.hits:
                ET.SubElement(case, "skipped", {"message": message(i)})
        for b in fc.below:
            case = ET.SubElement(suite, "testcase", {
                "classname": f"coverage.{fc.name}", "name": "fail-under", "file": fc.file})
            ET.SubElement(case, "failure", {"message": b, "type": "CoverageBelow"}).text = b
        suites.append(suite)
    return suites


def render(report: Sequence[FunnelCoverage], fmt: str) -> str:
    """The coverage report alone, in ``fmt`` (text, json, github or junit)."""
    if fmt == "json":
        return json.dumps(as_json(report), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    if fmt == "github":
        return github(report)
    if fmt == "junit":
        root = ET.Element("testsuites", {"name": "funnel coverage"})
        root.extend(junit_suites(report))
        ET.indent(root)
        return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
    return text(report)


def data(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def prop(value: str) -> str:
    return data(value).replace(":", "%3A").replace(",", "%2C")
