"""`funnel deploy` (`funnel migrate` and the version store, as one step) and `funnel
versions` (what the version store holds), docs/versions.md."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from ..funnel.compiled import load_funnel
from ..store import open_store
from .database import cmd_migrate


def cmd_deploy(args: argparse.Namespace) -> int:
    """Bring the table up to the funnel and store the version (what `funnel migrate`
    does, never in ``--check`` mode)."""
    args.check = False
    return cmd_migrate(args)


def cmd_versions(args: argparse.Namespace) -> int:
    """The funnel's stored versions, newest deployment last, with their sessions."""
    funnel = load_funnel(args.funnel)

    async def run() -> tuple[list[dict[str, Any]], dict[int, int]]:
        store = await open_store(args.db)
        try:
            return await store.list_versions(funnel.name), \
                await store.sessions_by_version(funnel.spec)
        finally:
            await store.close()

    every, sessions = asyncio.run(run())
    stored = [row for row in every if not row.get("trial")]
    trials = [row for row in every if row.get("trial")]
    if not stored and not trials:
        print(f"no version of funnel '{funnel.name}' is stored; run `funnel deploy "
              f"{args.funnel}`")
        return 0
    current = {row["version"]: row["hash"] for row in stored}  # the last deployed wins
    # An edit stored without a `version:` bump is a second bundle of the same version: each
    # gets its own name, v1, v1.2, v1.3 in the order they were first stored.
    edits: dict[int, list[str]] = {}
    for row in sorted(stored, key=lambda r: (r["version"], r["created_at"])):
        edits.setdefault(row["version"], []).append(row["hash"])
    for row in stored:
        running = current[row["version"]] == row["hash"]
        mark = "" if running else "  (replaced)"
        n = edits[row["version"]].index(row["hash"]) + 1
        name = f"v{row['version']}" + (f".{n}" if n > 1 else "")
        if n > 1 and running:
            mark = "  (files edited without a `version:` bump)"
        # A version's sessions run its current bundle (an edit reaches them at their next
        # turn): they are counted there, once, never under a replaced edit too.
        count = sessions.get(row["version"], 0) if running else 0
        print(f"{name:<6}{row['hash'][:12]}  deployed "
              f"{row['deployed_at']:%Y-%m-%d %H:%M}  {count} session(s){mark}")
    for version in sorted(set(sessions) - set(current)):
        print(f"v{version}  not stored  {sessions[version]} session(s): they run on the "
              "newest version")
    # Trials (docs/versions.md): copies the studio, `funnel chat`, `funnel test`, ... ran
    # on; kept by hash for replay, never loaded for a pinned session. Counted by the
    # sessions whose turns ran on them.
    for row in sorted(trials, key=lambda r: (r["version"], r["deployed_at"])):
        print(f"{'v' + str(row['version']):<6}{row['hash'][:12]}  tried    "
              f"{row['deployed_at']:%Y-%m-%d %H:%M}  {row.get('sessions') or 0} session(s)  "
              "trial")
    return 0
