"""What-if: after each clean save, what the edit would have done to the last days' sessions.

A clean save (engine.studio.watch) calls :meth:`WhatIf.start` with the funnel as saved.
After a short settle (a burst of saves starts one replay, not one per save) it reads the
customers' sessions with a turn in the last ``days`` (the most recent ``max_sessions``
of them; the studio's playground sessions never count) and replays them on the edit
with `funnel replay`'s own entry point (:func:`engine.evidence.replay.replay`, its
default baseline: each session's version from the version store), so that its counts
are those of ``funnel replay EDITED --since Nd --format json`` on the same database.

It runs in the background, a few sessions at a time in a worker thread, so that the
page keeps answering; the next save cancels it (its status says ``cancelled``). The
page reads :meth:`WhatIf.status` (``/api/whatif``): the sentence ("this edit changes
34 of 212 sessions: 9 reach presentation earlier"), the share of the changed sessions
whose outcome needs the model to know, and each changed session with its first
difference. Nothing is written anywhere: replay reads in a read-only transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from ..errors import StoreUnavailable, first_line
from ..evidence.compare import SessionDiff
from ..evidence.records import Population, read_bundle, read_copy, read_population
from ..evidence.replay import Replay, base_from, copies_from, replay
from ..format.names import TURNS
from ..funnel.compiled import CompiledFunnel
from ..store.base import Store
from ..store.playground import real_session

__all__ = ["WhatIf", "WhatIfSettings", "summary"]

log = logging.getLogger("funnel.studio")
KEPT = 5  # runs kept per funnel: the latest and the few before it (cancelled, done)
SHOWN = 200  # changed sessions listed (the count is always whole)


@dataclass(frozen=True)
class WhatIfSettings:
    """How much a what-if replays (``funnel studio --what-if-days --what-if-max``)."""

    days: float = 7.0  # the sessions with a turn in the last ``days``
    max_sessions: int = 200  # the most recent of them at most; 0 turns the what-if off
    settle: float = 0.5  # seconds a save waits for the next before it starts
    chunk: int = 20  # sessions per worker-thread call (a cancel waits for one at most)


@dataclass
class Run:
    """One save's what-if."""

    id: int
    funnel: str
    version: int
    status: str = "running"  # running, done, cancelled, failed
    phase: str = "settling"  # running: settling, reading, replaying
    started_at: float = field(default_factory=time.time)
    seconds: float | None = None
    done: int = 0  # sessions replayed so far
    total: int = 0  # sessions to replay
    in_period: int = 0  # sessions in the period (more than ``total`` when capped)
    error: str | None = None
    result: dict[str, Any] | None = None
    task: asyncio.Task[None] | None = None
    worker: asyncio.Future[Replay] | None = None  # the replay's thread, once it started

    def as_json(self) -> dict[str, Any]:
        out = {"id": self.id, "funnel": self.funnel, "version": self.version,
               "status": self.status, "started_at": self.started_at,
               "seconds": self.seconds, "error": self.error}
        if self.status == "running":
            out.update(phase=self.phase, done=self.done, total=self.total)
        if self.result is not None:
            out.update(self.result)
        return out


class WhatIf:
    """The what-ifs of a studio's funnels: the latest run of each, and a few before it."""

    def __init__(self, store: Store, settings: WhatIfSettings | None = None) -> None:
        self.store = store
        self.settings = settings or WhatIfSettings()
        self.runs: dict[str, list[Run]] = {}
        self._ids = itertools.count(1)

    def start(self, funnel: CompiledFunnel) -> None:
        """A clean save of ``funnel``: cancel its running what-if, start another."""
        if self.settings.max_sessions <= 0:
            return
        runs = self.runs.setdefault(funnel.name, [])
        for earlier in runs:
            if earlier.status == "running":
                earlier.status, earlier.seconds = "cancelled", time.time() - earlier.started_at
                if earlier.task is not None:
                    earlier.task.cancel()
        run = Run(next(self._ids), funnel.name, funnel.spec.version)
        run.task = asyncio.get_running_loop().create_task(self._run(run, funnel))
        runs.insert(0, run)
        del runs[KEPT:]

    def status(self, name: str) -> dict[str, Any]:
        """The page's view: the settings, the latest run, the ones before it."""
        runs = self.runs.get(name, [])
        return {"funnel": name,
                "settings": {"days": self.settings.days,
                             "max_sessions": self.settings.max_sessions},
                "run": runs[0].as_json() if runs else None,
                "earlier": [{"id": r.id, "status": r.status, "version": r.version,
                             "started_at": r.started_at} for r in runs[1:]]}

    async def close(self) -> None:
        """Cancel the running what-ifs and wait for their threads (the studio closes)."""
        tasks = [r.task for runs in self.runs.values() for r in runs
                 if r.task is not None and not r.task.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # A cancelled replay's thread ends after its chunk: wait, so its folders go too.
        for runs in self.runs.values():
            for r in runs:
                if r.worker is not None:
                    with contextlib.suppress(Exception):
                        await r.worker

    async def _run(self, run: Run, funnel: CompiledFunnel) -> None:
        try:
            await asyncio.sleep(self.settings.settle)
            run.phase = "reading"
            url: str | None = getattr(self.store, "url", None)
            if url is None:
                raise StoreUnavailable("the what-if reads the sessions from PostgreSQL; "
                                       "this store has none")
            since = timedelta(days=self.settings.days)
            ids, run.in_period = await _recent(self.store, funnel.name,
                                               datetime.now().astimezone() - since,
                                               self.settings.max_sessions)
            run.total = len(ids)
            population = (await asyncio.to_thread(read_population, url, funnel.name,
                                                  sessions=ids)) if ids else Population([])
            run.phase = "replaying"
            result = await self._replay(run, funnel, url, population)
            run.result = summary(result, in_period=run.in_period, days=self.settings.days)
            run.status, run.seconds = "done", time.time() - run.started_at
        except asyncio.CancelledError:
            run.status = "cancelled"  # start() said so already; close() too
            raise
        except Exception as exc:  # the database away, a bug: the page says it, the log too
            if not isinstance(exc, StoreUnavailable):
                log.exception("studio: the what-if of %s failed", funnel.name)
            run.status, run.error = "failed", first_line(exc) or type(exc).__name__
            run.seconds = time.time() - run.started_at

    async def _replay(self, run: Run, funnel: CompiledFunnel, url: str,
                      population: Population) -> Replay:
        """:meth:`_replay_here` in a worker thread; a cancel stops it after its chunk."""
        stop = threading.Event()
        run.worker = asyncio.ensure_future(asyncio.to_thread(
            self._replay_here, run, funnel, url, population, stop))
        try:
            return await asyncio.shield(run.worker)
        except asyncio.CancelledError:
            stop.set()
            raise

    def _replay_here(self, run: Run, funnel: CompiledFunnel, url: str, population: Population,
                     stop: threading.Event) -> Replay:
        """`funnel replay`'s entry point, a chunk of sessions at a time until ``stop``."""
        resolve, loaded, where = base_from(lambda v: read_bundle(url, funnel.name, v),
                                           funnel.name, None)
        # Each session on the copy its turns ran on, as `funnel replay` does (issue 44).
        copy, _ = copies_from(lambda v, h: read_copy(url, funnel.name, v, h), funnel.name,
                              loaded)
        bases: dict[int, CompiledFunnel | str] = {}

        def base(version: int) -> CompiledFunnel | str:  # each version compiled once
            if version not in bases:
                bases[version] = resolve(version)
            return bases[version]

        spec = funnel.spec
        whole = Replay(spec.name, str(spec.path), [], stages=list(spec.stages),
                       handoff_stage=spec.handoff.stage if spec.handoff else None)
        size = max(1, self.settings.chunk)
        try:
            for at in range(0, len(population.sessions), size):
                if stop.is_set():
                    break
                played = replay(funnel, Population(population.sessions[at:at + size]), base,
                                copy=copy)
                whole.diffs += played.diffs
                whole.legacy += played.legacy
                whole.stages += [s for s in played.stages if s not in whole.stages]
                run.done = len(whole.diffs)
        finally:
            for version in loaded:  # the bundles' folders, written by base_from
                if version.folder is not None:
                    version.folder.cleanup()
        whole.versions = dict(where)
        return whole


async def _recent(store: Store, funnel: str, start: datetime, limit: int
                  ) -> tuple[list[str], int]:
    """The ``limit`` customers' sessions of ``funnel`` with the latest turns since
    ``start``, and how many have a turn since then in all."""
    pool = getattr(store, "pool", None)
    if pool is None:
        raise StoreUnavailable("the what-if reads the sessions from PostgreSQL; this store "
                               "has no pool")
    query = sql.SQL(
        "SELECT session_id, count(*) OVER () FROM {} t WHERE funnel = %s AND created_at >= %s "
        "AND {} GROUP BY session_id ORDER BY max(created_at) DESC, session_id LIMIT %s"
    ).format(sql.Identifier(TURNS),
             real_session(sql.Placeholder(), sql.Identifier("t", "session_id")))
    try:
        async with pool.connection() as conn:
            rows = await (await conn.execute(query, (funnel, start, funnel, limit))).fetchall()
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"PostgreSQL did not answer: {first_line(exc)}") from None
    return [str(r[0]) for r in rows], int(rows[0][1]) if rows else 0


def summary(result: Replay, *, in_period: int | None = None, days: float | None = None
            ) -> dict[str, Any]:
    """What the page shows of a replay: its counts (``funnel replay``'s), the sentence,
    the share of the changed sessions that needs the model, and the changed sessions."""
    counts = result.counts()
    n, changed, needs = counts["sessions"], counts["changed"], counts["needs_model"]
    effects: list[tuple[int, str]] = []
    for stage in result.stages:
        gained, lost, earlier = result.reach(stage)
        effects += [(len(earlier), f"{len(earlier)} reach {stage} earlier"),
                    (len(gained), f"{len(gained)} now reach {stage}"),
                    (len(lost), f"{len(lost)} no longer reach {stage}")]
    effects = sorted((e for e in effects if e[0]), key=lambda e: -e[0])[:4]
    of = f"{changed} of {n} sessions" if changed else f"none of the {n} sessions"
    sentence = f"this edit changes {of}" + (
        ": " + ", ".join(t for _, t in effects) if effects else "")
    scope = ""
    if days is not None:
        scope = (f"the {n} most recent of the {in_period} sessions with a turn in the last "
                 if in_period and in_period > n else "the sessions with a turn in the last ")
        scope += f"{days:g} day(s)"
    share = needs / changed if changed else 0.0
    return {"counts": counts, "sentence": sentence, "scope": scope,
            "needs_model": {"sessions": needs, "of": changed, "share": round(share, 4),
                            "text": (f"{needs} of the {changed} changed sessions "
                                     f"({share:.0%}) need the model to know how they end: "
                                     "the recording has no answer for their later turns")
                            if needs else "no changed session needs the model to know"},
            "not_reproduced": [{"session_id": d.session_id, "reason": d.reason}
                               for d in result.of("not_reproduced")][:SHOWN],
            "changed": [_changed(d) for d in result.of("different", "needs_model")][:SHOWN]}


def _changed(d: SessionDiff) -> dict[str, Any]:
    what = [*d.changes, *(e.describe() for e in d.exits)]
    return {"session_id": d.session_id, "status": d.status, "turn": d.turn, "stage": d.stage,
            "what": "; ".join(what) or d.reason or "the outcome differs",
            "needs_model_from_turn": d.needs_model}

