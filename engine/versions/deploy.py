"""Deploying a version from the command line: the version store's writes and the eager
state migration of `funnel migrate --sessions` (docs/versions.md)."""

from __future__ import annotations

from datetime import UTC, datetime

from ..funnel.compiled import CompiledFunnel
from ..store import Store
from .bundle import bundle_of
from .pinning import Versions

__all__ = ["changed_files", "move_sessions", "store_version"]


async def store_version(store: Store, funnel: CompiledFunnel) -> str | None:
    """Write the funnel's bundle to the version store; say what happened (None when it
    was stored already)."""
    spec = funnel.spec
    bundle = bundle_of(spec)
    before = await store.load_version(spec.name, spec.version)
    await store.save_version(bundle.name, bundle.version, bundle.digest, bundle.entry,
                             bundle.files)
    short = bundle.digest[:12]
    if before is None:
        return f"stored v{spec.version} in the version store ({short})"
    if before[0] == bundle.digest:
        return None
    changed = changed_files(before[2], bundle.files)
    return (f"replaced v{spec.version} in the version store ({before[0][:12]} -> {short}; "
            f"changed: {', '.join(changed) or 'nothing readable'}): its files changed without "
            "a `version:` bump, so sessions on it get the new files at their next turn; bump "
            "`version:` to keep them on the old ones")


def changed_files(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """The files of a bundle that differ between two stored bundles (added, removed, edited)."""
    return sorted(f for f in old.keys() | new.keys() if old.get(f) != new.get(f))


async def move_sessions(store: Store, funnel: CompiledFunnel) -> list[str]:
    """`funnel migrate --sessions`: move every session that would move at its next turn
    (ended, or ``pin: false``) to this version now, through the declared migrations."""
    versions = Versions(funnel, store)
    versions.digest = bundle_of(funnel.spec).digest
    now = datetime.now(UTC)
    moved = pinned = failed = raced = 0
    after = ""
    try:
        while True:
            rows = await store.sessions_on_other_versions(funnel.spec, after)
            if not rows:
                break
            after = str(rows[-1]["session_id"])
            for row in rows:
                await versions.prepare(row)
                if versions.choose(row, now) is not funnel:
                    pinned += 1
                    continue
                _, values, record = versions.move(str(row["session_id"]), row, funnel)
                if record is not None and record.get("error"):
                    failed += 1
                elif await store.move_session(funnel.spec, values, int(row["row_version"])):
                    moved += 1
                else:
                    raced += 1  # a turn saved meanwhile: it moves the session itself
    finally:
        versions.close()
    out = [f"moved {moved} session(s) to v{funnel.spec.version}"]
    if pinned:
        out.append(f"{pinned} session(s) stay pinned to older versions until they end")
    if raced:
        out.append(f"{raced} session(s) had a turn meanwhile; they move at their next turn")
    if failed:
        out.append(f"error: {failed} session(s) could not be migrated (the log names the "
                   "step); fix `migrations:` and run again")
    return out
