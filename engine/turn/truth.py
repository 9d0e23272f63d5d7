"""What the reply claims, checked before the customer reads it (engine.claims).

The check needs the state the turn leaves: a reply that says "your cart is 697 UAH"
is true only once the turn's ``add_to_cart`` was applied, and "a manager will call
you" only once the turn handed the session off. So the turn applies the answer and
advances first, then :func:`checked` reads the reply against that state. When a claim
is refused, the turn is put back as it was before the answer was applied
(:class:`Snapshot`), the model is asked once more with each conflict quoted
(engine.turn.output.repair_claims), and that answer is applied and checked in turn;
when it is refused too, the stage's fallback is sent instead of its reply (what code
allowed of the answer stands). A funnel's hooks run again for the answer that replaces
a refused one.

Each refused claim is kept for the turn record (``claims``), the turn's notices and
result, `/metrics` and `funnel report`.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..claims import Refusal, problem
from ..llm.models import Model
from .data import Turn
from .output import Answer, repair_claims
from .stream import ReplyStream

__all__ = ["Snapshot", "checked"]

Apply = Callable[[Turn, Answer], Awaitable[None]]


@dataclass
class Snapshot:
    """The turn as it was before an answer was applied: what apply and advance change."""

    state: dict[str, Any]
    pos: dict[str, Any]
    scratch: tuple[Any, ...]
    mover: tuple[Any, ...]
    turn: tuple[Any, ...]

    @classmethod
    def take(cls, turn: Turn) -> Snapshot:
        s, m = turn.mover.scratch, turn.mover
        return cls(copy.deepcopy(turn.state), copy.deepcopy(dict(turn.pos)),
                   (s.stage, s.stage_iteration, list(s.notices), s.handoff_requested,
                    list(s.ungrounded)),
                   (list(m.accepted), list(m.explanation), m.held),
                   (list(turn.firings), list(turn.updated), list(turn.outcomes),
                    turn.handoff_before))

    def restore(self, turn: Turn) -> None:
        """Put ``turn`` back as it was taken (a deep copy: the snapshot stays reusable)."""
        turn.state.clear()
        turn.state.update(copy.deepcopy(self.state))
        pos: dict[str, Any] = turn.pos  # type: ignore[assignment]  # the mover's same dict
        pos.clear()
        pos.update(copy.deepcopy(self.pos))
        s, m = turn.mover.scratch, turn.mover
        (s.stage, s.stage_iteration, notices, s.handoff_requested, ungrounded) = self.scratch
        s.notices[:] = notices
        s.ungrounded[:] = ungrounded
        accepted, explanation, m.held = self.mover
        m.accepted, m.explanation = list(accepted), list(explanation)
        firings, updated, outcomes, turn.handoff_before = self.turn
        turn.firings, turn.updated, turn.outcomes = list(firings), list(updated), list(outcomes)


def refusals(turn: Turn, answer: Answer, stage: str) -> list[Refusal]:
    """The claims of ``answer``'s reply that the state ``turn`` leaves does not back."""
    if answer.fallback:
        return []
    reply = str(answer.envelope.get("reply", ""))
    return turn.funnel.claims.check(reply, stage, turn.state, turn.mover.context(turn.state))


def _keep(turn: Turn, found: list[Refusal], attempt: int) -> None:
    turn.claims[:] = [c for c in turn.claims if c["attempt"] != attempt]
    for refusal in found:
        turn.claims.append({**refusal.as_record(), "attempt": attempt})
        turn.mover.scratch.notices.append(
            f"(engine) a reply was not sent: {refusal.sentence()}"[:300])


async def checked(turn: Turn, answer: Answer, snapshot: Snapshot, stage: str, model: Model,
                  apply: Apply, fallback: str,
                  reply_check: Callable[[dict[str, Any]], str | None] | None,
                  stream: ReplyStream | None) -> Answer:
    """``answer`` (already applied to ``turn``) when its reply's claims hold; else the
    answer of one repair call, applied, when its claims hold; else the stage's
    ``fallback`` reply.

    What code allowed of the answer (its updates and actions) stands when only its
    reply claimed too much: the fallback replaces the words, not the customer's phone
    number. Of two answers, the repair's stands; of a repair that failed, the first's.
    ``stage`` is the stage the model answered in (whose ``claims:`` settings apply);
    ``apply`` applies an answer and advances (engine.turn.engine).
    """
    found = refusals(turn, answer, stage)
    if not found:
        return answer
    snapshot.restore(turn)
    _keep(turn, found, 0)
    again = await repair_claims(model, turn.funnel.stage(stage), answer, problem(found),
                                fallback, reply_check, stream)
    if again.fallback:  # the repair call failed, or its answer was invalid
        await apply(turn, answer)
        error = again.error
    else:
        await apply(turn, again)
        still = refusals(turn, again, stage)
        if not still:
            return again
        _keep(turn, still, 1)
        if stream is not None:
            stream.rejected()
        answer, error = again, (f"reply claims refused: {problem(found)}; after repair: "
                                f"{problem(still)}")
    return Answer({**answer.envelope, "reply": fallback}, again.completions,
                  failures=again.failures + int(not again.fallback), fallback=True,
                  error=error, attempts=again.attempts, failed=list(again.failed))
