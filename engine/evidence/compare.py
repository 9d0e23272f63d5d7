"""A session played twice, on the version it ran on and on the edit: what changed.

:func:`compare` finds the first turn where the two plays part (the stage they end the
turn in, the transitions that fired, the actions accepted or refused, the cart total,
and every exit whose condition held in one play and not in the other) and the
outcome of each: the final stage, the cart, the hand-off. :class:`Outcome` is one
play's; :class:`SessionDiff` the pair's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from .play import Playthrough, held

__all__ = ["Continued", "ExitChange", "Outcome", "SessionDiff", "compare", "outcome"]


@dataclass
class Outcome:
    """How one play of a session ended."""

    stage: str
    reached: list[str]
    cart_total: Any
    handoff: bool
    handoff_reason: Any
    first_turn: dict[str, int]  # stage -> the turn (1-based) it was first entered in

    def as_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "reached": self.reached, "cart_total": self.cart_total,
                "handoff": self.handoff, "handoff_reason": self.handoff_reason}


@dataclass(frozen=True)
class ExitChange:
    """An exit whose condition held in one play and not in the other, at one turn."""

    stage: str
    to: str
    when: str | None  # the condition on the edit (None: always, or no such exit now)
    then: Any  # held on the version the session ran on (None: not evaluated / an error)
    now: Any  # held on the edit
    when_then: str | None = None  # the condition then, when the edit rewrote it

    def describe(self) -> str:
        def word(v: Any) -> str:
            return {True: "held", False: "did not hold", None: "was not evaluated"}[v]
        if self.when is None and self.when_then is not None and self.now is None:
            return f"{self.stage} -> {self.to} `{self.when_then}` is gone now, {word(self.then)} then"
        cond = f"`{self.when}`" if self.when else "(always)"
        was = f" (then `{self.when_then}`)" if self.when_then not in (None, self.when) else ""
        return (f"{self.stage} -> {self.to} {cond}{was} {word(self.now)} now, "
                f"{word(self.then)} then")


@dataclass
class Continued:
    """The turns a model played where the recording had no answer (``--model``)."""

    model: str  # the model as given (``--model``)
    turn: int  # the first turn it played (1-based): the first the recording could not answer
    turns: int = 0  # how many it played
    fallbacks: int = 0
    repairs: int = 0
    tokens: int = 0
    ended: str = ""  # why it stopped before the recorded messages ran out (a final stage)

    def describe(self) -> str:
        text = (f"continued with {self.model} from turn {self.turn} ({self.turns} turn(s) by "
                f"the model, {self.fallbacks} fallback(s), {self.repairs} repair(s)")
        return text + (f"; {self.ended})" if self.ended else ")")


@dataclass
class SessionDiff:
    """One session's replay: ``status`` is ``same``, ``different``, ``needs_model``,
    ``continued`` (needed the model, and ``--model`` played the rest: its outcome after
    rests on new model outputs), ``not_reproduced`` (the version it ran on does not
    replay as recorded) or ``skipped``."""

    session_id: str
    status: str
    turns: int = 0
    before: Outcome | None = None
    after: Outcome | None = None
    turn: int | None = None  # the first turn that differs
    stage: str | None = None  # the stage the session was in at that turn
    changes: list[str] = field(default_factory=list)
    exits: list[ExitChange] = field(default_factory=list)
    needs_model: int | None = None
    reason: str | None = None  # needs_model / not_reproduced / skipped: why
    revenue: Decimal = Decimal(0)  # recorded orders
    revenue_after: Decimal | None = None  # None: cannot say (the model is needed)
    continued: Continued | None = None  # the model that played the turns the recording lacked
    # The copies it was played on as recorded, turn by turn, when its copy changed between
    # turns: (content hash, first turn, last turn), in order; empty: one copy.
    copies: list[tuple[str, int, int]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"session_id": self.session_id, "status": self.status,
                               "turns": self.turns}
        if self.turn is not None:
            out["first_difference"] = {
                "turn": self.turn, "stage": self.stage, "changes": self.changes,
                "exits": [{"stage": e.stage, "to": e.to, "when": e.when,
                           "when_then": e.when_then, "then": e.then, "now": e.now}
                          for e in self.exits]}
        if self.needs_model is not None:
            out["needs_model_from_turn"] = self.needs_model
        if self.continued:
            c = self.continued
            out["continued"] = {"model": c.model, "from_turn": c.turn, "turns": c.turns,
                                "fallbacks": c.fallbacks, "repairs": c.repairs,
                                "tokens": c.tokens, "ended": c.ended or None,
                                "text": c.describe()}
        if self.reason:
            out["reason"] = self.reason
        if self.copies:
            out["copies"] = [{"hash": h, "turns": [first, last]}
                             for h, first, last in self.copies]
        if self.before:
            out["before"] = self.before.as_json()
        if self.after:
            out["after"] = self.after.as_json()
        out["revenue"] = {"before": _num(self.revenue),
                          "after": None if self.revenue_after is None
                          else _num(self.revenue_after)}
        return out


def _num(d: Decimal) -> int | float:
    return int(d) if d == d.to_integral_value() else float(d)


def outcome(play: Playthrough, handoff_stage: str | None, reason_field: str | None,
            cart_field: str | None) -> Outcome:
    first: dict[str, int] = {}
    for number, t in enumerate(play.turns, 1):
        first.setdefault(t.stage_before, number)
        for tr in t.transitions:
            first.setdefault(tr.split("->", 1)[1], number)
    if play.pos and play.pos["stage_history"]:
        first.setdefault(play.pos["stage_history"][0]["stage"], 1)
    state = play.state
    handoff = handoff_stage is not None and handoff_stage in play.reached
    return Outcome(play.stage, play.reached,
                   state.get(cart_field) if cart_field else None, handoff,
                   state.get(reason_field) if reason_field else None, first)


def compare(session_id: str, before: Playthrough, after: Playthrough, b: Outcome, a: Outcome
            ) -> SessionDiff:
    """The pair's :class:`SessionDiff` (before reproduces the recording: checked earlier)."""
    diff = SessionDiff(session_id, "same", turns=len(before.turns), before=b, after=a)
    for number, (x, y) in enumerate(zip(before.turns, after.turns, strict=False), 1):
        changes: list[str] = []
        if x.transitions != y.transitions:
            changes.append(f"moved {_moves(y.transitions)} now, {_moves(x.transitions)} then")
        if x.actions != y.actions or x.refused != y.refused:
            changes.append(f"actions {_acts(y)} now, {_acts(x)} then")
        if x.cart_total != y.cart_total:
            changes.append(f"cart total {y.cart_total} now, {x.cart_total} then")
        if x.fallback != y.fallback:
            changes.append("the fallback reply now" if y.fallback else
                           "the model's reply now, the fallback then")
        exits = _exits(held(x.explanation), held(y.explanation))
        if changes or exits:
            diff.status, diff.turn, diff.stage = "different", number, x.stage_before
            diff.changes, diff.exits = changes, exits
            break
    if after.needs_model is not None:
        diff.status, diff.needs_model = "needs_model", after.needs_model
        diff.reason = after.needs_reason
        if diff.turn is None:
            diff.turn = after.needs_model
            diff.stage = after.turns[-1].stage_after if after.turns else None
    elif after.settled is not None:
        diff.status = "different"
        diff.reason = (f"it reached the final stage {a.stage}; the turns from "
                       f"{after.settled} on are not replayed")
    elif diff.status == "same" and (b.stage, b.cart_total, b.handoff) != \
            (a.stage, a.cart_total, a.handoff):
        diff.status = "different"  # reached only by what the plays end with
    return diff


def _exits(hx: dict[tuple[str, str, int], tuple[str | None, Any]],
           hy: dict[tuple[str, str, int], tuple[str | None, Any]]) -> list[ExitChange]:
    """The exits that held in one play and not in the other, in the stages both plays
    evaluated (a stage only one reached is a move, told apart); an exit the edit added
    or removed counts when it held."""
    both = {k[0] for k in hx} & {k[0] for k in hy}
    out = []
    for k in [*hx, *(k for k in hy if k not in hx)]:
        if k[0] not in both:
            continue
        then, now = hx.get(k, (None, None)), hy.get(k, (None, None))
        if (then[1] is True) != (now[1] is True):
            out.append(ExitChange(k[0], k[1], now[0] if k in hy else None, then[1], now[1],
                                  then[0] if k in hx else None))
    return out


def _moves(transitions: list[str]) -> str:
    return ", ".join(transitions) if transitions else "nowhere"


def _acts(p: Any) -> str:
    parts = list(p.actions) + [f"{r} (refused)" for r in p.refused]
    return ", ".join(parts) if parts else "none"
