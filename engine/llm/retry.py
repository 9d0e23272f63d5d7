"""Retries owned by the engine: which failures are worth another call, and when.

litellm's own retries are switched off (``num_retries=0``, ``max_retries=0``):
they differ by provider (Anthropic and Ollama make one call whatever the
setting) and their count is not reported truthfully. Here every provider gets
the same policy:

- retried: HTTP 429, 408, 409, 5xx, timeouts and connection errors;
- never retried: authentication, permission, bad request (400/404/422) and
  anything else a second identical call cannot fix;
- the wait is exponential with jitter (0.25 s, 0.5 s, 1 s ... capped at 8 s),
  or the server's ``Retry-After`` when it sends one, and never past the turn's
  deadline: a retry that could not finish in time is not made.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

BASE_DELAY = 0.25
MAX_DELAY = 8.0
# A call given less time than this would only time out: it is not made.
MIN_CALL_SECONDS = 0.2

_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
_RETRY_NAMES = ("Timeout", "APIConnectionError", "ServiceUnavailableError", "RateLimitError",
                "InternalServerError", "BadGatewayError", "APITimeoutError")


_KEY_PROBLEM = re.compile(r"api[ _-]?key", re.IGNORECASE)


@dataclass
class Deadline:
    """A point on the monotonic clock that a whole turn's model calls must end by."""

    at: float
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def remaining(self) -> float:
        return max(0.0, self.at - self.clock())

    def share(self, parts: int) -> Deadline:
        """An earlier deadline: this one's remaining time split in ``parts`` equal shares."""
        return Deadline(self.clock() + self.remaining() / max(1, parts), self.clock)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a litellm/openai exception, when it has one."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


def is_retryable(exc: BaseException) -> bool:
    """Whether the same call could succeed if made again a little later."""
    if isinstance(exc, TimeoutError):
        return True
    if _KEY_PROBLEM.search(str(exc)):  # some clients say so as a "connection error"
        return False
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & {"AuthenticationError", "PermissionDeniedError", "BadRequestError",
                "NotFoundError", "UnprocessableEntityError", "ContextWindowExceededError"}:
        return False
    if names & set(_RETRY_NAMES):
        return True
    status = status_of(exc)
    return status in _RETRY_STATUS if status is not None else False


def retry_after(exc: BaseException, now: float | None = None) -> float | None:
    """Seconds the server asked to wait (``Retry-After``, ``retry-after-ms``), if it did."""
    headers: Any = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000)
        value = headers.get("retry-after")
    except (AttributeError, TypeError, ValueError):
        return None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(str(value))
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff(retry: int, exc: BaseException, rng: random.Random | None = None) -> float:
    """The wait before retry number ``retry`` (1 for the first) after ``exc``."""
    asked = retry_after(exc)
    if asked is not None:
        return min(asked, 60.0)
    cap = min(MAX_DELAY, BASE_DELAY * 2 ** (retry - 1))
    return (rng or random).uniform(cap / 2, cap)
