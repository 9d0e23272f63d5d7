"""What a replay measured, for its gates: a verdict is never greener than what was measured.

A replay's figures (``handoff_rate``, ``reach.<stage>``, ...) are taken over the sessions
the recording decides on both sides (:attr:`Replay.comparable`). :class:`Measured`
counts the rest beside every verdict: the sessions not reproduced (with the first
reason), skipped, and those that need the model to know (``needs_model``, and those a
``--model`` continued: their outcome rests on new model outputs). :func:`judge` turns
``--fail-if`` gates into verdicts: a figure over no comparable session fails (unless
``--allow-unmeasured``); ``--max-needs-model`` fails (or, with ``--warn-needs-model``,
warns) when the share of sessions that need the model is above it (docs/evidence.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput
from .gates import Gate, Verdict
from .replay import Replay

__all__ = ["Measured", "judge", "parse_share"]

_SHARE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%?)\s*$")


@dataclass(frozen=True)
class Measured:
    """What a replay's figures were measured over, and what they left out."""

    sessions: int
    comparable: int
    not_reproduced: int
    skipped: int
    needs_model: int  # needs_model and continued: the recording cannot decide them
    first_reason: str | None  # the first session not reproduced: why
    legacy: int = 0  # replayed on their version's deployed copy (records without a hash)

    @classmethod
    def of(cls, result: Replay) -> Measured:
        odd = result.of("not_reproduced")
        return cls(len(result.diffs), len(result.comparable), len(odd),
                   len(result.of("skipped")), len(result.of("needs_model", "continued")),
                   odd[0].reason if odd else None, result.legacy)

    @property
    def share(self) -> float:
        """The share of the sessions that need the model to know (0 with no session)."""
        return self.needs_model / self.sessions if self.sessions else 0.0

    def note(self) -> str:
        """``4 of 6 sessions comparable (2 not reproduced: turn 3: ...; 1 needs the
        model)``: beside every verdict."""
        parts = []
        if self.not_reproduced:
            parts.append(f"{self.not_reproduced} not reproduced: {self.first_reason}")
        if self.skipped:
            parts.append(f"{self.skipped} skipped")
        if self.needs_model:
            verb = "needs" if self.needs_model == 1 else "need"
            parts.append(f"{self.needs_model} {verb} the model ({self.share * 100:.1f}%)")
        return (f"{self.comparable} of {self.sessions} sessions comparable"
                + (f" ({'; '.join(parts)})" if parts else ""))

    def as_json(self) -> dict[str, Any]:
        return {"sessions": self.sessions, "comparable": self.comparable,
                "not_reproduced": self.not_reproduced, "first_reason": self.first_reason,
                "skipped": self.skipped, "needs_model": self.needs_model,
                "needs_model_share": round(self.share, 4), "legacy": self.legacy}


def parse_share(text: str, option: str = "--max-needs-model") -> float:
    """A share option (``--max-needs-model``, ``--max-degenerate``): ``20%``, ``20``
    (percent) or ``0.2``: a fraction.

    Raises:
        InvalidInput: not a share from 0 to 100 %.
    """
    m = _SHARE.match(text)
    value = float(m.group(1)) if m else -1.0
    if m and (m.group(2) or value > 1):
        value /= 100
    if not m or not 0 <= value <= 1:
        raise InvalidInput(f"{option} {text!r}: expected a share from 0% to 100%, e.g. 20%")
    return value


def judge(gates: Sequence[Gate], result: Replay, *, allow_unmeasured: bool = False,
          max_needs_model: float | None = None, warn_needs_model: bool = False
          ) -> tuple[Measured, list[Verdict]]:
    """The verdicts of ``gates`` on ``result``, then of ``--max-needs-model`` when given."""
    measured = Measured.of(result)
    metrics, counts = result.metrics(), result.counts()
    note = measured.note()
    verdicts = [g.check(metrics, counts, comparable=measured.comparable, note=note,
                        allow_unmeasured=allow_unmeasured) for g in gates]
    if max_needs_model is not None:
        above = measured.share > max_needs_model
        verdicts.append(Verdict(
            f"--max-needs-model {max_needs_model * 100:g}%",
            above and not warn_needs_model, f"{measured.share * 100:.1f}%",
            f"{measured.needs_model} of {measured.sessions} sessions need the model to know"
            + (" (--warn-needs-model: the exit code stays 0)"
               if above and warn_needs_model else ""),
            warning=above and warn_needs_model))
    return measured, verdicts
