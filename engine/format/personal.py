"""What a state field declares about the customer: personal data and the customer's own facts.

Two marks, on a state field or on any part of it (a property of an object, the
items of an array)::

    customer:
      type: object
      retention: personal            # the whole field is personal data
      properties:
        name: {type: string, grounded: true}
    pet:
      type: object
      properties:
        name: {type: string, personal: true, grounded: true}
    objections_raised:
      type: array
      items: {properties: {detail: {type: string, personal: true}}}

``personal: true`` (or ``retention: personal`` on the field itself) is personal
data: `funnel purge --anonymize` removes it wherever a copy is kept
(docs/persistence.md). ``grounded: true`` is a fact only the customer can give
(name, phone, address): a model's value for it is kept only when the customer's
own messages hold its words, and stored as the customer wrote it
(engine.funnel.grounding, engine.format.words).

A mark's place is a *path*: property names, and ``*`` for every item of an array;
the empty path is the whole field. The marks are taken out of the field's schema,
which stays plain JSON Schema.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["EVERY_ITEM", "Path", "marks", "remove_path", "value_at"]

Path = tuple[str, ...]
EVERY_ITEM = "*"
_MARKS = ("personal", "grounded")


def marks(raw: dict[str, Any]) -> tuple[dict[str, Any], tuple[Path, ...], tuple[Path, ...]]:
    """``raw`` (a state field's declaration, storage keys removed or not) without the
    marks, and the paths marked ``personal`` and ``grounded``."""
    personal: list[Path] = []
    grounded: list[Path] = []

    def walk(node: Any, path: Path) -> Any:
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key == "personal" and value is True:
                personal.append(path)
            elif key == "grounded" and value is True:
                grounded.append(path)
            elif key in _MARKS and isinstance(value, bool):
                continue
            elif key == "properties" and isinstance(value, dict):
                out[key] = {k: walk(v, (*path, k)) for k, v in value.items()}
            elif key == "items" and isinstance(value, dict):
                out[key] = walk(value, (*path, EVERY_ITEM))
            else:
                out[key] = value
        return out

    clean = walk(copy.deepcopy(raw), ())
    if raw.get("retention") == "personal" and () not in personal:
        personal.insert(0, ())
    return clean, tuple(personal), tuple(grounded)


def remove_path(value: Any, path: Path) -> Any:
    """``value`` without what ``path`` points at (a copy; nothing to remove: unchanged)."""
    if not path:
        return None
    head, rest = path[0], path[1:]
    if head == EVERY_ITEM:
        if not isinstance(value, list):
            return value
        return [remove_path(item, rest) for item in value]
    if not isinstance(value, dict) or head not in value:
        return value
    if not rest:
        return {k: v for k, v in value.items() if k != head}
    return {**value, head: remove_path(value[head], rest)}


def value_at(value: Any, path: Path) -> list[Any]:
    """Every value ``path`` points at inside ``value`` (``*`` fans out over a list)."""
    if not path:
        return [value]
    head, rest = path[0], path[1:]
    if head == EVERY_ITEM:
        return [v for item in value for v in value_at(item, rest)] \
            if isinstance(value, list) else []
    if isinstance(value, dict) and head in value:
        return value_at(value[head], rest)
    return []
