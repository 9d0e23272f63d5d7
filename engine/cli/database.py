"""`funnel migrate` and `funnel purge`: the funnel's table and its retention."""

from __future__ import annotations

import argparse
import asyncio

from ..errors import InvalidInput
from ..funnel import load_funnel
from ..spec import parse_duration
from ..store import open_store


def cmd_migrate(args: argparse.Namespace) -> int:
    funnel = load_funnel(args.funnel)

    async def run() -> list[str]:
        store = await open_store(args.db)
        try:
            return await store.migrate(funnel.spec, drop=args.drop, check=args.check)
        finally:
            await store.close()

    changes = asyncio.run(run())
    for line in changes:
        print(line)
    if not changes:
        print(f"table {funnel.spec.table} is up to date")
    # Informational lines ("column x is no longer declared; kept") are not pending work.
    pending = args.check and any(c.startswith("would ") or " will move to " in c
                                 for c in changes)
    return 1 if pending or any(c.startswith("error:") for c in changes) else 0


def cmd_purge(args: argparse.Namespace) -> int:
    funnel = load_funnel(args.funnel)
    if args.older_than:
        try:
            period = parse_duration(args.older_than)
        except ValueError as exc:
            raise InvalidInput(f"--older-than: {exc}") from None
    elif funnel.spec.retention:
        period = funnel.spec.retention
    else:
        raise InvalidInput(f"funnel '{funnel.name}' declares no `retention`; give --older-than "
                          "(e.g. 90d)")

    async def run() -> dict[str, int]:
        store = await open_store(args.db)
        try:
            await store.ensure_schema(funnel.spec)
            return await store.purge(funnel.spec, period, anonymize=args.anonymize,
                                     batch=args.batch)
        finally:
            await store.close()

    counts = asyncio.run(run())
    verb = "anonymized" if args.anonymize else "deleted"
    print(f"{verb} {counts['sessions']} session(s) idle for more than {period / 86400:g} day(s): "
          f"{counts['messages']} message(s)" + ("" if args.anonymize else
                                                 f", {counts['turns']} turn record(s)"))
    return 0
