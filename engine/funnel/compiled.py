"""Load a funnel once into a :class:`CompiledFunnel`: everything a turn needs, prebuilt.

Parsing, validation, the `transitions` machine, compiled conditions, templates
and JSON Schema validators are built here once per funnel, never per turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import jsonschema_rs
from jinja2 import Template

from ..claims import ClaimChecker
from ..errors import ConfigError, FunnelInvalid
from ..format import contract
from ..format.catalog import Catalog, load_catalog
from ..format.paths import confine, funnel_roots
from ..format.spec import FunnelSpec, StageSpec
from ..sandbox.expressions import compile_condition, make_environment
from ..sandbox.patterns import linear_validator
from ..validation import check_file
from ..validation.schemas import action_types, resolve_local_ref
from .actions import ActionRunner
from .machine import StageMachine
from .state import StateRules, fast_validator


@dataclass(frozen=True)
class CompiledStage:
    spec: StageSpec
    template: Template
    schema: dict[str, Any]
    validator: jsonschema.Draft202012Validator
    allowed_updates: frozenset[str]
    # The action types the contract lets the model take here (engine.turn.output drops
    # any other with a notice, keeping the rest of the answer).
    allowed_actions: frozenset[str] = frozenset()
    # `validator`'s schema compiled by jsonschema-rs: a turn asks it first whether the
    # output is valid (well under a microsecond, against ~50 us for `validator`), and
    # `validator` stays the authority that explains a rejection (engine.turn.output). Derived,
    # so that a stage copied with another validator (dataclasses.replace) gets its own.
    fast_validator: jsonschema_rs.Draft202012Validator | None = field(
        init=False, repr=False, compare=False)
    # The static part of the prompt, rendered once (engine.turn.prompts.render_parts): it reads
    # only names that do not change from turn to turn. Keyed by those values, since the
    # stage may serve more than one funnel (variants share stages).
    static_prompts: dict[tuple[Any, ...], tuple[Any, str]] = field(
        init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        schema = self.validator.schema
        object.__setattr__(self, "fast_validator",
                           fast_validator(schema) if isinstance(schema, dict) else None)


class CompiledFunnel:
    """A funnel ready to run: build it with :func:`load_funnel` and share it across sessions."""

    # The experiment's variant this compiled funnel is (engine.experiments), else None.
    variant: str | None = None

    def __init__(self, spec: FunnelSpec) -> None:
        self.spec = spec
        self.name = spec.name
        # Every file the funnel names is re-checked here, not only by validate: a file
        # swapped for a symlink after validation is refused all the same.
        roots = funnel_roots(spec.path)
        if spec.knowledge is not None:
            confine(spec.knowledge.folder, roots, "knowledge folder")
        self.catalog: Catalog | None = (
            load_catalog(confine(spec.catalog_path, roots, "catalog")) if spec.catalog_path
            else None)
        self.machine = StageMachine(spec)
        # What templates see of the catalog, built once (the sandbox is immutable).
        self.catalog_view = [p.as_prompt() for p in self.catalog.products] if self.catalog else []
        # For prompts.full_view: every field with its default, and the objects among them
        # whose declared properties must read as None when missing.
        self.view_defaults = [(name, f.default) for name, f in spec.state.items()]
        self.view_objects = [(name, f.schema) for name, f in spec.state.items()
                             if isinstance(f.schema.get("properties"), dict)]
        completeness = [
            (compile_condition(src), points, src) for src, points in spec.completeness_rules
        ]
        self.rules = StateRules(spec, self.catalog, completeness)
        # Each exit condition on its own, for explanations (engine.turn.explain).
        self.explain_conditions = {
            t.when: compile_condition(t.when)
            for t in (*spec.global_transitions,
                      *(t for st in spec.stages.values() for t in st.transitions))
            if t.when is not None}
        # Each stage's approval gate (`approval.when`), compiled once; None: always asks.
        self.approval_conditions = {
            name: compile_condition(st.approval.when) if st.approval.when is not None else None
            for name, st in spec.stages.items() if st.approval is not None}
        self.actions = ActionRunner(spec, self.catalog)
        # What the replies may claim, against the catalog and the state (engine.claims).
        self.claims = ClaimChecker(spec, self.catalog)
        self.stages: dict[str, CompiledStage] = {}
        for stage in spec.stages.values():
            confine(stage.prompt, roots, "template")
            env = make_environment(stage.prompt.parent, roots)
            template = env.get_template(stage.prompt.name)
            schema = self._contract(stage, roots)
            updates = schema.get("properties", {}).get("updates", {})
            updates = resolve_local_ref(schema, updates if isinstance(updates, dict) else {})
            allowed = frozenset(updates.get("properties", {})) - spec.engine_owned
            self.stages[stage.name] = CompiledStage(
                spec=stage,
                template=template,
                schema=schema,
                validator=linear_validator(schema),
                allowed_updates=allowed,
                allowed_actions=frozenset(t for _, t in action_types(schema)),
            )

    def _contract(self, stage: StageSpec, roots: tuple[Path, ...]) -> dict[str, Any]:
        """The stage's output contract: its file, or derived from the funnel (and extended)."""
        file: dict[str, Any] | None = None
        if stage.schema is not None:
            file = json.loads(confine(stage.schema, roots, "output schema").read_text("utf-8"))
        if not stage.derived:
            return file or {}
        data = self.spec.located.data if self.spec.located is not None else None
        if not isinstance(data, dict):  # pragma: no cover - specs come from check_file
            raise ConfigError(f"funnel '{self.name}': the stage '{stage.name}' contract is "
                              "derived from the funnel file, which this spec does not carry")
        skus = [p.sku for p in self.catalog.products] if self.catalog else None
        derived = contract.derive(data, stage.name, skus)
        return contract.extend(derived, file) if file else derived

    def stage(self, name: str) -> CompiledStage:
        try:
            return self.stages[name]
        except KeyError:
            target = self.spec.removed_stages.get(name)
            if target:
                return self.stages[target]
            raise ConfigError(
                f"funnel '{self.name}' has no stage '{name}'; declare where its sessions go "
                f"under `removed_stages` and run `funnel migrate --check`"
            ) from None


def load_funnel(path: str | Path) -> CompiledFunnel:
    """Validate and compile a funnel file.

    Raises:
        FunnelInvalid: the funnel has errors (all of them are in ``.diagnostics``).
        ConfigError: the file cannot be read.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no funnel file at {path}")
    spec, diagnostics = check_file(path)
    if spec is None:
        raise FunnelInvalid(diagnostics)
    return CompiledFunnel(spec)
