"""`funnel studio`: the browser playground (engine.studio, docs/studio.md)."""

from __future__ import annotations

import argparse

from ..studio.server import serve_studio


def cmd_studio(args: argparse.Namespace) -> int:
    serve_studio(list(args.funnels), db=args.db, model=args.model, api_base=args.api_base,
                 host=args.host, port=args.port)
    return 0
