"""A funnel file's YAML built into the typed :class:`~engine.format.spec.FunnelSpec`.

`build_spec` assumes the data passed the format's JSON Schema (the first layer of
`engine.validation`); semantic checks live in `engine.validation`. The types
themselves are in :mod:`engine.format.spec`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ._yaml import Located
from .claims import claims_spec, promotions
from .contract import is_derived
from .follow_up import build_follow_up
from .personal import marks
from .settings import (
    KnowledgeSpec,
    MemorySettings,
    ModelSettings,
    StageKnowledge,
    language_policy,
    migration_steps,
    parse_duration,
)
from .spec import (
    ActionSpec,
    ApprovalSpec,
    CartSpec,
    FieldSpec,
    FunnelSpec,
    HandoffSpec,
    IndexSpec,
    MaxIterations,
    StageSpec,
    TransitionSpec,
    default_column_type,
    index_name,
    zero_value,
)
from .texts import FALLBACK, Localized

__all__ = ["build_spec", "implied_engine_fields"]


def implied_engine_fields(data: dict[str, Any]) -> set[str]:
    """Fields that a feature (completeness, cart, handoff, ...) writes, so the model may not."""
    names: set[str] = set()
    comp = data.get("completeness") or {}
    if isinstance(comp, dict) and isinstance(comp.get("field"), str):
        names.add(comp["field"])
    cart = data.get("cart") or {}
    if isinstance(cart, dict):
        for key in ("field", "count", "total"):
            if isinstance(cart.get(key), str):
                names.add(cart[key])
        for sub in ("gift", "free_delivery"):
            flag = (cart.get(sub) or {}).get("flag") if isinstance(cart.get(sub), dict) else None
            if isinstance(flag, str):
                names.add(flag)
    memory = data.get("memory") or {}
    if isinstance(memory, dict) and isinstance(memory.get("summary"), str):
        names.add(memory["summary"])
    for section, keys in (
        ("presented", ("field",)),
        ("language", ("detected", "response")),
        ("handoff", ("triggered_at", "reason", "channel")),
    ):
        sec = data.get(section) or {}
        if isinstance(sec, dict):
            names.update(sec[k] for k in keys if isinstance(sec.get(k), str))
    for action in (data.get("actions") or {}).values():
        if isinstance(action, dict) and isinstance(action.get("field"), str):
            names.add(action["field"])
        if isinstance(action, dict) and isinstance(action.get("writes"), list):
            names.update(w for w in action["writes"] if isinstance(w, str))
    return names


def build_spec(data: dict[str, Any], path: Path, located: Located | None = None) -> FunnelSpec:
    """Turn schema-valid funnel data into a :class:`FunnelSpec`."""
    base = path.parent
    implied = implied_engine_fields(data)
    handoff_data = data.get("handoff") or {}
    write_once_implied = {handoff_data.get("triggered_at"), handoff_data.get("reason")}

    def line_of(*keys: str | int) -> int:
        return located.where(keys, key=True)[0] if located else 0

    state: dict[str, FieldSpec] = {}
    for name, raw in (data.get("state") or {}).items():
        ftype = raw["type"]
        # A timestamp or date has no zero value: without a default it is NULL until set.
        temporal = ftype == "string" and raw.get("format") in ("date-time", "date")
        nullable = bool(raw.get("nullable", temporal and "default" not in raw))
        if "default" in raw:
            default = raw["default"]
        else:
            default = None if nullable else zero_value(ftype)
        raw, personal_paths, grounded_paths = marks(raw)
        schema = {k: v for k, v in raw.items() if k not in _STORAGE_KEYS}
        state[name] = FieldSpec(
            name=name,
            type=ftype,
            default=default,
            nullable=nullable,
            owner="engine" if name in implied else raw.get("owner", "llm"),
            write_once=bool(raw.get("write_once", name in write_once_implied)),
            column_type=(raw.get("column") or default_column_type(ftype, raw.get("format"))).lower(),
            schema=schema,
            line=line_of("state", name),
            personal=() in personal_paths,
            personal_paths=personal_paths,
            grounded_paths=grounded_paths,
        )

    model = ModelSettings().merged(data.get("model"))
    memory = MemorySettings().merged(data.get("memory"))
    prompts_dir = Path(os.path.normpath(base / data.get("prompts", "prompts")))
    schemas_dir = Path(os.path.normpath(base / data.get("schemas", "schemas")))

    funnel_claims = claims_spec(data.get("claims"))
    stages: dict[str, StageSpec] = {}
    for name, raw in (data.get("stages") or {}).items():
        raw = raw or {}
        mi = raw.get("max_iterations")
        derived = is_derived(data, name)
        if derived:
            extension = raw.get("schema_extension")
            contract_file = schemas_dir / extension if isinstance(extension, str) else None
        else:
            contract_file = schemas_dir / raw.get("schema", f"{name}.json")
        stages[name] = StageSpec(
            name=name,
            description=raw.get("description", ""),
            prompt=prompts_dir / raw.get("prompt", f"{name}.j2"),
            schema=contract_file,
            fallback=Localized.of(raw["fallback"]) if "fallback" in raw else FALLBACK,
            transitions=tuple(
                _transition(t, line_of("stages", name, "transitions", i))
                for i, t in enumerate(raw.get("transitions") or [])
            ),
            max_iterations=MaxIterations(**mi) if mi else None,
            on_enter=tuple(raw.get("on_enter") or ()),
            final=bool(raw.get("final", False)),
            context=tuple(raw["context"]) if "context" in raw else None,
            model=model.merged(raw.get("model")),
            memory=memory.merged(raw.get("memory")),
            line=line_of("stages", name),
            knowledge=_stage_knowledge(raw.get("knowledge")),
            derived=derived,
            approval=_approval(raw.get("approval"), line_of("stages", name, "approval")),
            claims=claims_spec(raw["claims"], funnel_claims) if "claims" in raw else None,
            follow_up=build_follow_up(
                raw.get("follow_up"), line_of("stages", name, "follow_up"),
                lambda i, n=name: line_of("stages", n, "follow_up", "steps", i)),
        )

    actions = {
        name: ActionSpec(
            name=name,
            builtin=raw.get("builtin"),
            hook=raw.get("hook"),
            options={k: v for k, v in raw.items() if k not in ("builtin", "hook", "side_effect")},
            side_effect=bool(raw.get("side_effect", False)),
        )
        for name, raw in (data.get("actions") or {}).items()
    }

    table = data["table"]
    indexes = tuple(
        IndexSpec(
            name=ix.get("name") or index_name(table, ix["column"]),
            column=ix["column"],
            descending=ix.get("order") == "desc",
            where_not_null=bool(ix.get("where_not_null", False)),
        )
        for ix in data.get("indexes") or []
    ) + tuple(
        IndexSpec(index_name(table, name), name, False, False)
        for name, raw in (data.get("state") or {}).items()
        if raw.get("indexed")
    )

    comp = data.get("completeness") or {}
    cart_raw = data.get("cart")
    cart = None
    if cart_raw:
        gift = cart_raw.get("gift") or {}
        free = cart_raw.get("free_delivery") or {}
        cart = CartSpec(
            field=cart_raw["field"],
            count=cart_raw.get("count"),
            total=cart_raw.get("total"),
            gift_sku=gift.get("sku"),
            gift_threshold=gift.get("threshold"),
            gift_flag=gift.get("flag"),
            free_delivery_threshold=free.get("threshold"),
            free_delivery_flag=free.get("flag"),
            max_qty=int(cart_raw.get("max_qty", 20)),
        )
    handoff = None
    if handoff_data:
        handoff = HandoffSpec(
            stage=handoff_data["stage"],
            triggered_at=handoff_data.get("triggered_at"),
            reason=handoff_data.get("reason"),
            channel=handoff_data.get("channel"),
            notify=dict(handoff_data.get("notify") or {"log": True}),
            holding_reply=Localized.optional(handoff_data.get("holding_reply")),
        )
    presented = data.get("presented") or {}
    language = data.get("language") or {}
    return FunnelSpec(
        name=data["funnel"],
        version=int(data["version"]),
        table=table,
        initial=data["initial"],
        description=data.get("description", ""),
        path=path,
        state=state,
        stages=stages,
        global_transitions=tuple(
            _transition(t, line_of("global_transitions", i))
            for i, t in enumerate(data.get("global_transitions") or [])
        ),
        actions=actions,
        indexes=indexes,
        completeness_field=comp.get("field"),
        completeness_rules=tuple((r["when"], int(r["points"])) for r in comp.get("rules") or []),
        cart=cart,
        presented_field=presented.get("field"),
        presented_max=int(presented.get("max_per_turn", 3)),
        language_detected=language.get("detected"),
        language_response=language.get("response"),
        handoff=handoff,
        catalog_path=base / data["catalog"] if data.get("catalog") else None,
        model=model,
        memory=memory,
        retention=parse_duration(data["retention"]) if data.get("retention") else None,
        removed_stages=dict(data.get("removed_stages") or {}),
        located=located,
        language_policy=language_policy(language),
        knowledge=_knowledge(data.get("knowledge"), base),
        pin=bool(data.get("pin", True)),
        session_ttl=parse_duration(data["session_ttl"]) if data.get("session_ttl") else None,
        migrations=migration_steps(data.get("migrations"),
                                   lambda i: line_of("migrations", i)),
        schemas_dir=schemas_dir,
        claims=funnel_claims,
        promotions=promotions(data.get("promotions")),
        follow_up=build_follow_up(data.get("follow_up"), line_of("follow_up"),
                                  lambda i: line_of("follow_up", "steps", i)),
    )


def _approval(raw: Any, line: int) -> ApprovalSpec | None:
    if not raw:
        return None
    when = raw.get("when")
    return ApprovalSpec(when=None if when is None else str(when),
                        timeout=parse_duration(raw["timeout"]), on_timeout=raw["on_timeout"],
                        holding_reply=Localized.optional(raw.get("holding_reply")), reason=raw.get("reason"),
                        line=line)


def _stage_knowledge(raw: Any) -> StageKnowledge | None:
    if raw is None:
        return None
    raw = dict(raw)
    raw["facts"] = tuple(raw.get("facts") or ())
    return StageKnowledge(**raw)


def _knowledge(raw: Any, base: Path) -> KnowledgeSpec | None:
    if not raw:
        return None
    if isinstance(raw, str):
        raw = {"folder": raw}
    return KnowledgeSpec(folder=Path(os.path.normpath(base / raw["folder"])),
                         chunk_tokens=int(raw.get("chunk_tokens", 200)),
                         language=raw.get("language"))


_STORAGE_KEYS = frozenset(
    {"default", "nullable", "owner", "write_once", "indexed", "column", "description", "retention"}
)


def _transition(raw: dict[str, Any], line: int) -> TransitionSpec:
    when = raw.get("when")
    return TransitionSpec(
        to=raw["to"],
        when=None if when is None else str(when),
        reason=raw.get("reason"),
        line=line,
    )
