"""A playground engine's turns: saved as any other, and nothing leaves the process.

The studio's engine (``Engine.open(..., playground=True)``) runs only the sessions of
the playground (engine.store.playground). Its turns save the state, the messages and
the turn record as any turn does (so that they can be rewound, branched and saved as
scenarios), but what would reach someone outside the process is withheld: the outbox
rows (a hand-off alert to the funnel's webhook, hook or the managers' Telegram chat; a
channel's reply) and an approval's control row (which would put the session in the
managers' queue, and its sweep would act on it). The turn's result lists them in
:attr:`~engine.turn.data.TurnResult.withheld`, for the studio to show what would have
been sent.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..records.messages import Message
from ..store import Control, Held, Inbound, OutboxItem, SessionAccess, TurnWrite

__all__ = ["Withholding"]


def _item(item: OutboxItem) -> dict[str, Any]:
    return {"kind": item.kind, "key": item.key, "payload": item.payload}


class Withholding:
    """A :class:`~engine.store.SessionAccess` that saves the turn without its side
    effects, and keeps them in :attr:`withheld` (``{"kind", "key", "payload"}`` each;
    an approval's held move as kind ``approval``)."""

    def __init__(self, access: SessionAccess) -> None:
        self.access = access
        self.withheld: list[dict[str, Any]] = []

    @property
    def control(self) -> Control | None:
        return self.access.control

    @control.setter
    def control(self, value: Control | None) -> None:
        self.access.control = value

    async def load(self, window: int, *, text: str | None = None, current_id: int = 0,
                   inbound: Inbound | None = None
                   ) -> tuple[int, dict[str, Any] | None, list[Message]]:
        return await self.access.load(window, text=text, current_id=current_id,
                                      inbound=inbound)

    async def save(self, write: TurnWrite) -> int:
        self.withheld += [_item(o) for o in write.outbox]
        if write.approval is not None:
            self.withheld.append({"kind": "approval", "key": None,
                                  "payload": dict(write.approval["held"])})
        return await self.access.save(replace(write, outbox=[], approval=None))

    async def hold(self, held: Held) -> None:
        self.withheld += [_item(o) for o in held.outbox]
        await self.access.hold(replace(held, outbox=[]))
