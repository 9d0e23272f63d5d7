"""`funnel record`: turn a real conversation from the database into a scenario."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import InvalidInput
from ..funnel.compiled import load_funnel
from ..scenarios.record import recorded_scenario, scenario_yaml
from ..store import open_store


def cmd_record(args: argparse.Namespace) -> int:
    funnel = load_funnel(args.funnel)

    async def run() -> list[dict[str, Any]]:
        store = await open_store(args.db)
        try:
            return await store.turn_records(funnel.spec, args.session)
        finally:
            await store.close()

    records = asyncio.run(run())
    out = Path(args.out) if args.out else None
    # The scenario names its funnel relative to itself.
    base = out.resolve().parent if out else Path.cwd()
    funnel_path = Path(os.path.relpath(Path(args.funnel).resolve(), base)).as_posix()
    text = scenario_yaml(recorded_scenario(funnel.spec, args.session, records, funnel_path))
    if out is None:
        sys.stdout.write(text)
        return 0
    if out.exists() and not args.force:
        raise InvalidInput(f"{out} exists; give another --out, or --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, "utf-8")
    print(f"{out}: {len(records)} turn(s) of session {args.session!r}; replay with "
          f"`funnel test {out}`", file=sys.stderr)
    return 0
