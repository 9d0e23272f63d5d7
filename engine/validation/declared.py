"""Where a funnel file declares follow-ups: read by several checkers (conditions,
customer texts, engine.validation.follow_ups)."""

from __future__ import annotations

from typing import Any

from .diagnostics import as_dict

Keys = tuple[str | int, ...]


def follow_up_declarations(data: dict[str, Any]) -> list[tuple[Keys, str | None, dict[str, Any]]]:
    """(where, stage or None for the funnel's default, the raw ``follow_up``) of each."""
    found: list[tuple[Keys, str | None, dict[str, Any]]] = []
    if isinstance(data.get("follow_up"), dict):
        found.append((("follow_up",), None, data["follow_up"]))
    for name, raw in as_dict(data.get("stages")).items():
        follow = as_dict(raw).get("follow_up")
        if isinstance(follow, dict):
            found.append((("stages", name, "follow_up"), str(name), follow))
    return found
