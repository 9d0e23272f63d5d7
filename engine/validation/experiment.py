"""Checks of the funnel's ``experiment:`` (F801-F808; engine.experiments.spec reads it)."""

from __future__ import annotations

from typing import Any

from ..experiments.spec import read_experiment
from .diagnostics import Report, as_dict


def check_experiment(data: dict[str, Any], report: Report) -> None:
    """Every problem of the experiment, at its file, line and field."""
    if data.get("experiment") is None:
        return
    _, problems = read_experiment(data["experiment"], report.path, report.located,
                                  stages=set(as_dict(data.get("stages"))))
    for p in problems:
        report.add(p.file, p.line, p.col, "error", p.code, p.message)
