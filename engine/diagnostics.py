"""Diagnostics: one problem found in a funnel, with where it is and how to fix it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Literal

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
