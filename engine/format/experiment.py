"""The ``experiment:`` of a funnel: its variants, their weights, its goal (F811-F809).

Read from the funnel file (``experiment:`` a mapping) or from a small file it names
(``experiment: experiments/gift.yaml``). :func:`read_experiment` returns the
experiment and every problem found, each with its file, line and field, so that
``funnel validate`` reports them all and ``Engine.open`` refuses a broken one.

This module imports nothing of the engine but the YAML loader: the validator and
the variant router both read it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from . import _yaml
from .paths import funnel_roots, is_confined

__all__ = ["Experiment", "Goal", "Problem", "Variant", "read_experiment"]

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
GOALS = ("handoff", "purchase", "cart_at_least")
THRESHOLDS = ("gift", "free_delivery")
VARIANT_KEYS = ("name", "weight", "funnel", "prompts", "thresholds", "catalog")
EXPERIMENT_KEYS = ("name", "goal", "variants", "winner", "force", "description")


@dataclass(frozen=True)
class Problem:
    """One problem of an experiment: where (file, line, column), a code and what to do."""

    file: str
    line: int
    col: int
    code: str
    message: str

    def format(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: error {self.code} {self.message}"


@dataclass(frozen=True)
class Goal:
    """What counts as a conversion: a hand-off, a recorded purchase, or a cart total."""

    kind: Literal["handoff", "purchase", "cart_at_least"]
    cart_at_least: float | None = None

    def describe(self) -> str:
        if self.kind == "cart_at_least":
            return f"cart total >= {self.cart_at_least:g}"
        return {"handoff": "handed off to a human",
                "purchase": "a purchase recorded (funnel_conversions)"}[self.kind]


@dataclass(frozen=True)
class Variant:
    """One arm. Without ``funnel``/overrides it runs the funnel as declared (a control)."""

    name: str
    weight: float
    funnel: Path | None = None
    prompts: dict[str, Path] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)
    catalog: Path | None = None
    line: int = 0

    @property
    def overrides(self) -> bool:
        return bool(self.prompts or self.thresholds or self.catalog)


@dataclass(frozen=True)
class Experiment:
    """An experiment: the first variant is the control the others are compared with."""

    name: str
    goal: Goal
    variants: tuple[Variant, ...]
    winner: str | None = None  # set: stopped, new sessions all go to it
    force: dict[str, str] = field(default_factory=dict)  # session id (or `prefix*`) -> variant
    file: Path | None = None

    @property
    def names(self) -> list[str]:
        return [v.name for v in self.variants]

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)

    def forced(self, session_id: str) -> str | None:
        """The variant the experiment's ``force:`` gives this session, if any."""
        if session_id in self.force:
            return self.force[session_id]
        best: tuple[str, str] | None = None  # the longest matching prefix wins
        for key, name in self.force.items():
            if key.endswith("*") and session_id.startswith(key[:-1]) and (
                    best is None or len(key) > len(best[0])):
                best = (key, name)
        return best[1] if best else None


class _Reader:
    def __init__(self, file: Path, located: _yaml.Located | None, prefix: tuple[Any, ...],
                 roots: tuple[Path, ...] = ()) -> None:
        self.file, self.located, self.prefix, self.roots = file, located, prefix, roots
        self.problems: list[Problem] = []

    def outside(self, path: Path) -> bool:
        """A file outside the funnel's project (or hidden): never read (engine.format.paths)."""
        return bool(self.roots) and not is_confined(path, self.roots)

    def err(self, keys: tuple[Any, ...], code: str, message: str, *, key: bool = False) -> None:
        line, col = (self.located.where(self.prefix + keys, key=key) if self.located
                     else (0, 0))
        self.problems.append(Problem(str(self.file), line, col, code, message))

    def line(self, keys: tuple[Any, ...]) -> int:
        return self.located.where(self.prefix + keys)[0] if self.located else 0


def read_experiment(raw: Any, funnel_path: Path, located: _yaml.Located | None = None,
                    *, states: set[str] | None = None, stages: set[str] | None = None
                    ) -> tuple[Experiment | None, list[Problem]]:
    """The funnel's ``experiment:`` value (a mapping, or a file name), parsed and checked.

    Args:
        raw: the value of ``experiment:`` in the funnel file (``None``: no experiment).
        funnel_path: the funnel file; relative paths are resolved against its folder.
        located: the funnel file's positions, for the problems' lines.
        stages: the funnel's stage names, to check ``prompts:`` overrides against.
        states: unused today (kept for checks of variant funnels' state).

    Returns:
        (the experiment, or ``None`` when there is none or it has problems; the problems).
    """
    del states
    if raw is None:
        return None, []
    base = funnel_path.parent
    file, prefix = funnel_path, ("experiment",)
    roots = funnel_roots(funnel_path)
    r = _Reader(file, located, prefix, roots)
    if isinstance(raw, str):  # a small experiment file next to the funnel
        file = Path(os.path.normpath(base / raw))
        if r.outside(file):
            r.err((), "F811", f"the experiment file {file} is outside the funnel's project (or "
                  "hidden): move it beside the funnel")
            return None, r.problems
        try:
            sub = _yaml.load(file.read_text("utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            r.err((), "F811", f"cannot read the experiment file {file}: {exc}; create it or "
                  "fix `experiment:`")
            return None, r.problems
        except _yaml.YamlSyntaxError as exc:
            return None, [Problem(str(file), exc.line, exc.col, "F811",
                                  f"{exc}; fix the experiment file's YAML")]
        data = sub.data
        if isinstance(data, dict) and set(data) == {"experiment"}:
            r, data = _Reader(file, sub, ("experiment",), roots), data["experiment"]
        else:
            r = _Reader(file, sub, (), roots)
        base = file.parent
    else:
        data = raw
    if not isinstance(data, dict):
        r.err((), "F812", "`experiment` must be a mapping with `name`, `goal` and `variants` "
              "(or the name of a file holding one)")
        return None, r.problems
    for key in data:
        if key not in EXPERIMENT_KEYS:
            r.err((key,), "F812", f"unknown key `{key}` in the experiment; expected one of "
                  f"{', '.join(EXPERIMENT_KEYS)}", key=True)
    name = data.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        r.err(("name",), "F812", "the experiment needs a `name`: letters, digits, `_.-`, at "
              "most 63 characters (it seeds the assignment: renaming it reshuffles sessions)")
    goal = _goal(data.get("goal"), r)
    variants = _variants(data.get("variants"), base, r, stages)
    names = [v.name for v in variants]
    winner = data.get("winner")
    if winner is not None and winner not in names:
        r.err(("winner",), "F817", f"`winner: {winner}` is not a variant of the experiment; "
              f"expected one of {', '.join(names) or '(none)'}")
    force: dict[str, str] = {}
    raw_force = data.get("force", {})
    if not isinstance(raw_force, dict):
        r.err(("force",), "F818", "`force` must map session ids (or `prefix*`) to variants, "
              "e.g. `force: {qa-b-*: B}`")
    else:
        for sid, target in raw_force.items():
            if str(target) not in names:
                r.err(("force", sid), "F818", f"`force: {sid}: {target}` names no variant; "
                      f"expected one of {', '.join(names) or '(none)'}")
            force[str(sid)] = str(target)
    if r.problems or goal is None or not isinstance(name, str):
        return None, r.problems
    return Experiment(name, goal, tuple(variants), winner if isinstance(winner, str) else None,
                      force, file if file != funnel_path else None), r.problems


def _goal(raw: Any, r: _Reader) -> Goal | None:
    if raw in ("handoff", "purchase"):
        return Goal(raw)
    if isinstance(raw, dict) and set(raw) == {"cart_at_least"}:
        value = raw["cart_at_least"]
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return Goal("cart_at_least", float(value))
        r.err(("goal", "cart_at_least"), "F813", f"`cart_at_least: {value!r}` must be a "
              "positive number (the cart total a converting session reaches)")
        return None
    r.err(("goal",), "F813", f"`goal: {raw!r}` is not a goal; expected `handoff`, `purchase` "
          "or `{cart_at_least: AMOUNT}`")
    return None


def _variants(raw: Any, base: Path, r: _Reader, stages: set[str] | None) -> list[Variant]:
    if not isinstance(raw, list) or len(raw) < 2:
        r.err(("variants",), "F814", "`variants` must list two or more variants, each with "
              "`name` and `weight` (the first is the control)")
        return []
    out: list[Variant] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        keys: tuple[Any, ...] = ("variants", i)
        if not isinstance(item, dict):
            r.err(keys, "F814", f"variant {i + 1} must be a mapping with `name` and `weight`")
            continue
        for key in item:
            if key not in VARIANT_KEYS:
                r.err(keys + (key,), "F814", f"unknown key `{key}` in variant {i + 1}; "
                      f"expected one of {', '.join(VARIANT_KEYS)}", key=True)
        name = item.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            r.err(keys + ("name",), "F814", f"variant {i + 1} needs a `name`: letters, digits, "
                  "`_.-`, at most 63 characters")
            continue
        if name in seen:
            r.err(keys + ("name",), "F814", f"variant name `{name}` is used twice; rename one")
        seen.add(name)
        weight = item.get("weight")
        if not isinstance(weight, int | float) or isinstance(weight, bool) or weight <= 0:
            r.err(keys + ("weight",), "F815", f"variant `{name}`: `weight: {weight!r}` must be "
                  "a positive number (weights are relative: 50/50 and 1/1 are the same)")
            weight = 1.0
        funnel = _path(item, "funnel", base, keys, r, name)
        catalog = _path(item, "catalog", base, keys, r, name)
        if funnel is not None and ("prompts" in item or "thresholds" in item
                                   or "catalog" in item):
            r.err(keys + ("funnel",), "F816", f"variant `{name}`: give either `funnel` (a whole "
                  "funnel file) or overrides (`prompts`, `thresholds`, `catalog`), not both")
        prompts: dict[str, Path] = {}
        for stage, file in _mapping(item, "prompts", keys, r, name).items():
            if stages is not None and stage not in stages:
                r.err(keys + ("prompts", stage), "F816", f"variant `{name}`: `prompts` names "
                      f"stage `{stage}`, which the funnel does not declare", key=True)
            elif not isinstance(file, str) or not (base / file).is_file():
                r.err(keys + ("prompts", stage), "F816", f"variant `{name}`: template "
                      f"{base / str(file)} does not exist; create it or fix the path")
            elif r.outside(base / file):
                r.err(keys + ("prompts", stage), "F816", f"variant `{name}`: template "
                      f"{base / file} is outside the funnel's project (or hidden); move it in")
            else:
                prompts[str(stage)] = Path(os.path.normpath(base / file))
        thresholds: dict[str, float] = {}
        for key, value in _mapping(item, "thresholds", keys, r, name).items():
            if key not in THRESHOLDS:
                r.err(keys + ("thresholds", key), "F816", f"variant `{name}`: unknown threshold "
                      f"`{key}`; expected one of {', '.join(THRESHOLDS)} (the cart's)", key=True)
            elif not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                r.err(keys + ("thresholds", key), "F816", f"variant `{name}`: threshold `{key}` "
                      f"must be a number >= 0, not {value!r}")
            else:
                thresholds[str(key)] = float(value)
        out.append(Variant(name, float(weight), funnel, prompts, thresholds, catalog,
                           r.line(keys)))
    return out


def _path(item: dict[str, Any], key: str, base: Path, keys: tuple[Any, ...], r: _Reader,
          name: str) -> Path | None:
    value = item.get(key)
    if value is None:
        return None
    path = Path(os.path.normpath(base / str(value)))
    if not isinstance(value, str) or not path.is_file():
        r.err(keys + (key,), "F816", f"variant `{name}`: {key} file {path} does not exist; "
              "create it or fix the path")
        return None
    if r.outside(path):
        r.err(keys + (key,), "F816", f"variant `{name}`: {key} file {path} is outside the "
              "funnel's project (or hidden); move it in")
        return None
    return path


def _mapping(item: dict[str, Any], key: str, keys: tuple[Any, ...], r: _Reader, name: str
             ) -> dict[str, Any]:
    value = item.get(key, {})
    if not isinstance(value, dict):
        r.err(keys + (key,), "F816", f"variant `{name}`: `{key}` must be a mapping")
        return {}
    return value
