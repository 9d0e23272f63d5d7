"""The threshold advisor: `funnel report FUNNEL --advise`.

For each numeric threshold in a stage's exit condition (``discovery_completeness >= 60``,
read with a pattern, never evaluated) it reads the recorded sessions (the funnel's
session table, one read-only transaction) and answers:

* how many sessions entered the stage, left by the exit, and stayed there, and how many
  of those stayed *just below* the threshold (within :data:`BAND` of it);
* how the sessions that took the exit converted (an order, or the hand-off), by their
  score;
* the value the data suggests: the score where conversion steps up (the split of the
  sessions that took the exit into two groups, below and from it, that fits them best;
  a step only when the two groups' Wilson 95% intervals do not overlap), with a
  bootstrap 95% interval; with no step, none (the data does not say to move it);
* what that value would change: the funnel with the threshold substituted, in a
  temporary copy of its files, replayed (:func:`engine.evidence.replay.replay`) over the
  most recent sessions (at most ``replay_cap``; the report says when it capped).

A session's score is its last value of the field (for a score that only grows, like a
completeness, its highest).
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from psycopg import sql

from ..errors import InvalidInput
from ..experiments.stats import wilson
from ..format.names import CONVERSIONS, PLAYGROUND
from ..funnel.compiled import CompiledFunnel
from ..store.playground import real_session
from .advise_replay import replay_threshold
from .records import _connect, _has, read_population

__all__ = ["Advice", "Threshold", "advise", "thresholds"]

BAND = 0.15  # "just below": within 15% of the threshold (1 at least)
MIN_GROUP = 5  # sessions on each side of a step, at least
BOOTSTRAP = 200
_COND = re.compile(r"(?<![\w.'\"])([a-z_][a-z0-9_]*)\s*(>=|<=|>|<)\s*(-?\d+(?:\.\d+)?)(?![\w.])")


@dataclass(frozen=True)
class Threshold:
    """One numeric comparison in a stage's exit condition."""

    stage: str
    to: str
    field: str
    op: str
    value: float
    when: str
    line: int

    @property
    def text(self) -> str:
        return f"{self.field} {self.op} {_num(self.value)}"

    @property
    def up(self) -> bool:
        """Whether a higher score takes the exit (``>=``, ``>``)."""
        return self.op in (">=", ">")

    def passes(self, score: float, value: float | None = None) -> bool:
        v = self.value if value is None else value
        return {">=": score >= v, ">": score > v, "<=": score <= v, "<": score < v}[self.op]


def thresholds(funnel: CompiledFunnel) -> list[Threshold]:
    """The numeric thresholds of the exits, on numeric state fields, in file order."""
    spec = funnel.spec
    numeric = {n for n, f in spec.state.items() if f.type in ("integer", "number")}
    out = []
    for stage in spec.stages.values():
        for exit_ in stage.transitions:
            for m in _COND.finditer(exit_.when or ""):
                if m.group(1) in numeric:
                    out.append(Threshold(stage.name, exit_.to, m.group(1), m.group(2),
                                         float(m.group(3)), exit_.when or "", exit_.line))
    return out


@dataclass
class Advice:
    """What the sessions say about one threshold."""

    threshold: Threshold
    entered: int = 0
    passed: int = 0
    stayed: int = 0
    just_below: int = 0
    band: tuple[float, float] = (0.0, 0.0)
    by_score: list[dict[str, Any]] = field(default_factory=list)
    step: dict[str, Any] | None = None  # below/from the suggested value: k, n, rate, low, high
    suggested: float | None = None
    interval: tuple[float, float] | None = None
    advice: str = ""
    replay: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        t = self.threshold
        return {"stage": t.stage, "to": t.to, "condition": t.when, "threshold": t.text,
                "field": t.field, "op": t.op, "value": t.value, "line": t.line,
                "entered": self.entered, "passed": self.passed, "stayed": self.stayed,
                "just_below": self.just_below, "band": list(self.band),
                "by_score": self.by_score, "step": self.step, "suggested": self.suggested,
                "interval": list(self.interval) if self.interval else None,
                "advice": self.advice, "replay": self.replay}


@dataclass
class Row:
    score: float | None
    stages: set[str]
    stage: str
    converted: bool


def advise(funnel: CompiledFunnel, db: str | None, *, since: float | None = None,
           replay_cap: int = 500, seed: int = 0) -> tuple[list[Advice], dict[str, Any]]:
    """Advice on each threshold, and the run's facts (sessions, seconds).

    Raises:
        InvalidInput: the funnel has no numeric threshold, or no session was recorded in
            the period.
    """
    started = time.perf_counter()
    found = thresholds(funnel)
    if not found:
        raise InvalidInput(f"funnel '{funnel.name}' has no numeric threshold in an exit "
                           "condition (such as `discovery_completeness >= 60`) to advise on")
    rows, recent = _read(funnel, db, since, sorted({t.field for t in found}))
    if not rows:
        window = f"in the last {since:g} s" if since is not None else "at all"
        raise InvalidInput(f"no recorded session of funnel '{funnel.name}' {window} in the "
                           "database: nothing to advise from (check --db and --since)")
    out = [_advise(t, rows, random.Random(seed)) for t in found]
    read = time.perf_counter() - started
    replayed = 0.0
    if replay_cap > 0:
        t0 = time.perf_counter()
        ids = recent[:replay_cap]
        population = read_population(db, funnel.name, sessions=ids)
        for a in out:
            value = a.suggested if a.suggested is not None else _tried(a, rows)
            if value is not None:
                a.replay = replay_threshold(funnel, db, a.threshold, value, population,
                                            len(recent), replay_cap)
                a.replay["without_turns"] = len(ids) - len(population.sessions)
        replayed = time.perf_counter() - t0
    return out, {"funnel": funnel.name, "sessions": len(recent), "since_seconds": since,
                 "seconds": round(time.perf_counter() - started, 3),
                 "seconds_advice": round(read, 3), "seconds_replay": round(replayed, 3),
                 "replay_cap": replay_cap}


def _read(funnel: CompiledFunnel, db: str | None, since: float | None, fields: list[str]
          ) -> tuple[dict[str, dict[str, Row]], list[str]]:
    """Each field -> session -> its row; and the session ids, most recent first."""
    spec = funnel.spec
    h = spec.handoff
    conn = _connect(db)
    with conn:
        if not _has(conn, spec.table):
            return {}, []
        where: list[sql.Composable] = [sql.SQL("TRUE")]
        params: list[Any] = []
        if since is not None:
            where.append(sql.SQL("s.last_message_at >= %s"))
            params.append(datetime.now().astimezone() - timedelta(seconds=since))
        if _has(conn, PLAYGROUND):
            where.append(real_session(sql.Literal(spec.name), sql.Identifier("s", "session_id")))
        orders = sql.SQL("EXISTS (SELECT 1 FROM {} c WHERE c.funnel = {} AND c.session_id = "
                         "s.session_id)").format(sql.Identifier(CONVERSIONS),
                                                 sql.Literal(spec.name)) \
            if _has(conn, CONVERSIONS) else sql.SQL("FALSE")
        rows = conn.execute(sql.SQL(
            "SELECT s.session_id, s.stage, jsonb_path_query_array(s.stage_history, "
            "'$[*].stage'), {} {} FROM {} s WHERE {} ORDER BY s.last_message_at DESC, "
            "s.session_id").format(
                orders, sql.SQL("").join(sql.SQL(", s.{}").format(sql.Identifier(f))
                                         for f in fields),
                sql.Identifier(spec.table), sql.SQL(" AND ").join(where)), params).fetchall()
    out: dict[str, dict[str, Row]] = {f: {} for f in fields}
    for sid, stage, stages, ordered, *values in rows:
        seen = {*(stages or []), stage}
        converted = bool(ordered) or bool(h and h.stage in seen)
        for f, v in zip(fields, values, strict=True):
            out[f][sid] = Row(float(v) if v is not None else None, seen, stage, converted)
    return (out if rows else {}), [r[0] for r in rows]


def _advise(t: Threshold, rows: dict[str, dict[str, Row]], rng: random.Random) -> Advice:
    a = Advice(t)
    entered = [r for r in rows[t.field].values() if t.stage in r.stages and r.score is not None]
    passed = [r for r in entered if t.to in r.stages]
    stayed = [r for r in entered if r.stage == t.stage]
    width = max(1.0, abs(t.value) * BAND)
    a.band = (t.value - width, t.value) if t.up else (t.value, t.value + width)
    a.entered, a.passed, a.stayed = len(entered), len(passed), len(stayed)
    a.just_below = sum(1 for r in stayed if r.score is not None
                       and a.band[0] <= r.score <= a.band[1] and not t.passes(r.score))
    cells = [(float(r.score if t.up else -r.score), r.converted) for r in passed
             if r.score is not None]
    a.by_score = _bands(cells, t.up)
    split = _split(_tally(cells))
    if split is None:
        a.advice = ("keep: too few sessions took the exit to read a step" if len(cells) <
                    2 * MIN_GROUP else "keep: the sessions that took the exit convert alike "
                    "at every score; the data gives no reason to move it")
        return a
    cut, low, high = split
    if high["rate"] <= low["rate"]:
        a.advice = "keep: higher scores do not convert better"
        return a
    tally = _tally(cells)
    boots = []
    for _ in range(BOOTSTRAP):
        # The Poisson bootstrap: each (score, outcome) count drawn anew around itself (a
        # resample of the sessions, without drawing each of them).
        sample = {score: [_poisson(rng, n - k), _poisson(rng, k)] for score, (n, k)
                  in tally.items()}
        found = _split({s: [a + b, b] for s, (a, b) in sample.items() if a + b},
                       need_gap=False)
        if found is not None:
            boots.append(found[0])
    boots.sort()
    sign = 1 if t.up else -1
    a.suggested = sign * cut
    lo, hi = boots[int(0.025 * len(boots))], boots[min(len(boots) - 1, int(0.975 * len(boots)))]
    a.interval = (min(sign * lo, sign * hi), max(sign * lo, sign * hi))
    a.step = {"below": low, "from": high}
    move = "keep" if a.suggested == t.value else (
        "raise" if (a.suggested > t.value) == t.up else "lower")
    a.advice = (f"{move} it to {_num(a.suggested)} (95% interval {_num(a.interval[0])} to "
                f"{_num(a.interval[1])}): those that took the exit with a score "
                f"{'below' if t.up else 'above'} it converted {low['rate'] * 100:.0f}%, "
                f"from it on {high['rate'] * 100:.0f}%")
    return a


def _bands(cells: Sequence[tuple[float, bool]], up: bool) -> list[dict[str, Any]]:
    """The exit's sessions by score, in up to 10 bands, with each band's conversion."""
    if not cells:
        return []
    lo, hi = min(s for s, _ in cells), max(s for s, _ in cells)
    width = max(1.0, math.ceil((hi - lo + 1) / 10))
    bands: dict[int, list[bool]] = {}
    for s, c in cells:
        bands.setdefault(int((s - lo) // width), []).append(c)
    out = []
    for i in sorted(bands):
        k, n = sum(bands[i]), len(bands[i])
        first, last = lo + i * width, lo + (i + 1) * width
        span = (first, last) if up else (-last, -first)
        low, high = wilson(k, n)
        out.append({"from": span[0], "to": span[1], "n": n, "converted": k, "rate": k / n,
                    "low": low, "high": high})
    return out


def _tally(cells: Sequence[tuple[float, bool]]) -> dict[float, list[int]]:
    """score -> [sessions, converted]."""
    counts: dict[float, list[int]] = {}
    for score, converted in cells:
        entry = counts.setdefault(score, [0, 0])
        entry[0] += 1
        entry[1] += int(converted)
    return counts


def _poisson(rng: random.Random, mean: int) -> int:
    """A Poisson draw (Knuth's below 30, the normal approximation above)."""
    if mean <= 0:
        return 0
    if mean > 30:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def _split(counts: dict[float, list[int]], need_gap: bool = True
           ) -> tuple[float, dict[str, Any], dict[str, Any]] | None:
    """The score that splits the sessions (``score -> [sessions, converted]``) into the
    two groups (below it, from it) whose two conversion rates fit them best (the most
    likely step), with each group's count, rate and Wilson interval; None when no split
    leaves :data:`MIN_GROUP` on each side, or (``need_gap``) when the two intervals
    overlap."""
    scores = sorted(counts)
    n_all = sum(c[0] for c in counts.values())
    k_all = sum(c[1] for c in counts.values())
    best: tuple[float, float, int, int] | None = None
    n_low = k_low = 0
    for prev, score in zip(scores, scores[1:], strict=False):
        n_low += counts[prev][0]
        k_low += counts[prev][1]
        if n_low < MIN_GROUP or n_all - n_low < MIN_GROUP:
            continue
        fit = _ll(k_low, n_low) + _ll(k_all - k_low, n_all - n_low)
        if best is None or fit > best[0]:
            best = (fit, score, n_low, k_low)
    if best is None:
        return None
    _, cut, n_low, k_low = best
    low = _group(k_low, n_low)
    high = _group(k_all - k_low, n_all - n_low)
    if need_gap and not (low["high"] < high["low"] or high["high"] < low["low"]):
        return None
    return cut, low, high


def _ll(k: int, n: int) -> float:
    """The binomial log-likelihood of ``k`` of ``n`` at their own rate."""
    if k in (0, n):
        return 0.0
    p = k / n
    return k * math.log(p) + (n - k) * math.log(1 - p)


def _group(k: int, n: int) -> dict[str, Any]:
    low, high = wilson(k, n)
    return {"n": n, "converted": k, "rate": k / n if n else 0.0, "low": low, "high": high}


def _tried(a: Advice, rows: dict[str, dict[str, Row]]) -> float | None:
    """With no step: the threshold moved to the edge of the band (what letting more
    through would change), when sessions stayed in the stage and some score of those
    that entered it would still fall short (a threshold no session fails is no
    threshold); else None."""
    t = a.threshold
    value = a.band[0] if t.up else a.band[1]
    scores = [r.score for r in rows[t.field].values()
              if t.stage in r.stages and r.score is not None]
    if not a.stayed or all(t.passes(s, value) for s in scores):
        return None
    return value


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
