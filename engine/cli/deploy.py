"""`funnel deploy`: `funnel migrate` and the version store, as one step (docs/versions.md)."""

from __future__ import annotations

import argparse

from .database import cmd_migrate


def cmd_deploy(args: argparse.Namespace) -> int:
    """Bring the table up to the funnel and store the version (what `funnel migrate`
    does, never in ``--check`` mode)."""
    args.check = False
    return cmd_migrate(args)
