"""The funnel's main path and its side branches, from the stages' exits.

The *main path* is the shortest chain of stage exits (global transitions left out)
from the initial stage to the *goal*: the final stage furthest from it, so the stage a
successful conversation ends in (a not-a-fit stage is final too, but sits nearer the
start). Exits are tried in their declared order, so of two chains of the same length the
one the author wrote first wins. Every other stage is a *side branch* (objection
handling, a not-a-fit stage, a hand-off only global transitions reach), placed beside
the main stage that first leads to it.

The studio's stage graph and the report's funnel chart both draw from this, so a branch
with no sessions never reads as if the funnel collapsed between two main stages.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .spec import FunnelSpec

__all__ = ["StagePaths", "stage_paths"]


@dataclass(frozen=True)
class StagePaths:
    """``main``: the main path in order; ``branches``: every other stage (declared order),
    each with the main stage it leaves from (``None``: reached only by global
    transitions, or not at all)."""

    main: tuple[str, ...]
    branches: dict[str, str | None]


def _distances(spec: FunnelSpec) -> tuple[dict[str, int], dict[str, str]]:
    """Breadth-first over the stages' exits: each stage's distance and the stage it was
    first reached from."""
    dist, parent = {spec.initial: 0}, {}
    todo = deque([spec.initial])
    while todo:
        name = todo.popleft()
        for t in spec.stages[name].transitions:
            if t.to in spec.stages and t.to not in dist:
                dist[t.to] = dist[name] + 1
                parent[t.to] = name
                todo.append(t.to)
    return dist, parent


def stage_paths(spec: FunnelSpec) -> StagePaths:
    """The main path and the side branches of ``spec`` (the module docstring)."""
    if spec.initial not in spec.stages:
        return StagePaths((), dict.fromkeys(spec.stages))
    dist, parent = _distances(spec)
    order = list(spec.stages)
    finals = [s for s in spec.final_stages() if s in dist]
    pool = finals or list(dist)
    goal = max(pool, key=lambda s: (dist[s], -order.index(s)))
    main = [goal]
    while main[-1] != spec.initial:
        main.append(parent[main[-1]])
    main.reverse()
    on_main = set(main)
    branches: dict[str, str | None] = {}
    for name in order:
        if name in on_main:
            continue
        # The main stage nearest the start that leads to it, else the branch stage's own
        # first way in (a branch off a branch is still drawn off the main path).
        into = [p for p in main if any(t.to == name for t in spec.stages[p].transitions)]
        step: str | None = into[0] if into else parent.get(name)
        seen = {name}
        while step is not None and step not in on_main and step not in seen:
            seen.add(step)
            step = parent.get(step)
        branches[name] = step if step in on_main else None
    return StagePaths(tuple(main), branches)
