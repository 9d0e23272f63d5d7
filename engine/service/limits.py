"""Request limits: body size (413), per-client rate (429), per-session queue (503).

Every limit answers before the engine sees the message, so a refused message
was never accepted (never logged) and the client may simply send it again
after ``Retry-After`` seconds. A message the engine accepted is logged in its
own commit before anything else can fail.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..boundary.customer import MAX_MESSAGE_CHARS, MAX_SESSION_ID
from ..boundary.sanitize import Rejected, loads_bounded

# A JSON body of MAX_MESSAGE_CHARS characters, each escaped as \uXXXX, plus room.
MAX_BODY_BYTES = MAX_MESSAGE_CHARS * 6 + 1024
# Telegram updates carry more than text (entities, reply_to_message, ...).
MAX_UPDATE_BYTES = 256 * 1024

__all__ = ["MAX_BODY_BYTES", "MAX_MESSAGE_CHARS", "MAX_SESSION_ID", "MAX_UPDATE_BYTES",
           "RateLimiter", "RequestRefused", "SessionQueue", "error", "read_json"]


class RequestRefused(Exception):
    """Answer the request with ``error(status, code, message, retry_after)``."""

    def __init__(self, status: int, code: str, message: str, retry_after: int | None = None
                 ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after

    def response(self) -> JSONResponse:
        return error(self.status, self.code, self.message, self.retry_after)


def error(status: int, code: str, message: str, retry_after: int | None = None) -> JSONResponse:
    """The service's error body: ``{"error": code, "message": ...}``."""
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse({"error": code, "message": message}, status_code=status, headers=headers)


async def read_json(request: Request, max_bytes: int = MAX_BODY_BYTES) -> Any:
    """The JSON body, read no further than ``max_bytes`` (413 past it, 400 if not JSON)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise RequestRefused(413, "too_large", f"the body is over {max_bytes} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise RequestRefused(413, "too_large", f"the body is over {max_bytes} bytes")
    try:
        # Strict and bounded (engine.boundary.sanitize): depth checked before parsing, no lone
        # surrogates, no NaN; a refusal says why.
        return loads_bounded(bytes(body), max_values=100_000, clean=False)
    except Rejected as exc:
        raise RequestRefused(400, "bad_request", f"the body must be JSON: {exc}") from None


class RateLimiter:
    """A token bucket per client: ``count`` requests per ``seconds``, bursts up to ``count``.

    Per process: with N workers a client may get up to N times the rate when
    its requests spread over workers (documented in docs/service.md).
    """

    def __init__(self, count: int, seconds: float, *, clock: Callable[[], float] = time.monotonic,
                 max_clients: int = 100_000) -> None:
        self.capacity = float(count)
        self.rate = count / seconds
        self.clock = clock
        self.max_clients = max_clients
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, at)

    def check(self, client: str) -> None:
        """Take one token for ``client``, or raise a 429 refusal with Retry-After."""
        now = self.clock()
        tokens, at = self._buckets.get(client, (self.capacity, now))
        tokens = min(self.capacity, tokens + (now - at) * self.rate)
        if tokens < 1.0:
            self._buckets[client] = (tokens, now)
            wait = max(1, math.ceil((1.0 - tokens) / self.rate))
            raise RequestRefused(429, "rate_limited", f"too many requests; retry in {wait} s",
                                 retry_after=wait)
        self._buckets[client] = (tokens - 1.0, now)
        if len(self._buckets) > self.max_clients:
            self._prune(now)

    def _prune(self, now: float) -> None:
        full = [c for c, (t, at) in self._buckets.items()
                if t + (now - at) * self.rate >= self.capacity]
        for c in full:
            del self._buckets[c]
        while len(self._buckets) > self.max_clients:  # all busy: forget the oldest
            del self._buckets[next(iter(self._buckets))]


class SessionQueue:
    """Counts the turns of each session that run or wait in this process.

    The engine serializes a session's turns with a database lock, each waiter
    holding a connection; past ``depth`` the next message gets a 503 rather
    than a connection.
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self._count: dict[str, int] = {}

    def enter(self, key: str) -> None:
        n = self._count.get(key, 0)
        if n >= self.depth:
            raise RequestRefused(503, "session_busy", f"{n} messages of this session are "
                                 "already being answered; send this one again shortly",
                                 retry_after=1)
        self._count[key] = n + 1

    def leave(self, key: str) -> None:
        n = self._count.get(key, 1) - 1
        if n <= 0:
            self._count.pop(key, None)
        else:
            self._count[key] = n

    def __len__(self) -> int:
        return sum(self._count.values())
