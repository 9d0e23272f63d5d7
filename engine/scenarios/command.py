"""`funnel test`: find the scenario files, play them, write the report."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .load import discover, load_scenario
from .report import write_report
from .run import run_all


def run_command(paths: Sequence[str], db: str | None, fmt: str, out: str | None) -> int:
    """`funnel test`: run the scenarios under ``paths``; 0 all passed, 1 a failure, 2 usage."""

    files, missing = discover(paths)
    if missing:
        print(f"funnel test: error: no such file or folder: {', '.join(missing)}",
              file=sys.stderr)
        return 2
    if not files:
        print(f"funnel test: error: no scenario files in {', '.join(paths)} (YAML files with a "
              "top-level `scenario:` key)", file=sys.stderr)
        return 2
    results = run_all([(f, *load_scenario(f)) for f in files], db)
    write_report(results, fmt, out)
    return 1 if any(not r.passed for r in results) else 0
