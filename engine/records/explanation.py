"""The stored form of a turn's explanation, which the turn writes and the store reads.

What the funnel fixes (each exit's destination, condition, whether it is global) is
cited by a digest of the stage's exit list, stored once in ``funnel_exits``; what
the turn found (held, the values read, derived and error notes) stays in the turn
record. :func:`compact` makes the stored form from the explanation
:mod:`engine.turn.explain` builds, :func:`expand` gives it back in full.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ..sandbox.expressions import condition_names

__all__ = ["compact", "exits_of", "expand"]

# Exit lists by digest (content-addressed, so one table serves every store), and the
# digest of each list seen: a turn's compaction looks its stage's list up, hashing once.
_EXITS: dict[str, list[list[Any]]] = {}
_DIGESTS: dict[tuple[tuple[Any, ...], ...], str] = {}
_NOTES = ("error", "derived")  # what an exit's verdict may carry besides held and values


def _digest(exits: list[list[Any]]) -> str:
    key = tuple(map(tuple, exits))
    digest = _DIGESTS.get(key)
    if digest is None:
        digest = hashlib.sha1(orjson.dumps(exits)).hexdigest()[:16]
        _DIGESTS[key], _EXITS[digest] = digest, exits
    return digest


def exits_of(digest: str) -> list[list[Any]] | None:
    """The exit list (``[to, when, global]`` each) a digest of :func:`compact` cites, when
    this process compacted it (else it is read from ``funnel_exits``)."""
    return _EXITS.get(digest)


def compact(explanation: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The explanation as a turn record stores it: per stage, the digest of its exit
    list (``exits``) and per exit only what the turn found (``held``: ``[held]`` for an
    exit without a condition, else ``[held, [values in the condition's order]]`` and a
    third item with its ``error`` / ``derived`` notes when it has any)."""
    out = []
    for step in explanation:
        transitions = step.get("transitions") or []
        exits, held = [], []
        for t in transitions:
            exits.append([t["to"], t.get("when"), bool(t.get("global"))])
            verdict: list[Any] = [t.get("held")]
            if t.get("when") is not None:
                verdict.append(list((t.get("values") or {}).values()))
                notes = {k: t[k] for k in _NOTES if k in t}
                if notes:
                    verdict.append(notes)
            held.append(verdict)
        stored = {k: v for k, v in step.items() if k != "transitions"}
        stored["exits"], stored["held"] = _digest(exits), held
        out.append(stored)
    return out


def expand(stored: Sequence[Mapping[str, Any]] | None,
           exits: Mapping[str, Sequence[Sequence[Any]]]) -> list[dict[str, Any]] | None:
    """The explanation :func:`compact` stored, in full again (``exits``: exit lists by
    digest, as read from ``funnel_exits``). A record written before compaction is
    returned as it is; an exit list that cannot be found shows its exits as ``?``."""
    if stored is None:
        return None
    out = []
    for step in stored:
        if "exits" not in step:  # written in full, before records were compacted
            out.append(dict(step))
            continue
        listed = exits.get(step["exits"]) or []
        full = {k: v for k, v in step.items() if k not in ("exits", "held")}
        transitions = []
        for i, verdict in enumerate(step.get("held") or []):
            to, when, is_global = listed[i] if i < len(listed) else ("?", "?", False)
            entry: dict[str, Any] = {"to": to, "when": when}
            if is_global:
                entry["global"] = True
            entry["held"] = verdict[0]
            if len(verdict) > 1:
                names = condition_names(when) if i < len(listed) else ()
                values = verdict[1]
                entry["values"] = dict(zip(names, values, strict=False)) \
                    if len(names) == len(values) else {f"#{j}": v for j, v in enumerate(values)}
                if len(verdict) > 2:
                    entry.update(verdict[2])
            transitions.append(entry)
        full["transitions"] = transitions
        out.append(full)
    return out
