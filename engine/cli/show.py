"""`funnel graph` and `funnel sql`: what a funnel declares, as a diagram or as DDL."""

from __future__ import annotations

import argparse

from ..funnel.compiled import load_funnel
from ..funnel.machine import dot, mermaid
from ..store.ddl import render


def cmd_graph(args: argparse.Namespace) -> int:
    funnel = load_funnel(args.funnel)
    print((dot if args.format == "dot" else mermaid)(funnel.machine), end="")
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    print(render(load_funnel(args.funnel).spec), end="")
    return 0
