"""Which variant of the funnel a session runs on: sticky, weighted, forceable, stoppable.

:class:`Variants` is built once per engine: every variant's :class:`CompiledFunnel`
is compiled then (a control or a variant without overrides shares the funnel's own),
and :meth:`Variants.funnel_for` is what ``Engine._funnel_for`` returns for a turn.

A new session's variant, in order of precedence:

1. forced for QA: :meth:`Variants.force` (``funnel chat --variant``) or the
   experiment's ``force:`` (a session id, or a ``prefix*``);
2. the ``winner:`` of a stopped experiment;
3. its assignment: a SHA-256 of the experiment's name and the session id, read as a
   number in [0, 1), placed on the cumulative weights. Stable across processes and
   restarts (never Python's salted ``hash()``).

The variant is then recorded in the session's row (``variant``, written once) and
read back from it on every later turn: a session keeps its variant when weights
change or the experiment stops.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..format import _yaml
from ..format.experiment import Experiment, Variant, read_experiment
from ..funnel.compiled import CompiledFunnel, load_funnel

__all__ = ["Variants", "assign", "bucket", "load_experiment"]

_EXPERIMENT_KEY = re.compile(r"^experiment\s*:", re.MULTILINE)


def bucket(experiment: str, session_id: str) -> float:
    """The session's stable point in [0, 1) for this experiment."""
    digest = hashlib.sha256(f"{experiment}\x00{session_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


def assign(experiment: Experiment, session_id: str) -> str:
    """The variant the weights give ``session_id`` (ignores ``force`` and ``winner``)."""
    point = bucket(experiment.name, session_id) * sum(v.weight for v in experiment.variants)
    edge = 0.0
    for v in experiment.variants:
        edge += v.weight
        if point < edge:
            return v.name
    return experiment.variants[-1].name  # rounding at the top edge


def load_experiment(path: Path, stages: set[str] | None = None) -> Experiment | None:
    """The experiment a funnel file declares (``None`` without one).

    Raises:
        ConfigError: the experiment has problems (every one is in the message, with
            its file, line and field).
    """
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the funnel file: {exc}", file=str(path)) from None
    if not _EXPERIMENT_KEY.search(text):
        return None
    located = _yaml.load(text)
    data = located.data if isinstance(located.data, dict) else {}
    experiment, problems = read_experiment(data.get("experiment"), path, located, stages=stages)
    if problems:
        raise ConfigError("the experiment is invalid:\n" +
                          "\n".join(p.format() for p in problems[:20]))
    return experiment


class Variants:
    """The variants of one funnel's experiment, compiled once; the seam's resolver."""

    def __init__(self, base: CompiledFunnel, experiment: Experiment | None) -> None:
        self.base = base
        self.experiment = experiment
        self.funnels: dict[str, CompiledFunnel] = {}
        self._forced: dict[str, str] = {}
        for v in experiment.variants if experiment else ():
            self.funnels[v.name] = _compile(base, v)

    @classmethod
    def for_funnel(cls, base: CompiledFunnel) -> Variants:
        """Read the funnel file's ``experiment:`` and compile its variants.

        Raises:
            ConfigError: the experiment is invalid or a variant cannot be compiled.
        """
        path = base.spec.path
        experiment = load_experiment(path, set(base.spec.stages)) if path.is_file() else None
        return cls(base, experiment)

    def force(self, session_id: str, variant: str) -> None:
        """Run ``session_id`` on ``variant`` if it is new (QA); an assigned session keeps its own.

        Raises:
            ConfigError: the funnel has no experiment, or no such variant.
        """
        if self.experiment is None:
            raise ConfigError(f"funnel '{self.base.name}' declares no `experiment:`; "
                              "there is no variant to force", file=str(self.base.spec.path))
        if variant not in self.funnels:
            raise ConfigError(f"experiment '{self.experiment.name}' has no variant "
                              f"'{variant}'; expected one of {', '.join(self.funnels)}",
                              file=str(self.base.spec.path))
        self._forced[session_id] = variant

    def choose(self, session_id: str) -> str | None:
        """The variant a new session gets (``None``: no experiment)."""
        exp = self.experiment
        if exp is None:
            return None
        forced = self._forced.get(session_id) or exp.forced(session_id)
        if forced is not None:
            return forced
        if exp.winner is not None:
            return exp.winner
        return assign(exp, session_id)

    def funnel_for(self, session_id: str, row: Mapping[str, Any] | None) -> CompiledFunnel:
        """The funnel a turn of this session runs on.

        A session with a row keeps the variant recorded in it; one that began before
        the experiment (no variant recorded) stays on the funnel as declared, outside
        the experiment. A new session is given its variant by :meth:`choose`.
        """
        if not self.funnels:
            return self.base
        if row is not None:
            variant = row.get("variant")
            return self.funnels.get(variant, self.base) if isinstance(variant, str) else self.base
        name = self.choose(session_id)
        return self.funnels[name] if name is not None else self.base


def _compile(base: CompiledFunnel, v: Variant) -> CompiledFunnel:
    """A variant's funnel: another funnel file, the funnel with overrides, or the funnel."""
    spec = base.spec
    if v.funnel is not None:
        funnel = load_funnel(v.funnel)
        other = funnel.spec
        if (other.name, other.table) != (spec.name, spec.table) or \
                set(other.state) != set(spec.state):
            raise ConfigError(
                f"variant '{v.name}': funnel file {v.funnel} must run on the same sessions: the "
                f"same `funnel` ({spec.name}), `table` ({spec.table}) and state fields; it has "
                f"{other.name}, {other.table} and differs in "
                f"{sorted(set(other.state) ^ set(spec.state))}", file=str(spec.path), line=v.line)
    elif v.overrides:
        changes: dict[str, Any] = {}
        if v.prompts:
            changes["stages"] = {
                name: dataclasses.replace(stage, prompt=v.prompts[name]) if name in v.prompts
                else stage for name, stage in spec.stages.items()}
        if v.catalog is not None:
            changes["catalog_path"] = v.catalog
        if v.thresholds:
            if spec.cart is None:
                raise ConfigError(f"variant '{v.name}': `thresholds` change the cart's, but "
                                  "the funnel declares no cart", file=str(spec.path),
                                  line=v.line)
            changes["cart"] = dataclasses.replace(
                spec.cart, gift_threshold=v.thresholds.get("gift", spec.cart.gift_threshold),
                free_delivery_threshold=v.thresholds.get(
                    "free_delivery", spec.cart.free_delivery_threshold))
        funnel = CompiledFunnel(dataclasses.replace(spec, **changes))
    else:
        funnel = copy.copy(base)  # the control: the funnel's own compiled parts, shared
    funnel.variant = v.name
    return funnel
