"""One recorded session played again in memory: the decided parts of each turn, with the
model outputs its turn records kept.

A turn of :class:`~engine.turn.engine.Engine` is LOAD -> route -> language -> ask ->
apply -> advance -> SAVE. Replay keeps the steps that code decides and runs them with
the engine's own functions (``steps.route``, ``steps.apply``, ``Mover.advance``, the
output check of ``engine.turn.output``); what the model did is taken from the record
(``raw_output``: the answer, then the repair when there was one); nothing is read from
or written to the database while a session plays. The prompt is never rendered: the
model is not asked, so what it would read does not matter, as long as it would be
asked in the same stage with the same prompt. When the funnel played puts the session
in another stage than the recording did, or that stage's prompt or output schema
changed, the recording has no answer for the turn: the play stops there, marked
"needs the model from turn N" (:attr:`Playthrough.needs_model`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from ..format.settings import LanguagePolicy
from ..funnel.actions import TurnScratch
from ..funnel.compiled import CompiledFunnel, CompiledStage
from ..funnel.state import defaults
from ..turn import language, steps
from ..turn.advance import Mover, Position, start_position
from ..turn.budget import bound_notices
from ..turn.data import Incoming, Turn
from ..turn.output import Answer, Kept, parse_kept

__all__ = ["Playthrough", "Played", "Recorded", "carry", "play"]

CHANNEL = "replay"  # the hand-off's channel field in a replayed session


@dataclass
class Recorded:
    """One turn as its record kept it (``funnel_turns`` and the customer's message)."""

    customer: str
    outputs: list[str] | None  # raw model outputs; None: not kept (anonymized, too old)
    at: datetime
    stage_before: str
    stage_after: str
    fallback: bool = False
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # The session's messages, (role, content) oldest first (one list its turns share), and
    # where this turn's customer message is in it (-1: not known): the window the turn
    # read, whose customer messages grounded facts and confirmed actions must cite.
    messages: Sequence[tuple[str, str]] = ()
    index: int = -1
    # The content hash of the copy of the funnel the turn ran on (``funnel_turns.funnel_hash``;
    # None: recorded before turn records kept it).
    funnel_hash: str | None = None


@dataclass
class Played:
    """What one turn did when played."""

    stage_before: str  # where the model was asked (after an idle return moved it)
    stage_after: str
    transitions: list[str]  # "from->to"
    actions: list[str]  # accepted action types
    refused: list[str]
    fallback: bool
    cart_total: Any
    handoff: bool  # handed off in this turn
    explanation: list[dict[str, Any]]


@dataclass
class Playthrough:
    """A session played: its turns, where it ended, and where the recording ran out."""

    turns: list[Played] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    pos: Position | None = None
    needs_model: int | None = None  # the first turn (1-based) the recording cannot answer
    needs_reason: str = ""
    # The turn (1-based) from which the recording was asked elsewhere, but the session sits
    # in a final stage: the outcome is decided, the later turns are not played.
    settled: int | None = None

    @property
    def stage(self) -> str:
        return self.pos["stage"] if self.pos else ""

    @property
    def reached(self) -> list[str]:
        """Every stage the session entered, in order, without repeats."""
        seen: list[str] = []
        for h in self.pos["stage_history"] if self.pos else []:
            if h.get("stage") not in seen:
                seen.append(h["stage"])
        return seen


class _Languages:
    """The language decisions of a run, remembered: they depend on the customer's text,
    the session's language so far and the policy, never on the edit; detection is the
    dearest step of a played turn. Keyed by the policy's value (a frozen dataclass), not
    its identity: the version a session ran on and the edit are two compiled funnels with
    equal policies, and each text is detected once for both plays."""

    def __init__(self) -> None:
        self.decisions: dict[tuple[LanguagePolicy, str, str | None], language.Decision] = {}
        self.problems: dict[tuple[LanguagePolicy, frozenset[str], str], str | None] = {}

    def decide(self, turn: Turn) -> None:
        spec = turn.spec
        policy = spec.language_policy
        current = turn.state.get(spec.language_response) if spec.language_response else None
        current = current if isinstance(current, str) else None
        key = (policy, turn.text, current)
        decision = self.decisions.get(key)
        if decision is None:
            decision = self.decisions[key] = language.decide(policy, turn.text, current)
        turn.lang = decision
        if spec.language_response and decision.response:
            turn.state[spec.language_response] = decision.response

    def check(self, turn: Turn) -> Callable[[dict[str, Any]], str | None]:
        policy, decision = turn.spec.language_policy, turn.lang

        def problem(envelope: dict[str, Any]) -> str | None:
            reply = str(envelope.get("reply", ""))
            key = (policy, decision.accept, reply)
            if key not in self.problems:
                self.problems[key] = language.reply_problem(policy, decision, reply)
            return self.problems[key]

        return problem


LANGUAGES = _Languages()


class _Outputs:
    """Parsed outputs by stage schema and text: both plays of a session parse the same
    outputs against the same schema (unless the edit changed it). Envelopes are shared,
    read-only: every step copies what it keeps. Parsed as the turn parses them
    (``parse_kept``: an answer whose only fault is an action the stage does not allow is
    kept without it, the action dropped); the allowed actions are part of the key."""

    def __init__(self) -> None:
        self.parsed: dict[tuple[str, str], Kept] = {}
        self.digests: dict[int, tuple[Any, str]] = {}

    def parse(self, stage: CompiledStage, text: str) -> Kept:
        known = self.digests.get(id(stage))
        if known is None or known[0] is not stage:
            digest = hashlib.sha1(orjson.dumps(
                [stage.schema, sorted(stage.allowed_actions)], option=orjson.OPT_SORT_KEYS)
                ).hexdigest()
            known = self.digests[id(stage)] = (stage, digest)
        key = (known[1], text)
        found = self.parsed.get(key)
        if found is None:
            if len(self.parsed) > 200_000:  # bounded: a long run keeps the recent ones
                self.parsed.clear()
            found = self.parsed[key] = parse_kept(stage, text)
        return found


OUTPUTS = _Outputs()


def _answer(funnel: CompiledFunnel, turn: Turn, rec: Recorded) -> Answer | None:
    """The answer the recorded outputs give on ``funnel`` (as ``engine.turn.output.ask``
    would have made it), or None when the recording cannot tell (an output this funnel
    refuses, with no repair recorded)."""
    stage = funnel.stage(turn.pos["stage"])
    fallback = {"reply": turn.say(stage.spec.fallback)}  # in the session's language
    outputs = rec.outputs or []
    if not outputs:  # the call failed, or the prompt did not fit: the fallback
        return Answer(fallback, [], fallback=True, error=rec.error)
    check = LANGUAGES.check(turn)
    for i, text in enumerate(outputs[:2]):
        envelope, _, dropped = OUTPUTS.parse(stage, text)
        if envelope is not None and not check(envelope):
            return Answer(envelope, [], failures=i, dropped=list(dropped))
    if len(outputs) >= 2 or rec.fallback:
        return Answer(fallback, [], failures=min(len(outputs), 2), fallback=True,
                      error=rec.error)
    return None  # refused now, accepted then: the repair was never asked for


def play(funnel: CompiledFunnel, records: Sequence[Recorded], session_id: str, *,
         stages: Sequence[str] | None = None,
         answerable: Callable[[str], bool] | Sequence[Callable[[str], bool]] | None = None,
         copies: Sequence[CompiledFunnel] | None = None) -> Playthrough:
    """Play a session's recorded turns on ``funnel``, from a new session.

    Args:
        funnel: The funnel to play them on (the version they ran on, or an edit of it).
        records: The session's turns, oldest first.
        session_id: The session's id (actions and hooks read it).
        stages: Where the model was asked in each turn on the funnel the outputs came
            from (None: the recording's own ``stage_before``); a turn asked elsewhere now
            has no recorded answer.
        answerable: Whether a stage's prompt and output schema are those the outputs
            came from (None: all are); one per turn when the outputs came from several
            copies (``copies``).
        copies: The funnel each turn is played on, in place of ``funnel``: the copies a
            session whose copy changed between turns ran on, turn by turn. Each turn starts
            from the state the one before left, read as the engine's LOAD reads a session
            row on another copy (:func:`carry`).
    """
    out = Playthrough()
    if not records:
        return out
    now = records[0].at
    if copies:
        funnel = copies[0]
    state, pos = defaults(funnel.spec), start_position(funnel.spec.initial, now)
    last: datetime | None = None
    read = _read(funnel)
    for number, rec in enumerate(records, 1):
        if copies and copies[number - 1] is not funnel:  # the copy changed here
            funnel, state = copies[number - 1], carry(copies[number - 1], state)
            read = _read(funnel)
            if pos["stage"] not in funnel.stages and \
                    pos["stage"] not in funnel.spec.removed_stages:
                out.needs_model = number
                out.needs_reason = (f"{pos['stage']} is not a stage of the copy turn "
                                    f"{number} ran on")
                break
        turn = _turn(funnel, session_id, rec, state, pos, last, first=number == 1,
                     words=_words(records, number - 1, read))
        steps.route(turn)
        asked = turn.pos["stage"]
        was = stages[number - 1] if stages is not None else rec.stage_before
        if asked != was and funnel.stage(asked).spec.final:
            # A final stage is never left: what is left to decide is decided.
            out.settled = number
            break
        same = answerable[number - 1] if isinstance(answerable, Sequence) else answerable
        if asked != was or (same is not None and not same(asked)):
            out.needs_model = number
            out.needs_reason = (f"the model was asked in {was} then, in {asked} now"
                                if asked != was else f"the prompt or output schema of {asked} "
                                "changed")
            break
        LANGUAGES.decide(turn)
        answer = _answer(funnel, turn, rec)
        if answer is None:
            out.needs_model = number
            out.needs_reason = f"the output schema of {asked} refuses the recorded output"
            break
        steps.apply(turn, answer)
        turn.firings += turn.mover.advance(turn.state)
        out.turns.append(_finish(turn, answer, asked, called=bool(rec.outputs)))
        state, pos, last = turn.state, turn.pos, turn.now
    out.state, out.pos = state, pos
    return out


def _read(funnel: CompiledFunnel) -> int:
    """What the engine's LOAD reads: the session's last 3 windows of messages (its widest
    stage's window), engine.turn.engine.Engine._load."""
    return 3 * max(s.spec.memory.window for s in funnel.stages.values())


def carry(funnel: CompiledFunnel, state: dict[str, Any]) -> dict[str, Any]:
    """The state a turn on another copy of the funnel starts from: the fields that copy
    declares, as the engine's LOAD reads them from the session's row; a field new in that
    copy has its default (its column, added by the migration, has it)."""
    fresh = defaults(funnel.spec)
    return {name: state[name] if name in state else fresh.get(name)
            for name in funnel.spec.state}


def _words(records: Sequence[Recorded], i: int, read: int) -> tuple[str, ...]:
    """The customer's own words the turn ``records[i]`` could cite, as the engine's turn
    has them (engine.turn.engine.Engine._start): the customer messages among the ``read``
    messages before this one, and this one."""
    rec = records[i]
    if rec.index >= 0 and rec.messages:
        earlier = rec.messages[max(0, rec.index - read):rec.index]
        return (*(text for role, text in earlier if role == "user"), rec.customer)
    # No message log (a recording made by hand): a message and a reply per turn.
    earlier_turns = records[max(0, i - read // 2):i]
    return (*(r.customer for r in earlier_turns), rec.customer)


def _turn(funnel: CompiledFunnel, session_id: str, rec: Recorded, state: dict[str, Any],
          pos: Position, last: datetime | None, *, first: bool,
          words: tuple[str, ...] = ()) -> Turn:
    inbound = Incoming(session_id, rec.customer, CHANNEL, 0.0)
    pos = Position(stage=pos["stage"], stage_iteration=pos["stage_iteration"],
                   turns=pos["turns"], stage_history=pos["stage_history"],
                   notices=pos["notices"])
    # The play's state is its own, and every step replaces the values it changes
    # (copy on write): no copy per turn.
    scratch = TurnScratch(session_id, pos["stage"], pos["stage_iteration"], rec.at,
                          words=words)
    return Turn(inbound, rec.at, None if first else {}, [], state, pos, 0, last,
                stage_before=pos["stage"], mover=Mover(funnel, pos, rec.at, scratch,
                                                       values=False),
                funnel=funnel)


def _finish(turn: Turn, answer: Answer, asked: str, *, called: bool) -> Played:
    """What the engine's SAVE would write that a later turn reads, and the turn's result."""
    spec, state, pos = turn.spec, turn.state, turn.pos
    handoff = turn.handoff_before is None and steps.handoff_time(spec, state) is not None
    if handoff and spec.handoff is not None and spec.handoff.channel \
            and not state.get(spec.handoff.channel):
        state[spec.handoff.channel] = CHANNEL
    notices = turn.mover.scratch.notices
    # As the engine keeps them (engine.turn.engine._record): the model saw them this turn.
    pos["notices"] = bound_notices(notices if called
                                   else [*(pos["notices"] or []), *notices])
    cart = spec.cart
    return Played(
        stage_before=asked, stage_after=pos["stage"],
        transitions=[f"{f.source}->{f.dest}" for f in turn.firings],
        actions=[o.type for o in turn.outcomes if o.accepted],
        refused=[o.type for o in turn.outcomes if not o.accepted],
        fallback=answer.fallback,
        cart_total=state.get(cart.total) if cart and cart.total else None,
        handoff=handoff, explanation=turn.mover.explanation)


def reproduced(played: Playthrough, records: Sequence[Recorded]) -> str | None:
    """Where the play of the recorded version departs from the recording, or None.

    Replay is evidence only where it reproduces what happened; a departure (a session
    seeded by hand, a hook that reads the outside world) is reported, never hidden.
    """
    if played.needs_model is not None:
        return f"turn {played.needs_model}: {played.needs_reason}"
    for number, (p, rec) in enumerate(zip(played.turns, records, strict=False), 1):
        if p.stage_after != rec.stage_after:
            return (f"turn {number}: the recording ended in {rec.stage_after}, the replay "
                    f"in {p.stage_after}")
    return None


def stage_answerable(before: CompiledFunnel, after: CompiledFunnel) -> Callable[[str], bool]:
    """Whether a stage of ``after`` asks the model what ``before`` asked: the same prompt
    template source and the same output schema."""
    memo: dict[str, bool] = {}

    def same(stage: str) -> bool:
        if stage not in memo:
            a, b = before.stages.get(stage), after.stages.get(stage)
            memo[stage] = a is not None and b is not None and a.schema == b.schema and \
                _source(a.spec.prompt) == _source(b.spec.prompt)
        return memo[stage]

    return same


def _source(path: Any) -> str | None:
    try:
        return str(path.read_text("utf-8"))
    except OSError:
        return None


def held(explanation: Sequence[Mapping[str, Any]]
         ) -> dict[tuple[str, str, int], tuple[str | None, Any]]:
    """Each exit evaluated in a turn, ``(stage, to, n) -> (when, held)``: an exit is known
    by where it leads (the ``n``-th of the stage's exits there), so that an exit whose
    condition an edit rewrote is compared with what it was."""
    out: dict[tuple[str, str, int], tuple[str | None, Any]] = {}
    for step in explanation:
        for t in step.get("transitions") or []:
            n = 0
            while (step["stage"], t["to"], n) in out:
                n += 1
            out[step["stage"], t["to"], n] = (t.get("when"), t.get("held"))
    return out
