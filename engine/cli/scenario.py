"""`funnel test`: play the conversation scenarios."""

from __future__ import annotations

import argparse

from ..scenarios.command import run_command


def cmd_test(args: argparse.Namespace) -> int:
    return run_command(args.paths, args.db, args.format, args.out)
