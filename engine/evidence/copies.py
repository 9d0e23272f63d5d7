"""The copies of a funnel a session's turns ran on, for :func:`engine.evidence.replay.replay`.

Every turn record keeps the content hash of the copy it ran on (``funnel_hash``); the
version store keeps each copy, deployed or a trial, by that hash. A session whose copy
changed between turns (files deployed without a ``version:`` bump while it was open) is
played turn by turn, each turn on the copy it ran on (:func:`engine.evidence.play.play`'s
``copies``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..funnel.compiled import CompiledFunnel
from ..versions.bundle import Bundle, LoadedVersion, compile_bundle
from .records import Session

__all__ = ["Base", "copies_from", "distinct", "per_turn", "ran_on", "runs"]

# What a session is played on as recorded: a funnel, one per turn, or why it cannot be.
Base = CompiledFunnel | tuple[CompiledFunnel, ...] | str


def copies_from(bundle: Callable[[int, str], tuple[str, str, dict[str, str]] | None],
                name: str, loaded: list[LoadedVersion]
                ) -> tuple[Callable[[int, str], CompiledFunnel | str], dict[int, list[str]]]:
    """The ``copy`` resolver :func:`engine.evidence.replay.replay` takes: each copy a
    session ran on, by version and content hash, from the version store (deployed or a
    trial), compiled once (into ``loaded``); also the copies found, per version (their
    hashes). :func:`~engine.evidence.replay.replay` asks for each copy once per call."""
    found: dict[int, list[str]] = {}

    def resolve(version: int, digest: str) -> CompiledFunnel | str:
        stored = bundle(version, digest)
        if stored is None:
            return (f"the copy of version {version} it ran on ({digest[:12]}) is not in the "
                    "version store any more (purged); give the funnel it ran on with --base "
                    "FILE")
        _, entry, files = stored
        version_loaded = compile_bundle(Bundle(name, version, entry, files, digest))
        loaded.append(version_loaded)
        found.setdefault(version, []).append(digest)
        return version_loaded.funnel

    return resolve, found


def per_turn(funnels: list[CompiledFunnel | str]) -> Base:
    """The copies of a session's turns, or why one cannot be had (the first such)."""
    gone = [f for f in funnels if isinstance(f, str)]
    return gone[0] if gone else tuple(f for f in funnels if not isinstance(f, str))


def distinct(edited: CompiledFunnel, bases: Mapping[Any, Base]) -> list[CompiledFunnel]:
    """The edit, then each funnel a session is played on as recorded, once."""
    seen: dict[int, CompiledFunnel] = {id(edited): edited}
    for b in bases.values():
        for f in (b,) if isinstance(b, CompiledFunnel) else () if isinstance(b, str) else b:
            seen.setdefault(id(f), f)
    return list(seen.values())


def runs(session: Session) -> list[tuple[str, int, int]]:
    """The copies a session's turns ran on, in order: (hash, first turn, last turn)."""
    out: list[tuple[str, int, int]] = []
    for number, t in enumerate(session.turns, 1):
        digest = str(t.funnel_hash)
        if out and out[-1][0] == digest:
            out[-1] = (digest, out[-1][1], number)
        else:
            out.append((digest, number, number))
    return out


def ran_on(copies: Sequence[tuple[str, int, int]]) -> str:
    """The copies a session whose copy changed between turns was played on, in words."""
    return f"played on the {len(copies)} copies it ran on (" + ", ".join(
        f"turns {a}-{b} on {h[:12]}" if a != b else f"turn {a} on {h[:12]}"
        for h, a, b in copies) + ")"
