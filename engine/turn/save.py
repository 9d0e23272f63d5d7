"""SAVE, the turn's last step: state, reply, turn record and outbox in one transaction;
and the end of a turn that failed after its message was logged (the stage's fallback,
saved the same way). :class:`~engine.turn.engine.Engine` calls both."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..errors import ConfigError, FunnelError
from ..format.texts import TECHNICAL
from ..store import OutboxItem, SessionAccess, TurnWrite
from . import approval, steps
from .advance import handoff_payload
from .budget import bound_notices
from .data import Turn, TurnResult, refused_claims, turn_record
from .output import Answer

__all__ = ["TECHNICAL_REPLY", "fail", "record"]

log = logging.getLogger("funnel.engine")  # the engine's logger: its lines keep their name

# The reply when not even the stage's fallback is at hand (the stage is unknown), by
# language (engine.format.texts).
TECHNICAL_REPLY = TECHNICAL


async def record(access: SessionAccess, turn: Turn, answer: Answer, model: str | None
                 ) -> TurnResult:
    """SAVE: state, reply, turn record and outbox in one transaction. ``model``: the name
    the turn record gives the engine's model."""
    spec, state, pos = turn.spec, turn.state, turn.pos
    handoff = turn.handoff_before is None and steps.handoff_time(spec, state) is not None
    outbox = []
    if handoff and spec.handoff is not None:
        if spec.handoff.channel and not state.get(spec.handoff.channel):
            state[spec.handoff.channel] = turn.channel
        outbox.append(OutboxItem(
            key=f"{spec.name}:{turn.session_id}:handoff", kind="handoff",
            payload=handoff_payload(turn.funnel, turn.session_id, state, turn.channel)))
    reply = str(answer.envelope["reply"])
    gated = approval.gate(turn)  # a move held for a manager (engine.turn.approval)
    if gated is not None:
        outbox.append(gated[1])
        waiting = turn.funnel.stages[gated[0]["held"]["to"]].spec.approval
        if waiting is not None and waiting.holding_reply:
            reply = turn.say(waiting.holding_reply)
    # Stripped once, here: the text the turn returns, streams, logs and sends is one
    # (a model's "  Hi!\n", a YAML block's trailing newline).
    reply = reply.strip()
    if turn.inbound.reply_to is not None:  # delivered by the outbox, with retries
        outbox.insert(0, OutboxItem(
            key=f"{spec.name}:{turn.session_id}:reply:{turn.inbound.message_id}",
            kind="reply", payload={**turn.inbound.reply_to, "text": reply}))
    notices = turn.mover.scratch.notices
    # Notices are cleared once the model was shown them; a turn that never reached the
    # model keeps them (bounded: they can never crowd the model out of the prompt).
    pos["notices"] = bound_notices(
        [*(pos["notices"] or []), *notices] if not answer.completions else notices)
    transitions = [{"from": f.source, "to": f.dest, "trigger": f.trigger,
                    "when": f.spec.when if f.spec else None} for f in turn.firings]
    values = {**state, **pos, "funnel_version": spec.version,
              "variant": turn.funnel.variant}
    record = turn_record(turn, answer, transitions, model)
    model_seconds = record.pop("model_seconds")
    await access.save(TurnWrite(
        session_id=turn.session_id, values=values, expected_version=turn.expected,
        reply=reply, stage_after=pos["stage"], turn=record, outbox=outbox,
        message_time=turn.now, summary=turn.folded[0] if turn.folded else None,
        summary_upto=turn.folded[1] if turn.folded else None, spec=spec,
        approval=gated[0] if gated is not None else None))
    return TurnResult(
        session_id=turn.session_id, reply=reply, stage_before=turn.stage_before,
        stage_after=pos["stage"], state=values, transitions=transitions,
        actions=turn.outcomes, updated=turn.updated, notices=list(notices),
        validation_failures=answer.failures, repaired=record["repaired"],
        fallback=answer.fallback, prompt_tokens=record["prompt_tokens"],
        completion_tokens=record["completion_tokens"], handoff=handoff,
        cached_prompt_tokens=record["cached_prompt_tokens"],
        cache_write_tokens=record["cache_write_tokens"],
        returning=turn.mover.returning, error=answer.error, backlog=turn.backlog,
        message_id=turn.inbound.message_id or 0, recalled=list(turn.recalled),
        model_seconds=model_seconds,  # every call's, a timed-out one's too
        explain=turn.mover.explanation,
        approval=gated[0]["held"]["to"] if gated is not None else None,
        refused_claims=refused_claims(turn.mover.scratch.ungrounded),
        reply_claims=list(turn.claims))


async def fail(access: SessionAccess, turn: Turn, exc: Exception, model: str | None,
               start: Callable[[Turn], Turn]) -> TurnResult:
    """A turn that failed after its message was logged still ends well: the stage's
    fallback (or a technical reply when the stage is unknown), the state as it was
    read, and a turn record naming the error. A failure that is not a
    :class:`FunnelError` is a bug: logged with its traceback, and the record says so.
    ``start`` begins the turn afresh from what ``turn`` read (``Engine._start``).
    """
    bug = not isinstance(exc, FunnelError)
    if bug:
        log.exception("session %r: the turn failed (a bug); answering with the fallback",
                      turn.session_id)
    else:
        log.warning("session %r: the turn failed (%s); answering with the fallback",
                    turn.session_id, exc)
    # On the funnel the turn ran on: a deploy since it began must not change it.
    fresh = start(turn)
    fresh.lang = turn.lang  # the language decided before it failed, if it got that far
    try:
        reply = fresh.say(fresh.funnel.stage(fresh.pos["stage"]).spec.fallback)
    except ConfigError:  # a stage neither declared nor mapped under removed_stages
        reply = fresh.say(TECHNICAL_REPLY)
    error = f"{'bug: ' if bug else ''}the turn failed: {type(exc).__name__}: {exc}"
    fresh.pos["turns"] += 1
    fresh.handoff_before = steps.handoff_time(fresh.spec, fresh.state)  # nothing new to hand off
    return await record(access, fresh, Answer({"reply": reply}, [], fallback=True,
                                              error=error), model)
