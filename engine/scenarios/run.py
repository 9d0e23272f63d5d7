"""Plays scenarios (`load`) on the real engine and checks what it did.

One run: one temporary PostgreSQL schema (``funnel_test_<random>``, dropped
afterwards) on the embedded server or ``--db``, so scenarios never see real
sessions; one store; one :class:`Engine` per funnel, shared by its scenarios,
whose model, clock and notifier the runner points at the current scenario.
Each scenario runs in a fresh session id. Nothing here imports litellm.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import FunnelError, FunnelInvalid, ModelError
from ..funnel.compiled import CompiledFunnel, load_funnel
from ..funnel.state import defaults
from ..llm.models import Completion, ModelRequest, ScriptedModel
from ..memory.summary import ExtractiveSummarizer
from ..store import Store, TurnWrite, open_store
from ..store.connect import temporary_schema
from ..turn.engine import Engine
from ..turn.prompts import full_view
from .check import check
from .coverage import from_result
from .load import DEFAULT_CLOCK, Failure, Scenario, Turn, check_against

CHANNEL = "scenario"  # the channel turns arrive on (the hand-off's `channel` field)


@dataclass
class ScenarioResult:
    file: str
    name: str
    line: int
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0
    turns: int = 0  # turns played
    # The funnel it ran on, each turn's observation (engine.scenarios.coverage) and the
    # first model request of each turn (the prompt and contract, engine.scenarios.snapshot).
    funnel: CompiledFunnel | None = None
    observed: list[dict[str, Any]] = field(default_factory=list)
    requests: list[tuple[int, ModelRequest]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def errored(self) -> bool:
        return any(f.kind == "error" for f in self.failures)


class ScenarioModel:
    """The model of every engine in a run: answers with the current turn's ``llm`` output
    (through :class:`ScriptedModel`, so the output takes the engine's validation path) and
    keeps the prompt the engine rendered."""

    name = "scenario"

    def __init__(self) -> None:
        self.script: ScriptedModel | None = None
        self.prompt: str | None = None
        self.request: ModelRequest | None = None

    def play(self, llm: Any) -> None:
        self.script = ScriptedModel.from_data({"default": llm})
        self.script.name = self.name
        self.prompt = None
        self.request = None

    async def complete(self, request: ModelRequest) -> Completion:
        if request.attempt == 0 and request.messages:
            self.prompt = "\n".join(m["content"] for m in prompt_messages(request.messages))
            self.request = request
        if self.script is None:
            raise ModelError("the scenario gives no `llm` output for this turn")
        return await self.script.complete(request)


def prompt_messages(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The prompt without the conversation (engine.turn.budget.assemble): the system messages
    (static prefix, state part, turn part) and the data messages (summary, notices), each
    of which follows a system message; not the window, not the customer's message."""
    out: list[dict[str, str]] = []
    for before, m in zip(messages, messages[1:-1], strict=False):
        if m["role"] == "system" or (m["role"] == "user" and before["role"] == "system"
                                     and m["content"].startswith("<data>\n")):
            out.append(m)
    return ([messages[0]] if messages[:-1] else []) + out


class Clock:
    """The engines' clock: stands still unless a turn moves it (``after`` / ``at``)."""

    def __init__(self) -> None:
        self.now = DEFAULT_CLOCK

    def __call__(self) -> datetime:
        return self.now


class Notifications:
    """The engines' notifier: records hand-off notifications instead of sending them."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def __call__(self, payload: Mapping[str, Any]) -> None:
        self.sent.append(dict(payload))


LoadedScenario = tuple[Path, Scenario | None, list[Failure]]


def run_all(loaded: Sequence[LoadedScenario], db: str | None) -> list[ScenarioResult]:
    """Run every loaded scenario in order, in a temporary schema on ``db`` (the embedded
    server when ``None``), created only if one can run."""
    results: dict[int, ScenarioResult] = {}
    ready: list[tuple[int, Scenario]] = []
    for i, (path, scenario, problems) in enumerate(loaded):
        if scenario is None:
            name = problems[0].scenario if problems else path.stem
            results[i] = ScenarioResult(str(path), name, 1, list(problems))
        else:
            ready.append((i, scenario))
    if ready:
        with temporary_schema(db) as url:
            results.update(asyncio.run(_play(url, ready)))
    return [results[i] for i in range(len(loaded))]


async def _play(url: str, ready: list[tuple[int, Scenario]]) -> dict[int, ScenarioResult]:
    store = await open_store(url)
    try:
        runner = Runner(store, secrets.token_hex(6))
        return {i: await runner.run(scenario) for i, scenario in ready}
    finally:
        await store.close()


class Runner:
    def __init__(self, store: Store, token: str) -> None:
        self.store = store
        self.token = token
        self.model = ScenarioModel()
        self.clock = Clock()
        self.notifications = Notifications()
        self.engines: dict[Path, Engine | str] = {}
        self.sessions = 0
        self.result: ScenarioResult | None = None  # the scenario being played

    async def engine(self, scenario: Scenario) -> Engine | str:
        """The funnel's engine (opened once per run), or why it cannot be opened."""
        key = scenario.funnel.resolve()
        if key not in self.engines:
            try:
                # The offline summarizer, never `memory.summarizer_model` (a real model).
                self.engines[key] = await Engine.open(
                    load_funnel(key), store=self.store, model=self.model,
                    notifier=self.notifications, clock=self.clock,
                    summarizer=ExtractiveSummarizer())
            except FunnelInvalid as exc:
                errors = [d for d in exc.diagnostics if d.severity == "error"]
                self.engines[key] = (f"the funnel {scenario.funnel} has {len(errors)} error(s); "
                                     f"run `funnel validate` on it: {errors[0].format()}")
            except FunnelError as exc:
                self.engines[key] = " ".join(str(exc).split())
        return self.engines[key]

    async def run(self, scenario: Scenario) -> ScenarioResult:
        started = time.perf_counter()
        result = ScenarioResult(scenario.file, scenario.name, scenario.line)
        engine = await self.engine(scenario)
        if isinstance(engine, str):
            result.failures.append(scenario.error(scenario.funnel_line, engine))
            return result
        result.funnel = engine.funnel
        self.result = result
        result.failures += check_against(scenario, engine.funnel)
        if result.failures:
            return result
        self.sessions += 1
        session = f"scenario-{self.token}-{self.sessions}"
        self.clock.now = scenario.clock
        line, number = scenario.line_at("start") if scenario.start else scenario.line, None
        try:
            if scenario.start is not None:
                await self.seed(engine, session, scenario.start)
            for turn in scenario.turns:
                line, number = turn.line, turn.number
                failures = await self.turn(engine, session, scenario, turn)
                result.turns += 1
                if failures:  # later turns would only repeat the divergence
                    result.failures += failures
                    break
        except Exception as exc:  # the engine failed: report it and go on with the next one
            message = " ".join(str(exc).split()) or type(exc).__name__
            result.failures.append(Failure(scenario.file, line, scenario.name, number,
                                           f"the engine raised {type(exc).__name__}: {message}",
                                           "error"))
        result.seconds = time.perf_counter() - started
        return result

    async def turn(self, engine: Engine, session: str, scenario: Scenario, turn: Turn
                   ) -> list[Failure]:
        if turn.at is not None:
            self.clock.now = turn.at
        if turn.after is not None:
            self.clock.now += turn.after
        self.model.play(turn.llm)
        self.notifications.sent.clear()
        result = await engine.handle(session, turn.customer, channel=CHANNEL)
        await engine.drain()  # a background summary lands before the next turn, every run
        if self.result is not None:
            self.result.observed.append(from_result(engine.funnel, result))
            if self.model.request is not None:
                self.result.requests.append((turn.number, self.model.request))
        row = await engine.state(session) if "state" in turn.expect else None
        found = check(turn.expect, result, row, self.model.prompt,
                      bool(self.notifications.sent))
        return sorted((Failure(scenario.file, turn.line_of(key), scenario.name, turn.number,
                               message) for key, message in found), key=lambda f: f.line)

    async def seed(self, engine: Engine, session: str, start: Mapping[str, Any]) -> None:
        """Write the ``start`` row: defaults, the given fields, derived fields recomputed."""
        funnel, spec, now = engine.funnel, engine.spec, self.clock.now
        state = defaults(spec)
        state.update({k: copy.deepcopy(v) for k, v in start.items() if k in spec.state})
        stage = start["stage"]
        eng = {"stage": stage, "stage_iteration": start.get("stage_iteration", 0),
               "turns": start.get("turns", 0), "notices": list(start.get("notices") or []),
               "stage_history": start.get("stage_history")
               or [{"stage": stage, "entered_at": now.isoformat()}]}
        _complete_lines(funnel, state, now.isoformat())
        ctx = full_view(funnel, state)
        ctx.update(stage=stage, stage_iteration=eng["stage_iteration"], actions=[],
                   handoff_requested=None, returning=False, turns=eng["turns"],
                   stage_history=eng["stage_history"])
        funnel.rules.recompute(state, ctx, now.isoformat())
        await self.store.save_turn(spec, TurnWrite(
            session_id=session, values={**state, **eng, "funnel_version": spec.version},
            expected_version=0, reply=None, stage_after=stage,
            turn={"stage_before": stage, "transitions": [], "actions": [], "refused": [],
                  "validation_failures": 0, "repaired": False, "fallback": False,
                  "prompt_tokens": 0, "completion_tokens": 0, "model": "scenario:start"},
            message_time=now))


def _complete_lines(funnel: CompiledFunnel, state: dict[str, Any], now: str) -> None:
    """Cart lines and presented products given by SKU get the catalog's name and price."""
    spec, catalog = funnel.spec, funnel.catalog
    if spec.cart and catalog is not None:
        lines = []
        for raw in state.get(spec.cart.field) or []:
            product = catalog.by_sku[str(raw["sku"])]
            lines.append({"name": product.name, "price": product.as_prompt()["price"], "qty": 1,
                          "line_total": 0, "added_at": now, **raw})
        state[spec.cart.field] = lines
    if spec.presented_field:
        state[spec.presented_field] = [
            {"presented_at": now, "stage_iteration": 0, **p} if isinstance(p, dict) else p
            for p in state.get(spec.presented_field) or []]
