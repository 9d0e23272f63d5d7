"""``funnel doctor``: what a model endpoint accepts, probed with tiny requests.

For each structured-output strategy, one request asks for ``{"ok": true}``
under a one-field schema; the answer says whether the endpoint accepted the
strategy, whether the reply was the JSON asked for, and how long it took.
Then every stage's schema is sent once with the strategy ``auto`` would
choose, in the form a turn sends it (the provider's strict form where it has
one, :mod:`engine.llm.strict`, else the portable form), so a grammar-based
server (llama.cpp, vLLM, Ollama) or a strict provider that cannot compile one
says so here instead of in a customer's turn. The report says which form the
model gets and why. Nothing is retried and nothing is written to a database.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ..format.settings import ModelSettings
from ..funnel.compiled import CompiledFunnel
from . import cache as _cache
from . import strategy as _strategy
from . import strict as _strict
from .client import Caller, close_clients, error_detail
from .models import LiteLLMModel, ModelRequest

PROBE_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": False,
                                "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}
PROBE_MESSAGES = [{"role": "system", "content": "Answer with one JSON object and nothing else."},
                  {"role": "user", "content": 'Reply with exactly {"ok": true}'}]


@dataclass
class Probe:
    """One request: what was asked (a strategy, a stage's schema) and what came back."""

    strategy: str
    accepted: bool
    valid: bool
    latency_ms: float
    detail: str = ""
    stage: str | None = None


@dataclass
class Diagnosis:
    model: str
    api_base: str | None
    setting: str
    chain: tuple[str, ...]
    probes: list[Probe] = field(default_factory=list)
    chosen: str | None = None
    cost_known: bool = False
    stages: list[Probe] = field(default_factory=list)
    cache_marker: str | None = None  # how the static prefix is marked (engine.llm.cache)
    # The form the chosen strategy sends (engine.llm.strict), and why; None: no strategy.
    mode: _strict.Mode | None = None
    # Stages whose contract has no strict form (they get the portable one), and why.
    not_strict: dict[str, str] = field(default_factory=dict)


async def diagnose(funnel: CompiledFunnel, model: str, *, api_base: str | None = None,
                   structured_output: str | None = None, timeout: float = 30.0) -> Diagnosis:
    """Probe ``model`` (at ``api_base``) once per strategy, then once per stage schema."""
    llm = LiteLLMModel(model, api_base=api_base)
    caller = llm.caller
    spec_model = funnel.spec.model
    base = api_base or spec_model.api_base
    setting = structured_output or spec_model.structured_output
    chain = caller.describe(model, base, setting)
    report = Diagnosis(model=model, api_base=base, setting=setting, chain=chain,
                       cost_known=caller.cost_known(model),
                       cache_marker=_cache.cache_marker(caller._litellm, model, base))
    try:
        await _run(report, caller, model, base, funnel, timeout)
    finally:
        await close_clients(caller._litellm)
    return report


async def _run(report: Diagnosis, caller: Caller, model: str, base: str | None,
               funnel: CompiledFunnel, timeout: float) -> None:
    chain = report.chain
    settings = ModelSettings(name=model, max_tokens=16, timeout=timeout, retries=0,
                             api_base=base, deadline=timeout)
    for strategy in _strategy.STRATEGIES:
        probe = await _probe(caller, model, base, strategy, PROBE_SCHEMA, "probe", settings)
        report.probes.append(probe)
    accepted = {p.strategy for p in report.probes if p.accepted}
    report.chosen = next((s for s in chain if s in accepted), None)
    if report.chosen is not None:
        report.mode = _strict.mode(model, base, report.chosen, caller._litellm)
        if report.mode.strict:
            form = report.mode.form
            report.not_strict = {name: forms.why_not.get(form, "")
                                 for name, stage in funnel.stages.items()
                                 if (forms := _strict.forms(stage.schema)).get(form) is None}
    if report.chosen in ("json_schema", "json_object_schema", "tool"):
        for stage in funnel.stages.values():
            probe = await _probe(caller, model, base, report.chosen, stage.schema,
                                 stage.spec.name, settings)
            probe.stage = stage.spec.name
            report.stages.append(probe)


async def _probe(caller: Caller, model: str, api_base: str | None, strategy: str,
                 schema: Any, stage: str, settings: ModelSettings) -> Probe:
    request = ModelRequest(messages=PROBE_MESSAGES, schema=schema, stage=stage,
                           settings=settings, session_id="doctor", turn=0, user_text="")
    kwargs = caller.request_kwargs(model, api_base, request, strategy, settings.timeout)
    started = time.perf_counter()
    try:
        response = await caller._litellm.acompletion(**kwargs)
    except Exception as exc:
        return Probe(strategy, False, False, (time.perf_counter() - started) * 1000,
                     f"{type(exc).__name__}: {error_detail(exc)}")
    latency = (time.perf_counter() - started) * 1000
    try:
        text = _strategy.answer_text(response.choices[0].message)
    except (AttributeError, IndexError):
        return Probe(strategy, True, False, latency, 'expected a message holding {"ok": true}; '
                     "the response had no message")
    try:
        data = json.loads(text.strip().removeprefix("```json").strip("`\n "))
    except ValueError:
        return Probe(strategy, True, False, latency,
                     f'expected the JSON object {{"ok": true}}, got text that is not JSON: '
                     f"{text[:80]!r}")
    valid = isinstance(data, dict) and isinstance(data.get("ok"), bool)
    return Probe(strategy, True, valid, latency, "" if valid else (
        f'expected the JSON object {{"ok": true}} (a boolean "ok"), got {text[:80]!r}'))


def render(report: Diagnosis) -> str:
    """The diagnosis as text for the terminal."""
    where = f" at {report.api_base}" if report.api_base else ""
    lines = [f"model {report.model}{where}", "",
             f"  {'strategy':<20}{'accepted':<10}{'answer':<10}{'latency':>9}  detail"]
    for p in report.probes:
        lines.append(f"  {p.strategy:<20}{'yes' if p.accepted else 'no':<10}"
                     f"{('valid' if p.valid else 'invalid') if p.accepted else '-':<10}"
                     f"{p.latency_ms:>7.0f} ms  {p.detail[:160]}".rstrip())
    order = " > ".join(report.chain)
    lines.append("")
    if report.chosen:
        lines.append(f"chosen strategy: {report.chosen}  ({report.setting}: {order})")
    else:
        lines.append(f"chosen strategy: none: the endpoint accepted none of {order}")
    lines.append("cost: " + ("known (litellm's price map)" if report.cost_known else
                             "unknown: turns are recorded with cost NULL"))
    lines.append("prompt cache: " + (_MARKED.get(report.cache_marker, "") if report.cache_marker
                                     else _UNMARKED))
    if report.mode is not None:
        lines.append(f"strict: {'yes' if report.mode.strict else 'no'} ({report.mode.why})")
        for stage, why in report.not_strict.items():
            lines.append(f"  {stage:<22}portable form: no strict form ({why})")
    if report.stages:
        form = report.mode.form if report.mode is not None and report.mode.strict else \
            "portable"
        lines.append(f"stage schemas ({form} form, sent with {report.chosen}):")
        for p in report.stages:
            state = "compiles" if p.accepted else "REFUSED"
            lines.append(f"  {p.stage or '':<22}{state:<10}{p.latency_ms:>7.0f} ms  "
                         f"{'' if p.accepted else p.detail[:160]}".rstrip())
    return "\n".join(lines) + "\n"


_MARKED = {"cache_control": "the static prefix and the conversation's end are marked "
                            "cache_control",
           "cachePoint": "the static prefix and the conversation's end are followed by a "
                         "Bedrock cachePoint"}
_UNMARKED = ("not marked (the provider caches a shared prefix by itself, or this route "
             "takes no mark)")


def healthy(report: Diagnosis) -> bool:
    """A strategy was found and every stage schema was accepted with it."""
    return report.chosen is not None and all(p.accepted for p in report.stages)
