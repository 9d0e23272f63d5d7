"""Reading an answer given under a strict form (:mod:`engine.llm.strict`).

A strict form makes the model write ``null`` for an optional property it has nothing
for; :func:`drop_forced_nulls` removes those nulls (only where the stage's own schema
does not take null), so that a forced null reads exactly as an absent property. Where
such nulls may stand is worked out once per schema and kept (:class:`_Plan`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["allows_null", "drop_forced_nulls", "forget_plans"]

_PLANS_KEPT = 512  # schemas whose plan is kept (as engine.llm.strict keeps their forms)


def drop_forced_nulls(data: Any, schema: Mapping[str, Any]) -> Any:
    """``data`` without the nulls a strict form forced: a ``null`` for a property that is
    not required and whose schema (``schema``, the stage's own) does not take null is
    removed, at every depth (objects, array items, the action call whose ``const``
    properties match). Changes ``data`` in place and returns it. Where such nulls may be
    is worked out once per schema and kept (:class:`_Plan`)."""
    key = id(schema)
    found = _plans.get(key)
    if found is None or found[0] is not schema:
        found = (schema, _plan(schema, schema, {}))
        _plans[key] = found
        if len(_plans) > _PLANS_KEPT:
            _plans.popitem(last=False)
    if found[1] is not None:
        found[1].apply(data)
    return data


_MAX_DEPTH = 32


@dataclass
class _Plan:
    """Where in an answer a forced null may stand, for one schema node: per property,
    whether a null there is dropped and the plan below it; the branches of an action
    call, told apart by their constants; the plan of an array's items."""

    props: dict[str, tuple[bool, _Plan | None]]
    branches: list[tuple[dict[str, Any], _Plan]]
    items: _Plan | None

    def apply(self, data: Any) -> None:
        if isinstance(data, dict):
            for name in [k for k in data if k in self.props]:
                droppable, below = self.props[name]
                value = data[name]
                if value is None:
                    if droppable:
                        del data[name]
                elif below is not None:
                    below.apply(value)
            branch = self._branch(data)
            if branch is not None:
                branch.apply(data)
        elif isinstance(data, list) and self.items is not None:
            for item in data:
                self.items.apply(item)

    def _branch(self, data: dict[str, Any]) -> _Plan | None:
        """The one branch whose constants ``data`` has (two that match: neither)."""
        found = None
        for consts, plan in self.branches:
            if all(data.get(k) == v for k, v in consts.items()):
                if found is not None:
                    return None
                found = plan
        return found


# id(schema) -> (the schema, its plan or None: no null can be forced into it).
_plans: OrderedDict[int, tuple[Mapping[str, Any], _Plan | None]] = OrderedDict()


def _plan(schema: Any, root: Mapping[str, Any], seen: dict[int, _Plan | None]
          ) -> _Plan | None:
    """The plan of ``schema``; ``seen``: the plans of the nodes met so far, by identity (a
    recursive ``$ref`` meets its own plan, built once, however deep it goes)."""
    node = _resolve(schema, root)
    if id(node) in seen:
        return seen[id(node)]
    out = seen[id(node)] = _Plan({}, [], None)
    props = out.props
    raw = node.get("properties")
    if isinstance(raw, Mapping):
        required = node.get("required")
        needed = set(required) if isinstance(required, list) else set()
        for name, sub in raw.items():
            droppable = name not in needed and not allows_null(_resolve(sub, root), root)
            below = _plan(sub, root, seen)
            if droppable or below is not None:
                props[name] = (droppable, below)
    branches = out.branches
    for key in ("oneOf", "anyOf"):
        for option in node.get(key) or []:
            target = _resolve(option, root)
            subs = target.get("properties")
            if not isinstance(subs, Mapping):
                continue
            consts = {k: _resolve(v, root)["const"] for k, v in subs.items()
                      if "const" in _resolve(v, root)}
            plan = _plan(target, root, seen)
            if consts and plan is not None:
                branches.append((consts, plan))
    items = node.get("items")
    out.items = _plan(items, root, seen) if isinstance(items, Mapping) else None
    if not props and not branches and out.items is None:
        seen[id(node)] = None  # nothing to drop below here
        return None
    return out


def _resolve(node: Any, root: Mapping[str, Any]) -> Mapping[str, Any]:
    for _ in range(_MAX_DEPTH):
        if not isinstance(node, Mapping):
            return {}
        ref = node.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return node
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        node = target
    return {}


def allows_null(schema: Mapping[str, Any], root: Mapping[str, Any] | None = None) -> bool:
    """Whether ``schema`` takes null (a schema with no type takes anything)."""
    root = root if root is not None else schema
    node = _resolve(schema, root)
    kind = node.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    if "enum" in node:
        return None in (node["enum"] or [])
    if "const" in node:
        return node["const"] is None
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            return any(allows_null(_resolve(b, root), root) for b in node[key])
    return kind is None and "allOf" not in node and "not" not in node


def forget_plans() -> None:
    """Forget the kept plans (:func:`engine.llm.strict.forget`, for tests)."""
    _plans.clear()
