"""Counters and a latency histogram in the Prometheus text format (no client library).

Each worker process counts its own requests. With several workers, set
``FUNNEL_METRICS_DIR`` (``funnel serve --workers N`` makes a temporary one):
every worker writes its counts there at most once a second (:meth:`Metrics.flush`,
called by the service; a file write per turn cost a tenth of a worker's CPU),
and ``/metrics``, whichever worker answers it, adds all the files up, so a
scrape sees the whole service, the other workers' last second aside.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..turn import TurnResult

Labels = tuple[tuple[str, str], ...]

BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

HELP = {
    "funnel_turns_total": ("counter", "Turns answered, by funnel and the stage the turn ran in."),
    "funnel_turn_duration_seconds": ("histogram", "Time to answer a turn, in seconds."),
    "funnel_model_errors_total": ("counter", "Turns whose model call failed (fallback reply)."),
    "funnel_validation_failures_total": ("counter", "Model outputs rejected by the stage schema."),
    "funnel_fallbacks_total": ("counter", "Turns answered with the stage's fallback reply."),
    "funnel_handoffs_total": ("counter", "Sessions handed off to a manager."),
    "funnel_stage_transitions_total": ("counter", "Stage changes, by source and target stage."),
    "funnel_requests_refused_total": ("counter", "Requests refused before a turn, by reason."),
    "funnel_telegram_updates_total": ("counter", "Telegram updates received, by kind."),
    "funnel_telegram_send_errors_total": ("counter", "Bot API sendMessage calls that failed."),
}


def _labels(**labels: str) -> Labels:
    return tuple(sorted(labels.items()))


class Metrics:
    """The process's counters; :meth:`render` adds the other workers' from ``directory``."""

    def __init__(self, directory: str | None = None) -> None:
        self.counters: dict[tuple[str, Labels], float] = {}
        # name, labels -> [count per bucket (cumulative at render) ..., +Inf count, sum]
        self.histograms: dict[tuple[str, Labels], list[float]] = {}
        self.directory = Path(directory) if directory else None
        self._file = (self.directory / f"metrics-{os.getpid()}-{secrets.token_hex(4)}.json"
                      if self.directory else None)
        self.dirty = False  # counted since the last save

    # -- recording ---------------------------------------------------------------------
    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = (name, _labels(**labels))
        self.counters[key] = self.counters.get(key, 0.0) + value

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        key = (name, _labels(**labels))
        h = self.histograms.setdefault(key, [0.0] * (len(BUCKETS) + 2))
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                h[i] += 1
                break
        else:
            h[len(BUCKETS)] += 1
        h[-1] += seconds

    def turn(self, funnel: str, result: TurnResult, seconds: float) -> None:
        """Record one answered turn."""
        stage = result.stage_before
        self.inc("funnel_turns_total", funnel=funnel, stage=stage)
        self.observe("funnel_turn_duration_seconds", seconds, funnel=funnel, stage=stage)
        if result.validation_failures:
            self.inc("funnel_validation_failures_total", result.validation_failures,
                     funnel=funnel, stage=stage)
        if result.fallback:
            self.inc("funnel_fallbacks_total", funnel=funnel, stage=stage)
            # Two rejected outputs make a validation fallback; fewer, a failed call.
            if result.validation_failures < 2:
                self.inc("funnel_model_errors_total", funnel=funnel, stage=stage)
        if result.handoff:
            self.inc("funnel_handoffs_total", funnel=funnel, stage=result.stage_after)
        for t in result.transitions:
            self.inc("funnel_stage_transitions_total", funnel=funnel,
                     from_stage=str(t["from"]), to_stage=str(t["to"]))
        self.dirty = True

    def refused(self, funnel: str, reason: str) -> None:
        self.inc("funnel_requests_refused_total", funnel=funnel, reason=reason)
        self.dirty = True

    def count(self, name: str, **labels: str) -> None:
        self.inc(name, 1.0, **labels)
        self.dirty = True

    # -- sharing between workers -------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {"counters": [[n, list(map(list, lb)), v] for (n, lb), v in self.counters.items()],
                "histograms": [[n, list(map(list, lb)), h]
                               for (n, lb), h in self.histograms.items()]}

    def flush(self) -> None:
        """Write this worker's counts for the others, if anything changed."""
        if self.dirty:
            self.save()

    def save(self) -> None:
        self.dirty = False
        if self._file is None:
            return
        tmp = self._file.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(self.snapshot()), "utf-8")
            os.replace(tmp, self._file)
        except OSError:
            pass  # metrics never fail a request

    def _others(self) -> Iterable[dict[str, Any]]:
        if self.directory is None:
            return
        for path in sorted(self.directory.glob("metrics-*.json")):
            if path == self._file:
                continue
            try:
                yield json.loads(path.read_text("utf-8"))
            except (OSError, ValueError):
                continue

    # -- exposition --------------------------------------------------------------------
    def render(self) -> str:
        """All counters of all workers, in the Prometheus text exposition format 0.0.4."""
        counters = dict(self.counters)
        histograms = {k: list(v) for k, v in self.histograms.items()}
        for snap in self._others():
            for name, labels, value in snap.get("counters", []):
                key = (name, tuple((str(a), str(b)) for a, b in labels))
                counters[key] = counters.get(key, 0.0) + float(value)
            for name, labels, h in snap.get("histograms", []):
                key = (name, tuple((str(a), str(b)) for a, b in labels))
                mine = histograms.setdefault(key, [0.0] * (len(BUCKETS) + 2))
                if len(h) == len(mine):
                    histograms[key] = [a + float(b) for a, b in zip(mine, h, strict=True)]
        lines: list[str] = []
        for name, (kind, text) in HELP.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            if kind == "counter":
                for (n, labels), value in sorted(counters.items()):
                    if n == name:
                        lines.append(f"{name}{_fmt(labels)} {_num(value)}")
                continue
            for (n, labels), h in sorted(histograms.items()):
                if n != name:
                    continue
                running = 0.0
                for bound, count in zip((*BUCKETS, None), h[:-1], strict=True):
                    running += count
                    le = "+Inf" if bound is None else _num(bound)
                    lines.append(f"{name}_bucket{_fmt((*labels, ('le', le)))} {_num(running)}")
                lines.append(f"{name}_sum{_fmt(labels)} {h[-1]!r}")
                lines.append(f"{name}_count{_fmt(labels)} {_num(running)}")
        return "\n".join(lines) + "\n"


def _fmt(labels: Iterable[tuple[str, str]]) -> str:
    parts = [f'{k}="{_escape(v)}"' for k, v in labels]
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
