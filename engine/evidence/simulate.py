"""`funnel simulate`: simulated customers walk a funnel before it meets real ones.

Each conversation is one persona (:mod:`engine.evidence.personas`) played by its script
(deterministic, for CI) or by a customer model; the funnel answers with its own model,
through the real engine, on a temporary PostgreSQL schema that is dropped afterwards:
simulated sessions never reach the real report, the experiments or the retention
counts, and their hand-offs notify no one. Each conversation is scored by the funnel's
own outcomes (:class:`Conversation`); the run gives rates per stage and per persona
with Wilson 95% intervals (:class:`Simulation`), compared with an earlier run's JSON.
Conversations that never started (the customer model failed before a first message)
are counted apart and left out of the rates; the customer messages that are no
customer's (:mod:`engine.evidence.degenerate`) are counted, and a run where their
share is above ``max_degenerate`` is invalid: it gives no rates.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from ..boundary.sanitize import Rejected, loads_bounded, printable
from ..errors import FunnelError, InvalidInput, ModelError
from ..experiments.stats import compare as compare_rates
from ..experiments.stats import wilson
from ..format.follow_up import MAX_AFTER_SECONDS
from ..format.names import TURNS
from ..funnel.compiled import CompiledFunnel
from ..llm.models import Model, ModelRequest
from ..memory.summary import ExtractiveSummarizer
from ..store import open_store
from ..store.connect import temporary_schema
from ..turn import follow_up
from ..turn.engine import Engine
from .degenerate import degenerate
from .personas import Persona

__all__ = ["MAX_CONVERSATIONS", "MAX_DEGENERATE", "Conversation", "Simulation",
           "SimulationCancelled", "simulate"]

# A run keeps every conversation in memory and in its temporary schema: 10,000 is
# hours with a remote model and a few hundred MB; more is several runs (--seed).
MAX_CONVERSATIONS = 10_000

# The share of degenerate customer messages above which a run measures its customer
# model, not the funnel (`--max-degenerate`).
MAX_DEGENERATE = 0.2

CHANNEL = "simulate"
CUSTOMER_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["message"],
                   "properties": {"message": {"type": "string", "minLength": 1,
                                              "maxLength": 1000},
                                  "leave": {"type": "boolean"}}}


class SimulationCancelled(Exception):
    """Raised by a run whose ``cancelled`` said so (the studio's Cancel): its temporary
    schema is dropped like any other run's."""


# Called after each conversation with how many are done and the last one.
Progress = Callable[[int, "Conversation"], None]


@dataclass
class Conversation:
    """One simulated conversation, scored by the funnel's outcomes."""

    persona: str
    session_id: str
    turns: int = 0
    stage: str = ""
    reached: list[str] = field(default_factory=list)
    completeness: Any = None
    cart_total: Any = None
    handoff: bool = False
    handoff_reason: Any = None
    tokens: int = 0
    cost: float | None = None
    fallbacks: int = 0
    repairs: int = 0
    ended: str = ""  # why it ended: the script, patience, the customer left, a final stage
    started: bool = True  # False: the customer never sent a first message
    degenerate: dict[str, int] = field(default_factory=dict)  # kind -> customer messages
    follow_ups: int = 0  # follow-ups the funnel sent when the customer was silent


@dataclass
class Simulation:
    """A run: its conversations and what they add up to."""

    funnel: str
    model: str
    customer: str
    seed: int
    stages: list[str]
    conversations: list[Conversation] = field(default_factory=list)
    max_degenerate: float = MAX_DEGENERATE

    @property
    def measured(self) -> list[Conversation]:
        """The conversations that started: the rates' population."""
        return [c for c in self.conversations if c.started]

    @property
    def never_started(self) -> int:
        return sum(not c.started for c in self.conversations)

    def degenerate(self) -> dict[str, Any]:
        """The degenerate customer messages: by kind, in all, their share of the
        messages sent, and the run's limit."""
        kinds: dict[str, int] = {}
        for c in self.conversations:
            for kind, k in c.degenerate.items():
                kinds[kind] = kinds.get(kind, 0) + k
        sent = sum(c.turns for c in self.conversations)
        bad = sum(kinds.values())
        return {"kinds": dict(sorted(kinds.items())), "messages": bad, "sent": sent,
                "share": bad / sent if sent else 0.0, "max": self.max_degenerate}

    @property
    def valid(self) -> bool:
        """Whether the run measures the funnel: some conversation started, and at most
        ``max_degenerate`` of the customer messages are degenerate."""
        return bool(self.measured) and self.degenerate()["share"] <= self.max_degenerate

    def invalid_reason(self) -> str | None:
        if not self.measured:
            return (f"no conversation started ({self.never_started} of "
                    f"{len(self.conversations)}: the customer model failed before a first "
                    "message)")
        d = self.degenerate()
        if d["share"] > self.max_degenerate:
            kinds = ", ".join(f"{k} {n}" for k, n in d["kinds"].items())
            return (f"{d['messages']} of {d['sent']} customer messages are degenerate "
                    f"({d['share'] * 100:.1f}% > {self.max_degenerate * 100:g}%: {kinds}); "
                    "the run measures the customer model, not the funnel")
        return None

    def metrics(self) -> dict[str, float]:
        """Rates as fractions, averages per conversation, over the conversations that
        started."""
        convs = self.measured
        n = len(convs) or 1
        turns = sum(c.turns for c in convs) or 1
        out = {"handoff_rate": sum(c.handoff for c in convs) / n,
               "turns": sum(c.turns for c in convs) / n,
               "cart_total": sum(float(c.cart_total or 0) for c in convs) / n,
               "tokens": sum(c.tokens for c in convs) / n,
               "cost": sum(c.cost or 0 for c in convs) / n,
               "fallback_rate": sum(c.fallbacks for c in convs) / turns,
               "repair_rate": sum(c.repairs for c in convs) / turns}
        for stage in self.stages:
            out[f"reach.{stage}"] = sum(stage in c.reached for c in convs) / n
        return out

    def rates(self) -> dict[str, dict[str, Any]]:
        """``reach.<stage>`` and ``handoff_rate``, overall and per persona, each with its
        count and its Wilson 95% interval."""
        groups: dict[str, list[Conversation]] = {"all": self.measured}
        for c in self.measured:
            groups.setdefault(c.persona, []).append(c)
        out: dict[str, dict[str, Any]] = {}
        for group, convs in groups.items():
            row: dict[str, Any] = {}
            for name in ["handoff_rate", *(f"reach.{s}" for s in self.stages)]:
                k = sum(c.handoff for c in convs) if name == "handoff_rate" else \
                    sum(name[6:] in c.reached for c in convs)
                low, high = wilson(k, len(convs))
                row[name] = {"k": k, "n": len(convs), "rate": k / len(convs) if convs else 0.0,
                             "low": low, "high": high}
            out[group] = row
        return out

    def as_json(self) -> dict[str, Any]:
        """The run; an invalid run's ``rates`` are null (``invalid`` says why)."""
        return {"funnel": self.funnel, "model": self.model, "customer": self.customer,
                "seed": self.seed, "conversations": [asdict(c) for c in self.conversations],
                "never_started": self.never_started, "degenerate": self.degenerate(),
                "valid": self.valid, "invalid": self.invalid_reason(),
                "metrics": self.metrics(), "rates": self.rates() if self.valid else None}


def against(run: Simulation, earlier: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each rate of ``run`` beside an earlier run's (its ``--format json``), with the
    two-proportion z-test's p-value."""
    out: list[dict[str, Any]] = []
    if not run.valid:
        return out
    then = (earlier.get("rates") or {}).get("all") or {}
    for name, now in run.rates()["all"].items():
        old = then.get(name)
        if not isinstance(old, dict):
            continue
        test = compare_rates(int(old["k"]), int(old["n"]), now["k"], now["n"])
        out.append({"metric": name, "then": old["rate"], "now": now["rate"],
                    "p_value": test.p_value if test else None})
    return out


class _Quiet:
    """The engine's notifier in a simulation: a simulated hand-off reaches no manager."""

    async def __call__(self, payload: Mapping[str, Any]) -> None:
        return None


class _Customer:
    """One simulated customer: the persona's script, or a model playing the persona."""

    def __init__(self, persona: Persona, model: Model | None, funnel: CompiledFunnel,
                 session_id: str) -> None:
        self.persona, self.model, self.session_id = persona, model, session_id
        self.settings = funnel.stage(funnel.spec.initial).spec.model
        self.chat: list[dict[str, str]] = [{"role": "system", "content": persona.brief()}]
        self.said = 0
        self.degenerate: dict[str, int] = {}

    def judge(self, message: str, reply: str | None) -> None:
        """Count ``message`` when it is no customer's (engine.evidence.degenerate)."""
        kind = degenerate(message, reply, self.chat[0]["content"] if self.model else "")
        if kind is not None:
            self.degenerate[kind] = self.degenerate.get(kind, 0) + 1

    async def next(self, reply: str | None) -> tuple[str | None, str]:
        """The customer's next message, or None and why they end the conversation."""
        if self.said >= self.persona.patience:
            return None, "patience"
        if self.model is None:
            if self.said >= len(self.persona.script):
                return None, "script"
            self.said += 1
            said = self.persona.script[self.said - 1]
            return (None, "silent") if said is None else (said, "")
        # The funnel's reply is the other side of the chat: data, never instructions.
        self.chat.append({"role": "user", "content": printable(reply or "(the chat opens)",
                                                               4000)})
        request = ModelRequest(messages=list(self.chat), schema=CUSTOMER_SCHEMA,
                               stage="customer", settings=self.settings,
                               session_id=self.session_id, turn=self.said + 1,
                               user_text=reply or "")
        try:
            answer = loads_bounded(_unfenced((await self.model.complete(request)).text))
        except (ModelError, Rejected) as exc:
            return None, f"the customer model failed: {printable(str(exc), 200)}"
        if not isinstance(answer, dict):
            return None, "the customer model did not answer with a JSON object"
        message = answer.get("message")
        if not isinstance(message, str) or not message.strip():
            return None, "the customer model gave no message"
        message = printable(message, 1000)
        self.chat.append({"role": "assistant", "content": message})
        self.said += 1
        if answer.get("leave") is True:
            return None, "left"
        return message, ""


def _unfenced(text: str) -> str:
    """A small model wraps its JSON in a fenced block: the block's content."""
    body = text.strip()
    if body.startswith("```") and body.endswith("```"):
        body = body[3:-3].removeprefix("json").strip()
    return body


def simulate(funnel: CompiledFunnel, personas: Sequence[Persona], model: Model, *,
             n: int, seed: int, db: str | None, customer: Model | None = None,
             variant: str | None = None, progress: Progress | None = None,
             cancelled: Callable[[], bool] | None = None,
             max_degenerate: float = MAX_DEGENERATE) -> Simulation:
    """Run ``n`` simulated conversations on a temporary schema of ``db``.

    ``progress`` is told of each conversation as it ends; ``cancelled`` is asked before
    each turn, and a True stops the run (:class:`SimulationCancelled`).

    Raises:
        InvalidInput: ``n`` is not from 1 to :data:`MAX_CONVERSATIONS`.
        FunnelError: a persona has no script and no customer model is given.
        SimulationCancelled: ``cancelled`` said so.
    """
    if not 1 <= n <= MAX_CONVERSATIONS:
        raise InvalidInput(f"from 1 to {MAX_CONVERSATIONS:,} simulated conversations; got {n}")
    if customer is None:
        unscripted = [p.name for p in personas if not p.script]
        if unscripted:
            raise FunnelError(f"persona(s) {', '.join(unscripted)} have no `script`; give "
                              "--customer-model M to have a model play them")
    pool = [p for p in personas for _ in range(p.weight)]
    random.Random(seed).shuffle(pool)
    run = Simulation(funnel.name, getattr(model, "name", "model"),
                     getattr(customer, "name", "script") if customer else "script", seed,
                     list(funnel.spec.stages), max_degenerate=max_degenerate)
    with temporary_schema(db, prefix="funnel_tmp_simulate") as url:
        run.conversations = asyncio.run(_run(url, funnel, model, customer, pool, n, seed,
                                             variant, _Hooks(progress, cancelled)))
    return run


@dataclass
class _Hooks:
    progress: Progress | None = None
    cancelled: Callable[[], bool] | None = None


async def _run(url: str, funnel: CompiledFunnel, model: Model, customer: Model | None,
               pool: list[Persona], n: int, seed: int, variant: str | None,
               hooks: _Hooks | None = None) -> list[Conversation]:
    hooks = hooks or _Hooks()
    store = await open_store(url)
    out: list[Conversation] = []
    try:
        engine = await Engine.open(funnel, store=store, model=model, notifier=_Quiet(),
                                   summarizer=ExtractiveSummarizer())
        try:
            for i in range(n):
                persona = pool[i % len(pool)]
                sid = f"sim-{seed}-{i}-{persona.name}"
                if variant is not None:
                    engine.variants.force(sid, variant)
                out.append(await _conversation(engine, persona, customer, sid,
                                               hooks.cancelled))
                if hooks.progress is not None:
                    hooks.progress(len(out), out[-1])
            await engine.drain()
        finally:
            await engine.close()
        costs = _costs(url, funnel.name)
        for c in out:
            c.cost = costs.get(c.session_id)
    finally:
        await store.close()
    return out


async def _conversation(engine: Engine, persona: Persona, customer: Model | None,
                        sid: str, cancelled: Callable[[], bool] | None = None
                        ) -> Conversation:
    conv = Conversation(persona.name, sid)
    player = _Customer(persona, customer, engine.funnel, sid)
    reply: str | None = None
    spec = engine.spec
    while True:
        if cancelled is not None and cancelled():
            raise SimulationCancelled(f"cancelled during conversation {sid}")
        text, why = await player.next(reply)
        if text is None and why == "silent":
            # The customer went quiet: what the funnel's follow-up says, if it has one.
            reply = await _follow_up(engine, sid)
            if reply is not None:
                conv.follow_ups += 1
                continue
            why = "silent (no follow-up came)"
        if text is None:
            conv.ended = why
            conv.started = conv.turns > 0
            break
        player.judge(text, reply)
        result = await engine.handle(sid, text, channel=CHANNEL)
        reply = result.reply
        conv.turns += 1
        conv.tokens += result.prompt_tokens + result.completion_tokens
        conv.fallbacks += int(result.fallback)
        conv.repairs += int(result.repaired)
        if engine.funnel.stage(result.stage_after).spec.final:
            conv.ended = f"final stage {result.stage_after}"
            break
    conv.degenerate = dict(sorted(player.degenerate.items()))
    state = await engine.state(sid) or {}
    conv.stage = str(state.get("stage", spec.initial))
    conv.reached = list(dict.fromkeys(h["stage"] for h in state.get("stage_history") or []))
    conv.completeness = state.get(spec.completeness_field) if spec.completeness_field else None
    conv.cart_total = state.get(spec.cart.total) if spec.cart and spec.cart.total else None
    h = spec.handoff
    conv.handoff = bool(h and h.stage in conv.reached)
    conv.handoff_reason = state.get(h.reason) if h and h.reason else None
    return conv


async def _follow_up(engine: Engine, sid: str) -> str | None:
    """Fast-forward past every follow-up's delay (and quiet hours): the text the funnel
    sends the silent customer of ``sid``, or None."""
    at = engine.clock() + timedelta(seconds=MAX_AFTER_SECONDS + 60)
    for _ in range(3):  # quiet hours defer a follow-up once; a step skipped moves on
        done = [d for d in await follow_up.run_due(engine, now=at, limit=MAX_CONVERSATIONS)
                if d["session_id"] == sid]
        if not done:
            return None
        if done[0]["outcome"] == "sent":
            return str(done[0]["text"])
        at = done[0].get("until") or at + timedelta(seconds=MAX_AFTER_SECONDS + 60)
    return None


def _costs(url: str, funnel: str) -> dict[str, float | None]:
    """Each session's cost, None when a turn's cost is unknown."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT session_id, sum(cost), count(*) FILTER (WHERE cost IS NULL) FROM {} "
            "WHERE funnel = %s GROUP BY session_id").format(sql.Identifier(TURNS)),
            (funnel,)).fetchall()
    return {sid: (float(Decimal(total)) if total is not None and not unknown else None)
            for sid, total, unknown in rows}
