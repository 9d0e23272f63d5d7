"""Coverage of the declared machine: which stages, exits, actions, fallbacks, gates,
iteration caps, idle returns and hand-off reasons a set of turns exercised.

The turns are *observations*, one plain dict per turn, made the same way from a
scenario's :class:`~engine.turn.data.TurnResult` (:func:`from_result`) and from a
real session's turn record (:func:`from_record`), so that `funnel test --coverage`
and `funnel report --coverage` count alike. :func:`measure` lays them over the
funnel's items (:func:`items`), each with the line of the funnel file that declares
it. Rendering is in :mod:`engine.scenarios.coverage_report`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import did_you_mean
from ..funnel.compiled import CompiledFunnel
from ..turn.data import TurnResult

# The `--fail-under` names, in report order, and what each counts.
CATEGORIES: dict[str, str] = {
    "stages": "stages entered",
    "exits": "exits and global transitions, held and not held",
    "actions": "allowed actions, accepted and refused",
    "fallbacks": "stage fallbacks sent",
    "gates": "approval gates that held a move",
    "caps": "iteration caps reached",
    "idle": "idle returns",
    "handoffs": "hand-off reasons",
}


@dataclass
class Item:
    """One thing the funnel declares that a turn can exercise, and how often one did."""

    category: str  # a key of CATEGORIES
    name: str  # "objection_handling -> presentation", "presentation: add_to_cart"
    outcome: str  # "held", "not held", "accepted", "refused", "entered", "sent", ...
    line: int  # in the funnel file
    key: tuple[Any, ...]  # what observations match on
    hits: int = 0

    @property
    def label(self) -> str:
        return f"{self.name}: {self.outcome}"

    def as_json(self) -> dict[str, Any]:
        return {"category": self.category, "name": self.name, "outcome": self.outcome,
                "line": self.line, "hits": self.hits}


def _line(funnel: CompiledFunnel, *path: str | int, key: bool = True) -> int:
    located = funnel.spec.located
    return located.where(path, key=key)[0] if located is not None else 0


def items(funnel: CompiledFunnel) -> list[Item]:
    """Every item of the funnel, in the order of the file (stage by stage)."""
    spec = funnel.spec
    out: list[Item] = []
    reasons: dict[str, int] = {}

    def reason(name: str | None, line: int) -> None:
        if name and name not in reasons:
            reasons[name] = line

    for i, g in enumerate(spec.global_transitions):
        line = g.line or _line(funnel, "global_transitions", i, key=False)
        name = f"* -> {g.to} (global) `{g.when}`" if g.when else f"* -> {g.to} (global)"
        for outcome in ("held", "not held") if g.when else ("held",):
            out.append(Item("exits", name, outcome, line, ("global", i, outcome == "held")))
        reason(g.reason, line)
    actions_line = {name: _line(funnel, "actions", name) for name in spec.actions}
    for stage in spec.stages.values():
        s = stage.name
        out.append(Item("stages", s, "entered", _line(funnel, "stages", s), ("stage", s)))
        for i, t in enumerate(stage.transitions):
            line = t.line or _line(funnel, "stages", s, "transitions", i, key=False)
            for outcome in ("held", "not held") if t.when else ("held",):
                out.append(Item("exits", f"{s} -> {t.to}", outcome, line,
                                ("exit", s, i, outcome == "held")))
            reason(t.reason, line)
        own = funnel.spec.located.data.get("stages", {}).get(s, {}).get("actions") \
            if funnel.spec.located is not None and isinstance(funnel.spec.located.data, dict) \
            else None
        listed = list(own) if isinstance(own, list) else None
        for action in sorted(funnel.stage(s).allowed_actions,
                             key=lambda a: (listed.index(a) if listed and a in listed else 99, a)):
            if listed and action in listed:
                line = _line(funnel, "stages", s, "actions", listed.index(action), key=False)
            elif own is None and spec.located is not None and "actions" in (
                    spec.located.data.get("output") or {}):
                line = _line(funnel, "output", "actions")  # the stages' default list
            else:
                line = actions_line.get(action) or _line(funnel, "stages", s)
            for outcome in ("accepted", "refused"):
                out.append(Item("actions", f"{s}: {action}", outcome, line,
                                ("action", s, action, outcome == "accepted")))
        if stage.fallback and not stage.final:
            out.append(Item("fallbacks", s, "sent", _line(funnel, "stages", s, "fallback"),
                            ("fallback", s)))
        if stage.approval is not None:
            out.append(Item("gates", s, "held a move",
                            stage.approval.line or _line(funnel, "stages", s, "approval"),
                            ("gate", s)))
            reason(stage.approval.reason, stage.approval.line)
        if stage.max_iterations is not None:
            line = _line(funnel, "stages", s, "max_iterations")
            out.append(Item("caps", s, f"reached {stage.max_iterations.limit}", line,
                            ("cap", s)))
            reason(stage.max_iterations.reason, line)
        if _own_idle(funnel, s):
            out.append(Item("idle", s, "returned",
                            _line(funnel, "stages", s, "memory", "idle_return_after"),
                            ("idle", s)))
    if spec.memory.idle_return_after is not None:
        out.append(Item("idle", "funnel", "returned", _line(funnel, "memory", "idle_return_after"),
                        ("idle", None)))
    for declared in spec.actions.values():
        if declared.builtin == "request_handoff":
            for i, r in enumerate(declared.options.get("reasons") or ()):
                reason(str(r), _line(funnel, "actions", declared.name, "reasons", i, key=False))
    for name, line in reasons.items():
        out.append(Item("handoffs", name, "handed off", line, ("handoff", name)))
    return out


def _own_idle(funnel: CompiledFunnel, stage: str) -> bool:
    """Whether the stage sets its own ``memory.idle_return_after``."""
    located = funnel.spec.located
    if located is None or not isinstance(located.data, dict):
        return False
    raw = (located.data.get("stages") or {}).get(stage) or {}
    memory = raw.get("memory") if isinstance(raw, dict) else None
    return isinstance(memory, dict) and "idle_return_after" in memory


def from_result(funnel: CompiledFunnel, result: TurnResult) -> dict[str, Any]:
    """A scenario turn's observation."""
    handoff = funnel.spec.handoff
    reason = None
    if handoff and result.stage_after == handoff.stage and result.stage_before != handoff.stage:
        reason = (result.state.get(handoff.reason) if handoff.reason else None) \
            or _derived_reason(funnel, result.transitions)
    return {"stage_before": result.stage_before, "stage_after": result.stage_after,
            "transitions": result.transitions, "explain": result.explain,
            "actions": [o.type for o in result.actions if o.accepted],
            "refused": [o.type for o in result.actions if not o.accepted],
            "fallback": result.fallback, "returning": result.returning,
            "approval": result.approval, "handoff_reason": reason}


def from_record(funnel: CompiledFunnel, record: Mapping[str, Any]) -> dict[str, Any]:
    """A turn record's observation (engine.store.turns; explanation expanded). A record
    keeps no idle return nor held move: those count from scenarios only."""
    transitions = list(record.get("transitions") or [])
    handoff = funnel.spec.handoff
    reason = None
    if handoff and record.get("stage_after") == handoff.stage \
            and record.get("stage_before") != handoff.stage:
        reason = _derived_reason(funnel, transitions)
    return {"stage_before": record.get("stage_before"), "stage_after": record.get("stage_after"),
            "transitions": transitions, "explain": record.get("explain") or [],
            "actions": list(record.get("actions") or []),
            "refused": [r.get("type") for r in record.get("refused") or []
                        if isinstance(r, dict) and r.get("type") != "ungrounded"],
            "fallback": bool(record.get("fallback")), "returning": False, "approval": None,
            "handoff_reason": reason}


def _derived_reason(funnel: CompiledFunnel, transitions: Iterable[Mapping[str, Any]]
                    ) -> str | None:
    """The reason of the move into the hand-off stage, from the exit that made it."""
    spec = funnel.spec
    for t in transitions:
        if spec.handoff is None or t.get("to") != spec.handoff.stage:
            continue
        source = spec.stages.get(str(t.get("from")))
        if t.get("trigger") == "iteration_limit" and source and source.max_iterations:
            return source.max_iterations.reason
        candidates = [*spec.global_transitions, *(source.transitions if source else ())]
        for c in candidates:
            if c.to == t.get("to") and c.when == t.get("when") and c.reason:
                return c.reason
    return None


def hits(funnel: CompiledFunnel, observation: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """The item keys one observation exercises."""
    spec = funnel.spec
    keys: list[tuple[Any, ...]] = []
    before = observation.get("stage_before")
    keys.append(("stage", before))
    keys.extend(("stage", t.get("to")) for t in observation.get("transitions") or [])
    keys.append(("stage", observation.get("stage_after")))
    globals_ = {(g.to, g.when): i for i, g in enumerate(spec.global_transitions)}
    for step in observation.get("explain") or []:
        stage = spec.stages.get(str(step.get("stage")))
        own = {(t.to, t.when): i for i, t in enumerate(stage.transitions)} if stage else {}
        for t in step.get("transitions") or []:
            held = t.get("held")
            if held is None:  # the condition failed: neither held nor not held
                continue
            pair = (t.get("to"), t.get("when"))
            if t.get("global") and pair in globals_:
                keys.append(("global", globals_[pair], bool(held)))
            elif stage is not None and pair in own:
                keys.append(("exit", stage.name, own[pair], bool(held)))
        it = step.get("iterations")
        if stage is not None and it and it.get("count", 0) >= it.get("limit", 1):
            keys.append(("cap", stage.name))
        if stage is not None and step.get("fired") and any(
                t.get("trigger") == "iteration_limit" and t.get("from") == stage.name
                for t in observation.get("transitions") or []):
            keys.append(("cap", stage.name))
    keys.extend(("action", before, a, True) for a in observation.get("actions") or [])
    keys.extend(("action", before, a, False) for a in observation.get("refused") or [])
    if observation.get("fallback"):
        keys.append(("fallback", before))
    if observation.get("approval"):
        keys.append(("gate", observation["approval"]))
    if observation.get("returning"):
        keys += [("idle", before), ("idle", None)]
    if observation.get("handoff_reason"):
        keys.append(("handoff", observation["handoff_reason"]))
    return keys


def measure(funnel: CompiledFunnel, observations: Iterable[Mapping[str, Any]]) -> list[Item]:
    """The funnel's items with how often the observations exercised each."""
    found = items(funnel)
    by_key: dict[tuple[Any, ...], list[Item]] = {}
    for item in found:
        by_key.setdefault(item.key, []).append(item)
    for observation in observations:
        for key in set(hits(funnel, observation)):
            for item in by_key.get(key, ()):
                item.hits += 1
    return found


def percentages(found: Iterable[Item]) -> dict[str, tuple[int, int, float]]:
    """Per category: (covered, total, percent); a category with no item is 100%."""
    counts = {c: [0, 0] for c in CATEGORIES}
    for item in found:
        counts[item.category][1] += 1
        counts[item.category][0] += item.hits > 0
    return {c: (n, total, 100.0 * n / total if total else 100.0)
            for c, (n, total) in counts.items()}


def parse_thresholds(text: str | None) -> dict[str, float]:
    """``"stages=100,exits=90"`` -> ``{"stages": 100.0, "exits": 90.0}``.

    Raises:
        ValueError: an unknown name or a value that is not a percentage; the message
            names it and what is expected.
    """
    out: dict[str, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if name not in CATEGORIES:
            hint = did_you_mean(name, list(CATEGORIES))
            raise ValueError(f"--fail-under: unknown name {name!r}{hint}; expected NAME=PERCENT "
                             f"with NAME one of {', '.join(CATEGORIES)}")
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not sep or not 0 <= number <= 100:
            raise ValueError(f"--fail-under: {part.strip()!r} needs a percentage from 0 to 100, "
                             f"e.g. {name}=90")
        out[name] = number
    return out
