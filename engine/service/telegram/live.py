"""A Telegram reply shown while the model writes it: one message, edited as it grows.

With streaming on for a bot (``FUNNEL_TELEGRAM_STREAM_<NAME>=1``), a turn's reply
stream (engine.turn.stream) feeds a :class:`LiveReply`: the first text goes out with
``sendMessage``, what follows with ``editMessageText`` of that message, **at most one
call per chat every** :data:`EDIT_INTERVAL` **seconds**. The Bot API allows a bot about
one message per second in a chat (and 20 a minute in a group), edits counted, and
answers a faster bot with 429 and a ``retry_after`` that stops it for longer than it
saved; so the text shown lags the model by a second at most, and a long reply costs
one call a second, not one per token.

These calls are best effort: one that fails stops the live message where it is
(nothing is retried). The reply itself is still the outbox row the turn saved, and its
delivery (engine.service.telegram.channel.send_reply) is what the customer is sure to
get, exactly once: the last edit of the live message to the validated reply (or
nothing, when the message shows it already), or, when there is no live message (the
first call failed, another worker delivers the row after a crash) or it cannot be
edited any more, a ``sendMessage`` as without streaming. A reply that validation
replaced (the repair's, the stage's fallback) replaces the live message's text the
same way: the customer never keeps a rejected text.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from .botapi import MAX_TEXT, BotApi

EDIT_INTERVAL = 1.0  # seconds between two Bot API calls for one chat's live reply


class LiveReply:
    """One turn's reply, shown in the chat as the model writes it.

    ``listener`` is the turn's stream listener; :meth:`close` stops it and returns the
    live message (its id and the text it shows), if one was sent.
    """

    def __init__(self, api: BotApi, token: str, target: Mapping[str, Any],
                 last_call: dict[Any, float], interval: float = EDIT_INTERVAL) -> None:
        self.api, self.token, self.interval = api, token, interval
        self.chat_id = target.get("chat_id")
        self.thread = target.get("message_thread_id")
        self.last_call = last_call  # chat -> monotonic time of its last call (shared)
        self.text = ""  # the reply as streamed so far
        self.shown: str | None = None  # what the live message shows
        self.message_id: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._waiting = False  # the task sleeps out the interval (safe to cancel)
        self._stopped = False

    def listener(self, kind: str, text: str) -> None:
        """A stream event (engine.turn.stream): ``delta`` adds, ``replace`` replaces."""
        self.text = self.text + text if kind == "delta" else text
        if not self._stopped and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        while not self._stopped and self.text.strip() and self.text[:MAX_TEXT] != self.shown:
            wait = self.last_call.get(self.chat_id, -1e9) + self.interval - time.monotonic()
            if wait > 0:
                self._waiting = True
                try:
                    await asyncio.sleep(wait)
                finally:
                    self._waiting = False
                continue
            text = self.text[:MAX_TEXT]
            self.last_call[self.chat_id] = time.monotonic()
            if self.message_id is None:
                body: dict[str, Any] = {"chat_id": self.chat_id, "text": text}
                if type(self.thread) is int:
                    body["message_thread_id"] = self.thread
                result = await self.api.call(self.token, "sendMessage", body)
                sent = result.result.get("message_id") if result.ok and isinstance(
                    result.result, dict) else None
                if type(sent) is not int:
                    self._stopped = True  # best effort: the outbox sends the reply
                    return
                self.message_id = sent
            else:
                result = await self.api.call(self.token, "editMessageText", {
                    "chat_id": self.chat_id, "message_id": self.message_id, "text": text})
                if not result.ok:
                    self._stopped = True  # the final delivery edits or sends it
                    return
            self.shown = text

    async def close(self) -> tuple[int, str] | None:
        """No more edits: a call in flight ends, a wait is cut short. The live message
        (id, text shown), or None when none was sent."""
        self._stopped = True
        task = self._task
        if task is not None and not task.done():
            if self._waiting:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.message_id is None or self.shown is None:
            return None
        return self.message_id, self.shown
