"""Diagnostics: one problem found in a funnel, with where it is and how to fix it.

:class:`Report` collects them for one funnel file; every checker of the
package writes into one, and reads the raw YAML data with :func:`as_dict` and
:func:`as_list`, so that a funnel with format errors still gets every other
problem reported in the same run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import Diagnostic as Diagnostic
from ..errors import Severity as Severity
from ..format import _yaml


def render(diagnostics: list[Diagnostic], fmt: str) -> str:
    """Render diagnostics as ``text``, ``json`` or ``github``."""
    if fmt == "json":
        return json.dumps([d.as_dict() for d in diagnostics], indent=2)
    if fmt == "github":
        return "\n".join(d.github() for d in diagnostics)
    return "\n".join(d.format() for d in diagnostics)


class Report:
    """Collects diagnostics for one funnel file and the files it names."""

    def __init__(self, path: Path, located: _yaml.Located | None = None) -> None:
        self.path = path
        self.located = located
        self.items: list[Diagnostic] = []

    def at(
        self,
        keys: Iterable[str | int],
        severity: Severity,
        code: str,
        message: str,
        *,
        key: bool = False,
    ) -> None:
        """Report at a position in the funnel file, given as a key path."""
        line, col = self.located.where(tuple(keys), key=key) if self.located else (0, 0)
        self.add(self.path, line, col, severity, code, message)

    def add(
        self, file: Path | str, line: int, col: int, severity: Severity, code: str, message: str
    ) -> None:
        self.items.append(Diagnostic(str(file), line, col, severity, code, message))

    @property
    def has_errors(self) -> bool:
        return any(d.severity == "error" for d in self.items)


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a mapping, else an empty one (checkers read raw YAML defensively)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """``value`` when it is a list, else an empty one."""
    return value if isinstance(value, list) else []
