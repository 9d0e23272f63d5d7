"""A funnel the studio was given that does not validate: listed, edited, never run.

``funnel studio`` in a folder where a funnel was saved with errors still starts: that
funnel is held here, with its diagnostics, and not run (it has no good version to run).
The editor opens its files (:func:`loose_files`: the funnel file and the text files of
its own folder, since no compiled funnel names them) with their diagnostics as typed; the
studio's watcher polls them (:meth:`Broken.poll`) and, once a save makes the funnel
valid, the studio opens it on an engine of its own (``promote``) without a restart.
Everything that would run it (a turn, the scenarios, the report...) answers "fix the
funnel in the Editor first: N problem(s)" (:func:`not_ready`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FunnelError, FunnelInvalid, InvalidInput, SchemaOutdated, first_line
from ..format import _yaml
from ..format.files import Snapshot, snapshot
from ..format.paths import funnel_roots, is_confined
from ..funnel.compiled import load_funnel

__all__ = ["Broken", "LooseSpec", "loose_files", "not_ready"]

log = logging.getLogger("funnel.studio")
TEXT = (".yaml", ".yml", ".j2", ".jinja", ".jinja2", ".md", ".txt", ".json")
MAX_FILES = 500  # a funnel's folder holds tens of files; more is not a funnel's folder
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,40}$")


@dataclass(frozen=True)
class LooseSpec:
    """What the editor needs of a funnel that has no compiled spec: its file and name."""

    path: Path
    name: str


def _folder(path: Path) -> Path:
    """The funnel's own folder: a `funnel new` folder (``x/funnel.yaml``), else the
    repository's layout (``funnels/x.yaml`` reads ``funnels/x/``)."""
    return path.parent if path.stem == "funnel" else path.parent / path.stem


def _kind(path: Path, folder: Path) -> str:
    parts = path.relative_to(folder).parts if path.is_relative_to(folder) else ()
    if parts[:1] == ("scenarios",):
        return "scenario"
    if parts[:1] == ("knowledge",):
        return "knowledge"
    if path.stem == "catalog" and path.suffix in (".yaml", ".yml"):
        return "catalog"
    return "schema" if path.suffix == ".json" else "prompt"


def loose_files(spec: LooseSpec) -> list[tuple[Path, str]]:
    """The files of a funnel that does not validate, with their kinds: the funnel file,
    then the visible text files of its own folder (at most :data:`MAX_FILES`), inside its
    project only (engine.format.paths)."""
    roots = funnel_roots(spec.path)
    out: list[tuple[Path, str]] = [(spec.path, "funnel")]
    folder = _folder(spec.path)
    if not folder.is_dir():
        return out
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            path = Path(root) / name
            if name.startswith(".") or path.suffix not in TEXT or path == spec.path:
                continue
            if is_confined(path, roots):
                out.append((path, _kind(path, folder)))
            if len(out) > MAX_FILES:
                return out
    return out


def guess_name(path: Path) -> str:
    """The funnel's ``funnel:`` name when its file still says it, else its folder's (or
    its file's)."""
    try:
        data = _yaml.load(path.read_text("utf-8")).data
    except (OSError, UnicodeDecodeError, _yaml.YamlSyntaxError, ValueError, FunnelError):
        data = None
    name = data.get("funnel") if isinstance(data, dict) else None
    if isinstance(name, str) and _NAME.match(name):
        return name
    return (path.parent.name if path.stem == "funnel" else path.stem).replace("-", "_")


def not_ready(name: str, problems: int) -> InvalidInput:
    """The answer of everything that would run a funnel that does not validate."""
    return InvalidInput(f"funnel '{name}' does not validate: fix the funnel in the Editor "
                        f"first: {problems} problem(s)")


@dataclass
class Broken:
    """A funnel the studio holds without running it, until a save makes it valid.

    ``promote`` opens the now valid funnel in the studio (its engine, its watcher) and
    says the name it runs under (:attr:`promoted_as`); a :class:`FunnelError` it raises
    (a name taken, a database problem) is shown as the funnel's problem and the funnel
    stays held.
    """

    path: Path
    name: str
    diagnostics: list[dict[str, Any]]
    promote: Callable[[Broken], Awaitable[str]]  # opens it; the name it runs under
    generation: int = 1
    changed_at: float = 0.0
    promoted_as: str | None = None  # the funnel's name once opened (its file may rename it)
    _seen: Snapshot = ()
    _tried_at: float = 0.0  # the last look at a table that needed a migration
    _files: list[Path] = field(default_factory=list)
    # One check at a time: two promotions of one funnel would open two engines.
    _checking: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self._files = [p for p, _k in loose_files(self.loose)]
        self._seen = snapshot(self._files)

    @property
    def loose(self) -> LooseSpec:
        return LooseSpec(self.path, self.name)

    @property
    def errors(self) -> int:
        return sum(1 for d in self.diagnostics if d.get("severity") == "error") or 1

    def error(self) -> InvalidInput:
        return not_ready(self.name, self.errors)

    async def poll(self) -> bool:
        """Look once; on a change, validate again (and promote when valid)."""
        files = [p for p, _k in loose_files(self.loose)]  # a new prompt file counts too
        now = snapshot(files)
        if now == self._seen:
            return await self._migrated()
        self._files, self._seen = files, now
        self.changed_at = time.time()
        await self.check()
        return True

    async def _migrated(self) -> bool:
        """Waiting for a migration, try again once a second: `funnel migrate` from a
        terminal changes no file. The page hears of it only when something changed."""
        waiting = any(d.get("code") == "migration" for d in self.diagnostics)
        if not waiting or time.monotonic() - self._tried_at < 1.0:
            return False
        self._tried_at = time.monotonic()
        diagnostics, generation = self.diagnostics, self.generation
        await self.check()
        if self.promoted_as is None and self.diagnostics == diagnostics:
            self.generation = generation  # nothing new to show
            return False
        return True

    async def check(self) -> None:
        """Validate the files as they are; promote the funnel when it is valid."""
        async with self._checking:
            if self.promoted_as is None:
                await self._check()

    async def _check(self) -> None:
        try:
            await asyncio.to_thread(load_funnel, self.path)
        except FunnelInvalid as exc:
            self.diagnostics = [d.as_dict() for d in exc.diagnostics]
        except SchemaOutdated as exc:
            self.diagnostics = [outdated(self.path, exc)]
        except FunnelError as exc:
            self.diagnostics = [_problem(self.path, str(exc))]
        else:
            try:
                opened = await self.promote(self)
            except SchemaOutdated as exc:
                self.diagnostics = [outdated(self.path, exc)]
            except FunnelError as exc:
                self.diagnostics = [_problem(self.path, f"valid, but it could not be opened: "
                                             f"{exc}")]
            else:
                self.promoted_as, self.diagnostics = opened, []
                log.info("studio: %s validates now; opened", self.path)
        self.generation += 1

    def watches(self, path: Path) -> bool:
        real = os.path.realpath(path)
        return any(os.path.realpath(p) == real for p in self._files)

    def status(self) -> dict[str, Any]:
        return {"generation": self.generation, "ok": False, "broken": True,
                "diagnostics": self.diagnostics, "problem": None, "version": None,
                "loaded_at": None, "changed_at": self.changed_at, "errors": self.errors}

    def listing(self) -> dict[str, Any]:
        """The funnel as ``/api/funnels`` lists it: marked broken, with its problems."""
        return {"name": self.name, "path": str(self.path), "version": None, "initial": None,
                "description": None, "stages": [], "svg": "", "broken": True,
                "status": self.status()}


def _problem(path: Path, message: str) -> dict[str, Any]:
    return {"file": str(path), "line": 0, "col": 0, "severity": "error", "code": "F000",
            "message": message}


def outdated(path: Path, exc: Exception) -> dict[str, Any]:
    """A funnel that validates but whose table is behind it (a save whose migration was
    never run): held like a broken one, its Editor offers the migration."""
    return {**_problem(path, f"{first_line(exc)}; the Editor's migration panel runs it"),
            "code": "migration"}
