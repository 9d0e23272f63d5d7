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

Prompt budgets: when a stage's rendered prompt exceeds ``memory.prompt_budget``
tokens, the oldest window messages are dropped first, then the summary; the
state and the stage instructions never are. A prompt that still does not fit
raises :class:`engine.errors.PromptTooLarge`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import PromptTooLarge
from .prompts import Message, chat_messages, estimate_tokens

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
        from .models import ModelRequest
        from .spec import ModelSettings

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
        import json

        try:
            text = str(json.loads(completion.text)["summary"])
        except (ValueError, KeyError, TypeError):
            text = completion.text
        return _clip(text.strip(), budget)


@dataclass
class FittedPrompt:
    messages: list[dict[str, str]]
    tokens: int
    dropped_messages: int
    dropped_summary: bool


def fit_prompt(
    stage: str,
    render: Callable[[str], str],
    summary: str,
    history: Sequence[Message],
    text: str,
    budget: int | None,
    count: Callable[[list[dict[str, str]]], int] = estimate_tokens,
) -> FittedPrompt:
    """Build the chat within ``budget`` tokens: drop old window messages, then the summary.

    ``render(summary)`` renders the stage prompt with the given summary.

    Raises:
        PromptTooLarge: even the stage prompt, the state and the message do not fit.
    """
    system = render(summary)
    history = list(history)
    messages = chat_messages(system, history, text)
    tokens = count(messages)
    if budget is None or tokens <= budget:
        return FittedPrompt(messages, tokens, 0, False)
    dropped = 0
    while history and tokens > budget:
        history.pop(0)
        dropped += 1
        messages = chat_messages(system, history, text)
        tokens = count(messages)
    dropped_summary = False
    if tokens > budget and summary:
        system = render("")
        dropped_summary = True
        messages = chat_messages(system, history, text)
        tokens = count(messages)
    if tokens > budget:
        raise PromptTooLarge(stage, tokens, budget)
    return FittedPrompt(messages, tokens, dropped, dropped_summary)
