"""Edit live: the studio polls the funnel's files and takes a clean save at once.

The files are those the funnel reads (the funnel file, its catalog, the folders of its
templates and output schemas, its knowledge folder), polled by size, mtime and inode
every :data:`POLL` seconds (as the service's hot reload does, engine/service/reload.py;
polling, for the same reasons). A change is validated in a thread: problems become the
page's diagnostics (file:line:col, code, message) and the last good version keeps
running; a clean save is deployed on the studio's engine (stored as a trial, never the
copy production loads: docs/versions.md), so the open session's next
turn runs on it. The page learns of either by polling ``/api/status`` (its generation).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FunnelError, FunnelInvalid
from ..format.files import Snapshot, snapshot, watched_files
from ..funnel.compiled import CompiledFunnel, load_funnel

__all__ = ["POLL", "Watched", "watched_files"]

log = logging.getLogger("funnel.studio")
POLL = float(os.environ.get("FUNNEL_STUDIO_POLL", "0.25"))  # seconds between looks
RETRY = 1.0  # seconds between tries of a save held back until its table is migrated

@dataclass
class Watched:
    """One funnel as the studio runs it: the last good compile and what the last save had.

    ``generation`` grows with every reload and every refused save, so that the page
    polling ``/api/status`` knows when to redraw.
    """

    path: Path
    funnel: CompiledFunnel
    deploy: Callable[[CompiledFunnel], Any]  # an awaitable: the engine's deploy
    saved: Callable[[CompiledFunnel], None] | None = None  # each clean save (the what-if)
    diagnostics: list[dict[str, Any]] = field(default_factory=list)
    problem: str | None = None  # a clean file that could not be taken (a schema change)
    generation: int = 0
    changed_at: float = 0.0  # time.time() of the save the page shows
    loaded_at: float = field(default_factory=time.time)
    _files: list[Path] = field(default_factory=list)
    _seen: Snapshot = ()
    _pending: CompiledFunnel | None = None  # the clean save a schema change held back
    _retry_at: float = 0.0

    def __post_init__(self) -> None:
        self._files = watched_files(self.funnel.spec)
        self._seen = snapshot(self._files)

    async def poll(self) -> bool:
        """Look once; on a change, validate and take or refuse it. True when it changed."""
        now = snapshot(self._files)
        if now == self._seen:
            if self._pending is not None and time.monotonic() >= self._retry_at:
                # `funnel migrate` in a terminal changes no file: try the held save again.
                self._retry_at = time.monotonic() + RETRY
                return await self._retry(self._pending)
            return False
        # A burst of writes (an editor's temporary file and rename): wait until quiet.
        while True:
            await asyncio.sleep(POLL / 2)
            again = snapshot(self._files)
            if again == now:
                break
            now = again
        self._seen = now
        self.changed_at = max((m for _p, _s, m, _i in now), default=0) / 1e9
        await self._reload()
        return True

    async def _reload(self) -> None:
        try:
            funnel = await asyncio.to_thread(load_funnel, self.path)
        except FunnelInvalid as exc:
            self.diagnostics = [d.as_dict() for d in exc.diagnostics]
            self.problem = None
            log.warning("studio: %s has %d problem(s); the last good version keeps running",
                        self.path, len(exc.diagnostics))
        except FunnelError as exc:
            self.diagnostics = [{"file": str(self.path), "line": 0, "col": 0,
                                 "severity": "error", "code": "F000", "message": str(exc)}]
            self.problem = None
        else:
            try:
                await self.deploy(funnel)
            except FunnelError as exc:  # a schema change: `funnel migrate` first
                self.problem = (f"the edit is valid but cannot be taken by the running "
                                f"session: {exc}")
                self.diagnostics = []  # the file is clean now: no stale problems beside it
                self._pending, self._retry_at = funnel, time.monotonic() + RETRY
            else:
                self.funnel, self.problem, self.diagnostics = funnel, None, []
                self.loaded_at = time.time()
                self._files = watched_files(funnel.spec)  # a new template folder, a new file
                self._seen = snapshot(self._files)
                if self.saved is not None:
                    self.saved(funnel)
        self.generation += 1
        if self.problem is None:
            self._pending = None

    async def _retry(self, funnel: CompiledFunnel) -> bool:
        """Deploy the held save again; taken (True) once its table has been migrated."""
        try:
            await self.deploy(funnel)
        except FunnelError:
            return False
        self.funnel, self.problem, self.diagnostics, self._pending = funnel, None, [], None
        self.loaded_at = time.time()
        self._files = watched_files(funnel.spec)
        self._seen = snapshot(self._files)
        self.generation += 1
        log.info("studio: %s taken after its migration", self.path)
        return True

    async def reload(self) -> None:
        """Take the files as they are now, at once, changed or not (after `funnel migrate`
        from the page, whose table change no file shows)."""
        self._seen = snapshot(self._files)
        self.changed_at = time.time()
        await self._reload()

    def watches(self, path: Path) -> bool:
        """Whether a save of ``path`` is seen (and validated) by :meth:`poll`."""
        real = os.path.realpath(path)
        return any(os.path.realpath(p) == real for p in self._files)

    def status(self) -> dict[str, Any]:
        errors = [d for d in self.diagnostics if d.get("severity") == "error"]
        return {"generation": self.generation, "ok": not errors and not self.problem,
                "diagnostics": self.diagnostics, "problem": self.problem,
                "version": self.funnel.spec.version, "loaded_at": self.loaded_at,
                "changed_at": self.changed_at}
