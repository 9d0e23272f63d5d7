"""The retention purge inside `funnel serve`: no cron job needed.

Every worker runs a :class:`RetentionScheduler`. It wakes up a first time
after ``min(interval, 60)`` seconds (a service redeployed more often than the
interval still purges), then every ``FUNNEL_RETENTION_INTERVAL`` seconds
(default 3600, ``0``: never), and purges each funnel that declares
``retention`` the way `funnel purge` does (deleting, or anonymizing with
``FUNNEL_RETENTION_ANONYMIZE=1``). Of all the workers on one database, one at a
time purges a funnel, and once per interval (engine.store.jobs). Each run logs
one line and counts ``funnel_retention_runs_total{outcome}``; a failure is
logged and the purge is due again at the next wake-up: it never stops the
service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..report.build import since_text
from .core import Service

log = logging.getLogger("funnel.service.retention")
FIRST_WAKE_UP = 60.0


class RetentionScheduler:
    """Wakes up every ``service.config.retention_interval`` seconds and purges."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.interval = service.config.retention_interval
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def start(self) -> RetentionScheduler:
        if self.interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._loop())
        return self

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()  # a purge is one transaction per batch: safe to cut
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        wait = min(self.interval, FIRST_WAKE_UP)
        while not self._stopping.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), wait)
            if self._stopping.is_set():
                return
            await self.run_once()
            wait = self.interval

    async def run_once(self) -> dict[str, str]:
        """Purge every funnel with ``retention`` that is due; funnel -> outcome (``done``,
        ``busy``: another worker purges it, ``not_due``, ``failed``)."""
        service, outcomes = self.service, {}
        anonymize = service.config.retention_anonymize
        for name, engine in list(service.engines.items()):
            spec = engine.spec
            if not spec.retention:
                continue
            try:
                outcome, counts = await engine.store.purge_when_due(
                    spec, spec.retention, self.interval, anonymize=anonymize)
            except Exception as exc:  # the database is down, a table is missing, ...
                outcome, counts = "failed", None
                log.warning("retention purge of funnel %s failed (retried at the next "
                            "wake-up, in %.0f s): %s: %s", name, self.interval,
                            type(exc).__name__, exc)
            outcomes[name] = outcome
            service.metrics.count("funnel_retention_runs_total", funnel=name, outcome=outcome)
            if counts is not None:
                service.metrics.inc("funnel_retention_purged_total", counts["sessions"],
                                    funnel=name)
                log.info("retention purge of funnel %s: %s %d session(s), %d message(s), %d "
                         "turn record(s) idle over %s", name,
                         "anonymized" if anonymize else "deleted", counts["sessions"],
                         counts["messages"], counts["turns"], since_text(spec.retention))
            elif outcome != "failed":
                log.debug("retention purge of funnel %s: %s", name, outcome)
        return outcomes
