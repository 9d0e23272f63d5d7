"""The store's side of channels and side effects: the outbox and delivery keys.

A mixin of :class:`engine.store.postgres.PostgresStore` (its SQL lives in
``engine.store.outbox`` and ``engine.store.idempotency``): each method takes a
pooled connection for one statement (or one small transaction).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

from ..format.spec import FunnelSpec
from . import idempotency, outbox
from .base import Inbound, OutboxItem
from .idempotency import Pending


class DeliveryMixin:
    """Outbox and delivery-key methods of the PostgreSQL store."""

    def _conn(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        raise NotImplementedError

    # -- outbox ------------------------------------------------------------------------
    async def claim_outbox(self, funnel: str | None = None, session_id: str | None = None,
                           limit: int = 50, kinds: list[str] | None = None
                           ) -> list[dict[str, Any]]:
        async with self._conn() as conn:
            return await outbox.claim(conn, funnel, session_id, kinds, limit)

    async def finish_outbox(self, item_id: int, error: str | None, *,
                            retry_in: float | None = None, give_up: bool = False) -> None:
        async with self._conn() as conn:
            await outbox.finish(conn, item_id, error, retry_in=retry_in, give_up=give_up)

    async def outbox_target_done(self, item_id: int, target: str) -> None:
        """Record that one target of an outbox row (a webhook, a hook) took it."""
        async with self._conn() as conn:
            await conn.execute(outbox.TARGET_DONE, {"id": item_id, "t": target})

    async def outbox_backlog(self) -> dict[str, tuple[int, float]]:
        """Per funnel: undelivered outbox rows still to try, and the oldest's overdue age."""
        async with self._conn() as conn:
            return await outbox.backlog(conn)

    # -- delivery keys (engine.store.idempotency) ------------------------------------
    async def accept_message(self, funnel: FunnelSpec, session_id: str, text: str,
                             inbound: Inbound, holder: str,
                             meta: dict[str, Any] | None = None) -> int | None:
        """Log a message with its delivery key in one commit, for a turn that runs after
        the channel is answered; its id, or None when the key was seen before."""
        async with self._conn() as conn:
            return await idempotency.accept(conn, funnel, session_id, text, inbound.channel,
                                            inbound.key, holder, meta)

    async def inbound_pending(self, funnel: str, channel: str, key: str) -> Pending | None:
        """A delivery key's message and, once its turn is saved, the answer."""
        async with self._conn() as conn:
            return await idempotency.pending(conn, funnel, channel, key)

    async def claim_inbound(self, funnel: str, channel: str, holder: str, *,
                            key: str | None = None, limit: int = 20
                            ) -> list[tuple[str, Pending]]:
        """Claim messages accepted and left unanswered (a dead worker's): (key, message)."""
        async with self._conn() as conn:
            return await idempotency.claim_orphans(conn, funnel, channel, holder, key=key,
                                                   limit=limit)

    async def record_delivery(self, funnel: str, channel: str, session_id: str,
                              key: str | None, delivery: str, unreachable: str | None = None
                              ) -> None:
        """How a channel's reply went (on the message's key), and whether the channel can
        reach the session at all (``unreachable``: why not)."""
        async with self._conn() as conn:
            await idempotency.record_delivery(conn, funnel, channel, session_id, key,
                                              delivery, unreachable)

    async def add_outbox(self, funnel: str, session_id: str, items: list[OutboxItem]) -> int:
        """Add outbox rows outside a turn (a channel's note); a key taken adds nothing.
        Returns how many were added."""
        async with self._conn() as conn:
            return await outbox.add(conn, funnel, session_id, items)
