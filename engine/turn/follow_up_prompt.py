"""A follow-up the model writes (a step's ``prompt:``, docs/follow-ups.md).

The model is asked as in a turn of the session's stage: the stage's prompt over the
state and its recent messages, the stage's output contract, its deadline, one repair
call for an invalid answer (engine.turn.output.ask). Where a turn has the customer's
message, it has the step's ``prompt`` (a template over the state) as the engine's
instruction. Only the answer's ``reply`` is used: whatever updates or actions it
proposes are dropped, never applied, so a follow-up never changes the session.

:func:`write` never raises for the model: a failed call, an invalid answer or a
prompt over the stage's budget give no text, with the reason; the caller
(engine.turn.follow_up) then sends the step's ``text`` when it has one, else nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jinja2 import TemplateError

from ..errors import MessageTooLong, PromptTooLarge
from ..format.follow_up import FollowUpStep
from ..funnel.compiled import CompiledFunnel
from ..llm.models import Completion, Model
from ..llm.tokens import token_counter
from ..records.messages import Message
from ..sandbox.expressions import make_environment
from ..sandbox.templates import bounded_render
from ..store.base import Store
from . import language
from .budget import fit
from .output import ask
from .prompts import at_level, build_context, prompt_data, render_parts

__all__ = ["Written", "write"]

_ENV = make_environment()


@dataclass
class Written:
    """What the model wrote for a follow-up: ``text`` (None when it failed: ``error``
    says why), the calls it took, and whether the answer proposed state changes that
    were dropped."""

    text: str | None
    completions: list[Completion] = field(default_factory=list)
    error: str | None = None
    dropped: bool = False

    @property
    def spend(self) -> tuple[int, int, float | None]:
        """(prompt tokens, completion tokens, cost; None when a call's is unknown)."""
        costs = [c.cost for c in self.completions]
        return (sum(c.prompt_tokens for c in self.completions),
                sum(c.completion_tokens for c in self.completions),
                None if not costs or None in costs else float(sum(c or 0.0 for c in costs)))


def instruction(step: FollowUpStep, context: Mapping[str, Any]) -> str:
    """The engine's message to the model in place of a customer's: the step's ``prompt``
    rendered over the state, framed as a follow-up after the customer's silence.

    Raises:
        jinja2.TemplateError: the prompt failed on this state.
    """
    assert step.prompt is not None
    asked = bounded_render(lambda: _ENV.from_string(step.prompt or "").render(context)).strip()
    hours = step.after / 3600
    return (f"(engine) The customer has not written for {hours:g} hours. Write one short "
            f"follow-up message to them now, in the conversation's language: {asked} "
            "Answer with the reply only: no updates, no actions.")


async def write(funnel: CompiledFunnel, store: Store, model: Model, step: FollowUpStep,
                state: Mapping[str, Any], session_id: str, reply_language: str | None,
                now: datetime, context: Callable[[], Mapping[str, Any]]) -> Written:
    """Ask ``model`` for the follow-up of ``step`` in the session's stage (see the module).

    ``context`` gives what the step's prompt reads (engine.turn.follow_up's ``_context``).
    """
    stage = funnel.stage(str(state.get("stage")))
    try:
        asked = instruction(step, context())
    except (TemplateError, TypeError, ValueError) as exc:
        return Written(None, error=f"the prompt failed: {exc}")
    window = stage.spec.memory.window
    rows = await store.history(funnel.spec, session_id, window)
    history = [Message(str(r["role"]), str(r["content"])) for r in rows
               if r["role"] in ("user", "assistant")]
    built = build_context(funnel, stage, state, state, customer_message="", messages=history,
                          returning=False, idle_seconds=step.after, now=now.isoformat())
    summary, notices = prompt_data(funnel, state, state)
    try:
        fitted = fit(stage.spec.name, lambda level: render_parts(
            stage, at_level(funnel, stage, state, built, level)), summary, notices, history,
            asked, stage.spec.memory.prompt_budget, count=token_counter(model), window=window)
    except (MessageTooLong, PromptTooLarge) as exc:
        return Written(None, error=str(exc))
    policy = funnel.spec.language_policy
    decision = language.Decision(None, reply_language, frozenset(
        {reply_language} if reply_language and policy.mode != "model" else ()))
    answer = await ask(model, stage, fitted.messages, session_id,
                       int(state.get("turns") or 0) + 1, asked,
                       reply_check=lambda env: language.reply_problem(
                           policy, decision, str(env.get("reply", ""))),
                       stable=fitted.stable, trimmed=fitted.trimmed, fallback_reply="")
    if answer.fallback:
        return Written(None, answer.completions, error=answer.error or "no valid answer")
    reply = str(answer.envelope.get("reply", "")).strip()
    dropped = bool(answer.envelope.get("updates") or answer.envelope.get("actions")
                   or answer.dropped)
    if not reply:
        return Written(None, answer.completions, error="the model wrote an empty reply",
                       dropped=dropped)
    return Written(reply, answer.completions, dropped=dropped)
