"""Version pinning: which version of its funnel a session's turn runs on.

A session runs on the version it started with until it ends: it reaches a final
stage, or it sat idle longer than ``session_ttl``. Then (or at once, when the
newest version declares ``pin: false``) it moves to the newest version, its row
transformed by the declared ``migrations:``. Old versions are compiled from the
version store (``funnel_versions``) the first time one of their sessions comes
back, and kept while the engine runs (docs/versions.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..errors import ConfigError, FunnelError, MigrationError
from ..format.migrations import migrate_row
from ..funnel.compiled import CompiledFunnel
from ..store import Store
from .bundle import Bundle, LoadedVersion, bundle_of, compile_bundle

__all__ = ["Versions"]

log = logging.getLogger("funnel.versions")

# Old versions kept compiled at once; one evicted is compiled again when needed.
MAX_LOADED = 32


class Versions:
    """The versions of one funnel an engine runs: the newest, and old ones on demand."""

    def __init__(self, newest: CompiledFunnel, store: Store, *, deploy: bool = True) -> None:
        self.newest = newest
        self.store = store
        # False: a trial's engine (the studio, `funnel chat`, `funnel test`, ...). Its copies
        # are stored as trials (by hash, for replay), never as the copy of their version
        # that pinned sessions load (docs/versions.md: trying is not deploying).
        self.deploy = deploy
        self.digest: str | None = None  # the newest's content hash, once stored
        self._old: OrderedDict[int, LoadedVersion] = OrderedDict()
        self._missing: set[int] = set()  # versions the store cannot give (logged once)
        self._loading: dict[int, asyncio.Task[None]] = {}

    # -- deploying ------------------------------------------------------------------------
    async def store_newest(self, funnel: CompiledFunnel, *, strict: bool = True) -> bool:
        """Store ``funnel``'s bundle (deployed, or as a trial) and make it the newest; True
        when it was new.

        Raises:
            ConfigError: a file of the funnel cannot be read any more (unless not
                ``strict``: then it is logged, and the version is not stored).
        """
        try:
            bundle = bundle_of(funnel.spec)
        except ConfigError as exc:
            if strict:
                raise
            log.warning("funnel '%s' v%d is not stored in the version store: %s",
                        funnel.name, funnel.spec.version, exc)
            # No stored copy: its turn records name none (replay plays them on their
            # version's deployed copy).
            self.newest, self.digest = funnel, None
            return False
        new = await self.store.save_version(
            bundle.name, bundle.version, bundle.digest, bundle.entry, bundle.files,
            trial=not self.deploy)
        old = self.newest
        if old is not funnel and old.spec.version != funnel.spec.version and self.digest:
            # The version it replaces keeps running its pinned sessions: keep it compiled.
            self._keep(old.spec.version, LoadedVersion(old, self.digest))
        self._old.pop(funnel.spec.version, None)
        self._missing.discard(funnel.spec.version)
        self.newest, self.digest = funnel, bundle.digest
        return new

    def digest_of(self, version: int) -> str | None:
        """The content hash of the copy of ``version`` this engine runs (None: not stored,
        or not loaded)."""
        if version == self.newest.spec.version:
            return self.digest
        loaded = self._old.get(version)
        return loaded.digest if loaded is not None else None

    def loaded(self) -> dict[int, str]:
        """Every version compiled now, newest included: {version: content hash}."""
        out = {v: lv.digest for v, lv in self._old.items()}
        out[self.newest.spec.version] = self.digest or ""
        return out

    def _keep(self, version: int, loaded: LoadedVersion) -> None:
        self._old[version] = loaded
        self._old.move_to_end(version)
        while len(self._old) > MAX_LOADED:
            _, evicted = self._old.popitem(last=False)
            if evicted.folder is not None:
                evicted.folder.cleanup()

    def close(self) -> None:
        for loaded in self._old.values():
            if loaded.folder is not None:
                loaded.folder.cleanup()
        self._old.clear()

    # -- a turn ---------------------------------------------------------------------------
    async def prepare(self, row: Mapping[str, Any] | None) -> None:
        """Compile the session's version from the store if it is not loaded yet (the turn's
        one await for versions; :meth:`choose` then decides without waiting)."""
        version = _version_of(row)
        if version is None or version == self.newest.spec.version or version in self._old \
                or version in self._missing:
            return
        task = self._loading.get(version)
        if task is None:
            task = self._loading[version] = asyncio.get_running_loop().create_task(
                self._load(version))
            task.add_done_callback(lambda _: self._loading.pop(version, None))
        await asyncio.shield(task)

    async def _load(self, version: int) -> None:
        name = self.newest.name
        found = await self.store.load_version(name, version)
        if found is None:
            log.warning("funnel '%s' v%d is not in the version store: its sessions run on "
                        "v%d (run `funnel deploy` for every version you serve)", name, version,
                        self.newest.spec.version)
            self._missing.add(version)
            return
        digest, entry, files = found
        try:
            loaded = await asyncio.to_thread(
                compile_bundle, Bundle(name, version, entry, files, digest))
        except FunnelError as exc:
            log.error("funnel '%s' v%d from the version store does not compile here (%s): its "
                      "sessions run on v%d", name, version, exc, self.newest.spec.version)
            self._missing.add(version)
            return
        self._keep(version, loaded)

    def choose(self, row: Mapping[str, Any] | None, now: datetime) -> CompiledFunnel:
        """The version the session's turn runs on: its own while it is open and pinned,
        else the newest."""
        version = _version_of(row)
        newest = self.newest
        if row is None or version is None or version == newest.spec.version:
            return newest
        loaded = self._old.get(version)
        if loaded is not None and version > newest.spec.version:
            return loaded.funnel  # a worker not yet restarted: never move a session back
        if loaded is None or not newest.spec.pin or _ended(loaded.funnel, row, now,
                                                           newest.spec.session_ttl):
            return newest
        self._old.move_to_end(version)
        return loaded.funnel

    def move(self, session_id: str, row: dict[str, Any], funnel: CompiledFunnel
             ) -> tuple[CompiledFunnel, dict[str, Any], dict[str, Any] | None]:
        """(the version the turn runs on, the row as that version reads it, the migration
        record: None when the row is on that version already).

        A declared step that cannot apply to this row (a :class:`MigrationError`) leaves the
        session where it was: on its own version when that is loaded, else on ``funnel``
        with the row as it is; the record carries the error either way.
        """
        version = _version_of(row)
        target = funnel.spec.version
        if version is None or version == target:
            return funnel, row, None
        try:
            moved, record = migrate_row(funnel.spec.migrations, row, version, target)
        except MigrationError as exc:
            log.error("session %r: cannot move from v%d to v%d: %s", session_id, version,
                      target, exc)
            failed = {"from": version, "to": target, "steps": [], "error": str(exc)}
            loaded = self._old.get(version)
            if loaded is not None:
                failed["to"] = version
                return loaded.funnel, row, failed
            return funnel, row, failed
        return funnel, moved, record


def _version_of(row: Mapping[str, Any] | None) -> int | None:
    value = row.get("funnel_version") if row else None
    return int(value) if value is not None else None


def _ended(funnel: CompiledFunnel, row: Mapping[str, Any], now: datetime,
           fallback_ttl: float | None) -> bool:
    """Whether the session's conversation on ``funnel`` is over: a final stage, or idle
    past the funnel's ``session_ttl``."""
    stage = str(row.get("stage"))
    stage = funnel.spec.removed_stages.get(stage, stage)
    spec = funnel.spec.stages.get(stage)
    if spec is not None and spec.final:
        return True
    ttl = funnel.spec.session_ttl or fallback_ttl
    seen = row.get("last_message_at")
    if ttl is None or not seen:
        return False
    last = seen if isinstance(seen, datetime) else datetime.fromisoformat(str(seen))
    return (now - last).total_seconds() > ttl
