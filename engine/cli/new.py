"""`funnel new`: a new funnel folder from a template, ready to validate and test."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..authoring.scaffold import scaffold


def cmd_new(args: argparse.Namespace) -> int:
    folder = Path(args.dir or args.name)
    files = scaffold(args.name, folder, args.template, catalog=args.catalog)
    for path in files:
        print(path)
    print(f"\nNext: funnel validate --strict {folder}/ && funnel test {folder}/scenarios/")
    return 0
