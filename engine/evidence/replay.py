"""`funnel replay`: the recorded sessions played on the version they ran on and on an edit.

:func:`replay` plays each session twice in memory (:mod:`engine.evidence.play`): on the
version its turns ran on (from the version store, or ``base``), which must reproduce
the recording, and on the edited funnel; :func:`engine.evidence.compare.compare` says
what changed. :class:`Replay` holds every session's :class:`SessionDiff` and the
whole: stages reached, hand-offs, carts and revenue before and after, over the
sessions whose replay is complete on both sides (the like-for-like set), and the
sessions behind each change. The sessions a model continued
(:mod:`engine.evidence.continuation`, ``--model``) are summed apart
(:meth:`Replay.metrics` with ``continued=True``): their outcome after rests on new
model outputs, not on the recording.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from ..funnel.compiled import CompiledFunnel
from ..turn import language
from ..versions.bundle import Bundle, LoadedVersion, compile_bundle
from .compare import Outcome, SessionDiff, compare, outcome
from .copies import Base, copies_from, distinct, per_turn, runs
from .play import Playthrough, held, play, reproduced, stage_answerable
from .records import Population, Session

__all__ = ["Replay", "copies_from", "replay", "revenue_after"]

# Where a session's base comes from: ("v", version) the version's (``base``),
# ("h", version, hash) the copy its turns ran on (``copy``), ("c", version, hashes) the
# copies its turns ran on, one per turn (its copy changed between turns), or ("x", why)
# none (its copy changed between turns, and a turn's copy is not known).
Key = tuple[Any, ...]


@dataclass
class Replay:
    """A replay's result: per session and for the whole."""

    funnel: str
    edited: str  # the edited funnel file
    diffs: list[SessionDiff]
    versions: dict[int, str] = field(default_factory=dict)  # version -> where it came from
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # CPU time of the replay, its forked processes' included
    # each exit (stage, to, n-th there) -> the sessions where its condition held
    conditions: dict[tuple[str, str, int], Held] = field(default_factory=dict)
    stages: list[str] = field(default_factory=list)
    handoff_stage: str | None = None
    model: str | None = None  # the model that continued the sessions (``--model``)
    # Sessions whose turns were recorded before turn records kept the copy they ran on:
    # played on their version's deployed copy (which may not be the one they ran on).
    legacy: int = 0

    def of(self, *status: str) -> list[SessionDiff]:
        return [d for d in self.diffs if d.status in status]

    @property
    def comparable(self) -> list[SessionDiff]:
        """The sessions replayed completely on both sides: the whole's before and after."""
        return self.of("same", "different")

    @property
    def with_continued(self) -> list[SessionDiff]:
        """:attr:`comparable` and the sessions a model continued (``--model``)."""
        return self.of("same", "different", "continued")

    def metrics(self, *, continued: bool = False) -> dict[str, tuple[float, float]]:
        """``name -> (before, after)`` over :attr:`comparable` (rates as fractions), or,
        with ``continued``, over :attr:`with_continued`."""
        rows = self.with_continued if continued else self.comparable
        n = len(rows) or 1

        def both(f: Callable[[Outcome], float]) -> tuple[float, float]:
            return (sum(f(d.before) for d in rows if d.before) / n,
                    sum(f(d.after) for d in rows if d.after) / n)

        out = {"handoff_rate": both(lambda o: 1.0 if o.handoff else 0.0),
               "cart_total": both(lambda o: float(o.cart_total or 0)),
               "revenue": (float(sum(d.revenue for d in rows)),
                           float(sum(d.revenue_after or 0 for d in rows))),
               "handoffs": (float(sum(1 for d in rows if d.before and d.before.handoff)),
                            float(sum(1 for d in rows if d.after and d.after.handoff)))}
        for stage in self.stages:
            out[f"reach.{stage}"] = both(_reaches(stage))
        return out

    def counts(self) -> dict[str, int]:
        """How many sessions ended in each status, and in all."""
        out = {s: len(self.of(s)) for s in ("same", "different", "needs_model",
                                             "not_reproduced", "skipped")}
        if self.model is not None:
            out["continued"] = len(self.of("continued"))
        out["sessions"] = len(self.diffs)
        out["changed"] = out["different"] + out["needs_model"] + out.get("continued", 0)
        return out

    def reach(self, stage: str, *, continued: bool = False
              ) -> tuple[list[str], list[str], list[str]]:
        """Sessions (comparable, or with ``continued`` those too) that reach ``stage``
        only now, only then, and the sessions (any played) that reach it earlier now."""
        rows = self.with_continued if continued else self.comparable
        gained = [d.session_id for d in rows if d.before and d.after
                  and stage in d.after.reached and stage not in d.before.reached]
        lost = [d.session_id for d in rows if d.before and d.after
                and stage in d.before.reached and stage not in d.after.reached]
        earlier = [d.session_id for d in self.of("same", "different", "needs_model",
                                                 "continued")
                   if d.before and d.after and stage in d.after.first_turn
                   and d.after.first_turn[stage] < d.before.first_turn.get(stage, 10**9)]
        return gained, lost, earlier


def _reaches(stage: str) -> Callable[[Outcome], float]:
    return lambda o: 1.0 if stage in o.reached else 0.0


def replay(edited: CompiledFunnel, population: Population,
           base: Callable[[int], CompiledFunnel | str], *, jobs: int = 1,
           copy: Callable[[int, str], CompiledFunnel | str] | None = None) -> Replay:
    """Replay ``population`` on ``edited``.

    Args:
        edited: The edited funnel.
        population: The sessions, as :func:`engine.evidence.records.read_population`
            read them.
        base: The funnel a version ran on, by version number, or why it cannot be had.
        jobs: Processes to play in (forked, each a share of the sessions); 1 plays here.
        copy: The copy a session's turns ran on, by version and content hash (the
            version store's, :func:`copies_from`), or why it cannot be had. Given, each
            session whose turn records name their copy is played on it (one whose copy
            changed between turns, turn by turn on the copies they ran on; skipped with
            the reason when one is gone); the others (older records) on ``base``, counted
            in :attr:`Replay.legacy`.
    """
    started, cpu = time.perf_counter(), _cpu()
    spec = edited.spec
    h = spec.handoff
    result = Replay(spec.name, str(spec.path), [], stages=list(spec.stages),
                    handoff_stage=h.stage if h else None)
    sessions = population.sessions
    keys = {s.session_id: _key(s, copy is not None) for s in sessions}
    bases: dict[Key, Base] = {}
    resolved: dict[tuple[int, str], CompiledFunnel | str] = {}

    def one(version: int, digest: str) -> CompiledFunnel | str:  # each copy compiled once
        if (version, digest) not in resolved:
            assert copy is not None
            resolved[version, digest] = copy(version, digest)
        return resolved[version, digest]

    for key in sorted(set(keys.values())):
        if key[0] == "x":  # its copy changed between turns, one not known: not played
            bases[key] = key[1] + "; a turn's copy is not known (recorded before turn " \
                "records kept it)"
        elif key[0] == "c":
            bases[key] = per_turn([one(key[1], d) for d in key[2]])
        else:
            bases[key] = base(key[1]) if key[0] == "v" else one(key[1], key[2])
    if copy is not None:
        result.legacy = sum(1 for s in sessions if s.digest is None and not s.skipped)
    for f in distinct(edited, bases)[1:]:  # a stage the edit removed is still reached
        result.stages += [s for s in f.spec.stages if s not in result.stages]
    for funnel in distinct(edited, bases):
        if funnel.spec.language_policy.mode != "model":
            # Before any fork: the detector's models load once, not in every process.
            language.warm(funnel.spec.language_policy.candidates)
    if jobs > 1 and len(sessions) >= 50 * jobs and "fork" in mp.get_all_start_methods():
        global _WORK
        _WORK = (edited, bases, keys, sessions, jobs)
        try:
            with mp.get_context("fork").Pool(jobs) as pool:
                parts = pool.map(_share, range(jobs))
        finally:
            _WORK = None
        order = {s.session_id: i for i, s in enumerate(sessions)}
        for diffs, conditions in parts:
            result.diffs += diffs
            for key, found in conditions.items():
                entry = result.conditions.setdefault(key, Held())
                entry.merge(found)
        result.diffs.sort(key=lambda d: order[d.session_id])
    else:
        result.diffs, result.conditions = _play_all(edited, bases, keys, sessions)
    result.seconds = time.perf_counter() - started
    result.cpu_seconds = _cpu() - cpu
    return result


def _key(session: Session, by_copy: bool) -> Key:
    if by_copy and session.changed_copy is not None:
        digests = tuple(t.funnel_hash for t in session.turns)
        return ("x", session.changed_copy) if None in digests \
            else ("c", session.version, digests)
    if by_copy and session.digest is not None:
        return ("h", session.version, session.digest)
    return ("v", session.version)


def _cpu() -> float:
    """This process's CPU time and its waited-for children's (the forked plays)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


# What the forked processes play: set before the fork, read by _share in the children.
_WORK: tuple[CompiledFunnel, dict[Key, Base], dict[str, Key],
             list[Session], int] | None = None


def _share(index: int) -> tuple[list[SessionDiff], dict[tuple[str, str, int], Held]]:
    assert _WORK is not None
    edited, bases, keys, sessions, jobs = _WORK
    return _play_all(edited, bases, keys, sessions[index::jobs])


def _play_all(edited: CompiledFunnel, bases: dict[Key, Base],
              keys: dict[str, Key], sessions: Sequence[Session]
              ) -> tuple[list[SessionDiff], dict[tuple[str, str, int], Held]]:
    diffs: list[SessionDiff] = []
    conditions: dict[tuple[str, str, int], Held] = {}
    answerable: dict[int, Callable[[str], bool]] = {}  # by the base's id()

    def answers(original: CompiledFunnel) -> Callable[[str], bool]:
        if id(original) not in answerable:
            answerable[id(original)] = stage_answerable(original, edited)
        return answerable[id(original)]

    for session in sessions:
        key = keys[session.session_id]
        original = bases.get(key)
        if session.skipped or original is None or isinstance(original, str):
            why = session.skipped or str(original)
            if not session.skipped and key[0] == "c":  # a copy it ran on is gone
                why = f"{session.changed_copy}; {why}"
            diffs.append(SessionDiff(session.session_id, "skipped", len(session.turns),
                                     reason=why, revenue=session.revenue))
            continue
        copies = (original,) if isinstance(original, CompiledFunnel) else original
        diffs.append(_one(conditions, session, copies, edited,
                          [answers(f) for f in copies]))
    return diffs, conditions


def _one(conditions: dict[tuple[str, str, int], Held], session: Session,
         copies: tuple[CompiledFunnel, ...], edited: CompiledFunnel,
         answerable: list[Callable[[str], bool]]) -> SessionDiff:
    """One session played on the copy it ran on (``copies``: one, or one per turn) and on
    the edit."""
    sid = session.session_id
    original = copies[-1]  # the copy it ended on: its outcome's hand-off and cart fields
    per_turn = copies if len(copies) > 1 else None
    then = play(original, session.turns, sid, copies=per_turn)
    ran_on = runs(session) if per_turn else []
    problem = reproduced(then, session.turns)
    if problem is not None:
        return SessionDiff(sid, "not_reproduced", len(session.turns), reason=problem,
                           revenue=session.revenue, copies=ran_on)
    now = play(edited, session.turns, sid, stages=[t.stage_before for t in then.turns],
               answerable=answerable if per_turn else answerable[0])
    _count_conditions(conditions, sid, then, now)
    b = _outcome(original, then)
    a = _outcome(edited, now)
    diff = compare(sid, then, now, b, a)
    diff.revenue = session.revenue
    diff.revenue_after = revenue_after(diff, b, a)
    diff.copies = ran_on
    return diff


def _outcome(funnel: CompiledFunnel, played: Playthrough) -> Outcome:
    spec = funnel.spec
    return outcome(played, spec.handoff.stage if spec.handoff else None,
                   spec.handoff.reason if spec.handoff else None,
                   spec.cart.total if spec.cart and spec.cart.total else None)


@dataclass
class Held:
    """Where one exit's condition held, at some turn, on each side (its text on each)."""

    then: set[str] = field(default_factory=set)
    now: set[str] = field(default_factory=set)
    moved: set[str] = field(default_factory=set)  # held at another turn now than then
    when_then: str | None = None
    when_now: str | None = None

    def merge(self, other: Held) -> None:
        self.then |= other.then
        self.now |= other.now
        self.moved |= other.moved
        self.when_then = self.when_then or other.when_then
        self.when_now = self.when_now or other.when_now


def _count_conditions(conditions: dict[tuple[str, str, int], Held], sid: str,
                      then: Playthrough, now: Playthrough) -> None:
    """Over the turns both plays played: where each exit's condition held, and the
    sessions where it held at another turn now than then."""
    for x, y in zip(then.turns, now.turns, strict=False):
        hx, hy = held(x.explanation), held(y.explanation)
        for key in {*hx, *hy}:
            when_then, was = hx.get(key, (None, None))
            when_now, is_ = hy.get(key, (None, None))
            if when_then is None and when_now is None:
                continue
            entry = conditions.get(key)
            if entry is None:
                entry = conditions[key] = Held()
            entry.when_then = entry.when_then or when_then
            entry.when_now = entry.when_now or when_now
            if was:
                entry.then.add(sid)
            if is_:
                entry.now.add(sid)
            if key[0] in {k[0] for k in hx} & {k[0] for k in hy} and \
                    (was is True) != (is_ is True):
                entry.moved.add(sid)


def revenue_after(diff: SessionDiff, b: Outcome, a: Outcome) -> Decimal | None:
    """What the session's recorded orders would come to after the edit: the same when
    nothing changed; none when it no longer hands off (or, without a hand-off, no
    longer ends where it did); scaled by the cart when the cart's total changed (a
    price); unknown when the model is needed (a session a model continued is counted
    as a different one)."""
    if diff.status == "same" or diff.revenue == 0:
        return diff.revenue if diff.status != "needs_model" else None
    if diff.status not in ("different", "continued"):
        return None
    kept = a.handoff if (b.handoff or a.handoff) else a.stage == b.stage
    if not kept:
        return Decimal(0)
    try:
        ratio = Decimal(str(a.cart_total)) / Decimal(str(b.cart_total))
    except (ArithmeticError, ValueError, TypeError):
        return diff.revenue
    return (diff.revenue * ratio).quantize(Decimal("0.01"))


def base_from(bundles: Callable[[int], tuple[str, str, dict[str, str]] | None], name: str,
              fixed: CompiledFunnel | None) -> tuple[Callable[[int], CompiledFunnel | str],
                                                     list[LoadedVersion], dict[int, str]]:
    """The resolver :func:`replay` takes: ``fixed`` (``--base``) for every version, else
    each version's bundle from the version store, compiled once. Also the loaded
    versions (their folders live until the caller drops them) and where each came from."""
    loaded: list[LoadedVersion] = []
    where: dict[int, str] = {}

    def resolve(version: int) -> CompiledFunnel | str:
        if fixed is not None:
            where[version] = str(fixed.spec.path)
            return fixed
        found = bundles(version)
        if found is None:
            return (f"version {version} of funnel '{name}' is not in the version store; "
                    "give the funnel it ran on with --base FILE")
        digest, entry, files = found
        version_loaded = compile_bundle(Bundle(name, version, entry, files, digest))
        loaded.append(version_loaded)
        where[version] = f"version store, version {version} ({digest[:12]})"
        return version_loaded.funnel

    return resolve, loaded, where


def funnel_text(funnel: CompiledFunnel) -> str:
    return Path(funnel.spec.path).read_text("utf-8")


def sessions_behind(ids: Sequence[str], limit: int = 10) -> str:
    """A few of the sessions behind a change, and how many more."""
    shown = ", ".join(ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def as_number(value: Any) -> Any:
    return float(value) if isinstance(value, Decimal) else value
