"""Moving a session between stages inside a turn: the machine decides, never the model.

After the turn's updates and actions, :func:`advance` evaluates the stage's
exit transitions on the state as it now is and chains them while they fire
(each stage at most once per turn); a turn that stays counts one more
iteration in its stage, and the stage's ``max_iterations`` may move it.
Entering a stage writes its history entry, stamps the hand-off fields when it
is the hand-off stage, and runs its ``on_enter`` actions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict

from ..funnel.actions import TurnScratch
from ..funnel.compiled import CompiledFunnel
from ..funnel.machine import Firing
from .explain import explain_stage
from .prompts import full_view


class Position(TypedDict):
    """Where a session is: the engine-owned columns the machine reads and writes."""

    stage: str
    stage_iteration: int
    turns: int
    stage_history: list[dict[str, Any]]
    notices: list[str]


def start_position(initial: str, now: datetime) -> Position:
    """A new session's position: its initial stage, entered now."""
    return Position(stage=initial, stage_iteration=0, turns=0, notices=[],
                    stage_history=[{"stage": initial, "entered_at": now.isoformat()}])


@dataclass
class Mover:
    """The stage machine applied to one turn's session (``pos`` is changed in place)."""

    funnel: CompiledFunnel
    pos: Position
    now: datetime
    scratch: TurnScratch
    returning: bool = False
    accepted: list[str] = field(default_factory=list)  # the action types applied this turn
    # Every stage's exits as evaluated this turn (engine.turn.explain), for the turn record.
    explanation: list[dict[str, Any]] = field(default_factory=list)
    # A move into a stage whose `approval:` gate held (engine.turn.approval): not made;
    # what it would have been (from, to, trigger, when, reason).
    held: dict[str, Any] | None = None
    # Whether the explanation keeps the values each condition read (the turn record's
    # "why"); a replay compares only which exits held, and skips reading them out.
    values: bool = True

    @property
    def now_iso(self) -> str:
        """``now`` as ISO text, written once a turn (the scratch's, when it is the same time)."""
        return self.scratch.now_iso if self.scratch.now is self.now else self.now.isoformat()

    def context(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The names conditions read: every declared field plus the turn's facts."""
        ctx = full_view(self.funnel, state)
        pos = self.pos
        ctx.update(stage=pos["stage"], stage_iteration=pos["stage_iteration"],
                   actions=self.accepted, handoff_requested=self.scratch.handoff_requested,
                   returning=self.returning, turns=pos["turns"],
                   stage_history=pos["stage_history"])
        return ctx

    def fire(self, trigger: str, ctx: Mapping[str, Any], *, notify: bool = True,
             verdicts: Mapping[str, bool] | None = None,
             gate: Mapping[str, Any] | None = None) -> list[Firing]:
        """Fire one trigger; enter the stage it leads to. Condition errors become notices.

        With ``gate`` (the conditions' context), a move into a stage whose ``approval``
        holds on it is not made: it is kept in :attr:`held`, and nothing fired.
        """
        session = self.funnel.machine.fire(self.pos["stage"], trigger, ctx, verdicts)
        if notify:
            self.scratch.notices.extend(f"(engine) {e}" for e in session.errors)
        if gate is not None and session.fired and session.state != self.pos["stage"] \
                and self._gated(session.fired[-1], gate):
            return []
        if session.fired and session.state != self.pos["stage"]:
            enter(self.pos, session.state, self.now)
            self.scratch.stage = session.state
            self.scratch.stage_iteration = 0
        return session.fired

    def _gated(self, firing: Firing, ctx: Mapping[str, Any]) -> bool:
        """Whether the move ``firing`` made waits for a manager (then it is :attr:`held`)."""
        if firing.dest not in self.funnel.approval_conditions:
            return False
        condition = self.funnel.approval_conditions[firing.dest]
        try:
            asks = condition is None or bool(condition(ctx))
        except Exception as exc:  # fail closed: a manager decides what code cannot
            self.scratch.notices.append(f"(engine) the approval condition of stage "
                                        f"'{firing.dest}' failed ({exc}); a manager decides")
            asks = True
        if asks:
            self.held = {"from": firing.source, "to": firing.dest, "trigger": firing.trigger,
                         "when": firing.spec.when if firing.spec else None,
                         "reason": firing.spec.reason if firing.spec else None}
        return asks

    def advance(self, state: dict[str, Any]) -> list[Firing]:
        """Exit transitions, chained while they fire, then the iteration count and limit."""
        funnel, pos = self.funnel, self.pos
        firings: list[Firing] = []
        visited = {pos["stage"]}
        for _ in range(len(funnel.spec.stages)):
            if funnel.stage(pos["stage"]).spec.final:
                break
            ctx = self.context(state)
            step = explain_stage(funnel, pos["stage"], ctx, values=self.values)
            self.explanation.append(step)
            # The explanation just evaluated every exit of the stage on this context:
            # when none held (nor failed), the machine has nothing to fire, and asking it
            # would evaluate them all again. Most turns stay in their stage.
            if all(t["held"] is False for t in step["transitions"]):
                break
            # ... and the machine need not evaluate them again either (an exit whose
            # condition failed is evaluated again: the machine records its error).
            fired = self.fire("advance", ctx, verdicts={
                t["when"]: t["held"] for t in step["transitions"]
                if t["when"] is not None and t["held"] is not None}, gate=ctx)
            if self.held is not None:  # the turn stays; the move waits for a manager
                return firings
            if not fired:
                break
            step["fired"] = fired[-1].dest
            firings += fired
            before = dict(state)
            self.on_enter(fired[-1], state)
            if state != before:  # entering the stage changed facts: derive again
                funnel.rules.recompute(state, self.context(state), self.now_iso)
            if pos["stage"] in visited:
                break
            visited.add(pos["stage"])
        if firings:
            return firings
        pos["stage_iteration"] += 1  # the session stayed: one more turn in the stage
        limit = funnel.stage(pos["stage"]).spec.max_iterations
        if limit and self.explanation:
            self.explanation[-1]["iterations"] = {"count": pos["stage_iteration"],
                                                  "limit": limit.limit, "to": limit.to}
        if limit and limit.to and pos["stage_iteration"] >= limit.limit:
            fired = self.fire("iteration_limit", {}, gate=self.context(state))
            if fired:
                if self.explanation:
                    self.explanation[-1]["fired"] = fired[-1].dest
                self.on_enter(fired[-1], state)
            firings += fired
        return firings

    def on_enter(self, firing: Firing, state: dict[str, Any]) -> None:
        """Stamp the hand-off fields (on the hand-off stage) and run ``on_enter`` actions."""
        spec = self.funnel.spec
        stage = self.funnel.stage(self.pos["stage"]).spec
        handoff = spec.handoff
        if handoff and stage.name == handoff.stage:
            if handoff.triggered_at and not state.get(handoff.triggered_at):
                state[handoff.triggered_at] = self.now_iso
            if handoff.reason and not state.get(handoff.reason):
                state[handoff.reason] = (firing.spec.reason if firing.spec else None) or \
                    self.scratch.handoff_requested or "unspecified"
        for call in stage.on_enter:
            self.funnel.actions.run(call, state, self.scratch)


def record_current(pos: Position, at: str) -> None:
    """Append the stage ``pos`` sits in to its history when the history does not end in
    it (a row written in the seed's format, or by another writer), entered ``at``
    (an ISO time); as `funnel migrate` does (engine.store.migrate.record_current_stages)."""
    history = pos["stage_history"]
    if history and history[-1].get("stage") == pos["stage"]:
        return
    history = [dict(h) for h in history]
    if history and "exited_at" not in history[-1]:
        history[-1]["exited_at"] = at
    history.append({"stage": pos["stage"], "entered_at": at})
    pos["stage_history"] = history


def enter(pos: Position, stage: str, now: datetime) -> None:
    """Move ``pos`` into ``stage`` now: close the open history entry, open a new one."""
    at = now.isoformat()
    history = [dict(h) for h in pos["stage_history"]]
    if history and "exited_at" not in history[-1]:
        history[-1]["exited_at"] = at
    history.append({"stage": stage, "entered_at": at})
    pos["stage_history"] = history
    pos["stage"] = stage
    pos["stage_iteration"] = 0


def handoff_payload(funnel: CompiledFunnel, session_id: str, state: Mapping[str, Any],
                    channel: str) -> dict[str, Any]:
    """The hand-off alert's body: who the customer is, the cart, the reason, the state."""
    spec = funnel.spec
    public = {k: v for k, v in state.items() if k not in ("conversation_summary",)}
    # The customer: the fields kept as personal data (Puramur's `customer`), the
    # value itself when there is one such field.
    personal = {k: state.get(k) for k, f in spec.state.items() if f.personal}
    customer = next(iter(personal.values())) if len(personal) == 1 else personal or None
    cart = {"lines": state.get(spec.cart.field) or [],
            "total": state.get(spec.cart.total) if spec.cart.total else None
            } if spec.cart else None
    reason = state.get(spec.handoff.reason) if spec.handoff and spec.handoff.reason else None
    return {"event": "handoff", "funnel": spec.name, "session_id": session_id,
            "channel": channel, "reason": reason, "customer": customer, "cart": cart,
            "state": public}
