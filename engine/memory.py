"""Conversation memory in tiers, all scoped to one session.

1. Storage: the message log and the state row (PostgreSQL).
2. Recent messages: the last N messages (``memory.window``, per stage),
   applied in SQL, oldest first.
3. Rolling summary: messages that leave the window are folded into the
   funnel's summary field (``memory.summary``, e.g. ``conversation_summary``)
   by a summarizer, kept under ``memory.summary_budget`` tokens. It runs in the
   background after the reply; a failure never fails a turn, and the next
   turn's job catches up from where the last one stopped (``summary_upto``).
4. Semantic recall: left out on purpose. The state row already holds the
   facts a sales funnel needs; recall over old messages would add an
   embedding model and pgvector for little gain here.

Prompt budgets (``memory.prompt_budget``) live in :mod:`engine.budget`: the
window goes first, then the summary, the notices, and the state is compacted;
the stage instructions never are cut. The summary, being customer-derived,
reaches the model in a delimited data message, never in the system message.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .chat import Message
from .models import ModelRequest, make_model
from .sanitize import printable
from .spec import FunnelSpec, ModelSettings
from .store import Store

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

    Used with the scripted model and whenever no ``memory.summarizer_model``
    is set; it calls no model, so its cost is zero and its output predictable.
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


class ModelSummarizer:
    """Summarizes with a model (its own setting, so a cheap model can do it)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    async def summarize(self, previous: str, messages: Sequence[Message], budget: int) -> str:
        transcript = "\n".join(f"{m.role}: {m.content}" for m in messages)
        prompt = (
            f"Update the running summary of a sales conversation. Keep facts the customer "
            f"stated, products discussed, doubts and decisions; at most {budget * 3 // 4} words."
            f"\n\nSummary so far:\n{previous or '(none)'}\n\nNew messages:\n{transcript}\n\n"
            'Answer with JSON: {"summary": "..."}'
        )
        request = ModelRequest(
            messages=[{"role": "user", "content": prompt}],
            schema={"type": "object", "required": ["summary"],
                    "properties": {"summary": {"type": "string"}}},
            stage="summary", settings=ModelSettings(name=getattr(self.model, "name", "")),
            session_id="", turn=0, user_text="")
        completion = await self.model.complete(request)
        try:
            text = str(json.loads(completion.text)["summary"])
        except (ValueError, KeyError, TypeError):
            text = completion.text
        # The summary is stored as text and shown to the model: the model's own output,
        # it crosses the same boundary (no NUL or control characters reach PostgreSQL).
        return _clip(printable(text.strip()), budget)


class RollingSummary:
    """Tier 3 for one funnel: decides when to fold, folds, and stores the summary."""

    def __init__(self, spec: FunnelSpec, store: Store, window: int,
                 summarizer: Summarizer | None = None, *, api_base: str | None = None) -> None:
        self.spec = spec
        self.store = store
        self.window = window
        self._summarizer = summarizer
        # The summarizer model calls the funnel's endpoint unless it is given its own.
        self.api_base = api_base if api_base is not None else spec.model.api_base

    @property
    def summarizer(self) -> Summarizer:
        if self._summarizer is None:
            name = self.spec.memory.summarizer_model
            self._summarizer = ModelSummarizer(make_model(
                name, api_base=self.spec.memory.summarizer_api_base or self.api_base)) \
                if name else \
                ExtractiveSummarizer()
        return self._summarizer

    @summarizer.setter
    def summarizer(self, value: Summarizer) -> None:
        self._summarizer = value

    def plan(self, state: Mapping[str, Any], row: Mapping[str, Any] | None,
             recent: list[Message], backlog: int) -> SummaryJob | None:
        """Whether this turn folds old messages into the summary, and which.

        The turn read up to three windows of messages; once a window's worth has left
        the window unsummarized, the job gets them directly, with no extra query.
        """
        field = self.spec.memory.summary
        if not field or row is None or backlog < max(2, self.window):
            return None
        upto = int(row.get("summary_upto") or 0)
        complete = len(recent) < 3 * self.window or (recent and recent[0].id <= upto)
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
        new = await self.summarizer.summarize(summary, messages,
                                              self.spec.memory.summary_budget)
        return new, messages[-1].id

    async def run(self, session_id: str, job: SummaryJob = (None, 0, None)) -> bool:
        """The background job: fold and store under the session's lock. Never raises: a
        failure is logged and the next turn's job starts again from ``summary_upto``.
        Returns whether a new summary was stored."""
        summary, upto, messages = job
        try:
            if summary is None or not messages:
                # Catching up (the turn did not have every message at hand): read the log.
                summary, upto, rows = await self.store.summary_backlog(
                    self.spec, session_id, self.window)
                messages = [Message(m.role, m.content, i) for i, m in rows]
            if not messages:
                return False
            new = await self.summarizer.summarize(summary, messages,
                                                  self.spec.memory.summary_budget)
            return await self.store.save_summary(self.spec, session_id, new, upto,
                                                 messages[-1].id)
        except Exception as exc:  # the customer's turn already succeeded
            log.warning("summary of session %r failed (%s: %s); it will catch up on the "
                        "next turn", session_id, type(exc).__name__, exc)
            return False
