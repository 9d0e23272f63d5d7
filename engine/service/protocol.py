"""HTTP/1.1 as `funnel serve` speaks it: uvicorn's httptools protocol with a deadline on
the request head.

uvicorn times out an idle keep-alive connection, but not a request head that never
ends: a client that sends ``POST / HTTP/1.1\\r\\nHost: x\\r\\n`` and then one byte a
minute (slowloris) holds a connection, and a few hundred of them a worker, for ever.
Here every request's head (from the connection's first byte, or the request's
first byte on a kept-alive connection) must be complete within
:data:`REQUEST_HEAD_SECONDS`, or the connection is closed. The body is bounded by
the app itself (engine.service.limits.read_json).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["REQUEST_HEAD_SECONDS", "HeadDeadlineProtocol"]

REQUEST_HEAD_SECONDS = 10.0


class HeadDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol; a request head unfinished after
    :data:`REQUEST_HEAD_SECONDS` closes the connection."""

    head_seconds = REQUEST_HEAD_SECONDS
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_seconds, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        transport: Any = self.transport
        if not transport.is_closing():
            self.logger.warning("closing a connection whose request head was not complete "
                                "after %g s", self.head_seconds)
            transport.close()
