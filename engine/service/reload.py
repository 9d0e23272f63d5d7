"""Hot reload: an edited funnel is validated, then new turns run on it, without a restart.

Every worker process of ``funnel serve`` runs one :class:`Reloader`. It polls the
files each funnel reads (:func:`watched_files`: the funnel file, the catalog, the
folders of its stages' templates and output schemas, the knowledge folder), listed
again every ``FUNNEL_RELOAD_INTERVAL`` seconds, comparing size, mtime and inode; a
change is acted on once the files have been quiet for one more poll (an editor's
save is a burst: a temporary file, a rename, sometimes a second write), and only
when the content hash differs from the running version's (a ``touch`` reloads
nothing). ``SIGHUP`` asks for the same reload at once. Polling, not inotify
(``watchfiles``): it is no dependency of ours (it comes with ``uvicorn[standard]``
only), inotify misses changes on network file systems and some container mounts,
and a few dozen ``stat`` calls a second cost nothing next to a turn.

A reload is validated before anything changes: the funnel is loaded and
compiled in a thread (a big funnel never stalls the turns on the event loop),
its table is checked, and only then does :meth:`engine.turn.engine.Engine.deploy` swap
it in. Turns in flight finish on the version they started with (each turn holds
its own ``turn.funnel``). A refused edit leaves the running version in place,
logs one line (file:line and the error) and counts in
``funnel_reloads_total{result="refused"}``. An edit whose table needs a new
column is refused with "run `funnel migrate`": reload never changes the database
schema (docs/service.md, "Hot reload").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from .. import knowledge
from ..errors import (
    ConfigError,
    FunnelError,
    FunnelInvalid,
    SchemaOutdated,
    StoreUnavailable,
    closest,
)
from ..format.files import Snapshot, file_hashes, snapshot, watched_files
from ..format.paths import funnel_roots
from ..format.spec import FunnelSpec
from ..funnel.compiled import CompiledFunnel, load_funnel
from ..store.base import Store
from ..store.open_sessions import open_sessions, sessions_in_stages
from ..turn.engine import Engine
from .config import ServiceConfig
from .metrics import Metrics, follow_up_stages

log = logging.getLogger("funnel.service")

# Sessions with no message for this long are not counted as open (a funnel's own
# `session_ttl`, once the format has one, wins).
DEFAULT_SESSION_TTL = 7 * 86400.0
OPEN_CACHE_SECONDS = 5.0  # /readyz and /metrics scrapes share one count per funnel



class Served(Protocol):
    """What the reloader reads and swaps of the service that owns it (`core.Service`).

    A protocol, not the class, so that this module does not import the service that
    imports it.
    """

    config: ServiceConfig
    funnels: dict[str, CompiledFunnel]
    engines: dict[str, Engine]
    metrics: Metrics
    store: Store | None


def changed(before: dict[str, str], after: dict[str, str], root: Path) -> list[str]:
    """The files that differ between two :func:`file_hashes`, relative to ``root`` where
    they lie under it (added, removed, edited)."""
    out = []
    for path in sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p)):
        try:
            out.append(str(Path(path).relative_to(root)))
        except ValueError:
            out.append(path)
    return out


def _look(spec: FunnelSpec) -> Snapshot:
    return snapshot(watched_files(spec))


def _read(spec: FunnelSpec) -> tuple[list[Path], Snapshot, dict[str, str]]:
    files = watched_files(spec)
    return files, snapshot(files), file_hashes(files)


@dataclass
class _Watched:
    """What the reloader knows of one funnel."""

    source: Path
    applied: Snapshot  # the files as they were when last loaded (or refused)
    hashes: dict[str, str]  # their content when the running version was loaded
    seen: Snapshot = ()  # at the previous poll
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    reloaded_at: str | None = None
    refused: str | None = None  # when the last refusal was, until a reload succeeds
    open: dict[int, int] = field(default_factory=dict)
    counted_at: float = -1e9


class Reloader:
    """Watches every funnel of ``service`` and reloads it (see the module docstring)."""

    def __init__(self, service: Served, interval: float = 0.5, watch: bool = True) -> None:
        self.service = service
        self.interval = interval
        self.watch = watch
        self.funnels: dict[str, _Watched] = {}
        for name, compiled in service.funnels.items():
            _, look, hashes = _read(compiled.spec)
            self.funnels[name] = _Watched(compiled.spec.path, look, hashes)
            service.metrics.version(name, [compiled.spec.version])
        self._task: asyncio.Task[None] | None = None
        self._jobs: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        if self.watch:
            self._task = asyncio.get_running_loop().create_task(self._poll())

    async def close(self) -> None:
        for task in (self._task, *self._jobs):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def on_signal(self) -> None:
        """SIGHUP: reload every funnel now (from the event loop's signal handler)."""
        log.info("SIGHUP: reloading %s", ", ".join(sorted(self.funnels)))
        job = asyncio.get_running_loop().create_task(self.reload_all("SIGHUP"))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    async def reload_all(self, reason: str) -> dict[str, str]:
        return {name: await self.reload(name, reason) for name in list(self.funnels)}

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            for name, watched in self.funnels.items():
                try:
                    # Listed again each round: a file created in a watched folder counts.
                    now = await asyncio.to_thread(_look, self.service.funnels[name].spec)
                    changed, quiet = now != watched.applied, now == watched.seen
                    watched.seen = now
                    if changed and quiet:  # changed, and no write since the last poll
                        await self.reload(name, "file change")
                except Exception:  # the watcher never dies of one bad round
                    log.exception("funnel %s: watching its files failed", name)

    async def reload(self, name: str, reason: str) -> str:
        """Validate the funnel's files and, if they pass, run new turns on them.

        Returns ``applied``, ``unchanged`` or ``refused``; never raises for a bad edit.
        """
        watched = self.funnels[name]
        async with watched.lock:
            # Read before loading: a write during the load is a change still to come.
            files, now, hashes = await asyncio.to_thread(_read, self.service.funnels[name].spec)
            watched.applied = watched.seen = now
            if hashes == watched.hashes:
                log.info("funnel %s: %s: the files are unchanged; nothing to reload", name,
                         reason)
                return "unchanged"
            try:
                compiled = await asyncio.to_thread(load_funnel, watched.source)
                await self._check(name, compiled)
            except Exception as exc:  # whatever the edit, the running version stays
                return self._refuse(name, watched, reason, exc)
            old = self.service.funnels[name]
            engine = self.service.engines.get(name)
            before = engine.loaded_versions().get(old.spec.version, "") if engine else ""
            if engine is not None:
                await engine.deploy(compiled)
            # The identity `funnel versions` shows: the stored bundle's hash (an edit that
            # keeps `version:` is a stored edit of its own there, v1.2, v1.3).
            after = engine.loaded_versions().get(compiled.spec.version, "") if engine else ""
            self.service.funnels[name] = compiled
            self.service.metrics.declare(name, compiled.spec.stages,
                                         telegram=self.service.config.telegram_bot(name)
                                         is not None,
                                         follow_ups=follow_up_stages(compiled.spec))
            self.service.metrics.version(
                name, engine.loaded_versions() if engine else [compiled.spec.version])
            self.service.metrics.count("funnel_reloads_total", funnel=name, result="applied")
            if await asyncio.to_thread(watched_files, compiled.spec) != files:
                # The new version reads other files: what they hold now is what it loaded
                # (a write during the load, to exactly these, would wait for the next one).
                _, now, hashes = await asyncio.to_thread(_read, compiled.spec)
            edited = changed(watched.hashes, hashes, funnel_roots(watched.source)[0])
            watched.applied = watched.seen = now
            watched.hashes = hashes
            watched.reloaded_at = datetime.now(UTC).isoformat(timespec="seconds")
            watched.refused = None
            watched.counted_at = -1e9
            same = old.spec.version == compiled.spec.version
            log.info("funnel %s: reloaded (%s): version %s%s -> %s%s, changed: %s; %s", name,
                     reason, old.spec.version, f" ({before[:12]})" if before else "",
                     compiled.spec.version, f" ({after[:12]})" if after else "",
                     ", ".join(edited) or "nothing readable",
                     "the same `version:`, so its sessions get the new files at their next "
                     "turn (bump `version:` to keep them on the old ones)" if same else
                     "new turns run on it, turns in flight finish on the version they "
                     "started with")
            return "applied"

    async def _check(self, name: str, compiled: CompiledFunnel) -> None:
        """What the database must already have for the new version (reload changes no schema).

        Raises:
            ConfigError: the funnel was renamed or moved to another table.
            SchemaOutdated: its table lacks a column; ``funnel migrate`` adds it.
        """
        spec, running = compiled.spec, self.service.funnels[name].spec
        if compiled.name != name:
            raise ConfigError(f"{spec.path}: the funnel is now named '{compiled.name}'; a "
                              f"running funnel keeps its name (its URL): restart the service "
                              "to rename it")
        if spec.table != running.table:
            raise ConfigError(f"{spec.path}: `table` changed from {running.table!r} to "
                              f"{spec.table!r}; run `funnel migrate {spec.path}`, then restart")
        store = self.service.store
        if store is None or name not in self.service.engines:
            return  # not opened yet: Engine.open checks the table of the version it gets
        missing, _ = await store.check_schema(spec)
        if missing:
            raise SchemaOutdated(
                f"table {spec.table!r} lacks column(s) {', '.join(missing)} that version "
                f"{spec.version} declares; run `funnel migrate {spec.path}` (reload never "
                "changes the database); the file is reloaded after the next change or SIGHUP")
        await self._check_stages(compiled, running)
        # The derived objects (the turn function, the knowledge index), as at start-up.
        await store.ensure_schema(spec)
        await knowledge.ensure_index(store, spec)

    async def _check_stages(self, compiled: CompiledFunnel, running: FunnelSpec) -> None:
        """An edit of the same version that removes (or renames) a stage with sessions in
        it, without saying under ``removed_stages`` where they go, is refused: those
        sessions would answer "something went wrong" on every message.

        Raises:
            ConfigError: with the count of sessions and the mapping to add.
        """
        spec, store = compiled.spec, self.service.store
        if spec.version != running.version or store is None:
            return  # a new version: sessions pinned to the old one stay on it
        gone = sorted(set(running.stages) - set(spec.stages) - set(spec.removed_stages))
        stranded = await sessions_in_stages(store, running, gone)
        if not stranded:
            return
        mapping = "\n".join(
            f"  {stage}: {closest(stage, spec.stages) or spec.initial}" for stage in stranded)
        counts = ", ".join(f"{stage!r}: {n}" for stage, n in sorted(stranded.items()))
        raise ConfigError(
            f"{spec.path}: the edit removes stage(s) with {sum(stranded.values())} live "
            f"session(s) in them ({counts}); declare where those sessions go, e.g.\n"
            f"removed_stages:\n{mapping}")

    def _refuse(self, name: str, watched: _Watched, reason: str, exc: BaseException) -> str:
        if isinstance(exc, FunnelInvalid):
            errors = [d for d in exc.diagnostics if d.severity == "error"]
            problem = "; ".join(d.format() for d in errors[:3]) + (
                f" (and {len(errors) - 3} more: run `funnel validate`)" if len(errors) > 3
                else "")
        elif isinstance(exc, StoreUnavailable):
            problem = (f"the database could not check the new version's table ({exc}); "
                       "save again or send SIGHUP once it answers")
        elif isinstance(exc, FunnelError | OSError):
            problem = str(exc)
        else:  # a bug in loading, not in the edit: keep the traceback for the report
            log.error("funnel %s: loading the edit failed", name, exc_info=exc)
            problem = f"{type(exc).__name__}: {exc}"
        watched.refused = datetime.now(UTC).isoformat(timespec="seconds")
        self.service.metrics.count("funnel_reloads_total", funnel=name, result="refused")
        log.error("funnel %s: edit refused (%s), version %s keeps running: %s", name, reason,
                  self.service.funnels[name].spec.version, problem)
        return "refused"

    # -- what /readyz and /metrics show ----------------------------------------------
    async def versions(self) -> dict[str, Any]:
        """Per funnel: the version new turns run on, the versions loaded in this process,
        open sessions by version (from the database, cached a few seconds), the last
        reload and a pending refusal."""
        out: dict[str, Any] = {}
        for name, watched in self.funnels.items():
            spec = self.service.funnels[name].spec
            engine = self.service.engines.get(name)
            await self._count_open(name, watched, spec)
            if engine is not None:
                self.service.metrics.version(name, engine.loaded_versions())
            body: dict[str, Any] = {
                "running": spec.version,
                "loaded": sorted(engine.loaded_versions()) if engine else [spec.version],
                "open_sessions": {str(v): n for v, n in sorted(watched.open.items())},
            }
            if watched.reloaded_at:
                body["reloaded_at"] = watched.reloaded_at
            if watched.refused:  # the probe is public: the reason (file paths) is in the log
                body["refused"] = (f"an edit was refused at {watched.refused}; version "
                                   f"{spec.version} keeps running; the service log says why")
            out[name] = body
        return out

    async def _count_open(self, name: str, watched: _Watched, spec: FunnelSpec) -> None:
        store = self.service.store
        if store is None or name not in self.service.engines:
            return
        if time.monotonic() - watched.counted_at < OPEN_CACHE_SECONDS:
            return
        watched.counted_at = time.monotonic()
        ttl = float(getattr(spec, "session_ttl", None) or DEFAULT_SESSION_TTL)
        try:
            counts = await open_sessions(store, spec, ttl)
        except StoreUnavailable:
            return  # readiness reports the database; the last counts stay
        except Exception as exc:  # a probe or a scrape never fails for a count
            log.warning("funnel %s: counting open sessions failed: %s", name, exc)
            return
        for version in set(watched.open) - set(counts):
            self.service.metrics.drop_gauge("funnel_open_sessions", funnel=name,
                                            version=str(version))
        watched.open = counts
        for version, count in counts.items():
            self.service.metrics.gauge("funnel_open_sessions", count, funnel=name,
                                       version=str(version))
