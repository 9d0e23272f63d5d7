"""`funnel test`: play the conversation scenarios; `funnel snapshot`: store what the
model reads at the funnel's fixture states."""

from __future__ import annotations

import argparse

from ..scenarios.command import run_command
from ..scenarios.snapshot_command import run_snapshot


def cmd_test(args: argparse.Namespace) -> int:
    return run_command(args.paths, args.db, args.format, args.out, coverage=args.coverage,
                       fail_under=args.fail_under, snapshots=args.snapshots)


def cmd_snapshot(args: argparse.Namespace) -> int:
    return run_snapshot(args.funnel, args.db, args.update, args.format)
