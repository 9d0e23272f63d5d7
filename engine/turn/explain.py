"""Why a session moved, or did not: every exit of the stage, its condition, what it read.

:class:`~engine.turn.advance.Mover` calls :func:`explain_stage` each time it
evaluates a stage's exits. The result is plain JSON (stored in the turn
record's ``explain`` column, returned in ``TurnResult.explain``)::

    {"stage": "discovery", "fired": null, "transitions": [
        {"to": "presentation", "when": "discovery_completeness >= 60", "held": false,
         "values": {"discovery_completeness": 50},
         "derived": {"discovery_completeness": "pet.type 25 + pet.problems 25"}}],
     "iterations": {"count": 2, "limit": 4, "to": "handoff"}}

:func:`describe` turns it into the lines ``funnel chat --explain``,
``funnel state --explain`` and ``funnel test`` print.

The turn record stores it compacted (:func:`engine.records.explanation.compact`): what the funnel fixes (each
exit's destination, condition, whether it is global) is cited by a digest of the
stage's exit list, stored once in ``funnel_exits``; what the turn found (held, the
values read, derived and error notes) stays in the record; ``expand`` gives the
form above back, so readers show the same explanation as before.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..sandbox.expressions import compact_json, compile_condition_list, condition_names

if TYPE_CHECKING:
    from ..funnel.compiled import CompiledFunnel

__all__ = ["describe", "explain_stage", "why_not"]

_MAX_VALUE = 120  # characters of one value's JSON kept in an explanation


def _lookup(ctx: Mapping[str, Any], parts: tuple[str, ...]) -> Any:
    value: Any = ctx
    for part in parts:
        # A dict first: the ABC check costs more than the lookup, on every value read.
        value = value.get(part) if type(value) is dict or isinstance(value, Mapping) else None
    return value


_SCALARS = frozenset({int, float, bool, type(None)})


def _short(value: Any) -> Any:
    if type(value) in _SCALARS:
        return value
    if isinstance(value, str | int | float | bool) or value is None:
        return value if not isinstance(value, str) or len(value) <= _MAX_VALUE \
            else value[:_MAX_VALUE] + "…"
    text = compact_json(value)
    return value if len(text) <= _MAX_VALUE else text[:_MAX_VALUE] + "…"


def _derived(funnel: CompiledFunnel, name: str, ctx: Mapping[str, Any]) -> str | None:
    """How a derived field got its value: the completeness rules that held."""
    if name != funnel.spec.completeness_field:
        return None
    parts = []
    # All the rules in one evaluation, as StateRules.recompute scores them.
    hits = funnel.rules.completeness_hits(ctx)
    for held, (_condition, points, source) in zip(hits, funnel.rules.completeness, strict=True):
        if held and points:
            parts.append(f"{source} {points}")
    return " + ".join(parts) if parts else "no rule holds"


def _evaluate(condition: Any, ctx: Mapping[str, Any]) -> tuple[bool | None, str | None]:
    try:
        return bool(condition(ctx)), None
    except Exception as exc:  # the machine records it as a notice; here it is a reason
        return None, str(exc)


@lru_cache(maxsize=512)
def _all_of(sources: tuple[str, ...]) -> Callable[[Mapping[str, Any]], list[bool]]:
    return compile_condition_list(list(sources))


def _held(funnel: CompiledFunnel, sources: tuple[str, ...], ctx: Mapping[str, Any]
          ) -> list[tuple[bool | None, str | None]]:
    """Each condition's verdict on ``ctx``: all of a stage's exits in one evaluation (one
    sandbox context instead of one per exit, on every turn), one by one when any fails,
    so that the failing one names its error and the others still count."""
    if not sources:
        return []
    try:
        values = _all_of(sources)(ctx)
        if len(values) == len(sources):
            return [(v, None) for v in values]
    except Exception:  # evaluated one by one below, each with its own error
        pass
    return [_evaluate(funnel.explain_conditions[s], ctx) for s in sources]


# (to, when, global, [(name, its parts)], whether it reads the completeness field)
_Exit = tuple[str, str | None, bool, tuple[tuple[str, tuple[str, ...]], ...], bool]
# Per compiled funnel and stage: its exits as explain_stage reads them, and their
# conditions. Built once, not on every turn (a stage's exits are the funnel's).
_PLANS: weakref.WeakKeyDictionary[CompiledFunnel, dict[str, tuple[list[_Exit], tuple[str, ...]]]
                                  ] = weakref.WeakKeyDictionary()


def _plan(funnel: CompiledFunnel, stage: str) -> tuple[list[_Exit], tuple[str, ...]]:
    plans = _PLANS.get(funnel)
    if plans is None:
        plans = _PLANS[funnel] = {}
    plan = plans.get(stage)
    if plan is None:
        spec = funnel.spec
        own = spec.stages[stage].transitions if stage in spec.stages else ()
        candidates = [(t, True) for t in spec.global_transitions if t.to != stage] + \
            [(t, False) for t in own]
        exits: list[_Exit] = []
        for t, is_global in candidates:
            names = condition_names(t.when) if t.when is not None else ()
            exits.append((t.to, t.when, is_global,
                          tuple((n, tuple(n.split("."))) for n in names),
                          spec.completeness_field is not None
                          and spec.completeness_field in names))
        plan = plans[stage] = (exits, tuple(t.when for t, _ in candidates
                                            if t.when is not None))
    return plan


def explain_stage(funnel: CompiledFunnel, stage: str, ctx: Mapping[str, Any], *,
                  values: bool = True) -> dict[str, Any]:
    """Every exit of ``stage`` (global ones first, as the machine tries them), evaluated;
    with ``values`` False, without the values each condition read (nor how a derived
    field got its value): only which held."""
    exits, sources = _plan(funnel, stage)
    verdicts = iter(_held(funnel, sources, ctx))
    derived: str | None = None  # how the completeness field got its value, once a call
    out: list[dict[str, Any]] = []
    for to, when, is_global, names, reads_derived in exits:
        entry: dict[str, Any] = {"to": to, "when": when}
        if is_global:
            entry["global"] = True
        if when is None:
            entry["held"] = True
        else:
            held, error = next(verdicts)
            entry["held"] = held
            if error:
                entry["error"] = error
            if not values:
                out.append(entry)
                continue
            entry["values"] = {n: _short(_lookup(ctx, parts)) for n, parts in names}
            if reads_derived:
                field = funnel.spec.completeness_field
                assert field is not None
                if derived is None:
                    derived = _derived(funnel, field, ctx)
                if derived is not None:
                    entry["derived"] = {field: derived}
        out.append(entry)
    return {"stage": stage, "fired": None, "transitions": out}


def _value(value: Any) -> str:
    return value if isinstance(value, str) and value.endswith("…") else compact_json(value)


def _line(stage: str, t: Mapping[str, Any]) -> str:
    arrow = f"{stage} -> {t['to']}{' (global)' if t.get('global') else ''}"
    if t.get("when") is None:
        return f"{arrow}: always"
    verdict = {True: "true", False: "false", None: "an error"}[t.get("held")]
    values = ", ".join(f"{k}={_value(v)}" + (f" ({t['derived'][k]})" if k in t.get("derived", {})
                                             else "")
                       for k, v in (t.get("values") or {}).items())
    text = f"{arrow}: `{t['when']}` was {verdict}"
    if values:
        text += f": {values}"
    if t.get("error"):
        text += f" [{t['error']}]"
    return text


def describe(explanation: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """One line per exit evaluated, in order, and one for the iteration count."""
    lines: list[str] = []
    for step in explanation or []:
        for t in step.get("transitions") or []:
            lines.append(_line(step["stage"], t))
        it = step.get("iterations")
        if it:
            dest = f", then -> {it['to']}" if it.get("to") else ""
            lines.append(f"{step['stage']}: turn {it['count']} of at most {it['limit']} in the "
                         f"stage{dest}")
    return lines


def why_not(explanation: Sequence[Mapping[str, Any]] | None, expected: str) -> str:
    """Why the session did not reach ``expected``: the exits towards it that did not hold.

    ``"`discovery_completeness >= 60` was false: discovery_completeness=50 (...)"``,
    or every exit evaluated when none leads there.
    """
    towards = [_line(step["stage"], t).split(": ", 1)[1]
               for step in explanation or [] for t in step.get("transitions") or []
               if t.get("to") == expected and not t.get("held")]
    if towards:
        return "; ".join(towards)
    return "; ".join(describe(explanation)) or "no exit was evaluated"
