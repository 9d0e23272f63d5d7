"""Prompts: the stage template rendered from compact state, plus a few recent messages.

The model sees what the stage needs and nothing else: the state as compact
JSON (no nulls, no engine bookkeeping), presented products numbered in order
with their SKUs (so "the first one" resolves to a SKU), thresholds as ready
booleans, what the engine refused last turn, and the last few messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import TemplateError, UndefinedError

from .chat import Message
from .errors import ConfigError
from .expressions import compact_json, declared_view
from .funnel import CompiledFunnel, CompiledStage

# Bookkeeping, not facts about the customer (the summary has its own `summary` slot).
_HIDDEN = frozenset(
    {"session_id", "stage_history", "row_version", "funnel_version", "notices", "created_at",
     "updated_at", "last_message_at", "turns", "summary_upto"}
)


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def _prune(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _prune(v) for k, v in value.items() if not _empty(_prune(v))}
    if isinstance(value, list):
        return [_prune(v) for v in value if not _empty(v)]
    return value


def compact_state(funnel: CompiledFunnel, state: Mapping[str, Any], stage: CompiledStage
                  ) -> dict[str, Any]:
    """The state the stage shows the model: its ``context`` fields, without nulls."""
    spec = funnel.spec
    names = stage.spec.context if stage.spec.context is not None else [
        n for n in spec.state if n not in _HIDDEN and n != spec.memory.summary
    ]
    out = {}
    for name in names:
        value = _prune(state.get(name))
        if not _empty(value):
            out[name] = value
    return out


def full_view(funnel: CompiledFunnel, state: Mapping[str, Any]) -> dict[str, Any]:
    """Every declared field, with declared-but-missing nested properties as ``None``."""
    view = {name: state.get(name, default) for name, default in funnel.view_defaults}
    for name, schema in funnel.view_objects:
        view[name] = declared_view(view[name], schema)
    return view


def presented_products(funnel: CompiledFunnel, state: Mapping[str, Any]) -> list[dict[str, Any]]:
    field = funnel.spec.presented_field
    if not field or funnel.catalog is None:
        return []
    out = []
    for i, item in enumerate(state.get(field) or [], start=1):
        product = funnel.catalog.by_sku.get(str(item.get("sku")))
        out.append({
            "index": i,
            "sku": item.get("sku"),
            "name": product.name if product else item.get("sku"),
            "price": product.as_prompt()["price"] if product else None,
            "presented_at": item.get("presented_at"),
        })
    return out


def build_context(
    funnel: CompiledFunnel,
    stage: CompiledStage,
    state: Mapping[str, Any],
    engine_row: Mapping[str, Any],
    *,
    customer_message: str,
    messages: Sequence[Message],
    returning: bool,
    idle_seconds: float | None,
    now: str,
) -> dict[str, Any]:
    """The variables a stage template sees (documented in docs/funnel-format.md)."""
    spec = funnel.spec
    view = full_view(funnel, state)
    presented = presented_products(funnel, state)
    iteration = int(engine_row.get("stage_iteration") or 0)
    mi = stage.spec.max_iterations
    handoff = spec.handoff
    ctx = dict(view)
    ctx.update(
        funnel=spec.name,
        stage=stage.spec.name,
        stage_description=stage.spec.description,
        stage_iteration=iteration,
        iteration_limit_reached=bool(mi and iteration >= mi.limit),
        offer=mi.offer if mi and iteration >= mi.limit else None,
        state=view,
        state_json=compact_json(compact_state(funnel, state, stage)),
        presented=presented,
        presented_skus=[p["sku"] for p in presented],
        catalog=funnel.catalog_view,
        currency=funnel.catalog.currency if funnel.catalog else "",
        thresholds=funnel.rules.thresholds(state),
        messages=[{"role": m.role, "content": m.content} for m in messages],
        summary=(state.get(spec.memory.summary) or "") if spec.memory.summary else "",
        returning=returning,
        idle_for=_human(idle_seconds) if idle_seconds else "",
        notices=list(engine_row.get("notices") or []),
        customer_message=customer_message,
        now=now,
        handoff={
            "reason": state.get(handoff.reason) if handoff and handoff.reason else None,
            "triggered_at": state.get(handoff.triggered_at)
            if handoff and handoff.triggered_at else None,
        },
        turns=int(engine_row.get("turns") or 0),
        knowledge=[],  # the stage's chunks, when it declares `knowledge:` (engine.knowledge)
    )
    return ctx


def render(stage: CompiledStage, context: Mapping[str, Any]) -> str:
    """Render a stage's template.

    Raises:
        ConfigError: the template reads an undefined name or fails; names the file and line.
    """
    try:
        return stage.template.render(context).strip()
    except UndefinedError as exc:
        raise ConfigError(f"template uses an undefined value: {exc.message}",
                          file=str(stage.spec.prompt)) from None
    except TemplateError as exc:
        raise ConfigError(f"template failed: {exc}", file=str(stage.spec.prompt)) from None


def _human(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.0f} day(s)"
    if seconds >= 3600:
        return f"{seconds / 3600:.0f} hour(s)"
    return f"{max(1, round(seconds / 60))} minute(s)"
