"""Checks of the funnel's ``experiment:`` (F811-F818; engine.format.experiment reads it),
and of the templates its variants use instead of the stages' (as `files` checks those)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..format.experiment import read_experiment
from ..format.paths import funnel_roots
from ..format.spec import PROMPT_NAMES
from .diagnostics import Report, as_dict
from .files import _check_template as check_template


def check_experiment(data: dict[str, Any], report: Report) -> None:
    """Every problem of the experiment, at its file, line and field."""
    if data.get("experiment") is None:
        return
    experiment, problems = read_experiment(data["experiment"], report.path, report.located,
                                           stages=set(as_dict(data.get("stages"))))
    for p in problems:
        report.add(p.file, p.line, p.col, "error", p.code, p.message)
    if experiment is None:
        return
    state = {k: v for k, v in as_dict(data.get("state")).items() if isinstance(v, dict)}
    roots, seen = funnel_roots(report.path), set[Path]()
    for variant in experiment.variants:
        for template in variant.prompts.values():
            check_template(template, template.parent, state, set(state) | set(PROMPT_NAMES),
                           report, seen, roots)
