"""`funnel test` reports: text (failures, then ``N passed, M failed``), GitHub annotations
and JUnit XML (one testcase per scenario)."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from .run import ScenarioResult


def summary(results: Sequence[ScenarioResult]) -> str:
    failed = sum(not r.passed for r in results)
    return f"{len(results) - failed} passed, {failed} failed"


def text(results: Sequence[ScenarioResult]) -> str:
    lines = [f.format() for r in results for f in r.failures]
    return "\n".join([*lines, summary(results)]) + "\n"


def github(results: Sequence[ScenarioResult]) -> str:
    """``::error file=...,line=...,title=...::message`` per failure, then the summary."""
    lines = []
    for r in results:
        for f in r.failures:
            where = f" turn {f.turn}" if f.turn else ""
            title = _prop(f"funnel test: {r.name}")
            lines.append(f"::error file={_prop(f.file)},line={f.line},title={title}::"
                         f"{_data(f'{r.name}{where}: {f.message}')}")
    return "\n".join([*lines, summary(results)]) + "\n"


def junit(results: Sequence[ScenarioResult], extra: Sequence[ET.Element] = ()) -> str:
    """JUnit XML: one testsuite, one testcase per scenario; expectation failures are
    ``<failure>``, scenarios that could not run ``<error>``; then the ``extra`` suites
    (coverage, snapshots)."""
    failures = sum(not r.passed and not r.errored for r in results)
    errors = sum(r.errored for r in results)
    seconds = f"{sum(r.seconds for r in results):.3f}"
    counts = {"tests": str(len(results)), "failures": str(failures), "errors": str(errors),
              "skipped": "0", "time": seconds}
    root = ET.Element("testsuites", {"name": "funnel test", **counts})
    suite = ET.SubElement(root, "testsuite", {"name": "funnel test", **counts})
    for r in results:
        case = ET.SubElement(suite, "testcase", {
            "classname": Path(r.file).with_suffix("").as_posix().lstrip("./").replace("/", "."),
            "name": r.name, "file": r.file, "line": str(r.line), "time": f"{r.seconds:.3f}"})
        if r.failures:
            tag = "error" if r.errored else "failure"
            first = r.failures[0]
            element = ET.SubElement(case, tag, {"message": first.format(),
                                                "type": "ScenarioError" if r.errored
                                                else "ScenarioFailure"})
            element.text = "\n".join(f.format() for f in r.failures)
    root.extend(extra)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_report(results: Sequence[ScenarioResult], fmt: str, out: str | None) -> None:
    """Without ``out`` the report goes to stdout (JUnit's summary to stderr); with it, the
    report goes to the file and stdout gets the text report."""
    report = {"text": text, "github": github, "junit": junit}[fmt](results)
    if out:
        Path(out).write_text(report, "utf-8")
        sys.stdout.write(text(results))
        return
    sys.stdout.write(report)
    if fmt == "junit":
        print(summary(results), file=sys.stderr)


def _data(message: str) -> str:
    return message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(value: str) -> str:
    return _data(value).replace(":", "%3A").replace(",", "%2C")
