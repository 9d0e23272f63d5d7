"""`funnel check-state`: the invariants of every session of a funnel (engine.turn.invariants)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from ..funnel.compiled import load_funnel
from ..store.connect import drop_stale_schemas, stale_message
from ..turn.invariants import check_funnel


def cmd_check_state(args: argparse.Namespace) -> int:
    """Print every broken invariant; exit 1 when any is an error (warnings do not fail)."""
    funnel = load_funnel(args.funnel)
    found = asyncio.run(check_funnel(funnel, args.db))
    # What a killed replay or simulation left: copies of messages no retention reaches.
    # Said on stderr: stdout keeps the check's own report, for scripts.
    stale = drop_stale_schemas(args.db)
    if stale:
        print(stale_message(stale), file=sys.stderr)
    errors = [v for v in found if v.severity == "error"]
    if args.format == "json":
        print(json.dumps([v.__dict__ for v in found], indent=2, ensure_ascii=False))
    else:
        for violation in found:
            print(violation)
        print(f"{funnel.name}: {len(errors)} error(s), {len(found) - len(errors)} warning(s)")
    return 1 if errors else 0
