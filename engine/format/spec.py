"""The funnel format as typed objects, built from a funnel file's YAML.

`build_spec` assumes the data passed the format's JSON Schema (the first
layer of `engine.validation`); semantic checks live in `engine.validation`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._yaml import Located
from .contract import is_derived
from .personal import marks, remove_path
from .settings import BASE_LANGUAGES as BASE_LANGUAGES  # the settings, re-exported
from .settings import DURATION as DURATION
from .settings import FallbackModel as FallbackModel
from .settings import KnowledgeSpec as KnowledgeSpec
from .settings import LanguagePolicy as LanguagePolicy
from .settings import MemorySettings as MemorySettings
from .settings import MigrationStep as MigrationStep
from .settings import ModelSettings as ModelSettings
from .settings import RecallSettings as RecallSettings
from .settings import StageKnowledge as StageKnowledge
from .settings import language_policy as language_policy
from .settings import migration_steps as migration_steps
from .settings import parse_duration as parse_duration

# Columns every session table has, whatever the funnel declares. The engine
# owns all of them: no model output can write them.
ENGINE_COLUMNS: tuple[str, ...] = (
    "session_id",
    "stage",
    "stage_iteration",
    "stage_history",
    "turns",
    "funnel_version",
    "row_version",
    "notices",
    "summary_upto",
    "variant",
    "created_at",
    "updated_at",
    "last_message_at",
)

# The names conditions and templates may use (besides the state fields).
from .names import CONDITION_NAMES as CONDITION_NAMES  # noqa: E402
from .names import PROMPT_NAMES as PROMPT_NAMES  # noqa: E402

SQL_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
COLUMN_TYPE = re.compile(
    r"^(text|int|integer|bigint|smallint|boolean|jsonb|timestamptz|date|double precision|real"
    r"|numeric(\([0-9]{1,2},[0-9]{1,2}\))?|varchar\([0-9]{1,5}\))$",
    re.IGNORECASE,
)

FieldType = Literal["string", "integer", "number", "boolean", "object", "array"]


@dataclass(frozen=True)
class FieldSpec:
    """One top-level state field; it becomes one column."""

    name: str
    type: FieldType
    default: Any
    nullable: bool
    owner: Literal["llm", "engine"]
    write_once: bool
    column_type: str
    schema: dict[str, Any]
    line: int = 0
    personal: bool = False  # the whole field is personal data (`retention: personal`)
    # Paths (engine.format.personal) of the field's personal data, () the whole field,
    # and of the customer's own facts (kept only when the customer's messages hold them).
    personal_paths: tuple[tuple[str, ...], ...] = ()
    grounded_paths: tuple[tuple[str, ...], ...] = ()

    @property
    def is_json(self) -> bool:
        return self.type in ("object", "array")

    def scrubbed(self, value: Any) -> Any:
        """``value`` with its personal data removed (the default for the whole field)."""
        if self.personal:
            return self.default
        for path in self.personal_paths:
            value = remove_path(value, path)
        return value


@dataclass(frozen=True)
class TransitionSpec:
    to: str
    when: str | None
    reason: str | None
    line: int = 0


@dataclass(frozen=True)
class MaxIterations:
    limit: int
    to: str | None = None
    reason: str | None = None
    offer: str | None = None


@dataclass(frozen=True)
class ApprovalSpec:
    """Entering a stage waits for a manager's approval when ``when`` holds (None: always).

    ``on_timeout`` is ``proceed``, ``reject``, ``handoff`` or a stage's name; ``timeout``
    is in seconds.
    """

    when: str | None
    timeout: float
    on_timeout: str
    holding_reply: str | None = None
    reason: str | None = None
    line: int = 0


# What an approval's ``on_timeout`` may name besides a stage.
APPROVAL_CHOICES = ("proceed", "reject", "handoff")


@dataclass(frozen=True)
class StageSpec:
    name: str
    description: str
    prompt: Path
    # The hand-written contract file (``schema:``, or ``<stage>.json`` by default), or for
    # a derived contract (engine.format.contract) its ``schema_extension`` file, if any.
    schema: Path | None
    fallback: str
    transitions: tuple[TransitionSpec, ...]
    max_iterations: MaxIterations | None
    on_enter: tuple[dict[str, Any], ...]
    final: bool
    context: tuple[str, ...] | None
    model: ModelSettings
    memory: MemorySettings
    line: int = 0
    knowledge: StageKnowledge | None = None
    derived: bool = False  # the contract is derived from the funnel (engine.format.contract)
    approval: ApprovalSpec | None = None  # entering the stage waits for a manager


@dataclass(frozen=True)
class ActionSpec:
    name: str
    builtin: str | None
    hook: str | None
    options: dict[str, Any]
    side_effect: bool


@dataclass(frozen=True)
class IndexSpec:
    name: str
    column: str
    descending: bool
    where_not_null: bool


@dataclass(frozen=True)
class CartSpec:
    field: str
    count: str | None
    total: str | None
    gift_sku: str | None
    gift_threshold: float | None
    gift_flag: str | None
    free_delivery_threshold: float | None
    free_delivery_flag: str | None
    max_qty: int


@dataclass(frozen=True)
class HandoffSpec:
    stage: str
    triggered_at: str | None
    reason: str | None
    channel: str | None
    notify: dict[str, Any]
    # Sent once per take-over, to the first customer message a manager holds (none: silence).
    holding_reply: str | None = None


@dataclass(frozen=True)
class FunnelSpec:
    """A funnel file, parsed. Paths are resolved against the funnel file's folder."""

    name: str
    version: int
    table: str
    initial: str
    description: str
    path: Path
    state: dict[str, FieldSpec]
    stages: dict[str, StageSpec]
    global_transitions: tuple[TransitionSpec, ...]
    actions: dict[str, ActionSpec]
    indexes: tuple[IndexSpec, ...]
    completeness_field: str | None
    completeness_rules: tuple[tuple[str, int], ...]
    cart: CartSpec | None
    presented_field: str | None
    presented_max: int
    language_detected: str | None
    language_response: str | None
    handoff: HandoffSpec | None
    catalog_path: Path | None
    model: ModelSettings
    memory: MemorySettings
    retention: float | None
    removed_stages: dict[str, str]
    located: Located | None = field(default=None, repr=False, compare=False)
    language_policy: LanguagePolicy = field(default_factory=LanguagePolicy)
    knowledge: KnowledgeSpec | None = None
    # Versions (docs/versions.md): whether sessions stay on the version they started
    # with, when an idle one has ended, and how state moves between versions.
    pin: bool = True
    session_ttl: float | None = None
    migrations: tuple[MigrationStep, ...] = ()
    # The `schemas:` folder: hand-written contracts and derived ones' extensions.
    schemas_dir: Path | None = None

    @property
    def engine_owned(self) -> frozenset[str]:
        """Fields no model output may write: declared `owner: engine` or implied by a feature."""
        return frozenset(f.name for f in self.state.values() if f.owner == "engine") | frozenset(
            ENGINE_COLUMNS
        )

    def final_stages(self) -> list[str]:
        return [s.name for s in self.stages.values() if s.final]


def index_name(table: str, column: str) -> str:
    """The name of an index that the funnel does not name (PostgreSQL keeps 63 characters)."""
    return f"idx_{table}_{column}"[:63]


def default_column_type(ftype: str, fmt: str | None) -> str:
    if ftype in ("object", "array"):
        return "jsonb"
    if ftype == "string":
        return "timestamptz" if fmt == "date-time" else ("date" if fmt == "date" else "text")
    return {"integer": "int", "number": "numeric", "boolean": "boolean"}[ftype]


def zero_value(ftype: str) -> Any:
    return {"string": "", "integer": 0, "number": 0, "boolean": False, "object": {}, "array": []}[
        ftype
    ]


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
            fallback=raw.get("fallback", "Sorry, I did not quite get that. Could you say it again?"),
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
            holding_reply=handoff_data.get("holding_reply"),
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
    )


def _approval(raw: Any, line: int) -> ApprovalSpec | None:
    if not raw:
        return None
    when = raw.get("when")
    return ApprovalSpec(when=None if when is None else str(when),
                        timeout=parse_duration(raw["timeout"]), on_timeout=raw["on_timeout"],
                        holding_reply=raw.get("holding_reply"), reason=raw.get("reason"),
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
