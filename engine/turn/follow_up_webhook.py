"""Follow-ups to a webhook: for sessions no channel of the engine reaches (the HTTP
API's), a funnel's ``follow_up.webhook`` gets each follow-up as a JSON POST, through
the outbox (kind ``follow_up``), so the integrator's own channel sends it
(docs/follow-ups.md).

Delivered at least once, like a hand-off alert (engine.turn.notify): every POST
carries the row's stable ``Idempotency-Key`` header; a failure is retried with the
outbox's backoff. The body: ``funnel``, ``session_id``, ``stage``, ``step``, ``text``,
``language``, ``due`` and ``idempotency_key``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request
from typing import Any

from ..store.base import Store
from .notify import HOOK_SECONDS

__all__ = ["KIND", "deliver"]

log = logging.getLogger("funnel.follow_up")

KIND = "follow_up"


def _post(url: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(
        url, data=json.dumps(body, ensure_ascii=False, default=str).encode(), method="POST",
        headers={"Content-Type": "application/json",
                 "Idempotency-Key": str(body["idempotency_key"])})
    with urllib.request.urlopen(request, timeout=HOOK_SECONDS) as response:  # noqa: S310
        if response.status >= 300:
            raise RuntimeError(f"the follow-up webhook answered HTTP {response.status}")


async def deliver(store: Store, funnel: str, limit: int = 50) -> int:
    """POST the funnel's due follow-up rows to their webhook; how many were taken."""
    delivered = 0
    for row in await store.claim_outbox(funnel, kinds=[KIND], limit=limit):
        payload = dict(row["payload"]) if isinstance(row["payload"], dict) else {}
        url = str(payload.pop("url", ""))
        body = {**payload, "idempotency_key": row["idempotency_key"]}
        try:
            await asyncio.to_thread(_post, url, body)
        except Exception as exc:  # the receiver's failure: retried after the backoff
            log.warning("follow-up of session %r not delivered to its webhook yet: %s",
                        row["session_id"], exc)
            await store.finish_outbox(row["id"], f"{type(exc).__name__}: {exc}")
            continue
        await store.finish_outbox(row["id"], None)
        delivered += 1
    return delivered
