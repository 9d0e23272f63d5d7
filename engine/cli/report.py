"""`funnel report`: the funnel's analytics as a table, JSON or an HTML page."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from ..errors import InvalidInput
from ..evidence.advise import advise
from ..evidence.advise_text import advice_json, advice_text
from ..funnel.compiled import CompiledFunnel, load_funnel
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
    if getattr(args, "advise", False):
        return _advise(args, funnel)
    if args.by == "variant":
        report = asyncio.run(build_variant_report(
            funnel, db=args.db, since=args.since, include_playground=args.include_playground))
        text = {"html": render_variant_html, "json": render_variant_json}.get(
            args.format, render_variant_table)(report)
    else:
        report = asyncio.run(build_report(funnel, db=args.db, since=args.since,
                                          include_playground=args.include_playground))
        text = _render(report, args.format)
    return _emit(args.out, text)


def _render(report: dict[str, Any], fmt: str) -> str:
    if fmt == "html":
        return render_html(report)
    return render_json(report) if fmt == "json" else render_table(report)


def _advise(args: argparse.Namespace, funnel: CompiledFunnel) -> int:
    """`--advise`: the thresholds of the exit conditions against the recorded sessions."""
    if args.format == "html" or args.by is not None or args.advise_sessions < 0:
        print("funnel report: error: --advise prints --format table or json, without --by, "
              "and --advise-sessions is 0 or more", file=sys.stderr)
        return 2
    try:
        advice, facts = advise(funnel, args.db, since=args.since,
                               replay_cap=args.advise_sessions)
    except InvalidInput as exc:
        print(f"funnel report: error: {exc}", file=sys.stderr)
        return 2
    text = advice_json(advice, facts) if args.format == "json" else advice_text(advice, facts)
    return _emit(args.out, text)


def _emit(out: str | None, text: str) -> int:
    """``text`` to the file ``out`` names (said on stderr), else to stdout."""
    if out:
        Path(out).write_text(text, "utf-8")
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
