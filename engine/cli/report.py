"""`funnel report`: the funnel's analytics as a table, JSON or an HTML page."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from ..funnel.compiled import load_funnel
from ..report import build_report, render_html, render_json, render_table
from ..report.variants import (
    build_variant_report,
    render_variant_html,
    render_variant_json,
    render_variant_table,
)
from ..scenarios.traffic import run_report_coverage


def cmd_report(args: argparse.Namespace) -> int:
    if args.coverage:
        return run_report_coverage(args.funnel, args.db, args.since, args.format, args.out,
                                   args.scenarios, args.include_playground)
    funnel = load_funnel(args.funnel)
    if args.by == "variant":
        report = asyncio.run(build_variant_report(
            funnel, db=args.db, since=args.since, include_playground=args.include_playground))
        text = {"html": render_variant_html, "json": render_variant_json}.get(
            args.format, render_variant_table)(report)
    else:
        report = asyncio.run(build_report(funnel, db=args.db, since=args.since,
                                          include_playground=args.include_playground))
        text = _render(report, args.format)
    if args.out:
        Path(args.out).write_text(text, "utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _render(report: dict[str, Any], fmt: str) -> str:
    if fmt == "html":
        return render_html(report)
    return render_json(report) if fmt == "json" else render_table(report)
