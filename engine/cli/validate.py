"""`funnel validate`: every problem in the funnels, as `file:line:col: error CODE message`."""

from __future__ import annotations

import argparse
import sys

from ..validation import render, validate_paths


def cmd_validate(args: argparse.Namespace) -> int:
    diagnostics = validate_paths(args.paths)
    if diagnostics or args.format == "json":  # JSON readers get `[]` when all is clean
        print(render(diagnostics, args.format))
    errors = sum(d.severity == "error" for d in diagnostics)
    warnings = len(diagnostics) - errors
    if args.format == "text":
        print(f"{errors} error(s), {warnings} warning(s)", file=sys.stderr)
    return 1 if errors or (args.strict and warnings) else 0
