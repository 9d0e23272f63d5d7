"""Side effects, delivered at least once: the outbox dispatcher and the handoff notifiers.

A turn writes its side effects (the manager's handoff alert, a channel's reply)
to the outbox in the same transaction as the state, keyed by an idempotency key.
After the commit the dispatcher claims due rows and delivers them; a failure is
retried with backoff, and a crash between save and delivery is delivered by the
next dispatch. A duplicate trigger finds the key taken and adds nothing.

Each target of a handoff alert (``webhook``, ``hook``, ``log``) is delivered and
retried on its own: a target that took the alert is recorded on the row
(``done_targets``) and is never sent it again because another target failed.

A ``hook`` target runs in a hook thread (engine.funnel.hooks) for at most
:data:`HOOK_SECONDS`, as a webhook's POST waits at most that long: a hook that
hangs fails its delivery (retried later) and never holds up the event loop or a
shutdown; what it raises, ``SystemExit`` included, is that delivery's error.

Delivery is **at least once**, never exactly once: a process killed after the
receiver took an alert and before the row was marked sends it again. Every
webhook POST carries the row's stable ``Idempotency-Key`` header (the same on
every retry): a receiver that must act once de-duplicates on it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import HookFailed
from ..format.spec import FunnelSpec
from ..funnel.actions import load_hook
from ..funnel.hooks import call_off_loop
from ..store import Store

log = logging.getLogger("funnel.handoff")

Notifier = Callable[[Mapping[str, Any]], Awaitable[None] | None]

# How long one delivery to a `hook` (or a webhook's POST) may take.
HOOK_SECONDS = 10.0


@dataclass(frozen=True)
class Outcome:
    """What a :data:`Sender` made of one outbox row: delivered (``error`` None), to retry
    (in ``retry_in`` seconds, else after a backoff), or given up on (``give_up``)."""

    error: str | None = None
    retry_in: float | None = None
    give_up: bool = False


# Delivers an outbox row of its kind (a channel's reply); never raises.
Sender = Callable[[Mapping[str, Any]], Awaitable[Outcome]]


class Targets:
    """A handoff notifier made of named targets, each delivered and retried on its own.

    Calling it delivers to every target in turn (what a plain :data:`Notifier` does).
    """

    def __init__(self, targets: Mapping[str, Notifier]) -> None:
        self.targets = dict(targets)

    async def __call__(self, payload: Mapping[str, Any]) -> None:
        for target in self.targets.values():
            result = target(payload)
            if inspect.isawaitable(result):
                await result


def make_notifier(spec: FunnelSpec, *, webhook: str | None = None,
                  link: Callable[[Mapping[str, Any]], str | None] | None = None) -> Targets:
    """The notifier the funnel's ``handoff.notify`` declares (``log`` by default).

    ``webhook`` replaces the funnel's ``handoff.notify.webhook`` (the service's
    ``FUNNEL_HANDOFF_WEBHOOK``); ``link(payload)``, when given, adds a ``link`` to
    the conversation to the webhook's body.
    """
    notify = spec.handoff.notify if spec.handoff else {"log": True}
    targets: dict[str, Notifier] = {}
    url = webhook or notify.get("webhook")
    if url:
        targets["webhook"] = _webhook(str(url), link)
    if notify.get("hook"):
        targets["hook"] = _hook(str(notify["hook"]),
                                load_hook(str(notify["hook"]), spec.path.parent))
    if notify.get("log", not targets):
        targets["log"] = _log
    return Targets(targets)


def _hook(target: str, fn: Callable[[Any], Any]) -> Notifier:
    what = f"the handoff hook {target}"

    async def call(payload: Mapping[str, Any]) -> None:
        result = await call_off_loop(fn, payload, timeout=HOOK_SECONDS, what=what)
        if inspect.isawaitable(result):  # an async hook: its coroutine runs here
            try:
                await asyncio.wait_for(result, HOOK_SECONDS)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this task is being cancelled (shutdown): not the hook's doing
                raise HookFailed(f"{what} raised CancelledError") from None
            except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
                raise HookFailed(f"{what} raised {type(exc).__name__}: {exc}") from None

    return call


def _log(payload: Mapping[str, Any]) -> None:
    state = payload.get("state") or {}
    log.warning("handoff: funnel=%s session=%s channel=%s", payload.get("funnel"),
                payload.get("session_id"), payload.get("channel"))
    log.debug("handoff payload: %s", json.dumps(state, ensure_ascii=False, default=str))


def _webhook(url: str, link: Callable[[Mapping[str, Any]], str | None] | None = None
             ) -> Notifier:
    async def post(payload: Mapping[str, Any]) -> None:
        address = link(payload) if link else None
        data = {**payload, "link": address} if address else payload
        body = json.dumps(data, ensure_ascii=False, default=str).encode()
        request = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json",
            "Idempotency-Key": str(payload.get("idempotency_key", "")),
        })

        def send() -> None:
            with urllib.request.urlopen(request, timeout=HOOK_SECONDS) as response:  # noqa: S310
                if response.status >= 300:
                    raise RuntimeError(f"webhook answered HTTP {response.status}")

        await asyncio.to_thread(send)

    return post


async def dispatch(store: Store, notifiers: Mapping[str, Notifier], *,
                   funnel: str | None = None, session_id: str | None = None,
                   senders: Mapping[str, Sender] | None = None) -> int:
    """Deliver due outbox rows; return how many were delivered.

    Rows of a kind in ``senders`` (a channel's ``reply``) go to that sender; the
    others (``handoff``) to the funnel's notifier, target by target. Rows of a kind
    this caller cannot deliver are left for one that can.
    """
    senders = senders or {}
    delivered = 0
    kinds = ["handoff", *senders]
    for row in await store.claim_outbox(funnel, session_id, kinds=kinds):
        sender = senders.get(row["kind"])
        if sender is not None:
            outcome = await sender(row)
            await store.finish_outbox(row["id"], outcome.error, retry_in=outcome.retry_in,
                                      give_up=outcome.give_up)
            delivered += outcome.error is None
            continue
        notifier = notifiers.get(row["funnel"])
        if notifier is None:
            await store.finish_outbox(row["id"], f"no notifier for funnel {row['funnel']!r}")
            continue
        payload = {**row["payload"], "idempotency_key": row["idempotency_key"]}
        targets = notifier.targets if isinstance(notifier, Targets) else {"notifier": notifier}
        done = set(row.get("done_targets") or [])
        errors = []
        for name, target in targets.items():
            if name in done:
                continue  # took the alert on an earlier attempt: never sent it again
            try:
                result = target(payload)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                problem = f"{type(exc).__name__}: {exc}"
                errors.append(f"{name}: {problem}" if len(targets) > 1 else problem)
                continue
            if len(targets) > 1:
                await store.outbox_target_done(row["id"], name)
        await store.finish_outbox(row["id"], "; ".join(errors) if errors else None)
        delivered += not errors
    return delivered
