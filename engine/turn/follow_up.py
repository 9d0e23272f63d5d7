"""Follow-ups: reaching a customer who went quiet in a stage (docs/follow-ups.md).

After each customer turn :func:`after_turn` plans the session's next follow-up from
that message (or cancels it: the stage has none, a manager holds the session, the
customer asked to be left alone). :func:`run_due` is the scheduler's pass, run by
``funnel serve`` (every worker, each dispatch) and ``funnel follow-up`` (cron): it
finds the due sessions with one indexed query and sends each follow-up at most once
per due time, however many workers run it (engine.store.follow_ups): a message in
the transcript and a turn record, both marked as a follow-up, and an outbox row the
session's channel delivers (Telegram; the widget shows the transcript).

A due follow-up is not sent, and nothing more is planned, when the customer wrote
since, a manager took the session over, the session was handed off, ended, moved to
another stage or was erased; inside quiet hours it waits for their end; a step whose
``when`` does not hold is passed over; a text whose claims the catalog and the state
do not back (engine.claims) is not sent. Playground sessions never get one: the
studio's engine plans none.

A step with ``prompt`` has the model write it (engine.turn.follow_up_prompt: the reply
only, no state change); when the model fails or its reply claims what nothing backs,
the step's ``text`` is sent instead, checked in turn, or nothing when it has none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from jinja2 import TemplateError

from ..errors import StoreUnavailable
from ..format.follow_up import FollowUpStep, is_opt_out
from ..format.spec import FunnelSpec
from ..funnel.compiled import CompiledFunnel
from ..llm.models import Model
from ..sandbox.expressions import compile_condition, make_environment
from ..sandbox.templates import bounded_render
from ..store.base import FollowUpClaim, OutboxItem, Store
from . import follow_up_prompt
from .data import TurnResult
from .prompts import full_view

__all__ = ["after_turn", "preview", "run_due"]

log = logging.getLogger("funnel.follow_up")


class EngineLike(Protocol):
    """What follow-ups need of an engine (engine.turn.engine.Engine, without importing it:
    the engine calls :func:`after_turn`)."""

    funnel: CompiledFunnel
    spec: FunnelSpec
    store: Store
    model: Model
    clock: Callable[[], datetime]


_ENV = make_environment()
# The channels a follow-up can reach a customer through unasked (their reply target).
CHANNELS = ("telegram",)


async def after_turn(engine: EngineLike, session_id: str, text: str, result: TurnResult,
                     now: datetime) -> None:
    """Plan the session's follow-ups from the customer's message the turn answered.

    Only a turn in a stage with follow-ups writes (one statement), or a message that
    opts out: a stage without them leaves the row as it was, and the scheduler drops
    what it planned (the session moved on, or the customer wrote since).
    """
    spec = engine.spec
    stage = result.stage_after
    follow = spec.follow_up_of(stage)
    phrases = (follow.opt_out if follow else ()) + (spec.follow_up.opt_out
                                                    if spec.follow_up else ())
    opted = is_opt_out(text, phrases)
    if (follow is None or result.held or result.handoff) and not opted:
        return
    steps = [] if follow is None or result.held or result.handoff else [
        (s.after, s.max) for s in follow.steps]
    await engine.store.follow_up_touch(spec.name, session_id, stage, now, result.message_id,
                                       steps, opted_out=opted)


def _language(engine: EngineLike, row: Mapping[str, Any]) -> str | None:
    spec = engine.spec
    for field in (spec.language_response, spec.language_detected):
        if field and isinstance(row.get(field), str):
            return str(row[field])
    return spec.language_policy.default


def _context(engine: EngineLike, state: Mapping[str, Any], stage: str, session_id: str
             ) -> dict[str, Any]:
    """What a follow-up's template and condition read: every declared field, and the
    names a condition may read (engine.format.names.CONDITION_NAMES) as a follow-up has
    them: no customer message, so no actions and no hand-off asked this turn."""
    return {**full_view(engine.funnel, state), "stage": stage,
            "stage_iteration": state.get("stage_iteration") or 0, "actions": [],
            "handoff_requested": None, "returning": False,
            "stage_history": state.get("stage_history") or [],
            "turns": state.get("turns") or 0, "session_id": session_id}


def _render(engine: EngineLike, step: FollowUpStep, state: Mapping[str, Any], session_id: str
            ) -> tuple[bool, str, str | None]:
    """(whether ``when`` holds, the text in the session's language, that language).

    Raises:
        jinja2.TemplateError: the template or the condition failed on this state.
    """
    context = _context(engine, state, str(state.get("stage")), session_id)
    holds = step.when is None or compile_condition(step.when)(context)
    language = _language(engine, state)
    template = step.text.pick(language, engine.spec.language_policy.default) \
        if step.text is not None else ""
    text = bounded_render(lambda: _ENV.from_string(template).render(context)).strip() \
        if holds and template else ""
    return holds, text, language


def preview(engine: EngineLike, state: Mapping[str, Any], session_id: str, anchor: datetime
            ) -> dict[str, Any]:
    """The follow-ups a session would get if its customer, who last wrote at ``anchor``,
    said nothing more: each step of its stage with when it is due, when it would be sent
    (quiet hours), whether its ``when`` holds now, and its text (the studio's
    fast-forward; nothing is written or sent)."""
    stage = str(state.get("stage"))
    follow = engine.spec.follow_up_of(stage)
    steps: list[dict[str, Any]] = []
    for i, step in enumerate(follow.steps if follow else ()):
        due = anchor + timedelta(seconds=step.after)
        quiet = follow.quiet_hours if follow else None
        entry: dict[str, Any] = {"step": i, "after_seconds": step.after, "max": step.max,
                                 "prompt": step.prompt,
                                 "due_at": due.isoformat(),
                                 "sent_at": (quiet.release(due) if quiet else due).isoformat()}
        try:
            entry["holds"], entry["text"], entry["language"] = _render(engine, step, state,
                                                                       session_id)
        except (TemplateError, TypeError, ValueError) as exc:
            entry["error"] = str(exc)
        steps.append(entry)
    return {"session_id": session_id, "stage": stage, "anchor": anchor.isoformat(),
            "steps": steps}


async def run_due(engine: EngineLike, *, now: datetime | None = None, dry_run: bool = False,
                  limit: int = 100) -> list[dict[str, Any]]:
    """One pass of the scheduler over ``engine``'s funnel at ``now`` (the engine's clock).

    Returns one entry per due session: ``outcome`` is ``sent`` (with ``text``,
    ``language``, ``channel``), ``deferred`` (quiet hours: ``until``), ``skipped`` (a
    step whose ``when`` does not hold), ``cancelled`` (``why``) or, with ``dry_run``,
    ``due`` (nothing is written then).
    """
    now = now or engine.clock()
    spec, store = engine.spec, engine.store
    if not spec.has_follow_ups:
        return []
    out: list[dict[str, Any]] = []
    for session_id in await store.due_follow_ups(spec.name, now, limit):
        if dry_run:
            found = await store.follow_up_state(spec.name, session_id)
            if found is not None:
                out.append({"session_id": session_id, "outcome": "due",
                            "stage": found["stage"], "step": found["step"],
                            "due_at": found["due_at"]})
            continue
        try:
            async with store.claim_follow_up(spec.name, session_id, now) as claim:
                if claim is None:  # another worker has it, or it was sent meanwhile
                    continue
                entry = await _one(engine, claim, now)
        except StoreUnavailable:
            raise
        except Exception:  # a bug: this session's follow-up must not stop every other's
            log.exception("follow-up of session %r failed; none more is planned for it",
                          session_id)
            await store.follow_up_cancel(spec.name, session_id)
            continue
        out.append({"session_id": session_id, **entry})
        if entry["outcome"] == "sent":
            log.info("follow-up %s:%s sent to session %r", entry["stage"], entry["step"],
                     session_id)
    return out


async def _one(engine: EngineLike, claim: FollowUpClaim, now: datetime) -> dict[str, Any]:
    spec, store, row = engine.spec, engine.store, claim.row
    stage, index = str(row["stage"]), int(row["step"])

    async def cancel(why: str) -> dict[str, Any]:
        await claim.cancel()
        return {"outcome": "cancelled", "why": why, "stage": stage, "step": index}

    if await claim.customer_wrote():
        return await cancel("the customer wrote")
    if await store.control(spec.name, claim.session_id) is not None:
        return await cancel("a manager holds the session")
    state = await store.load(spec, claim.session_id)
    if state is None:
        return await cancel("the session is gone")
    if state.get("stage") != stage:
        return await cancel("the session moved on")
    handoff = spec.handoff
    if handoff is not None and handoff.triggered_at and state.get(handoff.triggered_at):
        return await cancel("the session was handed off")
    follow = spec.follow_up_of(stage)
    if follow is None or index >= len(follow.steps):
        return await cancel("the stage has no such follow-up")
    step = follow.steps[index]
    if follow.quiet_hours is not None and follow.quiet_hours.contains(now):
        until = follow.quiet_hours.release(now)
        await claim.move(index, until)
        return {"outcome": "deferred", "until": until, "stage": stage, "step": index}
    sent: dict[str, int] = {str(k): int(v) for k, v in (row["sent"] or {}).items()}
    anchor: datetime = row["anchor_at"]
    planned = anchor + timedelta(seconds=step.after)
    try:
        holds, text, language = _render(engine, step, state, claim.session_id)
    except (TemplateError, TypeError, ValueError) as exc:
        log.warning("follow-up %s:%s of session %r: %s", stage, index, claim.session_id, exc)
        return await cancel(f"the follow-up failed: {exc}")
    nxt = follow.next_step(sent, stage, after=index)
    later = None if nxt is None else max(
        anchor + timedelta(seconds=follow.steps[nxt].after),
        now + timedelta(seconds=follow.steps[nxt].after - step.after))
    if not holds or (not text and step.prompt is None):
        await claim.move(nxt or 0, later)
        return {"outcome": "skipped", "stage": stage, "step": index}
    context = _context(engine, state, stage, claim.session_id)
    claims: list[dict[str, Any]] = []
    written = None
    if step.prompt is not None:
        written = await follow_up_prompt.write(engine.funnel, store, engine.model, step, state,
                                               claim.session_id, language, now,
                                               lambda: context)
        if written.dropped:
            log.info("follow-up %s:%s of session %r: the updates and actions the model "
                     "proposed were dropped (a follow-up changes no state)", stage, index,
                     claim.session_id)
        refused = [] if written.text is None else engine.funnel.claims.check(
            written.text, stage, state, context)
        claims = [{**r.as_record(), "attempt": 0} for r in refused]
        if written.text is not None and not refused:
            text = written.text
        else:
            why = written.error if written.text is None else \
                f"a claim nothing backs ({refused[0].sentence()})"
            log.warning("follow-up %s:%s of session %r: the model's follow-up is not sent: "
                        "%s; %s", stage, index, claim.session_id, why,
                        "its `text` is sent instead" if text else "nothing is sent")
            if not text:
                await claim.move(nxt or 0, later)
                return {"outcome": "refused", "why": f"the model's follow-up: {why}",
                        "stage": stage, "step": index, "claims": claims}
            written.text = None  # the declared text goes out: the fallback
    if written is None or written.text is None:
        refused = engine.funnel.claims.check(text, stage, state, context)
        if refused:
            attempt = 1 if claims else 0  # after the model's refused reply: its fallback
            claims += [{**r.as_record(), "attempt": attempt} for r in refused]
            await claim.move(nxt or 0, later)
            log.warning("follow-up %s:%s of session %r not sent: a claim nothing backs (%s)",
                        stage, index, claim.session_id, refused[0].sentence())
            return {"outcome": "refused", "why": "a claim nothing backs", "stage": stage,
                    "step": index, "claims": claims}
    delivery, channel = None, "messages"
    for name in CHANNELS:
        target = await store.reply_target(spec.name, claim.session_id, name)
        if target is not None:
            delivery = OutboxItem(
                key=f"{spec.name}:{claim.session_id}:follow_up:{stage}:{index}:"
                    f"{planned.isoformat()}",
                kind="reply", payload={**target, "text": text, "follow_up": True})
            channel = name
            break
    if delivery is None and follow.webhook:  # the integrator's channel (follow_up_webhook)
        delivery = OutboxItem(
            key=f"{spec.name}:{claim.session_id}:follow_up:{stage}:{index}:"
                f"{planned.isoformat()}",
            kind="follow_up", payload={
                "url": follow.webhook, "funnel": spec.name, "session_id": claim.session_id,
                "stage": stage, "step": index, "text": text, "language": language,
                "due": planned.isoformat()})
        channel = "webhook"
    record: dict[str, Any] = {"stage": stage, "step": index, "due": planned.isoformat(),
                              "language": language, "channel": channel}
    if written is not None:  # a `prompt:` step: who wrote what was sent, and why
        record["written_by"] = "model" if written.text is not None else "text"
        if written.completions:
            record["model"] = written.completions[-1].model
        if written.error:
            record["error"] = written.error[:500]
    message_id = await claim.send(text=text, version=int(state.get("funnel_version") or
                                                         spec.version),
                                  record=record, delivery=delivery, claims=claims,
                                  spend=written.spend if written is not None else (0, 0, 0.0))
    sent[f"{stage}:{index}"] = sent.get(f"{stage}:{index}", 0) + 1
    await claim.move(nxt or 0, later, sent)
    if message_id is None:
        return {"outcome": "cancelled", "why": "sent before", "stage": stage, "step": index}
    return {"outcome": "sent", "stage": stage, "step": index, "text": text,
            "language": language, "channel": channel, "message_id": message_id,
            **({"written_by": record["written_by"]} if "written_by" in record else {})}
