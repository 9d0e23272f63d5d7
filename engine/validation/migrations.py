"""F801-F803: a funnel's versions settings and declared state migrations (docs/versions.md).

F801: the steps' versions (each leads forward, none past this version, none
overlapping another); F802: a stage rename that lands on a stage this version
does not have; F803: a step that does not apply to an example state of the
funnel's scenarios (their ``start:`` rows, and the default state), or leaves a
value its field's schema refuses.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import jsonschema

from ..errors import MigrationError, did_you_mean
from ..format import _yaml
from ..format.migrations import apply_step
from ..format.settings import MigrationStep, migration_steps
from ..sandbox.patterns import linear_validator
from .diagnostics import Report, as_dict

_SCENARIO_KEY = re.compile(r"^(scenario|turns)\s*:", re.MULTILINE)
_STORAGE_KEYS = {"default", "nullable", "owner", "write_once", "indexed", "column",
                 "description", "retention"}
MAX_SCENARIOS = 200  # scenario files read per funnel, at most


def check_migrations(data: dict[str, Any], state: dict[str, Any], report: Report) -> None:
    raw = data.get("migrations")
    version = data.get("version")
    if not raw or not isinstance(version, int) or not isinstance(raw, list):
        return
    try:
        steps = migration_steps(raw)
    except (KeyError, TypeError, ValueError, AttributeError):
        return  # the format layer reported it
    previous: MigrationStep | None = None
    for i, step in sorted(enumerate(steps), key=lambda p: (p[1].source, p[1].target)):
        if step.target <= step.source:
            report.at(("migrations", i), "error", "F801", f"migration {step.source}->"
                      f"{step.target} leads backwards: `to` must be greater than `from`")
        elif step.target > version:
            report.at(("migrations", i), "error", "F801", f"migration {step.source}->"
                      f"{step.target} leads past this funnel's version {version}: end it at "
                      f"`to: {version}` or bump `version:`")
        elif previous is not None and step.source < previous.target:
            report.at(("migrations", i), "error", "F801", f"migration {step.source}->"
                      f"{step.target} overlaps {previous.source}->{previous.target}: each "
                      "version step is declared once; merge them into one step")
        previous = step
    stages = set(as_dict(data.get("stages"))) | set(as_dict(data.get("removed_stages")))
    renamed_later = {old for s in steps for old, _ in s.stages}
    for i, step in enumerate(steps):
        for old, new in step.stages:
            if new not in stages and new not in renamed_later:
                report.at(("migrations", i, "stages", old), "error", "F802",
                          f"migration {step.source}->{step.target} renames stage '{old}' to "
                          f"'{new}', which version {version} does not declare"
                          f"{did_you_mean(new, stages)}; name one of its stages "
                          f"({', '.join(sorted(as_dict(data.get('stages'))))})",
                          key=True)
    _check_examples(data, state, steps, report)


def _example_states(data: dict[str, Any], state: dict[str, Any], funnel: Path
                    ) -> list[tuple[str, dict[str, Any]]]:
    """(where, row): the default state, and each scenario's ``start:`` over it."""
    defaults = {name: raw.get("default") for name, raw in state.items()}
    out = [("the default state", {**defaults, "stage": data.get("initial")})]
    files, _ = _yaml.find_files([funnel.parent], lambda t: bool(_SCENARIO_KEY.search(t)))
    target = os.path.realpath(funnel)
    for path in files[:MAX_SCENARIOS]:
        try:
            scenario = _yaml.load(path.read_text("utf-8")).data
        except (OSError, UnicodeDecodeError, _yaml.YamlSyntaxError):
            continue  # `funnel test` reports it
        if not isinstance(scenario, dict) or not isinstance(scenario.get("funnel"), str):
            continue
        if os.path.realpath(path.parent / scenario["funnel"]) != target:
            continue
        start = scenario.get("start")
        if isinstance(start, dict):
            out.append((f"scenario {path.name}", {**defaults, **start}))
    return out


def _check_examples(data: dict[str, Any], state: dict[str, Any], steps: tuple[
        MigrationStep, ...], report: Report) -> None:
    for where, example in _example_states(data, state, report.path):
        row = dict(example)
        for i, step in enumerate(steps):
            try:
                apply_step(step, row, [])
            except MigrationError as exc:
                report.at(("migrations", i), "error", "F803", f"{exc.detail} (applied to "
                          f"{where})")
                break
        else:
            for name, value in row.items():
                raw = as_dict(state.get(name))
                if not raw or value is None:
                    continue
                schema = {k: v for k, v in raw.items() if k not in _STORAGE_KEYS}
                error = jsonschema.exceptions.best_match(
                    linear_validator(schema).iter_errors(value))
                if error is not None:
                    report.at(("migrations",), "error", "F803", f"the migrations leave "
                              f"'{name}' = {value!r} in {where}, which its field refuses: "
                              f"{error.message}; add a `defaults:` or `drop:` to the step",
                              key=True)


__all__ = ["check_migrations"]
