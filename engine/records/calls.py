"""One HTTP call to a model, as a turn record lists it (``funnel_turns.calls``).

A turn's model time, tokens and cost are the sums over every call it made: the
answered ones, and those that timed out, failed or were refused before a retry, a
fallback model or the repair call answered. :mod:`engine.llm.client` makes them; the
turn record (``engine.turn.data.turn_record``) lists them and sums them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["OUTCOMES", "Call", "listed"]

# ok: the call answered; timeout: cut by its timeout or the turn's deadline; refused: the
# server refused the request's structured output or streaming, or its response was not
# read to the end (too large); error: any other failure (HTTP 429/5xx, connection, key).
OUTCOMES = ("ok", "timeout", "error", "refused")


@dataclass(frozen=True)
class Call:
    """One HTTP call.

    Attributes:
        model: the litellm model string called.
        outcome: one of :data:`OUTCOMES`.
        ms: how long the call took (a wait before a retry is not part of it).
        prompt_tokens: what it sent, by the provider's usage; or counted by the engine.
        completion_tokens: what it answered, likewise (0 for a call that gave no answer).
        tokens_counted: the tokens were counted by the engine (the model's tokenizer, else
            the 4-characters estimate), not reported by the provider: it returned no
            usage, or the call gave no answer (a timeout was sent and read all the same).
        cost: litellm's price of those tokens; None when its price map lacks the model.
    """

    model: str
    outcome: str
    ms: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens_counted: bool = False
    cost: float | None = None

    def entry(self, attempt: int, repair: bool) -> dict[str, Any]:
        """The call as a ``funnel_turns.calls`` entry; ``attempt`` counts the turn's calls
        from 1, ``repair`` says it asked again after a rejected answer."""
        return {"attempt": attempt, "model": self.model, "outcome": self.outcome,
                "repair": repair, "ms": round(self.ms), "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "tokens_counted": self.tokens_counted,
                "cost": round(self.cost, 8) if self.cost is not None else None}


def listed(groups: Iterable[tuple[Iterable[Call], bool]]) -> list[dict[str, Any]]:
    """The entries of ``groups`` (each: its calls, and whether they were the repair's),
    numbered in order."""
    out: list[dict[str, Any]] = []
    for calls, repair in groups:
        for call in calls:
            out.append(call.entry(len(out) + 1, repair))
    return out
