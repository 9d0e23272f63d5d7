"""`funnel migrate` and `funnel purge`: the funnel's table and its retention."""

from __future__ import annotations

import argparse
import asyncio
import sys

from ..errors import InvalidInput
from ..format.spec import parse_duration
from ..funnel.compiled import load_funnel
from ..store import open_store
from ..store.connect import drop_stale_schemas, stale_message
from ..versions import deploy


def cmd_migrate(args: argparse.Namespace) -> int:
    funnel = load_funnel(args.funnel)

    async def run() -> tuple[list[str], list[str]]:
        store = await open_store(args.db)
        try:
            changes = await store.migrate(funnel.spec, drop=args.drop, check=args.check)
            versions: list[str] = []
            if not args.check and not any(c.startswith("error:") for c in changes):
                # The version store (docs/versions.md): sessions pinned to this version
                # run from it once a newer one is deployed.
                stored = await deploy.store_version(store, funnel)
                versions += [stored] if stored else []
                if getattr(args, "sessions", False):
                    versions += await deploy.move_sessions(store, funnel)
            return changes, versions
        finally:
            await store.close()

    changes, versions = asyncio.run(run())
    for line in changes:
        print(line)
    if not changes:
        print(f"table {funnel.spec.table} is up to date")
    for line in versions:
        print(line)
    changes += versions
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
    # Copies of messages out of every funnel's retention: what a killed replay or
    # simulation left in its temporary schema (engine.store.connect).
    # Said on stderr: stdout keeps the purge's own counts, for scripts.
    stale = drop_stale_schemas(args.db, dry_run=args.dry_run)
    if stale:
        print(stale_message(stale, "would drop" if args.dry_run else "dropped"), file=sys.stderr)

    async def run() -> tuple[dict[str, int] | None, dict[str, int] | None]:
        store = await open_store(args.db)
        try:
            # Counted first, and nothing created: a database without the funnel's table
            # has nothing to purge.
            found = await store.purge_preview(funnel.spec, period, anonymize=args.anonymize)
            if found is None or args.dry_run:
                return found, None
            if found["sessions"] + found["messages"]:
                print(_summary(found, "would " + ("anonymize" if args.anonymize else "delete"),
                               period, args.anonymize), file=sys.stderr)
            # Run with nothing idle too: the trials no turn names any more go with the period.
            return found, await store.purge(funnel.spec, period, anonymize=args.anonymize,
                                            batch=args.batch)
        finally:
            await store.close()

    found, counts = asyncio.run(run())
    if found is None:
        print(f"nothing to purge: table {funnel.spec.table} does not exist in this database")
        return 0
    if counts is None:
        print(_summary(found, "would " + ("anonymize" if args.anonymize else "delete") if
                       args.dry_run else ("anonymized" if args.anonymize else "deleted"),
                       period, args.anonymize))
        return 0
    print(_summary(counts, "anonymized" if args.anonymize else "deleted", period,
                   args.anonymize))
    return 0


def _summary(counts: dict[str, int], verb: str, period: float, anonymize: bool) -> str:
    return (f"{verb} {counts['sessions']} session(s) idle for more than {human_period(period)}"
            f": {counts['messages']} message(s)" + ("" if anonymize else
                                                    f", {counts['turns']} turn record(s)")
            + (f", {counts['trials']} trial(s) of the funnel no turn ran on any more"
               if counts.get("trials") else ""))


def human_period(seconds: float) -> str:
    """``90 days``, ``1 second``, ``36 hours``: a period as people say it."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds >= size and (seconds % size == 0 or unit == "second"
                                or seconds >= 10 * size):
            value = seconds / size
            text = f"{value:g}" if value == int(value) else f"{value:.1f}"
            return f"{text} {unit}{'' if text == '1' else 's'}"
    return f"{seconds:g} seconds"
