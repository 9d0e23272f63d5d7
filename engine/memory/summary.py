"""Conversation memory in tiers, all scoped to one session.

1. Storage: the message log and the state row (PostgreSQL).
2. Recent messages: the last N messages (``memory.window``, per stage),
   applied in SQL, oldest first.
3. Summary of older messages, in the funnel's summary field (``memory.summary``,
   e.g. ``conversation_summary``), written in the background after the reply; a
   failure never fails a turn, and the next turn's job catches up from where the
   last one stopped (``summary_upto``). Two kinds:

   * observational memory (seed 002's tier 3), with a real model: once the
     messages that left the window unobserved pass ``memory.observe_after`` tokens, the
     observer appends dated observations, one a line; when the list would pass
     ``memory.observation_budget``, the reflector condenses it. The block is
     append-only between reflections, so providers' prompt caches keep hitting;
   * the extractive summary, offline (the scripted model): a clipped transcript
     of the messages that left the window, under ``memory.summary_budget``.
4. Semantic recall (``memory.recall``, off by default): the session's past messages
   most like the current one, outside the window, with their neighbours
   (:mod:`engine.memory.recall`).

Prompt budgets (``memory.prompt_budget``) live in :mod:`engine.turn.budget`: the
window goes first, then the summary, the notices, and the state is compacted;
the stage instructions never are cut. The summary, being customer-derived,
reaches the model in a delimited data message, never in the system message.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from ..format.spec import FunnelSpec
from ..llm.models import LiteLLMModel, Model, make_model
from ..records.messages import Message, estimate_tokens
from ..store import Store
from .observations import ModelSummarizer as ModelSummarizer

# (summary so far, summary_upto, messages to fold); (None, 0, None): read them from the log.
SummaryJob = tuple[str | None, int, list[Message] | None]

log = logging.getLogger("funnel.memory")


class Summarizer(Protocol):
    """Folds messages into a running summary of at most ``budget`` tokens."""

    async def summarize(self, previous: str, messages: Sequence[Message], budget: int) -> str: ...


def _clip(text: str, budget: int) -> str:
    """Keep the newest part of ``text`` within ``budget`` tokens (4 characters a token)."""
    limit = budget * 4
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    return "…" + cut[cut.find(" ") + 1:] if " " in cut else "…" + cut


class ExtractiveSummarizer:
    """The offline summarizer: a compact transcript of the older messages, newest kept.

    Used with the scripted model when no ``memory.summarizer_model`` is set (and
    by ``funnel test``); it calls no model, so its cost is zero and its output
    predictable. It folds by message count and rewrites its text each fold.
    Being instant, it runs inside the turn (``inline``) and its result is saved
    with the turn's own statement: no extra round trip, no extra lock.
    """

    inline = True

    async def summarize(self, previous: str, messages: Sequence[Message], budget: int) -> str:
        lines = [previous] if previous else []
        for m in messages:
            who = "Customer" if m.role == "user" else "You"
            text = " ".join(m.content.split())
            lines.append(f"{who}: {text[:160]}")
        return _clip(" | ".join(lines), budget)


class RollingSummary:
    """Tier 3 for one funnel: decides when to fold, folds, and stores the summary.

    The summarizer: ``memory.summarizer_model`` when set; else, when the engine's
    model is a real (litellm) model, that model, at its endpoint: both write
    observational memory (:class:`ModelSummarizer`). With the scripted model, the
    offline :class:`ExtractiveSummarizer`.
    """

    def __init__(self, spec: FunnelSpec, store: Store, window: int,
                 summarizer: Summarizer | None = None, *, api_base: str | None = None,
                 model: Model | None = None,
                 clock: Callable[[], datetime] | None = None) -> None:
        self.spec = spec
        self.store = store
        self.window = window
        self._summarizer = summarizer
        self.model = model
        self.clock = clock
        self._running: set[str] = set()  # sessions with a fold in flight
        # The summarizer model calls the funnel's endpoint unless it is given its own.
        self.api_base = api_base if api_base is not None else spec.model.api_base

    @property
    def summarizer(self) -> Summarizer:
        if self._summarizer is None:
            memory = self.spec.memory
            # The funnel's timeout, retries and deadline; no fallback models: a failed
            # background fold is simply tried again on the next turn.
            settings = dataclasses.replace(self.spec.model, fallbacks=())
            if memory.summarizer_model:
                self._summarizer = ModelSummarizer(make_model(
                    memory.summarizer_model,
                    api_base=memory.summarizer_api_base or self.api_base),
                    dataclasses.replace(settings, name=memory.summarizer_model), self.clock)
            elif isinstance(self.model, LiteLLMModel):
                # The funnel's own model, at its own endpoint (or the summarizer's).
                base = memory.summarizer_api_base or self.model.api_base or self.api_base
                self._summarizer = ModelSummarizer(
                    LiteLLMModel(self.model.name, api_base=base),
                    dataclasses.replace(settings, name=self.model.name), self.clock)
            else:
                self._summarizer = ExtractiveSummarizer()
        return self._summarizer

    @summarizer.setter
    def summarizer(self, value: Summarizer) -> None:
        self._summarizer = value

    @property
    def observational(self) -> bool:
        """Whether the summary is an observation list (folded by tokens, append-only)."""
        return bool(getattr(self.summarizer, "observational", False))

    @property
    def budget(self) -> int:
        memory = self.spec.memory
        return memory.observation_budget if self.observational else memory.summary_budget

    def history(self, recent: list[Message], row: Mapping[str, Any] | None,
                window: int) -> list[Message]:
        """The messages the prompt shows: the last ``window``; with observational memory,
        also the older ones not observed yet (the seed's raw message block), so that no
        message is out of the model's sight between leaving the window and being observed.
        The prompt budget still drops the oldest first."""
        if not window:
            return []
        if not (self.observational and self.spec.memory.summary and row is not None):
            return recent[-window:]
        upto = int(row.get("summary_upto") or 0)
        unobserved = sum(1 for m in recent if m.id > upto)
        return recent[-max(window, unobserved):]

    def plan(self, state: Mapping[str, Any], row: Mapping[str, Any] | None,
             recent: list[Message], backlog: int, text: str = "",
             crowded: bool = False) -> SummaryJob | None:
        """Whether this turn folds old messages into the summary, and which.

        The extractive summary folds once a window's worth of messages has left the
        window; observational memory once the messages that left the window and are not
        observed yet pass ``memory.observe_after`` tokens (``text`` is not counted). The turn
        read up to three windows of messages: the job gets the ones to fold directly,
        with no extra query; when all of those are unsummarized, it reads the log.
        """
        field = self.spec.memory.summary
        if not field or row is None:
            return None
        upto = int(row.get("summary_upto") or 0)
        complete = len(recent) < 3 * self.window or (recent and recent[0].id <= upto)
        if self.observational:
            if not complete:  # more unobserved messages than the turn reads: fold them now
                return (None, 0, None)
            # The threshold counts the messages that left the window unobserved (tier 2
            # holds the rest): counting the window too would fold on every turn once the
            # window alone passes it, one observer call per turn.
            left = [m for m in recent[:-self.window] if m.id > upto] if self.window else []
            tokens = estimate_tokens([{"content": m.content} for m in left])
            if not left or (tokens < self.spec.memory.observe_after and not crowded):
                return None
        elif backlog < max(2, self.window):
            return None
        if not complete:
            return (None, 0, None)  # too far behind (a summarizer was down): read the log
        older = [m for m in recent[:-self.window] if m.id > upto] if self.window else []
        return (str(state.get(field) or ""), upto, older) if older else None

    async def fold_now(self, job: SummaryJob) -> tuple[str, int] | None:
        """Fold inside the turn when the summarizer is instant (``inline``): the result is
        saved with the turn's own statement. Returns (summary, last id) or None."""
        summary, _, messages = job
        if summary is None or not messages or not getattr(self.summarizer, "inline", False):
            return None
        new = await self.summarizer.summarize(summary, messages, self.budget)
        return new, messages[-1].id

    async def run(self, session_id: str, job: SummaryJob = (None, 0, None)) -> bool:
        """The background job: fold and store under the session's lock. Never raises: a
        failure is logged and the next turn's job starts again from ``summary_upto``.
        Returns whether a new summary was stored.

        One fold of a session at a time in this engine: a job that finds another in
        flight leaves (its model call would lose the compare-and-set anyway), and the
        next turn's job takes what is left."""
        if session_id in self._running:
            return False
        self._running.add(session_id)
        try:
            return await self._fold(session_id, job)
        finally:
            self._running.discard(session_id)

    async def _fold(self, session_id: str, job: SummaryJob) -> bool:
        summary, upto, messages = job
        try:
            if summary is None or not messages:
                # Catching up (the turn did not have every message at hand): read the log.
                summary, upto, rows = await self.store.summary_backlog(
                    self.spec, session_id, self.window)
                messages = [Message(m.role, m.content, i) for i, m in rows]
            if not messages:
                return False
            new = await self.summarizer.summarize(summary, messages, self.budget)
            return await self.store.save_summary(self.spec, session_id, new, upto,
                                                 messages[-1].id)
        except Exception as exc:  # the customer's turn already succeeded
            log.warning("summary of session %r failed (%s: %s); it will catch up on the "
                        "next turn", session_id, type(exc).__name__, exc)
            return False
