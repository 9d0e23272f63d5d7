"""Where a funnel may read files: its own project, never the service's secrets.

A funnel file names templates (``prompt:``, ``prompts:``, ``{% include %}``),
output schemas (``schema:``, ``schemas:``) and a catalog. Every such path is
resolved (symlinks included) and must land inside one of the funnel's *roots*:

- its project: the nearest folder at or above the funnel file holding
  ``.git`` or ``pyproject.toml`` (a repository keeps ``funnels/``,
  ``prompts/`` and ``schemas/`` side by side), else the funnel file's folder;
- the folders the operator lists in ``FUNNEL_ROOT`` (``os.pathsep``-separated):
  the environment of the service, never the funnel file, widens the set.

Hidden files and folders (``.env``, ``.git/``) are refused even inside a root:
that is where credentials live. ``/proc/self/environ``, ``/etc/passwd``,
``../../..`` and a symlink out of the project are all outside.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from ..errors import ConfigError

__all__ = ["OutsideFunnel", "confine", "funnel_roots", "is_confined"]

_MARKERS = (".git", "pyproject.toml")


class OutsideFunnel(ConfigError):
    """A funnel names a file outside its roots (or a hidden one)."""


@lru_cache(maxsize=256)
def _project(folder: Path) -> Path:
    for candidate in (folder, *folder.parents):
        if candidate.parent == candidate:  # never the file system's root
            break
        if any((candidate / m).exists() for m in _MARKERS):
            return candidate
    return folder


def funnel_roots(funnel_path: Path) -> tuple[Path, ...]:
    """The folders a funnel at ``funnel_path`` may read files from (resolved)."""
    folder = Path(os.path.realpath(funnel_path)).parent
    roots = [_project(folder)]
    for raw in os.environ.get("FUNNEL_ROOT", "").split(os.pathsep):
        if raw.strip():
            roots.append(Path(os.path.realpath(raw.strip())))
    return tuple(dict.fromkeys(roots))


def _inside(real: Path, roots: tuple[Path, ...]) -> bool:
    for root in roots:
        try:
            rel = real.relative_to(root)
        except ValueError:
            continue
        return not any(part.startswith(".") for part in rel.parts)
    return False


def is_confined(path: Path, roots: tuple[Path, ...]) -> bool:
    """Whether ``path`` (after resolving symlinks and ``..``) is a visible file in a root."""
    return _inside(Path(os.path.realpath(path)), roots)


def confine(path: Path, roots: tuple[Path, ...], what: str = "file") -> Path:
    """``path`` resolved, when it is inside one of ``roots``.

    Raises:
        OutsideFunnel: it resolves outside every root, or to a hidden file.
    """
    real = Path(os.path.realpath(path))
    if not _inside(real, roots):
        raise OutsideFunnel(
            f"{what} {path} is outside the funnel's folder ({', '.join(map(str, roots))}) "
            "or hidden: a funnel may only read visible files inside its own project; move "
            "the file there (or list its folder in FUNNEL_ROOT)")
    return real
