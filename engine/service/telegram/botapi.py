"""Bot API calls and what their answers mean for a retry.

The Bot API answers ``{"ok": false, "error_code": N, "description": "...",
"parameters": {"retry_after": S}}`` on failure. A 429 (flood control) says when
to try again; a 5xx, a timeout or a broken connection is retried with backoff; a
403 (``Forbidden: bot was blocked by the user``, ``user is deactivated``, ``bot
was kicked``) and a 400 ``chat not found`` mean the customer cannot be reached:
no retry, the session is marked. Any other 400 is our request's fault: not
retried either (it would fail the same way). The token is part of the URL, so
no error message here quotes a URL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

MAX_TEXT = 4096  # sendMessage's limit, in characters (after entity parsing)
MAX_RETRY_AFTER = 3600.0
_UNREACHABLE_400 = ("chat not found", "user not found", "peer_id_invalid",
                    "have no rights to send", "not enough rights", "chat_write_forbidden")


@dataclass(frozen=True)
class Result:
    """One call's outcome: ``ok``; else ``retry_in`` (None: back off), ``unreachable``
    (why, if the chat is gone) or ``final`` (do not retry), and the problem for the log."""

    ok: bool
    problem: str = ""
    retry_in: float | None = None
    unreachable: str | None = None
    final: bool = False
    result: Any = None


def backoff(attempts: int) -> float:
    """Seconds before the next try after ``attempts`` failed ones: 2, 4, 8, ... 300."""
    return float(min(300, 2 ** max(1, attempts)))


class BotApi:
    """``POST {api}/bot<token>/<method>`` with a JSON body."""

    def __init__(self, api: str) -> None:
        self.api = api.rstrip("/")
        self.http: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0))

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()

    async def call(self, token: str, method: str, body: dict[str, Any]) -> Result:
        assert self.http is not None, "BotApi.start() was not called"
        try:
            response = await self.http.post(f"{self.api}/bot{token}/{method}", json=body)
        except httpx.HTTPError as exc:  # str(exc) may quote the URL and its token
            return Result(False, f"{method}: {type(exc).__name__}")
        try:
            data = response.json()
        except ValueError:
            data = None
        return judge(method, response.status_code, data)


def judge(method: str, status: int, data: Any) -> Result:
    """What a Bot API answer means: delivered, retry (when), or give up (why)."""
    data = data if isinstance(data, dict) else {}
    if status == 200 and data.get("ok") is True:
        return Result(True, result=data.get("result"))
    description = str(data.get("description") or f"HTTP {status}")[:300]
    problem = f"{method}: HTTP {status}: {description}"
    if status == 429:
        params = data.get("parameters")
        wait = params.get("retry_after") if isinstance(params, dict) else None
        wait = float(wait) if isinstance(wait, int | float) and wait > 0 else None
        return Result(False, problem, retry_in=min(wait, MAX_RETRY_AFTER) if wait else None)
    if status == 403 or (status == 400 and any(s in description.lower()
                                                for s in _UNREACHABLE_400)):
        return Result(False, problem, unreachable=description, final=True)
    if status == 400:
        return Result(False, problem, final=True)
    return Result(False, problem)  # 5xx, 401/404 (a token being fixed), garbage: back off
