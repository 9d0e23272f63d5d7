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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..turn.engine import TurnResult

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
    "funnel_telegram_replies_delivered_total": ("counter", "Replies the Bot API accepted."),
    "funnel_telegram_unreachable_total": ("counter", "Replies given up: the chat refused "
                                          "the bot (403 blocked, chat not found)."),
    "funnel_telegram_start_payloads_dropped_total": ("counter", "/start payloads with no "
                                                     "declared field to keep them."),
    "funnel_replays_total": ("counter", "Deliveries of a message seen before: no second turn."),
    "funnel_inbound_recovered_total": ("counter", "Accepted messages a dead worker left, "
                                       "answered by another."),
    "funnel_model_seconds": ("histogram", "Model time of a turn (all its calls), in seconds."),
    "funnel_tokens_total": ("counter", "Model tokens, by kind (prompt, completion)."),
    "funnel_facts_refused_total": ("counter", "Model claims refused: a grounded field the "
                                   "customer's words do not hold (ungrounded), an action "
                                   "they did not ask for (unconfirmed)."),
    "funnel_cached_prompt_tokens_total": ("counter", "Of the prompt tokens, those the "
                                          "provider read from its prompt cache."),
    "funnel_cache_write_tokens_total": ("counter", "Of the prompt tokens, those the "
                                        "provider wrote to its prompt cache."),
    "funnel_conversions_total": ("counter", "Orders recorded against a session (not replays)."),
    "funnel_retention_runs_total": ("counter", "Scheduled retention purges, by outcome (done, "
                                    "skipped: another worker had it, failed)."),
    "funnel_retention_purged_total": ("counter", "Sessions the scheduled purge deleted or "
                                      "anonymized."),
    "funnel_turns_in_flight": ("gauge", "Turns running (or waiting for their session)."),
    "funnel_turns_queued": ("gauge", "Accepted Telegram messages waiting behind an earlier "
                            "message of the same session."),
    "funnel_outbox_backlog": ("gauge", "Outbox rows not delivered yet (given-up rows aside)."),
    "funnel_outbox_oldest_due_seconds": ("gauge", "How long the oldest undelivered outbox "
                                         "row has been due, in seconds."),
    "funnel_reloads_total": ("counter", "Hot reloads of a funnel's files, by result (applied, "
                             "refused: the running version stayed)."),
    "funnel_versions_loaded": ("gauge", "Worker processes that hold a funnel version (new "
                               "sessions run on the newest)."),
    "funnel_open_sessions": ("gauge", "Sessions not in a final stage with a message within the "
                             "session TTL, by the funnel version they last ran on."),
}
# Gauges that measure the shared database: every worker sees the same value.
_SHARED_GAUGES = ("funnel_outbox_backlog", "funnel_outbox_oldest_due_seconds",
                  "funnel_open_sessions")
_REFUSALS = ("unauthorized", "forbidden", "rate_limited", "too_large", "bad_request",
             "unavailable", "session_busy", "busy", "internal", "invalid_order", "conflict")


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
        self.gauges: dict[tuple[str, Labels], float] = {}
        self.turns_in_flight = 0
        self.queued: Callable[[], int] = lambda: 0  # set by the service

    def declare(self, funnel: str, stages: Iterable[str], telegram: bool) -> None:
        """Make the funnel's counters exist from the start, at zero (a rate over a series
        that appears at its first event misses that event)."""
        for stage in stages:
            for name in ("funnel_turns_total", "funnel_fallbacks_total",
                         "funnel_model_errors_total", "funnel_validation_failures_total"):
                self.counters.setdefault((name, _labels(funnel=funnel, stage=stage)), 0.0)
        for reason in _REFUSALS:
            self.counters.setdefault(("funnel_requests_refused_total",
                                      _labels(funnel=funnel, reason=reason)), 0.0)
        for result in ("applied", "refused"):
            self.counters.setdefault(("funnel_reloads_total",
                                      _labels(funnel=funnel, result=result)), 0.0)
        for kind in ("prompt", "completion"):
            self.counters.setdefault(("funnel_tokens_total", _labels(funnel=funnel, kind=kind)),
                                     0.0)
        for name in ("funnel_cached_prompt_tokens_total", "funnel_cache_write_tokens_total"):
            self.counters.setdefault((name, _labels(funnel=funnel)), 0.0)
        for channel in ("api", "web", *(("telegram",) if telegram else ())):
            self.counters.setdefault(("funnel_replays_total",
                                      _labels(funnel=funnel, channel=channel)), 0.0)
        if telegram:
            for name in ("funnel_telegram_send_errors_total",
                         "funnel_telegram_replies_delivered_total",
                         "funnel_telegram_unreachable_total"):
                self.counters.setdefault((name, _labels(funnel=funnel)), 0.0)
            self.counters.setdefault(("funnel_inbound_recovered_total",
                                      _labels(funnel=funnel, channel="telegram")), 0.0)
        for name in ("funnel_outbox_backlog", "funnel_outbox_oldest_due_seconds"):
            self.gauges.setdefault((name, _labels(funnel=funnel)), 0.0)

    def gauge(self, name: str, value: float, **labels: str) -> None:
        self.gauges[(name, _labels(**labels))] = float(value)
        self.dirty = True

    def drop_gauge(self, name: str, **labels: str) -> None:
        """Remove a gauge's series (a version no longer loaded, no longer open)."""
        if self.gauges.pop((name, _labels(**labels)), None) is not None:
            self.dirty = True

    def version(self, funnel: str, versions: Iterable[int]) -> None:
        """The versions of ``funnel`` this process holds, replacing the previous set."""
        keep = {str(v) for v in versions}
        for name, labels in list(self.gauges):
            tags = dict(labels)
            if name == "funnel_versions_loaded" and tags.get("funnel") == funnel \
                    and tags.get("version") not in keep:
                del self.gauges[(name, labels)]
        for v in keep:
            self.gauges[("funnel_versions_loaded", _labels(funnel=funnel, version=v))] = 1.0
        self.dirty = True

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
        if result.model_seconds:
            self.observe("funnel_model_seconds", result.model_seconds, funnel=funnel,
                         stage=stage)
        self.inc("funnel_tokens_total", result.prompt_tokens, funnel=funnel, kind="prompt")
        self.inc("funnel_tokens_total", result.completion_tokens, funnel=funnel,
                 kind="completion")
        # A counter of its own, not a third kind: the kinds of funnel_tokens_total add up
        # to the tokens billed, and cached tokens are already among the prompt's.
        self.inc("funnel_cached_prompt_tokens_total", result.cached_prompt_tokens,
                 funnel=funnel)
        self.inc("funnel_cache_write_tokens_total", result.cache_write_tokens, funnel=funnel)
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
                               for (n, lb), h in self.histograms.items()],
                "gauges": [[n, list(map(list, lb)), v] for (n, lb), v in self._gauges().items()]}

    def _gauges(self) -> dict[tuple[str, Labels], float]:
        gauges = dict(self.gauges)
        gauges[("funnel_turns_in_flight", ())] = float(self.turns_in_flight)
        gauges[("funnel_turns_queued", ())] = float(self.queued())
        return gauges

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
        gauges = self._gauges()
        for snap in self._others():
            for name, labels, value in snap.get("gauges", []):
                key = (name, tuple((str(a), str(b)) for a, b in labels))
                if name in _SHARED_GAUGES:  # the same database, seen by every worker
                    gauges[key] = max(gauges.get(key, 0.0), float(value))
                else:
                    gauges[key] = gauges.get(key, 0.0) + float(value)
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
            if kind in ("counter", "gauge"):
                for (n, labels), value in sorted((counters if kind == "counter"
                                                  else gauges).items()):
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
