"""What a turn carries and what it leaves: the message it answers, the turn in flight
(what the steps of `engine.turn.engine` read and write), its result, and its record."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..boundary.sanitize import printable
from ..format.spec import FunnelSpec, Localized
from ..funnel.actions import ActionOutcome
from ..funnel.compiled import CompiledFunnel
from ..funnel.machine import Firing
from ..memory.summary import SummaryJob
from ..records.calls import Call, listed
from ..records.explanation import compact
from ..records.messages import Message
from ..store import Inbound
from . import language
from .advance import Mover, Position
from .output import Answer
from .stream import ReplyStream

__all__ = ["Incoming", "Turn", "TurnResult", "turn_calls", "turn_record"]


@dataclass
class TurnResult:
    """What one turn did. ``reply`` is what to send the customer."""

    session_id: str
    reply: str
    stage_before: str
    stage_after: str
    state: dict[str, Any]
    transitions: list[dict[str, Any]] = field(default_factory=list)
    actions: list[ActionOutcome] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    validation_failures: int = 0
    repaired: bool = False
    fallback: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Of prompt_tokens, those the provider read from its prompt cache (billed lower).
    cached_prompt_tokens: int = 0
    # Of prompt_tokens, those the provider wrote to its prompt cache (billed higher).
    cache_write_tokens: int = 0
    handoff: bool = False
    returning: bool = False
    error: str | None = None
    backlog: int = 0  # messages that left the window and wait for the summary (at least)
    message_id: int = 0  # the customer's message in the log: the turn's id in the API
    model_seconds: float = 0.0  # time in model calls (first call, repair)
    explain: list[dict[str, Any]] = field(default_factory=list)  # engine.turn.explain, per stage
    # A manager holds the session (engine.turn.manager): the bot logged the message and
    # called no model; ``reply`` is the funnel's holding reply, or empty.
    held: bool = False
    # The stage a move into which waits for a manager's approval (engine.turn.approval).
    approval: str | None = None
    recalled: list[int] = field(default_factory=list)  # messages semantic recall showed
    # The model's claims refused this turn, as (kind, name): ("ungrounded", a grounded
    # field's path, array indices as ``[]``) or ("unconfirmed", an action): declared names.
    refused_claims: list[tuple[str, str]] = field(default_factory=list)
    # What the model's replies claimed that the catalog and the state do not back
    # (engine.claims): ``{kind, name, text, expected, attempt}`` each; a refused reply was
    # repaired or replaced by the fallback, never sent.
    reply_claims: list[dict[str, Any]] = field(default_factory=list)
    # A playground engine's turn (engine.turn.playground): the side effects it did not
    # queue, ``{"kind", "key", "payload"}`` each (what would have been sent).
    withheld: list[dict[str, Any]] = field(default_factory=list)


def refused_claims(ungrounded: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """What :attr:`TurnResult.refused_claims` holds, from the turn's ``ungrounded`` list."""
    out = []
    for what, _ in ungrounded:
        if what.startswith("action "):
            out.append(("unconfirmed", what.removeprefix("action ")))
        else:
            out.append(("ungrounded", _INDEX.sub("[]", what)))
    return out


_INDEX = re.compile(r"\[\d+\]")


@dataclass
class Incoming:
    """The message a turn answers; ``message_id`` once it is durable (kept across retries)."""

    session_id: str
    text: str
    channel: str
    started: float
    message_id: int | None = None
    delivery: Inbound | None = None  # the delivery key, recorded with the message
    reply_to: Mapping[str, Any] | None = None  # where the outbox sends the reply
    facts: Mapping[str, Any] = field(default_factory=dict)
    stream: ReplyStream | None = None  # the reply shown as it is written (every attempt)


@dataclass
class Turn:
    """One turn in flight: what the steps read and write (one per attempt)."""

    inbound: Incoming
    now: datetime
    row: dict[str, Any] | None
    recent: list[Message]
    state: dict[str, Any]
    pos: Position
    expected: int  # the row version the save is checked against
    last_seen: datetime | None
    stage_before: str
    mover: Mover
    funnel: CompiledFunnel  # the version (or variant) of the funnel this turn runs on
    migration: dict[str, Any] | None = None  # the row moved to this version (engine.versions)
    # The content hash of the copy of the funnel the turn runs on (its version store
    # bundle: deployed or a trial); what `funnel replay` replays it on. None: not stored.
    funnel_hash: str | None = None
    idle: float | None = None
    firings: list[Firing] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    outcomes: list[ActionOutcome] = field(default_factory=list)
    handoff_before: Any = None
    backlog: int = 0
    folded: tuple[str, int] | None = None  # (summary, last id) folded inside the turn
    summary_job: SummaryJob | None = None  # folded after the reply
    knowledge: list[str] = field(default_factory=list)  # ids of the chunks the prompt got
    # Semantic recall (engine.memory.recall): the customer message's embedding, asked for
    # when the turn starts; the vector once it came; the messages the prompt recalled.
    recall_task: asyncio.Task[list[float] | None] | None = None
    recall_started: float = 0.0
    query_vector: list[float] | None = None
    recalled: list[int] = field(default_factory=list)
    lang: language.Decision = field(default_factory=lambda: language.Decision(
        None, None, frozenset()))
    # The reply's claims refused this turn (engine.turn.truth): kind, name, text, expected,
    # attempt (0 the first answer, 1 its repair).
    claims: list[dict[str, Any]] = field(default_factory=list)

    @property
    def spec(self) -> FunnelSpec:
        return self.funnel.spec

    @property
    def session_id(self) -> str:
        return self.inbound.session_id

    @property
    def text(self) -> str:
        return self.inbound.text

    @property
    def channel(self) -> str:
        return self.inbound.channel

    @property
    def language(self) -> str | None:
        """The language the customer is answered in: the one decided this turn, else the
        session's (the state field ``language.response``); None when neither is known."""
        if self.lang.response is not None:
            return self.lang.response
        name = self.spec.language_response
        # Under the `model` policy the model writes the field: only a string is a language.
        value = self.state.get(name) if name else None
        return value if isinstance(value, str) else None

    def say(self, text: Localized) -> str:
        """``text`` in the customer's language, else the funnel's default language."""
        return text.pick(self.language, self.spec.language_policy.default)


def turn_calls(answer: Answer) -> list[Call]:
    """Every HTTP call of the turn, in order: each request's calls (those that timed out or
    failed before its answer, then the answered one), then a request's that gave none."""
    out: list[Call] = []
    for c in answer.completions:
        # A model that lists no calls (the scripted one) made one: this completion's.
        out += c.calls or (Call(c.model, "ok", c.latency_ms, c.prompt_tokens,
                                c.completion_tokens, c.tokens_counted, c.cost),)
    return out + answer.failed


def turn_record(turn: Turn, answer: Answer, transitions: list[dict[str, Any]],
                 model: str | None) -> dict[str, Any]:
    """The turn record's columns (``funnel_turns``). Time, tokens and cost are summed over
    every call of the turn, including those that gave no answer (:func:`turn_calls`)."""
    calls = turn_calls(answer)
    # The repair's calls follow the first request's (its answer, or its failure).
    first = len(answer.completions[0].calls or (None,)) if answer.completions else len(calls)
    costs = [c.cost for c in calls if c.cost is not None]
    return {
        "stage_before": turn.stage_before, "stage_after": turn.pos["stage"],
        "transitions": transitions,
        "actions": [o.type for o in turn.outcomes if o.accepted],
        "refused": [{"type": o.type, "reason": o.reason} for o in turn.outcomes
                    if not o.accepted] + [
            # What the model wrote that the customer's words do not support, counted.
            {"type": "ungrounded", "reason": what}
            for what, _ in turn.mover.scratch.ungrounded if not what.startswith("action ")],
        "validation_failures": answer.failures,
        "repaired": answer.failures > 0 and not answer.fallback,
        "fallback": answer.fallback,
        # Calls that gave no answer (timed out, failed before a retry) spent time too.
        "llm_ms": round(sum(c.ms for c in calls)),
        # Unrounded, for TurnResult.model_seconds (a fast model's turn is not 0 s there).
        "model_seconds": sum(c.ms for c in calls) / 1000,
        "turn_ms": round((time.perf_counter() - turn.inbound.started) * 1000),
        "prompt_tokens": sum(c.prompt_tokens for c in calls),
        "completion_tokens": sum(c.completion_tokens for c in calls),
        "cached_prompt_tokens": sum(c.cached_prompt_tokens for c in answer.completions),
        "cache_write_tokens": sum(c.cache_write_tokens for c in answer.completions),
        # One call of unknown cost makes the turn's cost unknown.
        "cost": sum(costs) if costs and len(costs) == len(calls) else None,
        "model": answer.model or model, "attempts": answer.attempts,
        "variant": turn.funnel.variant,
        "error": printable(answer.error, 2000) if answer.error else None,
        "knowledge": turn.knowledge,
        # Compacted: the exits' conditions are cited by digest (engine.turn.explain.compact).
        "explain": compact(turn.mover.explanation),
        # As received, but storable: PostgreSQL's jsonb refuses NUL and lone surrogates.
        "raw_output": [printable(c.text, 64_000) for c in answer.completions],
        "migration": turn.migration,
        "funnel_hash": turn.funnel_hash,
        "claims": turn.claims,
        "calls": listed([(calls[:first], False), (calls[first:], True)]),
        # Some call's tokens were counted by the engine, not reported by the provider.
        "tokens_counted": any(c.tokens_counted for c in calls),
    }
