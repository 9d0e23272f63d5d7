"""What the customer is shown of a reply while the model writes it.

A turn asked to stream (:meth:`engine.turn.engine.Engine.handle` with ``stream=``)
passes a :class:`ReplyStream` to its model calls. Each piece of the answer is read
once (:class:`engine.boundary.partial.PartialReply`); what it adds to the ``reply`` is
compared with what was shown (only the new part: the cost is linear in the answer),
and the listener gets one event:

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

from ..boundary.partial import PartialReply

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
        self._reply = PartialReply()
        self._owns = False  # this attempt's reply is what is shown (it replaced or outgrew it)
        self._caught = 0  # of a retry writing what was shown: how far it has matched it
        self._begun = False  # this attempt's reply has shown a character

    def text(self, piece: str) -> None:
        """The next piece of the model's answer (``on_text`` of the model request);
        ``""``: an attempt begins, and what an earlier one wrote is read no further."""
        if not piece:
            self._reply, self._owns, self._caught = PartialReply(), False, 0
            self._begun = False
            return
        added = self._reply.feed(piece)
        if added and not self._begun:
            # Without its leading spaces, as the reply is saved (engine.turn.save).
            added = added.lstrip()
            self._begun = bool(added)
        if added:  # an empty reply so far shows nothing (a repair's first bytes)
            self._grow(added)

    def rejected(self) -> None:
        """The answer whose reply was shown was rejected: the next reply replaces it."""
        self._void = bool(self.shown)
        self._owns = False

    def finish(self, reply: str) -> None:
        """The reply saved with the turn: make what was shown exactly it."""
        if self._void:
            self._void = False
            self._replace(reply)
        elif reply.startswith(self.shown):
            if len(reply) > len(self.shown):
                extra, self.shown = reply[len(self.shown):], reply
                self._emit("delta", extra)
        else:
            self._replace(reply)

    def _grow(self, added: str) -> None:
        if self._void:
            self._void, self._owns = False, True
            self._replace(self._reply.text.lstrip())
        elif self._owns:
            self.shown += added
            self._emit("delta", added)
        else:
            # A retry may write again what an earlier attempt showed: nothing new until
            # it goes past it; a reply that differs replaces what was shown.
            start, room = self._caught, len(self.shown) - self._caught
            if self.shown[start:start + len(added)] == added[:room]:
                if len(added) <= room:
                    self._caught += len(added)
                    return
                self._owns = True
                extra = added[room:]
                self.shown += extra
                self._emit("delta", extra)
            else:
                self._owns = True
                self._replace(self._reply.text.lstrip())

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
