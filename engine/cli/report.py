"""`funnel report`: the funnel's analytics as a table, JSON or an HTML page."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from ..funnel import load_funnel
from ..report import build_report, render_html, render_json, render_table


def cmd_report(args: argparse.Namespace) -> int:
    funnel = load_funnel(args.funnel)
    report = asyncio.run(build_report(funnel, db=args.db, since=args.since))
    if args.format == "html":
        text = render_html(report)
    else:
        text = render_json(report) if args.format == "json" else render_table(report)
    if args.out:
        Path(args.out).write_text(text, "utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
