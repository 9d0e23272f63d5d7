"""Diagnostics: one problem found in a funnel, with where it is and how to fix it.

:class:`Report` collects them for one funnel file; every checker of the
package writes into one, and reads the raw YAML data with :func:`as_dict` and
:func:`as_list`, so that a funnel with format errors still gets every other
problem reported in the same run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from ..format import _yaml

Severity = Literal["error", "warning"]


@dataclass(frozen=True, order=True)
class Diagnostic:
    """A problem in a funnel file (or a file it names).

    Attributes:
        file: the file at fault, as given on the command line or resolved from the funnel.
        line: 1-based line (0 when unknown).
        col: 1-based column (0 when unknown).
        severity: ``"error"`` or ``"warning"``.
        code: a stable code such as ``F101`` (see docs/funnel-format.md).
        message: what is wrong, what was expected, and the fix.
    """

    file: str
    line: int
    col: int
    severity: Severity
    code: str
    message: str

    def format(self) -> str:
        """``file:line:col: severity CODE message``, the form editors and CI understand."""
        return f"{self.file}:{self.line}:{self.col}: {self.severity} {self.code} {self.message}"

    def github(self) -> str:
        """A GitHub Actions workflow command that annotates the line in a pull request."""
        kind = "error" if self.severity == "error" else "warning"
        msg = self.message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
        return f"::{kind} file={self.file},line={self.line},col={self.col},title={self.code}::{msg}"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


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
