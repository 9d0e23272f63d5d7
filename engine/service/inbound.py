"""Exactly-once turns at the channel edge: a message's delivery key, and its replay.

Every inbound message may carry a delivery key (engine.store.idempotency): the
HTTP API's ``Idempotency-Key`` header or the body's ``client_message_id``, the
widget's per-message key, Telegram's bot and ``update_id``. The key is recorded
with the message in the turn's first round trip, so a second delivery (a client
retrying after a timeout or a 503, a proxy re-POSTing, Telegram re-sending an
update) runs no second turn, on whichever worker it lands and whenever:

- the first turn is done: its answer is replayed (``replayed: true``);
- it is still running (here or on another worker): the retry waits for it;
- its worker died, or the turn failed before its save: once the key's claim runs
  out (a few seconds, engine.store.heartbeat) the retry claims the message and
  runs its turn, once.

Keys are scoped by who sends them (the API client and the session, the widget
session, the bot), so one client can never read another's answer by guessing a
key. An API client is named by a digest of its API key (``Client.identity``),
never by the key's place in ``FUNNEL_API_KEYS``: reordering or replacing keys
never hands one client's answers to another. A key reused with another message
is refused (422, as payment APIs do), naming the key: the new message is not
silently dropped for the first one's answer.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from ..errors import DuplicateDelivery, StoreUnavailable
from ..turn.engine import TurnResult
from ..turn.stream import Listener
from .limits import RequestRefused

if TYPE_CHECKING:
    from .core import Service

MAX_KEY = 200
_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")  # printable ASCII, no spaces
REPLAY_HEADER = "Idempotent-Replayed"


def delivery_key(request: Request, body: Any) -> str | None:
    """The client's key of this message: ``Idempotency-Key``, else ``client_message_id``
    (the header wins when both are given).

    Raises:
        RequestRefused: 400 for a malformed key.
    """
    header = request.headers.get("idempotency-key")
    given = isinstance(body, dict) and "client_message_id" in body
    field = body["client_message_id"] if given else None
    if given and not isinstance(field, str):
        raise RequestRefused(400, "bad_request", "`client_message_id` must be a string")
    for value, name in ((header, "the Idempotency-Key header"),
                        (field, "`client_message_id`")):
        if value is not None and not _KEY.fullmatch(value):
            raise RequestRefused(400, "bad_request", f"{name} must be 1 to {MAX_KEY} printable "
                                 "ASCII characters without spaces (a UUID is a good key)")
    return header if header is not None else field


def body(result: TurnResult, turn_id: int | None, replayed: bool = False) -> dict[str, Any]:
    """The API's ``Turn``."""
    out = {"reply": result.reply, "stage": result.stage_after, "handoff": result.handoff,
           "fallback": result.fallback, "turn_id": turn_id, "replayed": replayed}
    if result.held:  # a manager holds the session (engine.turn.manager)
        out["held"] = True
    return out


async def turn(service: Service, funnel: str, session_id: str, text: str, *, channel: str,
               key: str | None, stream: Listener | None = None) -> dict[str, Any]:
    """Run the message's turn, or replay the answer of its first delivery (same key).

    ``stream`` gets the reply as the model writes it (engine.turn.stream); a replay
    (the saved answer, or one waited for) sends it nothing: the turn returned says all.
    """
    if key is None:
        result = await service.converse(funnel, session_id, text, channel=channel,
                                        stream=stream)
        return body(result, result.message_id)
    try:
        result = await service.converse(funnel, session_id, text, channel=channel, key=key,
                                        stream=stream)
        return body(result, result.message_id)
    except DuplicateDelivery as dup:
        await _same_message(service, funnel, channel, key, text)
        service.metrics.count("funnel_replays_total", funnel=funnel, channel=channel)
        if dup.response is not None:
            return {**dup.response, "replayed": True}
        return await wait_for_answer(service, funnel, channel, key)


async def _same_message(service: Service, funnel: str, channel: str, key: str, text: str
                        ) -> None:
    """Refuse a key whose first delivery carried another message.

    Raises:
        RequestRefused: 422 naming the key.
    """
    store = (await service.engine(funnel)).store
    try:
        first = await store.inbound_pending(funnel, channel, key)
    except StoreUnavailable:
        raise service.trip() from None
    if first is not None and first.text is not None and first.text != text:
        shown = key.rsplit("/", 1)[-1]  # the client's key, without our scope
        raise RequestRefused(422, "idempotency_key_reused", f"the Idempotency-Key {shown!r} "
                             "was used before with another message; a retry must send the "
                             "same message, and a new message needs a new key")


async def wait_for_answer(service: Service, funnel: str, channel: str, key: str
                          ) -> dict[str, Any]:
    """Wait for the turn of an earlier delivery of ``key``; run it if nobody will."""
    store = (await service.engine(funnel)).store
    deadline = time.monotonic() + service.config.replay_wait
    delay = 0.02
    while True:
        try:
            found = await store.inbound_pending(funnel, channel, key)
            claimed = None
            if found is not None and found.response is None and found.orphan:
                claims = await store.claim_inbound(funnel, channel, service.holder, key=key)
                claimed = claims[0][1] if claims else None
        except StoreUnavailable:
            raise service.trip() from None
        if found is None:  # purged meanwhile
            raise RequestRefused(409, "conflict", "this Idempotency-Key's message is gone "
                                 "(purged); send the message with a new key")
        if found.response is not None:
            return {**found.response, "replayed": True}
        if claimed is not None and claimed.message_id is not None and claimed.text is not None:
            # The first delivery was accepted and then left: its worker died, or the
            # database went away mid-turn. This delivery answers it, once.
            try:
                result = await service.converse(funnel, claimed.session_id, claimed.text,
                                                channel=channel, key=key,
                                                message_id=claimed.message_id)
            except DuplicateDelivery as dup:  # its first turn saved after all
                if dup.response is not None:
                    return {**dup.response, "replayed": True}
                continue
            return body(result, claimed.message_id, replayed=True)
        if time.monotonic() >= deadline:
            raise RequestRefused(503, "in_progress", "the first delivery of this message is "
                                 "still being answered; send it again with the same "
                                 "Idempotency-Key", retry_after=2)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.25)
