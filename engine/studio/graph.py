"""The stage graph as SVG, laid out from the funnel (no layout engine, no script).

The main path (`engine.format.main_path`: the shortest chain of exits from the initial
stage to the final stage furthest from it) runs down one column. Every other stage is
a side branch (objection handling, a not-a-fit stage), drawn in a column of its own
beside the stage that first leads to it, so a branch reads as a branch and never as a
step of the main path. Global transitions come from an "any stage" box at the top.

Nodes and edges carry ``data-stage`` / ``data-from``, ``data-to``, ``data-when`` so
that the page marks the current stage, where the session has been, and each exit
held or not held on the last turn, by class, without redrawing.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from ..format.main_path import stage_paths
from ..format.spec import FunnelSpec

__all__ = ["Layout", "layout", "svg"]

W, H = 176, 34  # a stage's box
GAP = 30  # between rows
LEFT = 84  # room on the left for edges that skip or go back
SIDE = LEFT + W + 110  # the side branches' column
TOP = 56  # room for the "any stage" box
_LABEL = 34  # characters of a condition shown on an edge (the rest in its tooltip)


@dataclass(frozen=True)
class Layout:
    """Where each stage is: ``(x, y)`` of its box, and whether it is on the main path."""

    boxes: dict[str, tuple[int, int]]
    main: list[str]
    width: int
    height: int


def layout(spec: FunnelSpec) -> Layout:
    main = list(stage_paths(spec).main)
    row = {name: i for i, name in enumerate(main)}
    boxes = {name: (LEFT, TOP + i * (H + GAP)) for i, name in enumerate(main)}
    taken: set[int] = set()
    # Side branches, in declaration order, beside the first placed stage leading to them.
    pending = [n for n in spec.stages if n not in row]
    for _ in range(len(pending) + 1):
        left = []
        for name in pending:
            parents = [p for p, st in spec.stages.items() if p in boxes
                       and any(t.to == name for t in st.transitions)]
            if not parents:
                left.append(name)
                continue
            r = min(row.get(p, len(main)) for p in parents)
            while r in taken:
                r += 1
            taken.add(r)
            boxes[name] = (SIDE, TOP + r * (H + GAP))
            row.setdefault(name, r)
        pending = left
        if not pending:
            break
    for name in pending:  # unreachable stages (validate warns): below everything
        r = max([*taken, len(main)]) + 1
        taken.add(r)
        boxes[name] = (SIDE, TOP + r * (H + GAP))
    rows = max((y for _, y in boxes.values()), default=TOP) + H + 20
    return Layout(boxes, main, SIDE + W + 24, rows)


def _label(when: str | None) -> str:
    if when is None:
        return "always"
    return when if len(when) <= _LABEL else when[:_LABEL - 1] + "…"


def _edge(src: tuple[int, int], dst: tuple[int, int], lane: int) -> tuple[str, int, int]:
    """The path from one box to another and where its label goes."""
    (x1, y1), (x2, y2) = src, dst
    if x1 == x2 and y2 == y1 + H + GAP:  # the next stage down the same column
        return f"M{x1 + W // 2},{y1 + H} L{x2 + W // 2},{y2}", x1 + W // 2 + 6, y1 + H + GAP // 2 + 4
    if x1 != x2:  # across columns: from the side of one to the side of the other
        a, b = (x1 + W, x2) if x2 > x1 else (x1, x2 + W)
        # Going out above the middle, coming back below it: a branch's two ways apart.
        dy = -7 if x2 > x1 else 7
        sy, ey = y1 + H // 2 + dy, y2 + H // 2 + dy
        mid = (a + b) // 2
        label_y = min(sy, ey) - 4 if dy < 0 else max(sy, ey) + 12 + lane * 11
        return (f"M{a},{sy} C{mid},{sy} {mid},{ey} {b},{ey}", mid - 40, label_y)
    # Same column, skipping or going back: a loop on the left.
    bend = x1 - 24 - 14 * lane
    return (f"M{x1},{y1 + H // 2} C{bend},{y1 + H // 2} {bend},{y2 + H // 2} {x2},{y2 + H // 2}",
            max(2, bend - 10), (y1 + y2) // 2 + H // 2)


def svg(spec: FunnelSpec) -> str:
    """The funnel's stage graph as one ``<svg>`` element (``data-testid="stage-graph-svg"``)."""
    lay = layout(spec)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" data-testid="stage-graph-svg" '
           f'viewBox="0 0 {lay.width} {lay.height}" width="{lay.width}" height="{lay.height}" '
           'role="img" aria-label="stage graph">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z"/>'
           '</marker></defs>']
    lanes: dict[tuple[int, int], int] = {}
    for name, stage in spec.stages.items():
        for t in stage.transitions:
            if t.to not in lay.boxes or name not in lay.boxes:
                continue
            key = (lay.boxes[name][0], lay.boxes[t.to][0])
            lane = lanes.get(key, 0)
            lanes[key] = lane + 1
            path, lx, ly = _edge(lay.boxes[name], lay.boxes[t.to], lane)
            when = t.when or ""
            out.append(f'<g class="edge" data-from="{escape(name)}" data-to="{escape(t.to)}" '
                       f'data-when="{escape(when)}"><title>{escape(name)} → {escape(t.to)}: '
                       f'{escape(t.when or "always")}</title><path d="{path}" '
                       'marker-end="url(#arrow)"/>'
                       f'<text x="{lx}" y="{ly}">{escape(_label(t.when))}</text></g>')
    if spec.global_transitions:
        gx, gy = SIDE, 8
        out.append(f'<g class="any"><rect x="{gx}" y="{gy}" width="{W}" height="{H - 6}" rx="14"/>'
                   f'<text x="{gx + W // 2}" y="{gy + 19}" text-anchor="middle">any stage</text></g>')
        for i, t in enumerate(spec.global_transitions):
            if t.to not in lay.boxes:
                continue
            x2, y2 = lay.boxes[t.to]
            sx = gx + W - 20 - 14 * i
            path = (f"M{sx},{gy + H - 6} C{sx + 60},{y2 // 2} {x2 + W + 40},{y2 + H // 2} "
                    f"{x2 + W},{y2 + H // 2}")
            out.append(f'<g class="edge global" data-from="*" data-to="{escape(t.to)}" '
                       f'data-when="{escape(t.when or "")}"><title>any stage → {escape(t.to)}: '
                       f'{escape(t.when or "always")}</title><path d="{path}" '
                       'marker-end="url(#arrow)"/></g>')
    for name, (x, y) in lay.boxes.items():
        stage = spec.stages[name]
        kind = "main" if name in lay.main else "side"
        extra = " final" if stage.final else ""
        cap = f" ≤{stage.max_iterations.limit}" if stage.max_iterations else ""
        out.append(f'<g class="node {kind}{extra}" data-stage="{escape(name)}" '
                   f'data-testid="stage-{escape(name)}"><title>{escape(stage.description)}</title>'
                   f'<rect x="{x}" y="{y}" width="{W}" height="{H}" rx="6"/>'
                   f'<text x="{x + W // 2}" y="{y + 22}" text-anchor="middle">'
                   f'{escape(name)}{escape(cap)}</text></g>')
    out.append("</svg>")
    return "".join(out)
