"""`funnel studio`: the browser playground (engine.studio, docs/studio.md)."""

from __future__ import annotations

import argparse
import sys

# The studio's web stack. They are in the default install (pyproject.toml): a package
# that still lacks one (an older install, a trimmed environment) gets one line saying
# what to install, not a traceback.
NEEDS = "starlette, uvicorn and pydantic"


def cmd_studio(args: argparse.Namespace) -> int:
    try:
        import uvicorn  # noqa: F401  (the server; imported by serve_studio when it runs)

        from ..studio.server import serve_studio
    except ModuleNotFoundError as exc:
        print(f"funnel studio: error: it needs {NEEDS} ({exc.name} is not installed); "
              "install them with: pip install -e '.[serve]' (pip install 'funnel-engine[serve]' "
              "outside a checkout)", file=sys.stderr)
        return 2
    serve_studio(list(args.funnels), db=args.db, model=args.model, api_base=args.api_base,
                 host=args.host, port=args.port)
    return 0
