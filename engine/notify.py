"""Side effects, delivered once: the outbox dispatcher and the handoff notifiers.

A turn writes its side effects (the manager's handoff alert) to the outbox in
the same transaction as the state, keyed by an idempotency key. After the
commit the dispatcher claims due rows and delivers them; a failure is retried
with backoff, and a crash between save and delivery is delivered by the next
dispatch. A duplicate trigger finds the key taken and adds nothing.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .actions import load_hook
from .spec import FunnelSpec
from .store import Store

log = logging.getLogger("funnel.handoff")

Notifier = Callable[[Mapping[str, Any]], Awaitable[None] | None]


def make_notifier(spec: FunnelSpec, *, webhook: str | None = None,
                  link: Callable[[Mapping[str, Any]], str | None] | None = None) -> Notifier:
    """The notifier the funnel's ``handoff.notify`` declares (``log`` by default).

    ``webhook`` replaces the funnel's ``handoff.notify.webhook`` (the service's
    ``FUNNEL_HANDOFF_WEBHOOK``); ``link(payload)``, when given, adds a ``link`` to
    the conversation to the webhook's body.
    """
    notify = spec.handoff.notify if spec.handoff else {"log": True}
    targets: list[Notifier] = []
    url = webhook or notify.get("webhook")
    if url:
        targets.append(_webhook(str(url), link))
    if notify.get("hook"):
        targets.append(load_hook(str(notify["hook"]), spec.path.parent))  # type: ignore[arg-type]
    if notify.get("log", not targets):
        targets.append(_log)

    async def deliver(payload: Mapping[str, Any]) -> None:
        for target in targets:
            result = target(payload)
            if inspect.isawaitable(result):
                await result

    return deliver


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
            with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
                if response.status >= 300:
                    raise RuntimeError(f"webhook answered HTTP {response.status}")

        await asyncio.to_thread(send)

    return post


async def dispatch(store: Store, notifiers: Mapping[str, Notifier], *,
                   funnel: str | None = None, session_id: str | None = None) -> int:
    """Deliver due outbox rows; return how many were delivered."""
    delivered = 0
    for row in await store.claim_outbox(funnel, session_id):
        notifier = notifiers.get(row["funnel"])
        if notifier is None:
            await store.finish_outbox(row["id"], f"no notifier for funnel {row['funnel']!r}")
            continue
        payload = {**row["payload"], "idempotency_key": row["idempotency_key"]}
        try:
            result = notifier(payload)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            await store.finish_outbox(row["id"], f"{type(exc).__name__}: {exc}")
            continue
        await store.finish_outbox(row["id"], None)
        delivered += 1
    return delivered
