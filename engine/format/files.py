"""The files a funnel reads, as of now, and a cheap snapshot of them: what the service's
hot reload (engine.service.reload) and the studio (engine.studio.watch) both watch."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from .spec import FunnelSpec

__all__ = ["Snapshot", "file_hashes", "hook_files", "snapshot", "watched_files"]

_MAX_FILES = 5000  # a knowledge folder that is a whole disk is not watched file by file

Snapshot = tuple[tuple[str, int, int, int], ...]


def hook_files(spec: FunnelSpec) -> list[Path]:
    """The hook modules beside the funnel file that its actions and ``handoff.notify``
    name (``module:function`` -> ``<module>.py``), as engine.funnel.hooks finds them;
    an installed module is no file of the funnel's. Sorted."""
    targets = [a.hook for a in spec.actions.values() if a.hook]
    notify = spec.handoff.notify if spec.handoff is not None else {}
    if isinstance(notify, dict) and isinstance(notify.get("hook"), str):
        targets.append(notify["hook"])
    found = set()
    for target in targets:
        module = str(target).partition(":")[0]
        local = spec.path.parent / (module.replace(".", "/") + ".py")
        if module and local.is_file():
            found.add(local)
    return sorted(found)


def watched_files(spec: FunnelSpec) -> list[Path]:
    """Every file the funnel reads, as of now: the funnel file, the catalog, its hook
    modules (:func:`hook_files`), and every visible file in its stages' template folders
    (``{% include %}`` reads them), output schema folders and knowledge folder. Sorted,
    without duplicates."""
    files: set[Path] = {spec.path, *hook_files(spec)}
    if spec.catalog_path is not None:
        files.add(spec.catalog_path)
    folders: set[Path] = set()
    for stage in spec.stages.values():
        files.add(stage.prompt)
        # Whole folders: an include, or a file an edit is about to name, is in them.
        folders.add(stage.prompt.parent)
        if stage.schema is not None:  # a derived contract lives in the funnel file
            files.add(stage.schema)
            folders.add(stage.schema.parent)
    if spec.schemas_dir is not None:  # where an edit's new schema extension would be
        folders.add(spec.schemas_dir)
    if spec.knowledge is not None:
        folders.add(spec.knowledge.folder)
    for folder in folders:
        files.update(_visible(folder))
    return sorted(files)[:_MAX_FILES]


def _visible(folder: Path) -> Iterable[Path]:
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            if not name.startswith("."):  # editors' swap and temporary files
                yield Path(root) / name


def snapshot(files: Iterable[Path]) -> Snapshot:
    """(path, size, mtime_ns, inode) of each file; a missing file reads as -1s."""
    out = []
    for path in files:
        try:
            st = path.stat()
            out.append((str(path), st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:
            out.append((str(path), -1, -1, -1))
    return tuple(out)


def file_hashes(files: Iterable[Path]) -> dict[str, str]:
    """Each file's SHA-256 by path (``"missing"`` for a file that cannot be read)."""
    out: dict[str, str] = {}
    for path in files:
        try:
            out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            out[str(path)] = "missing"
    return out
