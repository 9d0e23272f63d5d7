"""`funnel forget` and `funnel export`: one customer's erasure and access requests.

Both go through the store (engine.store.erasure), as the service's
``DELETE`` and ``GET .../export`` do, and are logged there as control events
(who: ``cli``; when; the counts), without the customer's id.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from ..boundary.customer import check_input
from ..errors import InvalidInput, UnknownSession
from ..funnel.compiled import load_funnel
from ..store import open_store

WHO = "cli"


def _checked(session: str) -> str:
    check_input(session, "-")  # the same bounds as a turn's session id
    return session


def cmd_forget(args: argparse.Namespace) -> int:
    funnel = load_funnel(args.funnel)
    sessions = [_checked(s) for s in args.sessions]

    async def run() -> list[dict[str, Any] | str]:
        store = await open_store(args.db)
        out: list[dict[str, Any] | str] = []
        try:
            for session in sessions:
                try:
                    out.append(await store.erase_session(funnel.spec, session, by=WHO,
                                                         wait=args.wait))
                except UnknownSession as exc:
                    out.append(str(exc))
        finally:
            await store.close()
        return out

    results = asyncio.run(run())
    missing = 0
    for result in results:
        if isinstance(result, str):
            missing += 1
            print(f"funnel: error: {result}", file=sys.stderr)
        elif args.format == "json":
            print(json.dumps(result, ensure_ascii=False))
        else:
            print(f"erased session {result['session_id']} of funnel {result['funnel']}: "
                  f"{result['total']} row(s), receipt {result['receipt']}")
            for table, count in result["tables"].items():
                print(f"  {table}: {count}")
    return 1 if missing else 0


def cmd_export(args: argparse.Namespace) -> int:
    funnel = load_funnel(args.funnel)
    session = _checked(args.session)

    async def run() -> dict[str, Any]:
        store = await open_store(args.db)
        try:
            return await store.export_session(funnel.spec, session, by=WHO)
        finally:
            await store.close()

    document = json.dumps(asyncio.run(run()), ensure_ascii=False, indent=2)
    if args.output:
        try:
            Path(args.output).write_text(document + "\n", "utf-8")
        except OSError as exc:
            raise InvalidInput(f"--output {args.output}: {exc.strerror or exc}") from None
    else:
        print(document)
    return 0

