"""`funnel studio`: the browser playground (engine.studio, docs/studio.md)."""

from __future__ import annotations

import argparse
import sys

# The studio's web stack (Starlette, uvicorn, pydantic) is in the default install
# (pyproject.toml); an environment that still lacks part of it (an older install, a
# trimmed image) gets one line saying what to install, never a traceback.
_missing: str | None
try:
    from ..studio.server import serve_studio
    _missing = None
except ModuleNotFoundError as exc:
    _missing = exc.name or str(exc)


def cmd_studio(args: argparse.Namespace) -> int:
    if _missing is not None:
        print(f"funnel studio: error: {_missing} is not installed; the studio needs "
              "starlette, uvicorn and pydantic: pip install -e '.[serve]' (or "
              "pip install 'funnel-engine[serve]' outside a checkout)", file=sys.stderr)
        return 2
    serve_studio(list(args.funnels), db=args.db, model=args.model, api_base=args.api_base,
                 host=args.host, port=args.port, what_if_days=args.what_if_days,
                 what_if_max=args.what_if_max)
    return 0
