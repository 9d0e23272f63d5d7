"""The service's counters, gauges and histograms, kept and shown by ``prometheus_client``.

One process: each :class:`Metrics` has a registry of its own (tests run several
services in one process), and ``/metrics`` is that registry's exposition.

Several workers (``funnel serve --workers N``): prometheus_client's multiprocess mode.
Every worker writes each value, as it changes, to memory-mapped files in
``PROMETHEUS_MULTIPROC_DIR``; ``/metrics``, whichever worker answers it, reads every
worker's files (``MultiProcessCollector``) and adds them up: counters and histograms
summed, each gauge as its :data:`GAUGE_MODES` says. The library chooses the mode when it
is first imported, from the environment, so the folder must be set before the worker
starts: ``funnel serve`` sets it for its workers (``FUNNEL_METRICS_DIR`` names it, or a
temporary folder) and empties it first; a worker that exits takes its live gauges with
it (``mark_process_dead``), its counts stay.

Series stay bounded: every label value comes from the funnels' files (funnel, stage,
version) or from the engine's own words (reason, kind, outcome...); a request for an
unknown funnel is a 404 and counted nowhere (engine.service.handlers).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    values,
)
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from ..errors import ConfigError
from ..format.spec import FunnelSpec
from ..turn.engine import TurnResult

# No `<name>_created` series: the dashboards' contract (tests/data/metrics_contract.json)
# has none, and multiprocess mode writes none either, so both modes show the same names.
disable_created_metrics()  # type: ignore[no-untyped-call]

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
    "funnel_reply_claims_refused_total": ("counter", "Claims in the model's replies that "
                                          "the catalog and the state do not back (a price, a "
                                          "discount, a product, a promise), by kind: the "
                                          "reply was repaired or replaced, never sent."),
    "funnel_follow_ups_total": ("counter", "Follow-ups to customers who went quiet, by "
                                "stage and outcome: sent, cancelled (the customer wrote, a "
                                "manager holds the session, it moved on...), refused (its "
                                "claims nothing backs, or the model's failed with no `text` "
                                "to fall back on): nothing was sent."),
    "funnel_actions_refused_total": ("counter", "Actions the model asked for and code "
                                     "refused (not allowed in the stage, an unknown SKU, "
                                     "...): the reply and the rest of the answer were kept."),
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

# Each metric's label names, sorted: the exposition shows them in this order, as it did
# when the engine wrote it by hand (dashboards match on the whole line in places).
_STAGE = ("funnel", "stage")
LABELS: dict[str, tuple[str, ...]] = {
    "funnel_turns_total": _STAGE, "funnel_turn_duration_seconds": _STAGE,
    "funnel_model_errors_total": _STAGE, "funnel_validation_failures_total": _STAGE,
    "funnel_fallbacks_total": _STAGE, "funnel_handoffs_total": _STAGE,
    "funnel_model_seconds": _STAGE,
    "funnel_stage_transitions_total": ("from_stage", "funnel", "to_stage"),
    "funnel_requests_refused_total": ("funnel", "reason"),
    "funnel_telegram_updates_total": ("funnel", "kind"),
    "funnel_replays_total": ("channel", "funnel"),
    "funnel_inbound_recovered_total": ("channel", "funnel"),
    "funnel_tokens_total": ("funnel", "kind"),
    "funnel_facts_refused_total": ("claim", "funnel", "kind"),
    "funnel_actions_refused_total": ("action", "funnel", "stage"),
    "funnel_reply_claims_refused_total": ("funnel", "kind", "stage"),
    "funnel_follow_ups_total": ("funnel", "outcome", "stage"),
    "funnel_retention_runs_total": ("funnel", "outcome"),
    "funnel_reloads_total": ("funnel", "result"),
    "funnel_versions_loaded": ("funnel", "version"),
    "funnel_open_sessions": ("funnel", "version"),
    "funnel_turns_in_flight": (), "funnel_turns_queued": (),
}

GaugeMode = Literal["livesum", "livemostrecent"]
# How the workers' values of a gauge make the service's (multiprocess mode): the turns a
# worker runs and the versions it holds add up; the gauges that measure the shared
# database are the same figure seen by every worker, so the latest measurement wins.
# "live": a worker that exited counts no more.
GAUGE_MODES: dict[str, GaugeMode] = {
    "funnel_turns_in_flight": "livesum", "funnel_turns_queued": "livesum",
    "funnel_versions_loaded": "livesum",
    "funnel_outbox_backlog": "livemostrecent", "funnel_outbox_oldest_due_seconds":
        "livemostrecent", "funnel_open_sessions": "livemostrecent",
}

# The outcomes of a scheduler pass counted (engine.turn.follow_up.run_due); a deferred
# or skipped step is not an outcome yet.
FOLLOW_UP_OUTCOMES = ("sent", "cancelled", "refused")
_REFUSALS = ("unauthorized", "forbidden", "rate_limited", "too_large", "bad_request",
             "unavailable", "session_busy", "busy", "internal", "invalid_order", "conflict")

Family = Counter | Gauge | Histogram


def follow_up_stages(spec: FunnelSpec) -> list[str]:
    """The stages of ``spec`` that have follow-ups (their own or the funnel's default)."""
    return [s for s in spec.stages if spec.follow_up_of(s) is not None]


def multiprocess() -> bool:
    """Whether prometheus_client runs in multiprocess mode in this process (it decided
    when it was imported: ``PROMETHEUS_MULTIPROC_DIR`` was set)."""
    return bool(getattr(values.ValueClass, "_multiprocess", False))


class Metrics:
    """The service's metrics in this process; :meth:`render` shows every worker's.

    Args:
        directory: the workers' shared folder (``PROMETHEUS_MULTIPROC_DIR``), or ``None``
            for one process. It must be the folder prometheus_client found in the
            environment when it was imported.

    Raises:
        ConfigError: ``directory`` is given but the process did not start with
            ``PROMETHEUS_MULTIPROC_DIR`` naming it.
    """

    def __init__(self, directory: str | None = None) -> None:
        env_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if directory and (not multiprocess() or not env_dir
                          or os.path.realpath(env_dir) != os.path.realpath(directory)):
            raise ConfigError(
                f"metrics folder {directory!r}: the workers share their metrics through "
                "prometheus_client's multiprocess mode, which needs PROMETHEUS_MULTIPROC_DIR "
                f"set to that folder before the process starts (found {env_dir!r}); "
                "`funnel serve --workers N` sets it, or export it yourself")
        self.directory = directory or (env_dir if multiprocess() else None)
        self.registry = CollectorRegistry(auto_describe=True)
        self._families: dict[str, Family] = {}
        for name, (kind, text) in HELP.items():
            labels = LABELS.get(name, ("funnel",))
            family: Family
            if kind == "counter":
                family = Counter(name, text, labels, registry=self.registry)
            elif kind == "histogram":
                family = Histogram(name, text, labels, buckets=BUCKETS, registry=self.registry)
            else:
                family = Gauge(name, text, labels, registry=self.registry,
                               multiprocess_mode=GAUGE_MODES[name])
            self._families[name] = family
        self._versions: dict[str, set[str]] = {}
        self._declared: set[str] = set()
        self.queued: Callable[[], int] = lambda: 0  # set by the service
        self._gauge("funnel_turns_in_flight").set(0)
        self._gauge("funnel_turns_queued").set(0)

    def _gauge(self, name: str, **labels: str) -> Gauge:
        family = self._families[name]
        assert isinstance(family, Gauge), name
        return family.labels(**labels) if labels else family

    def declare(self, funnel: str, stages: Iterable[str], telegram: bool,
                follow_ups: Iterable[str] = ()) -> None:
        """Make the funnel's counters exist from the start, at zero (a rate over a series
        that appears at its first event misses that event). ``follow_ups``: the stages
        that have follow-ups."""
        for stage in follow_ups:
            for outcome in FOLLOW_UP_OUTCOMES:
                self.inc("funnel_follow_ups_total", 0, funnel=funnel, stage=stage,
                         outcome=outcome)
        for stage in stages:
            for name in ("funnel_turns_total", "funnel_fallbacks_total",
                         "funnel_model_errors_total", "funnel_validation_failures_total"):
                self.inc(name, 0, funnel=funnel, stage=stage)
        for reason in _REFUSALS:
            self.inc("funnel_requests_refused_total", 0, funnel=funnel, reason=reason)
        for result in ("applied", "refused"):
            self.inc("funnel_reloads_total", 0, funnel=funnel, result=result)
        for kind in ("prompt", "completion"):
            self.inc("funnel_tokens_total", 0, funnel=funnel, kind=kind)
        for name in ("funnel_cached_prompt_tokens_total", "funnel_cache_write_tokens_total"):
            self.inc(name, 0, funnel=funnel)
        for channel in ("api", "web", *(("telegram",) if telegram else ())):
            self.inc("funnel_replays_total", 0, funnel=funnel, channel=channel)
        if telegram:
            for name in ("funnel_telegram_send_errors_total",
                         "funnel_telegram_replies_delivered_total",
                         "funnel_telegram_unreachable_total"):
                self.inc(name, 0, funnel=funnel)
            self.inc("funnel_inbound_recovered_total", 0, funnel=funnel, channel="telegram")
        if funnel not in self._declared:  # a reload declares again: keep the measurement
            self._declared.add(funnel)
            for name in ("funnel_outbox_backlog", "funnel_outbox_oldest_due_seconds"):
                self.gauge(name, 0, funnel=funnel)

    # -- gauges ------------------------------------------------------------------------
    def gauge(self, name: str, value: float, **labels: str) -> None:
        """Set a gauge's series."""
        self._gauge(name, **labels).set(value)

    def drop_gauge(self, name: str, **labels: str) -> None:
        """Remove a gauge's series (a version no longer loaded, no longer open).

        Multiprocess mode cannot remove a series from the workers' files
        (prometheus_client has no removal there): the series is set to 0 instead, which
        is what it now measures (no worker holds the version, no session is open on it).
        """
        family = self._families[name]
        assert isinstance(family, Gauge), name
        key = tuple(labels[n] for n in LABELS[name])
        if self.directory is not None:
            family.labels(*key).set(0)
        else:
            family.remove(*key)

    def version(self, funnel: str, versions: Iterable[int]) -> None:
        """The versions of ``funnel`` this process holds, replacing the previous set."""
        keep = {str(v) for v in versions}
        for v in self._versions.get(funnel, set()) - keep:
            self.drop_gauge("funnel_versions_loaded", funnel=funnel, version=v)
        for v in keep:
            self.gauge("funnel_versions_loaded", 1, funnel=funnel, version=v)
        self._versions[funnel] = keep

    def in_flight(self, delta: int) -> None:
        """A turn started (``+1``) or ended (``-1``) in this process."""
        self._gauge("funnel_turns_in_flight").inc(delta)

    # -- recording ---------------------------------------------------------------------
    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        """Add ``value`` to a counter's series (``0`` makes it exist)."""
        family = self._families[name]
        assert isinstance(family, Counter), name
        (family.labels(**labels) if labels else family).inc(value)

    def count(self, name: str, **labels: str) -> None:
        """Add one to a counter's series."""
        self.inc(name, 1.0, **labels)

    def follow_ups(self, funnel: str, done: Iterable[Mapping[str, Any]]) -> None:
        """Count the outcomes of a follow-up scheduler pass (engine.turn.follow_up.run_due):
        stages come from the funnel's file, outcomes from the engine's words."""
        for entry in done:
            outcome = str(entry.get("outcome"))
            if outcome in FOLLOW_UP_OUTCOMES and entry.get("why") != "sent before":
                self.count("funnel_follow_ups_total", funnel=funnel,
                           stage=str(entry.get("stage")), outcome=outcome)

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        """Count an observation in a histogram's series."""
        family = self._families[name]
        assert isinstance(family, Histogram), name
        family.labels(**labels).observe(seconds)

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

    def refused(self, funnel: str, reason: str) -> None:
        """Count a request refused before its turn."""
        self.inc("funnel_requests_refused_total", funnel=funnel, reason=reason)

    # -- reading -----------------------------------------------------------------------
    def value(self, sample: str, **labels: str) -> float:
        """This process's value of one sample (a counter's ``<name>_total``, a gauge,
        a histogram's ``<name>_count`` or ``_sum``); 0 for a series that does not exist.
        Other workers' counts are in :meth:`render` only."""
        self.flush()
        found = self.registry.get_sample_value(sample, labels)
        return 0.0 if found is None else found

    def flush(self) -> None:
        """Write the values read from a callable (the Telegram queue) into their gauge:
        the service calls it once a second with several workers, so that the others see
        it; one process does it at every :meth:`render`."""
        self._gauge("funnel_turns_queued").set(self.queued())

    def close(self) -> None:
        """This worker is stopping: its live gauges leave the shared folder with it (its
        counts stay: the service's totals do not drop when a worker is replaced)."""
        if self.directory is not None:
            mark_process_dead(os.getpid(), self.directory)  # type: ignore[no-untyped-call]

    # -- exposition --------------------------------------------------------------------
    def render(self, funnels: frozenset[str] | None = None) -> str:
        """Every worker's metrics in the Prometheus text exposition format 0.0.4."""
        self.flush()
        if self.directory is None:
            text = generate_latest(self.registry).decode("utf-8")
        else:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=self.directory)  # type: ignore[no-untyped-call]
            text = generate_latest(registry).decode("utf-8")
        return text if funnels is None else only_funnels(text, funnels)


# A sample line's `funnel` label. Label values escape `"` and `\\`; a funnel's name has
# neither (engine.format.names), so the value is compared as written.
_FUNNEL_LABEL = re.compile(r'[{,]funnel="((?:[^"\\]|\\.)*)"')


def only_funnels(text: str, funnels: frozenset[str]) -> str:
    """The exposition without the samples of other funnels (an API key limited to
    ``funnels``); samples without a ``funnel`` label (the process's own) stay."""
    kept = []
    for line in text.splitlines(keepends=True):
        labels = line[:line.rfind("}") + 1] if not line.startswith("#") else ""
        found = _FUNNEL_LABEL.search(labels) if labels else None
        if found is None or found.group(1) in funnels:
            kept.append(line)
    return "".join(kept)
