"""The funnel format as typed objects: what :func:`engine.format.build.build_spec` makes
of a funnel file's YAML, and what the rest of the engine reads."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._yaml import Located
from .claims import ClaimsSpec, Promotion
from .follow_up import FollowUpSpec
from .personal import remove_path
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
from .texts import Localized as Localized

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
    holding_reply: Localized | None = None
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
    fallback: Localized  # by language (engine.format.texts)
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
    # The stage's own `claims:` (engine.format.claims), over the funnel's; None: the funnel's.
    claims: ClaimsSpec | None = None
    follow_up: FollowUpSpec | None = None  # messages to a customer who went quiet here


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
    holding_reply: Localized | None = None


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
    # What the replies may claim, and the discounts the shop gives (engine.format.claims).
    claims: ClaimsSpec = field(default_factory=ClaimsSpec)
    promotions: tuple[Promotion, ...] = ()
    # The funnel's default follow-ups, for stages that declare none (docs/follow-ups.md).
    follow_up: FollowUpSpec | None = None

    @property
    def engine_owned(self) -> frozenset[str]:
        """Fields no model output may write: declared `owner: engine` or implied by a feature."""
        return frozenset(f.name for f in self.state.values() if f.owner == "engine") | frozenset(
            ENGINE_COLUMNS
        )

    def final_stages(self) -> list[str]:
        return [s.name for s in self.stages.values() if s.final]

    def follow_up_of(self, stage: str) -> FollowUpSpec | None:
        """The follow-ups of ``stage``: its own, else the funnel's default; none for a
        final stage, the hand-off's stage or a stage the funnel does not declare."""
        spec = self.stages.get(stage)
        if spec is None or spec.final or (self.handoff is not None
                                          and self.handoff.stage == stage):
            return None
        return spec.follow_up or self.follow_up

    @property
    def has_follow_ups(self) -> bool:
        return self.follow_up is not None or any(s.follow_up for s in self.stages.values())


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
