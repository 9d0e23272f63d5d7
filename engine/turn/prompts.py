"""Prompts: the stage template rendered from compact state, static part first.

The model sees what the stage needs and nothing else: the state as compact
JSON (no nulls, no engine bookkeeping), presented products numbered in order
with their SKUs (so "the first one" resolves to a SKU), thresholds as ready
booleans. The template is the system message, so it holds only what the
funnel's author wrote and what the engine computed from validated state:
customer and model text (recent messages, this message, the summary, the
notices) reach the model in messages of their own (engine.turn.budget), and the
template variables ``messages``, ``customer_message``, ``summary`` and
``notices`` are empty.

A template is rendered in up to three parts (:func:`render_parts`). Its
top-level ``{% block state %}`` holds what changes with the state (the facts,
the products shown so far), its top-level ``{% block turn %}`` what changes
every turn (the knowledge found for this message, a round counter); the rest
is the static prefix, rendered with :data:`~engine.format.names.STATIC_PROMPT_NAMES`
only, so that it is the same text on every turn of the stage and a provider's
prefix cache can reuse it (docs/funnel-format.md, "Prompt layout"). A
template without either block is one part, all of it turn-dependent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jinja2 import TemplateError, UndefinedError

from ..errors import ConfigError
from ..format.names import PROMPT_BLOCKS, STATE_BLOCK, STATIC_PROMPT_NAMES, TURN_BLOCK
from ..funnel.actions import ITEM_STAMPS
from ..funnel.compiled import CompiledFunnel, CompiledStage
from ..funnel.state import defaults
from ..records.messages import Message
from ..sandbox.expressions import compact_json, declared_view
from ..sandbox.templates import render_block, render_without
from .budget import Parts, bound_notices, compact, floor_tokens

# Bookkeeping, not facts about the customer (the summary has its own `summary` slot).
_HIDDEN = frozenset(
    {"session_id", "stage_history", "row_version", "funnel_version", "notices", "created_at",
     "updated_at", "last_message_at", "turns", "summary_upto"}
)


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def _prune(value: Any, item: bool = False) -> Any:
    if isinstance(value, dict):
        # Each value pruned once (pruning it again to test it doubled the work per level).
        out = {}
        for k, v in value.items():
            if item and k in ITEM_STAMPS:
                continue
            pruned = _prune(v)
            if not _empty(pruned):
                out[k] = pruned
        return out
    if isinstance(value, list):
        return [_prune(v, True) for v in value if not _empty(v)]
    return value


def compact_state(funnel: CompiledFunnel, state: Mapping[str, Any], stage: CompiledStage
                  ) -> dict[str, Any]:
    """The state the stage shows the model: its ``context`` fields, without nulls, and
    the list items without the engine's stamps (``presented_at``, ``added_at``...,
    :data:`~engine.funnel.actions.ITEM_STAMPS`). By default every field but the
    engine's bookkeeping, the summary and the detected language (the template states
    the language to reply in, from the response field)."""
    spec = funnel.spec
    names = stage.spec.context if stage.spec.context is not None else [
        n for n in spec.state
        if n not in _HIDDEN and n != spec.memory.summary and n != spec.language_detected
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
        state_json=compact_json(compact(compact_state(funnel, state, stage))),
        presented=presented,
        presented_skus=[p["sku"] for p in presented],
        catalog=funnel.catalog_view,
        currency=funnel.catalog.currency if funnel.catalog else "",
        thresholds=funnel.rules.thresholds(state),
        # The recent messages and this one reach the model as chat messages of their own
        # roles; in the system message they would read as instructions.
        messages=[],
        # Customer- and model-derived text stays out of the system message: the engine
        # sends the summary and the notices in a data message (engine.turn.budget).
        summary="",
        returning=returning,
        idle_for=_human(idle_seconds) if idle_seconds else "",
        notices=[],
        customer_message="",
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


def prompt_data(funnel: CompiledFunnel, state: Mapping[str, Any],
                engine_row: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The summary and the notices, for the data message (never the system message)."""
    field = funnel.spec.memory.summary
    summary = str(state.get(field) or "") if field else ""
    return summary, bound_notices(engine_row.get("notices") or [])


def at_level(funnel: CompiledFunnel, stage: CompiledStage, state: Mapping[str, Any],
             context: Mapping[str, Any], level: int) -> dict[str, Any]:
    """``context`` with the state compacted to ``level`` (engine.turn.budget.LEVELS): the
    fields a template reads directly too, so that no loop over a field the customer
    grows can outgrow the budget. The row keeps the full values."""
    out = dict(context)
    # Each field compacted once (a turn renders every prompt at least once: this is on
    # the hot path): the top-level names and ``state`` mostly hold the same values.
    view = context["state"]
    compacted = {k: compact(v, level) for k, v in view.items()}
    for name in funnel.spec.state:
        if name in out:
            value = out[name]
            out[name] = compacted[name] if name in view and value is view[name] \
                else compact(value, level)
    out["state"] = compacted
    # build_context wrote state_json at level 0 already.
    out["state_json"] = context["state_json"] if level == 0 else \
        compact_json(compact(compact_state(funnel, state, stage), level))
    return out


def prompt_floor(funnel: CompiledFunnel, stage: CompiledStage) -> int:
    """The smallest prompt of ``stage`` in estimated tokens: its template rendered for a
    new session with the most compacted state, and an empty message. A
    ``memory.prompt_budget`` under it can never be met (``funnel validate``, F204).

    Raises:
        ConfigError: the template fails to render.
    """
    state = defaults(funnel.spec)
    row = {"stage_iteration": 0, "turns": 0, "notices": []}
    context = build_context(funnel, stage, state, row, customer_message="", messages=[],
                            returning=False, idle_seconds=None, now="2000-01-01T00:00:00+00:00")
    return floor_tokens(lambda level: render_parts(stage, at_level(funnel, stage, state,
                                                                    context, level)))


def render(stage: CompiledStage, context: Mapping[str, Any]) -> str:
    """Render a stage's template whole (its ``turn`` block in place).

    Raises:
        ConfigError: the template reads an undefined name or fails; names the file and line.
    """
    return _rendered(stage, lambda: stage.template.render(context))


def render_parts(stage: CompiledStage, context: Mapping[str, Any]) -> Parts:
    """A stage's prompt as (static prefix, state part, turn part), see the module docstring.

    A template without a ``state`` or ``turn`` block renders whole as the static prefix
    (it may read every name, so its start changes with the state: nothing for a cache to
    reuse).

    Raises:
        ConfigError: the template fails, or its static part reads a name that changes
            from turn to turn; names the file and line.
    """
    template = stage.template
    blocks = [name for name in PROMPT_BLOCKS if name in template.blocks]
    if not blocks:
        return Parts(render(stage, context))
    hint = (f"; outside {{% block {STATE_BLOCK} %}} and {{% block {TURN_BLOCK} %}} a "
            f"template may read only {', '.join(sorted(STATIC_PROMPT_NAMES))} (the start of "
            "the prompt that every turn of the stage shares): move what reads the state "
            "into a block")
    view = static_view(context)
    # The static part depends on nothing else: rendered once per stage and funnel. The
    # catalog (one list per compiled funnel) is told apart by identity, and kept with
    # the text so that its id cannot be reused by another list while cached.
    catalog = view.get("catalog")
    key = (*(repr(view.get(name)) for name in sorted(view) if name != "catalog"),
           id(catalog))
    cached = stage.static_prompts.get(key)
    if cached is not None and cached[0] is catalog:
        static = cached[1]
    else:
        static = _rendered(stage, lambda: render_without(template, blocks, view), hint)
        if len(stage.static_prompts) >= 16:  # a stage serves a handful of funnels at most
            stage.static_prompts.clear()
        stage.static_prompts[key] = (catalog, static)

    def block(name: str) -> str:
        if name not in blocks:
            return ""
        # A block nested in the other renders once, in its own place in the chat.
        others = [other for other in blocks if other != name]
        return _rendered(stage, lambda: render_block(template, name, context, others))

    return Parts(static, block(STATE_BLOCK), block(TURN_BLOCK))


def static_view(context: Mapping[str, Any]) -> dict[str, Any]:
    """The variables of the static part: the same for every turn of a stage. Of
    ``thresholds`` only the thresholds themselves (not whether the cart reached them)."""
    out = {name: context[name] for name in STATIC_PROMPT_NAMES if name in context}
    out["thresholds"] = {k: v for k, v in (context.get("thresholds") or {}).items()
                         if k.endswith("_threshold")}
    return out


def _rendered(stage: CompiledStage, run: Callable[[], str], hint: str = "") -> str:
    try:
        return run().strip()
    except UndefinedError as exc:
        file, line = _template_position(exc, stage)
        raise ConfigError(f"template uses an undefined value: {exc.message}{hint}",
                          file=file, line=line) from None
    except TemplateError as exc:
        file, line = _template_position(exc, stage)
        raise ConfigError(f"template failed: {exc}", file=file, line=line) from None


def _template_position(exc: BaseException, stage: CompiledStage) -> tuple[str, int | None]:
    """The template file and line a render error happened at: Jinja rewrites the
    traceback with a frame per template line it went through (marked by
    ``__jinja_exception__`` in its globals); the innermost one names the file (an
    included one, maybe) and the line."""
    file, line = str(stage.spec.prompt), None
    tb = exc.__traceback__
    while tb is not None:
        if "__jinja_exception__" in tb.tb_frame.f_globals:
            file, line = tb.tb_frame.f_code.co_filename, tb.tb_lineno
        tb = tb.tb_next
    return file, line


def _human(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.0f} day(s)"
    if seconds >= 3600:
        return f"{seconds / 3600:.0f} hour(s)"
    return f"{max(1, round(seconds / 60))} minute(s)"
