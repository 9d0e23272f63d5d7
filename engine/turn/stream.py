"""What the customer is shown of a reply while the model writes it.

A turn asked to stream (:meth:`engine.turn.engine.Engine.handle` with ``stream=``)
passes a :class:`ReplyStream` to its model calls. Each time the answer grows, the
``reply`` read from it so far (:func:`engine.boundary.partial.partial_reply`) is
compared with what was shown, and the listener gets one event:

- ``("delta", text)``: ``text`` follows what was shown;
- ``("replace", text)``: ``text`` replaces all that was shown: the answer was
  rejected (invalid, or in the wrong language) and the repair's reply, or the
  stage's fallback, takes its place; or a retried call wrote another reply.

When the turn is saved, :meth:`ReplyStream.finish` makes what was shown exactly the
reply saved (one ``delta`` for a route that did not stream). Nothing streamed is
applied: updates and actions wait for the whole answer to validate, as in a turn
that does not stream. A listener that raises is a bug of the listener; it is logged
once and not called again, and the turn goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..boundary.partial import partial_reply

__all__ = ["Listener", "ReplyStream"]

log = logging.getLogger("funnel.engine")

Listener = Callable[[str, str], None]
"""Gets ``(kind, text)``: kind ``delta`` or ``replace``."""


class ReplyStream:
    """The reply shown so far, and the events that keep the listener in step with it."""

    def __init__(self, listener: Listener) -> None:
        self._listener: Listener | None = listener
        self.shown = ""
        self._void = False  # the shown text belongs to a rejected answer

    def text(self, answer: str) -> None:
        """The model's answer so far (``on_text`` of the model request)."""
        # Without its leading spaces, as the reply is saved (engine.turn.save).
        reply = (partial_reply(answer) or "").lstrip()
        if reply:  # an empty reply so far shows nothing (a repair's first bytes)
            self._show(reply, final=False)

    def rejected(self) -> None:
        """The answer whose reply was shown was rejected: the next reply replaces it."""
        self._void = bool(self.shown)

    def finish(self, reply: str) -> None:
        """The reply saved with the turn: make what was shown exactly it."""
        self._show(reply, final=True)

    def _show(self, reply: str, *, final: bool) -> None:
        if self._void:
            self._void = False
            self._replace(reply)
        elif reply.startswith(self.shown):
            if len(reply) > len(self.shown):
                extra, self.shown = reply[len(self.shown):], reply
                self._emit("delta", extra)
        elif final or not self.shown.startswith(reply):
            # Not a retry still catching up with what it wrote before: another reply.
            self._replace(reply)

    def _replace(self, reply: str) -> None:
        self.shown = reply
        self._emit("replace", reply)

    def _emit(self, kind: str, text: str) -> None:
        if self._listener is None:
            return
        try:
            self._listener(kind, text)
        except Exception:
            log.exception("a reply stream's listener failed; it gets no more events")
            self._listener = None
