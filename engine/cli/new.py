"""`funnel new`: a new funnel folder from a template, ready to validate and test."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..authoring.scaffold import funnel_name, scaffold


def cmd_new(args: argparse.Namespace) -> int:
    name = funnel_name(args.name)  # as the studio's New funnel: `pet-shop` is `pet_shop`
    folder = Path(args.dir or name)
    files = scaffold(name, folder, args.template, catalog=args.catalog)
    for path in files:
        print(path)
    print(f"\nNext: funnel validate --strict {folder}/ && funnel test {folder}/scenarios/")
    return 0
