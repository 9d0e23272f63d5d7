"""`funnel serve`: the HTTP service."""

from __future__ import annotations

import argparse

from ..service.server import serve


def cmd_serve(args: argparse.Namespace) -> int:
    return serve(args.funnels, db=args.db, host=args.host, port=args.port, workers=args.workers,
                 model=args.model, api_base=args.api_base,
                 structured_output=args.structured_output)
