"""The CI gates of `funnel replay --fail-if` and `funnel simulate --fail-under`.

``--fail-if 'METRIC OP VALUE'`` fails a replay when the change it measures matches:

* ``VALUE%``: the relative change of the metric, ``(after - before) / before``
  (``handoff_rate < -5%``: the hand-off rate falls by more than 5 %);
* ``VALUEpp``: the change of a rate in percentage points (``reach.presentation < -2pp``);
* a bare number: the change in the metric's own units (``revenue < -1000``), or, for a
  count of the replay itself (``changed``, ``needs_model``, ``continued``, ``not_reproduced``,
  ``different``, ``skipped``), the count (``not_reproduced > 0``).

``--fail-under 'METRIC=VALUE'`` fails a simulated run whose metric is below ``VALUE``.
Both are parsed strictly: an unknown metric or a malformed gate is a usage error that
lists what is known.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput, did_you_mean

__all__ = ["Gate", "Verdict", "check_floor", "parse_floor", "parse_gate"]

_GATE = re.compile(r"^\s*([a-z_][a-z0-9_.]*)\s*(<=|>=|<|>|==|!=)\s*(-?\d+(?:\.\d+)?)\s*(%|pp)?\s*$")
_FLOOR = re.compile(r"^\s*([a-z_][a-z0-9_.]*)\s*=\s*(-?\d+(?:\.\d+)?)\s*$")
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "==": operator.eq, "!=": operator.ne}
COUNTS = ("changed", "different", "needs_model", "continued", "not_reproduced", "skipped",
          "same")


@dataclass(frozen=True)
class Gate:
    """One ``--fail-if`` gate."""

    text: str
    metric: str
    op: str
    value: float
    unit: str  # "%", "pp" or ""

    def measure(self, metrics: Mapping[str, tuple[float, float]], counts: Mapping[str, int]
                ) -> float | None:
        """What the gate compares: the change (or the count); a relative change from zero
        is 0 when nothing changed, else infinite in its direction (a rise from nothing
        is above any percentage)."""
        if self.metric in COUNTS:
            return float(counts.get(self.metric, 0))
        before, after = metrics[self.metric]
        if self.unit == "%":
            if before == 0:
                return 0.0 if after == 0 else math.copysign(math.inf, after)
            return (after - before) / before * 100
        if self.unit == "pp":
            return (after - before) * 100
        return after - before

    def check(self, metrics: Mapping[str, tuple[float, float]], counts: Mapping[str, int],
              *, comparable: int | None = None, note: str = "",
              allow_unmeasured: bool = False) -> Verdict:
        """The verdict. ``comparable``: how many sessions the metrics were measured over;
        a metric (not a count) measured over none fails, whatever it says, unless
        ``allow_unmeasured`` (``note`` says why none was comparable)."""
        if comparable == 0 and self.metric not in COUNTS:
            return Verdict(self.text, not allow_unmeasured, "n/a", note, unmeasured=True)
        measured = self.measure(metrics, counts)
        failed = measured is not None and _OPS[self.op](measured, self.value)
        if measured is None:
            shown = "n/a"
        elif math.isinf(measured):
            shown = f"{'+' if measured > 0 else '-'}inf{self.unit} (from zero)"
        else:
            shown = f"{measured:+.2f}{self.unit}"
        return Verdict(self.text, failed, shown, note)


@dataclass(frozen=True)
class Verdict:
    """A gate's verdict; ``note`` says what it was measured over (and what it left out),
    ``unmeasured``: no session was comparable; ``warning``: above a threshold that only
    warns (the exit code stays 0)."""

    gate: str
    failed: bool
    measured: str
    note: str = ""
    unmeasured: bool = False
    warning: bool = False

    def line(self) -> str:
        head = "FAIL" if self.failed else "warning" if self.warning else "ok"
        if self.unmeasured:
            return (f"{head}: {self.gate}: not measured: {self.note}"
                    + ("" if self.failed else " (--allow-unmeasured)"))
        return f"{head}: {self.gate} (measured {self.measured})" + \
            (f"; {self.note}" if self.note else "")

    def as_json(self) -> dict[str, Any]:
        return {"gate": self.gate, "failed": self.failed, "measured": self.measured,
                "measured_over": self.note or None, "not_measured": self.unmeasured,
                "warning": self.warning, "line": self.line()}


def parse_gate(text: str, known: list[str]) -> Gate:
    """A ``--fail-if`` gate.

    Raises:
        InvalidInput: it is malformed or names an unknown metric.
    """
    m = _GATE.match(text)
    if m is None:
        raise InvalidInput(f"--fail-if {text!r}: expected METRIC OP VALUE[%|pp], e.g. "
                           "'handoff_rate < -5%' or 'not_reproduced > 0'")
    metric, op, value, unit = m.group(1), m.group(2), float(m.group(3)), m.group(4) or ""
    _known(metric, [*known, *COUNTS], "--fail-if")
    if metric in COUNTS and unit:
        raise InvalidInput(f"--fail-if {text!r}: {metric} is a count of sessions; compare it "
                           f"with a number (e.g. '{metric} > 0')")
    return Gate(text, metric, op, value, unit)


def parse_floor(text: str, known: list[str]) -> tuple[str, float]:
    """A ``--fail-under METRIC=VALUE`` floor.

    Raises:
        InvalidInput: it is malformed or names an unknown metric.
    """
    m = _FLOOR.match(text)
    if m is None:
        raise InvalidInput(f"--fail-under {text!r}: expected METRIC=VALUE, e.g. "
                           "handoff_rate=0.4")
    _known(m.group(1), known, "--fail-under")
    return m.group(1), float(m.group(2))


def check_floor(metric: str, floor: float, metrics: Mapping[str, float]) -> Verdict:
    """Whether a simulated run's ``metric`` is below ``floor`` (a failure)."""
    value = metrics[metric]
    return Verdict(f"{metric}={floor:g}", value < floor, f"{value:.4g}")


def _known(metric: str, known: list[str], option: str) -> None:
    if metric not in known:
        raise InvalidInput(f"{option}: unknown metric {metric!r}{did_you_mean(metric, known)}; "
                           f"known: {', '.join(sorted(known))}")
