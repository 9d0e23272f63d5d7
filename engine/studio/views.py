"""What the page shows after a turn, built from what the turn already returns.

Every panel is read from the :class:`engine.turn.data.TurnResult`, the session's row and
its turn records (``funnel_turns``); nothing here runs during a turn. The form schema
is the current stage's output schema (``CompiledStage.schema``) with its local
``$ref`` resolved and the catalog's SKUs offered as an enum, so that the page builds
the "I am the model" form generically from JSON Schema.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from ..funnel.compiled import CompiledFunnel
from ..funnel.state import defaults, plain
from ..turn.explain import describe
from ..turn.prompts import full_view

__all__ = ["changed", "completeness", "form_schema", "why"]

_POSITION = ("stage", "stage_iteration", "turns", "stage_history", "notices")
_MAX_DEPTH = 12  # $ref chains resolved this deep at most (a schema that refers to itself)


def context(funnel: CompiledFunnel, state: Mapping[str, Any]) -> dict[str, Any]:
    """The names conditions read, from a stored row (the turn's facts, such as the
    actions of the turn, are not in a row: they read as empty)."""
    ctx = full_view(funnel, state)
    ctx.update({k: state.get(k) for k in _POSITION}, actions=[], handoff_requested=None,
               returning=False)
    return ctx


def completeness(funnel: CompiledFunnel, state: Mapping[str, Any]) -> dict[str, Any] | None:
    """Each completeness rule, its points and whether it holds now; the score as stored."""
    spec = funnel.spec
    if not spec.completeness_field:
        return None
    hits = funnel.rules.completeness_hits(context(funnel, state))
    rules = [{"when": source, "points": points, "held": bool(held)}
             for held, (_c, points, source) in zip(hits, funnel.rules.completeness, strict=True)]
    return {"field": spec.completeness_field, "score": state.get(spec.completeness_field),
            "max": sum(points for _s, points in spec.completeness_rules), "rules": rules}


def fresh(funnel: CompiledFunnel) -> dict[str, Any]:
    """A session's row before its first turn: the defaults, in the initial stage."""
    spec = funnel.spec
    return {**defaults(spec), "session_id": None, "stage": spec.initial, "stage_iteration": 0,
            "turns": 0, "notices": [], "stage_history": [], "funnel_version": spec.version,
            "summary_upto": 0, "variant": None}


def changed(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> list[str]:
    """The top-level fields whose value differs (the turn's changes, derived ones too)."""
    before = before or {}
    skip = {"updated_at", "last_message_at", "row_version", "created_at", "session_id"}
    return sorted(k for k, v in after.items()
                  if k not in skip and plain(before.get(k)) != plain(v))


def why(explain: Sequence[Mapping[str, Any]] | None, *, returning: bool = False,
        notices: Sequence[str] = (), funnel: CompiledFunnel | None = None,
        claims: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The why panel: every exit evaluated (condition, values read, verdict), the lines
    ``funnel chat --explain`` prints, the iteration caps, the idle return, the notices,
    and the reply claims refused (engine.claims: what a reply said, what backs it)."""
    steps = [dict(step) for step in explain or []]
    caps = {}
    if funnel is not None:
        caps = {name: {"limit": st.max_iterations.limit, "to": st.max_iterations.to,
                       "offer": st.max_iterations.offer}
                for name, st in funnel.spec.stages.items() if st.max_iterations}
    return {"steps": steps, "lines": describe(steps), "returning": returning,
            "notices": list(notices), "caps": caps, "claims": [dict(c) for c in claims]}


def _resolve(root: Mapping[str, Any], node: Any, depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        return {}
    if isinstance(node, list):
        return [_resolve(root, n, depth + 1) for n in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        merged = {**(target if isinstance(target, dict) else {}),
                  **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(root, merged, depth + 1)
    return {k: _resolve(root, v, depth + 1) for k, v in node.items() if k != "$defs"}


def _skus(node: Any, skus: list[str], key: str = "") -> None:
    """Offer the catalog's SKUs where the schema asks for a product and names none."""
    if isinstance(node, list):
        for n in node:
            _skus(n, skus)
        return
    if not isinstance(node, dict):
        return
    if key in ("sku", "skus") and "enum" not in node:
        target = node.get("items") if node.get("type") == "array" else node
        if isinstance(target, dict) and target.get("type", "string") == "string" \
                and "enum" not in target and "const" not in target:
            target["enum"] = list(skus)
    for k, v in node.items():
        if k == "properties" and isinstance(v, dict):
            for name, sub in v.items():
                _skus(sub, skus, name)
        elif isinstance(v, dict | list):
            _skus(v, skus)


def form_schema(funnel: CompiledFunnel, stage: str) -> dict[str, Any]:
    """The stage's output schema for the form: ``$ref``s resolved, SKUs as an enum
    (labelled with the product names in ``x-labels``), the updates limited to the
    fields the stage allows."""
    compiled = funnel.stage(stage)
    schema: dict[str, Any] = _resolve(compiled.schema, copy.deepcopy(compiled.schema))
    if funnel.catalog is not None:
        skus = [p.sku for p in funnel.catalog.products]
        _skus(schema, skus)
        schema["x-labels"] = {p.sku: f"{p.sku} {p.name} ({p.price} {funnel.catalog.currency})"
                              for p in funnel.catalog.products}
    updates = (schema.get("properties") or {}).get("updates")
    if isinstance(updates, dict) and isinstance(updates.get("properties"), dict):
        updates["properties"] = {k: v for k, v in updates["properties"].items()
                                 if k in compiled.allowed_updates}
    return schema
