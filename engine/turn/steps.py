"""The steps of a turn between LOAD and SAVE, over the turn in flight: where it runs,
its language, the prompt and the model's answer, what of it is applied. engine.turn.engine
runs them in order; loading and saving (the session's lease) stay there."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from typing import Any

from .. import knowledge
from ..boundary.sanitize import excerpt
from ..errors import MessageTooLong, PromptTooLarge
from ..format.spec import FunnelSpec
from ..funnel.actions import ActionOutcome
from ..funnel.hooks import call_off_loop
from ..llm.models import Model
from ..llm.tokens import token_counter
from ..memory.recall import Recall, Snippet, waited
from ..memory.summary import RollingSummary
from ..records.messages import Message
from ..store import Store
from . import language
from .advance import enter
from .budget import fit
from .data import Turn
from .output import Answer, ask
from .prompts import at_level, build_context, prompt_data, render_parts
from .stream import ReplyStream

__all__ = ["applied", "apply", "apply_and_advance", "ask_model", "decide_language",
           "handoff_time", "off_loop", "reply_check", "route"]


async def off_loop(turn: Turn, step: Callable[..., None], *args: Any) -> None:
    """Run a synchronous step that may call hooks (``route``, ``apply``, advancing): on
    the event loop when the funnel has no hooks, else in a hook thread, for at most the
    stage's ``model.deadline`` seconds (engine.funnel.hooks).

    Raises:
        HookTimeout: a hook did not return in time. The step's thread may still be
            changing the turn's state; the row as read is put back for the fallback.
        HookFailed: a hook raised ``SystemExit`` or the like.
    """
    if not turn.funnel.actions.hooks:
        step(*args)
        return
    timeout = turn.funnel.stage(turn.pos["stage"]).spec.model.deadline
    read = copy.deepcopy(turn.row)
    try:
        await call_off_loop(step, *args, timeout=timeout,
                            what=f"the hooks of session {turn.session_id!r}")
    except BaseException:
        turn.row = read  # what the thread may still change is the turn's, not the row's
        raise


def route(turn: Turn) -> None:
    """Where the turn runs: a removed stage mapped, a return after the idle gap."""
    spec, pos = turn.spec, turn.pos
    if pos["stage"] not in turn.funnel.stages and pos["stage"] in spec.removed_stages:
        enter(pos, spec.removed_stages[pos["stage"]], turn.now)
        turn.mover.scratch.stage, turn.mover.scratch.stage_iteration = pos["stage"], 0
    turn.idle = (turn.now - turn.last_seen).total_seconds() if turn.last_seen else None
    gap = turn.funnel.stage(pos["stage"]).spec.memory.idle_return_after
    turn.mover.returning = bool(turn.idle is not None and gap is not None
                                and turn.idle >= gap)
    if turn.mover.returning and spec.memory.idle_return_stage:
        turn.firings += turn.mover.fire("idle_return", {}, notify=False)
    if turn.row is None:  # a new session enters its initial stage: run its on_enter
        for call in turn.funnel.stage(pos["stage"]).spec.on_enter:
            turn.funnel.actions.run(call, turn.state, turn.mover.scratch)


def decide_language(turn: Turn) -> None:
    """Decide the reply's language in code (docs/language.md); the prompt reads it."""
    spec = turn.spec
    current = turn.state.get(spec.language_response) if spec.language_response else None
    turn.lang = language.decide(spec.language_policy, turn.text,
                                current if isinstance(current, str) else None)
    if spec.language_response and turn.lang.response:
        turn.state[spec.language_response] = turn.lang.response


def reply_check(turn: Turn) -> Callable[[dict[str, Any]], str | None]:
    """What the output check asks of the reply: the language decided for it."""
    policy, decision = turn.spec.language_policy, turn.lang
    return lambda envelope: language.reply_problem(policy, decision,
                                                   str(envelope.get("reply", "")))


async def recalled(turn: Turn, recall: Recall | None, history: list[Message]
                   ) -> tuple[list[Snippet], float]:
    """The stretches semantic recall finds for the turn, outside ``history`` (the window
    the prompt shows), and the seconds the turn waited for the query's vector: at most
    what is left of ``memory.recall.deadline`` since the turn asked for it."""
    if recall is None or turn.recall_task is None:
        return [], 0.0
    started = time.monotonic()
    vector = await waited(turn.recall_task, recall.settings.deadline
                          - (started - turn.recall_started))
    spent = time.monotonic() - started
    if vector is None:
        return [], spent
    turn.query_vector = vector
    upto = min((m.id for m in history if m.id), default=turn.inbound.message_id or 0)
    found = await recall.find(turn.session_id, vector, upto)
    return found, spent


async def ask_model(turn: Turn, memory: RollingSummary, store: Store, model: Model,
                    stream: ReplyStream | None = None, recall: Recall | None = None
                    ) -> Answer:
    """Render the stage prompt within its budget and ask the model (validated, repaired
    once, else the stage's fallback); with ``stream``, the reply is shown as it grows;
    with ``recall``, the session's earlier messages like this one are in the prompt."""
    stage = turn.funnel.stage(turn.pos["stage"])
    window = stage.spec.memory.window
    history = memory.history(turn.recent, turn.row, window)
    memories, spent = await recalled(turn, recall, history)
    context = build_context(turn.funnel, stage, turn.state, turn.pos,
                            customer_message=turn.text, messages=history,
                            returning=turn.mover.returning, idle_seconds=turn.idle,
                            now=turn.mover.now_iso)
    if stage.spec.knowledge is not None:
        found = await knowledge.retrieve(store, turn.spec, stage.spec.knowledge,
                                         turn.text, turn.state)
        context["knowledge"], turn.knowledge = found.chunks, found.ids
    summary, notices = prompt_data(turn.funnel, turn.state, turn.pos)
    try:
        fitted = fit(stage.spec.name, lambda level: render_parts(
            stage, at_level(turn.funnel, stage, turn.state, context, level)),
            summary, notices, history, turn.text, stage.spec.memory.prompt_budget,
            count=token_counter(model), window=window,
            recall=[(s.position, s.text) for s in memories])
    except MessageTooLong as exc:
        # Not the model's fault nor the session's: ask the customer to shorten it.
        return Answer({"reply": turn.say(stage.spec.memory.too_long_reply)}, [], fallback=True,
                      error=f"the message is too long for the stage: {exc}")
    except PromptTooLarge as exc:
        # The customer still gets an answer; the turn record keeps the sizes.
        return Answer({"reply": turn.say(stage.spec.fallback)}, [], fallback=True,
                      error=str(exc))
    turn.recalled = [i for s in memories[:fitted.recalled] for i in s.ids]
    if fitted.dropped_messages and memory.observational and not (
            turn.summary_job or turn.folded):
        # The budget cut messages the observer has not seen: observe them now, below
        # the threshold, or they stay out of the model's sight until it is reached.
        turn.summary_job = memory.plan(turn.state, turn.row, turn.recent, turn.backlog,
                                       turn.text, crowded=True)
    return await ask(model, stage, fitted.messages, turn.session_id,
                     turn.pos["turns"] + 1, turn.text, reply_check=reply_check(turn),
                     stable=fitted.stable, stream=stream, spent=spent,
                     trimmed=fitted.trimmed, fallback_reply=turn.say(stage.spec.fallback))


def apply(turn: Turn, answer: Answer) -> None:
    """Apply what the model proposed and the code allows; derive the computed fields."""
    funnel, spec, state = turn.funnel, turn.spec, turn.state
    scratch = turn.mover.scratch
    if not answer.fallback:
        env = answer.envelope
        stage = funnel.stage(turn.pos["stage"])
        turn.updated = funnel.rules.apply_updates(state, env.get("updates") or {},
                                                  stage.allowed_updates, scratch.notices,
                                                  scratch.said, scratch.ungrounded)
        before = dict(state)
        turn.outcomes = [funnel.actions.run(call, state, scratch)
                         for call in env.get("actions") or []]
        for call in answer.dropped:  # kept out of the answer by engine.turn.output
            name = str(call.get("type"))[:64]
            reason = f"not allowed in stage '{stage.spec.name}'"
            scratch.notices.append(f"{excerpt(name)} refused: {reason}")
            turn.outcomes.append(ActionOutcome(
                name, {k: v for k, v in call.items() if k != "type"}, False, reason))
        funnel.rules.guard(state, before, scratch.notices)
        language.record(spec.language_policy, turn.lang, state, spec.language_detected,
                        spec.language_response, str(env.get("reply", "")),
                        env.get("language"))
    turn.mover.accepted = [o.type for o in turn.outcomes if o.accepted]
    turn.pos["turns"] += 1
    turn.handoff_before = handoff_time(spec, state)
    funnel.rules.recompute(state, turn.mover.context(state), turn.mover.now_iso)


def handoff_time(spec: FunnelSpec, state: Mapping[str, Any]) -> Any:
    """When the session was handed off (its ``handoff.triggered_at`` field), or None."""
    h = spec.handoff
    return state.get(h.triggered_at) if h and h.triggered_at else None


def apply_and_advance(turn: Turn, answer: Answer) -> None:
    """Apply the answer (:func:`apply`), then take the exits it opened."""
    apply(turn, answer)
    turn.firings += turn.mover.advance(turn.state)


async def applied(turn: Turn, answer: Answer) -> None:
    """:func:`apply_and_advance`, off the event loop when the turn is heavy
    (:func:`off_loop`)."""
    await off_loop(turn, apply_and_advance, turn, answer)
