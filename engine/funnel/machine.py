"""The stage machine: a `transitions.Machine` built once per funnel, shared by every session.

Each trigger fires the shared machine's event on a throwaway model object
that carries the session's stage and the conditions' context: building a
``Machine`` costs about as much as a whole database turn, and binding a model
with ``add_model`` would decorate it with every trigger and state helper, so
neither happens per turn. Most turns do not fire at all: a trigger is fired
only when one of the stage's conditions may hold.

Triggers:

* ``advance`` -- the exit transitions, global ones first (they are interrupts:
  a complaint or a request for a manager wins over the stage's own exits),
  then the stage's in declaration order; the first whose condition holds fires.
* ``iteration_limit`` -- a stage's ``max_iterations.to``.
* ``idle_return`` -- ``memory.idle_return_stage`` when a customer comes back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from transitions import EventData, Machine

from ..format.spec import FunnelSpec, TransitionSpec
from ..sandbox.expressions import Condition, compile_condition


class CompiledCondition:
    """A condition compiled once; keeps its source for diagrams and error messages."""

    __slots__ = ("source", "_fn")

    def __init__(self, source: str) -> None:
        self.source = source
        self._fn: Condition = compile_condition(source)

    def __call__(self, context: Mapping[str, Any]) -> bool:
        return self._fn(context)


@dataclass
class Firing:
    """What one ``advance``/``iteration_limit``/``idle_return`` trigger did."""

    source: str
    dest: str
    spec: TransitionSpec | None
    trigger: str


@dataclass
class _Session:
    """The model bound to the shared machine for the length of one trigger."""

    state: str
    ctx: Mapping[str, Any] = field(default_factory=dict)
    fired: list[Firing] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # Conditions already evaluated on ``ctx`` (by the explanation): source -> verdict.
    verdicts: Mapping[str, bool] = field(default_factory=dict)


class StageMachine:
    """The funnel's stages and transitions as one shared ``transitions.Machine``."""

    def __init__(self, spec: FunnelSpec) -> None:
        self.spec = spec
        # (sources, dest, label) of every declared edge, for diagrams
        self.labels: list[tuple[tuple[str, ...], str, str]] = []
        config: list[dict[str, Any]] = []
        open_stages = [s.name for s in spec.stages.values() if not s.final]
        for t in spec.global_transitions:
            sources = [s for s in open_stages if s != t.to]
            if sources:
                config.append(self._transition("advance", sources, t))
        for stage in spec.stages.values():
            for t in stage.transitions:
                config.append(self._transition("advance", [stage.name], t))
            mi = stage.max_iterations
            if mi and mi.to:
                limit = TransitionSpec(to=mi.to, when=None, reason=mi.reason)
                config.append(self._transition("iteration_limit", [stage.name], limit,
                                                label=f"after {mi.limit} turns"))
        idle = spec.memory.idle_return_stage
        if idle:
            back = TransitionSpec(to=idle, when=None, reason=None)
            sources = [s for s in open_stages if s != idle]
            if sources:
                config.append(self._transition("idle_return", sources, back, label="returning"))
        self.machine = Machine(
            model=None,
            states=list(spec.stages),
            initial=spec.initial,
            transitions=config,
            auto_transitions=False,
            ignore_invalid_triggers=True,
            send_event=True,
        )

    def _transition(
        self, trigger: str, sources: list[str], t: TransitionSpec, *, label: str | None = None
    ) -> dict[str, Any]:
        text = label if label is not None else (t.when or "")
        self.labels.append((tuple(sources), t.to, text))
        entry: dict[str, Any] = {
            "trigger": trigger,
            "source": sources,
            "dest": t.to,
            "after": [_recorder(t, trigger)],
        }
        if t.when is not None:
            entry["conditions"] = [_guard(CompiledCondition(t.when))]
        return entry

    def fire(self, stage: str, trigger: str, ctx: Mapping[str, Any],
             verdicts: Mapping[str, bool] | None = None) -> _Session:
        """Fire one trigger for a session sitting in ``stage``; return what happened.

        ``verdicts`` are conditions' values on ``ctx`` known already (the turn's
        explanation evaluated every exit): the machine uses them instead of evaluating
        those conditions again, and fires without the cheap pre-check, since the
        caller saw that one may fire."""
        session = _Session(state=stage, ctx=ctx, verdicts=verdicts or {})
        event = self.machine.events.get(trigger)
        if event is not None and (verdicts is not None
                                  or _may_fire(event.transitions.get(stage, ()), ctx)):
            # Fire the shared machine's event on a throwaway model: add_model would
            # decorate it with every trigger and state helper, several times the cost.
            event.trigger(session)
        return session


def _may_fire(transitions: Any, ctx: Mapping[str, Any]) -> bool:
    """Whether one of a stage's transitions may fire: most turns stay in their stage,
    and seeing that from the compiled conditions costs a fraction of a trigger. The
    machine decides (and evaluates again) whenever one may."""
    for t in transitions:
        if not t.conditions:
            return True
        for c in t.conditions:
            condition = getattr(c.func, "condition", None)
            if condition is None:
                return True
            try:
                if not condition(ctx):
                    break
            except Exception:
                return True  # the machine's guard records the error
        else:
            return True
    return False


def _guard(condition: CompiledCondition) -> Any:
    def check(event: EventData) -> bool:
        session = cast(_Session, event.model)
        known = session.verdicts.get(condition.source)
        if known is not None:
            return known
        try:
            return condition(session.ctx)
        except Exception as exc:  # a condition must never crash a turn
            session.errors.append(f"condition {condition.source!r} failed: {exc}")
            return False

    check.__doc__ = condition.source
    check.condition = condition  # type: ignore[attr-defined]  # for _may_fire
    return check


def _recorder(t: TransitionSpec, trigger: str) -> Any:
    def record(event: EventData) -> None:
        session = cast(_Session, event.model)
        source = event.transition.source if event.transition else session.state
        session.fired.append(Firing(source=source, dest=t.to, spec=t, trigger=trigger))

    return record


ANY = "any_open_stage"  # the diagrams' node for "from every stage that is not final"


def mermaid(machine: StageMachine) -> str:
    """The stage diagram as a Mermaid ``stateDiagram-v2``.

    A transition that applies from every open stage (a global one, the idle
    return) is drawn once, from an "any open stage" node.
    """
    spec = machine.spec
    lines = ["stateDiagram-v2", f"    [*] --> {spec.initial}"]
    edges = _edges(machine)
    if any(source == ANY for source, _, _ in edges):
        lines.append(f'    state "any open stage" as {ANY}')
    for source, dest, label in edges:
        text = f": {_mermaid_label(label)}" if label else ""
        lines.append(f"    {source} --> {dest}{text}")
    for name in spec.final_stages():
        lines.append(f"    {name} --> [*]")
    return "\n".join(lines) + "\n"


def dot(machine: StageMachine) -> str:
    """The stage diagram in Graphviz DOT (the same edges as :func:`mermaid`)."""
    spec = machine.spec
    out = [f'digraph "{spec.name}" {{', "    rankdir=LR;", '    node [shape=box, style=rounded];']
    for name in spec.final_stages():
        out.append(f'    "{name}" [peripheries=2];')
    out.append(f'    "__start" [shape=point]; "__start" -> "{spec.initial}";')
    edges = _edges(machine)
    if any(source == ANY for source, _, _ in edges):
        out.append(f'    "{ANY}" [label="any open stage", style=dashed];')
    for source, dest, label in edges:
        esc = label.replace("\\", "\\\\").replace('"', '\\"')
        out.append(f'    "{source}" -> "{dest}" [label="{esc}"];')
    out.append("}")
    return "\n".join(out) + "\n"


def _edges(machine: StageMachine) -> list[tuple[str, str, str]]:
    # Read the edges back from the built machine, so the diagram shows what runs.
    built = {
        (source, t.dest)
        for event in machine.machine.events.values()
        for source, ts in event.transitions.items()
        for t in ts
    }
    open_stages = {s.name for s in machine.spec.stages.values() if not s.final}
    seen: set[tuple[str, str, str]] = set()
    edges = []
    for sources, dest, label in machine.labels:
        if not all((source, dest) in built for source in sources):
            continue
        # An edge from every open stage but its target reads as "from any open stage".
        from_any = len(sources) > 1 and set(sources) == open_stages - {dest}
        for source in [ANY] if from_any else sources:
            if (source, dest, label) not in seen:
                seen.add((source, dest, label))
                edges.append((source, dest, label))
    return edges


_MERMAID_ESCAPES = {":": "#58;", ";": "#59;", '"': "#quot;"}


def _mermaid_label(text: str) -> str:
    # One pass: chained str.replace would re-escape the ';' of an earlier '#58;'.
    return "".join(_MERMAID_ESCAPES.get(ch, ch) for ch in text)
