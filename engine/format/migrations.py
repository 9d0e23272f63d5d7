"""Declared state migrations: a session's row moved from one version of its funnel to
another, step by step (``migrations:`` in the funnel, docs/versions.md).

Pure functions on plain values: the turn applies them lazily when a session moves
to a newer version, ``funnel migrate --sessions`` eagerly, and ``funnel validate``
to every example state of the scenarios.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import MigrationError
from .spec import MigrationStep

__all__ = ["MISSING", "apply_step", "migrate_row", "steps_between"]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def steps_between(steps: Iterable[MigrationStep], source: int, target: int
                  ) -> list[MigrationStep]:
    """The declared steps that lead from version ``source`` towards ``target``, in order."""
    return sorted((s for s in steps if s.source >= source and s.target <= target),
                  key=lambda s: (s.source, s.target))


def _get(data: Mapping[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return MISSING
        node = node[part]
    return node


def _parent(data: dict[str, Any], path: str, step: MigrationStep, create: bool
            ) -> tuple[dict[str, Any] | None, str]:
    *parents, last = path.split(".")
    node: Any = data
    walked: list[str] = []
    for part in parents:
        walked.append(part)
        child = node.get(part)
        if child is None and create:
            child = node[part] = {}
        if child is None:
            return None, last
        if not isinstance(child, dict):
            raise MigrationError(
                f"migration {step.source}->{step.target}: '{'.'.join(walked)}' holds "
                f"{type(child).__name__} {child!r}, not an object, so '{path}' cannot be "
                "reached; fix the step's path or move that value first")
        node = child
    return node, last


def _pop(data: dict[str, Any], path: str, step: MigrationStep) -> Any:
    parent, last = _parent(data, path, step, create=False)
    if parent is None or last not in parent:
        return MISSING
    return parent.pop(last)


def _put(data: dict[str, Any], path: str, value: Any, step: MigrationStep) -> None:
    parent, last = _parent(data, path, step, create=True)
    assert parent is not None
    parent[last] = value


def apply_step(step: MigrationStep, row: dict[str, Any], changes: list[str]) -> None:
    """Apply one step to ``row`` (state fields and ``stage``) in place; say what changed.

    A source that the state does not hold is skipped (a session may never have set
    it). Raises:
        MigrationError: a path runs through a value that is not an object.
    """
    for old, new in step.rename:
        if old in row:
            row[new] = row.pop(old)
            changes.append(f"renamed {old} -> {new}")
    for source, target in step.move:
        value = _pop(row, source, step)
        if value is not MISSING:
            _put(row, target, value, step)
            changes.append(f"moved {source} -> {target}")
    for old_stage, new_stage in step.stages:
        if row.get("stage") == old_stage:
            row["stage"] = new_stage
            changes.append(f"stage {old_stage} -> {new_stage}")
    for path, value in step.defaults:
        if _get(row, path) in (None, MISSING):
            _put(row, path, copy.deepcopy(value), step)
            changes.append(f"default {path}")
    for path in step.drop:
        if _pop(row, path, step) is not MISSING:
            changes.append(f"dropped {path}")


def migrate_row(steps: Iterable[MigrationStep], row: Mapping[str, Any], source: int,
                target: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``row`` moved from version ``source`` to ``target`` through the declared steps:
    (the new row, the record of what was done: from, to, steps applied and changes).

    The row is copied, never changed in place; ``funnel_version`` becomes ``target``.
    """
    out = copy.deepcopy(dict(row))
    applied: list[dict[str, Any]] = []
    for step in steps_between(steps, source, target):
        changes: list[str] = []
        apply_step(step, out, changes)
        applied.append({"from": step.source, "to": step.target, "changes": changes})
    out["funnel_version"] = target
    return out, {"from": source, "to": target, "steps": applied}
