"""A turn answered as Server-Sent Events: the reply as the model writes it, then the turn.

``POST .../messages`` with ``Accept: text/event-stream`` (the API's and the widget's)
answers ``text/event-stream`` with these events, in order (docs/service.md):

- ``delta`` ``{"text": ...}``: text that follows what was shown;
- ``replace`` ``{"text": ...}``: text that replaces all that was shown (the answer
  was rejected and the repair's reply, or the stage's fallback, takes its place);
- ``turn``: the validated turn exactly as the JSON API returns it; the last event;
- ``error`` ``{"error": code, "message": ...}`` instead of ``turn`` when the turn was
  refused after the stream began (the database went away).

Refusals that come before the first event (a bad key, the rate limit, a busy
session, the database down) are answered as without streaming: their status and
JSON body. The turn runs in a task of its own: a client that goes away mid-stream
stops receiving, and the turn still completes and is recorded, once. A replayed
delivery (the same Idempotency-Key) streams its saved reply as one ``delta``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..turn.stream import Listener
from .limits import RequestRefused

__all__ = ["MEDIA_TYPE", "respond", "wanted"]

log = logging.getLogger("funnel.service")
MEDIA_TYPE = "text/event-stream"
# Turns whose client may have gone: kept referenced until they end.
_running: set[asyncio.Task[None]] = set()

Run = Callable[[Listener], Awaitable[dict[str, Any]]]


def wanted(request: Request) -> bool:
    """Whether the client asked for the turn as events (``Accept: text/event-stream``)."""
    return MEDIA_TYPE in request.headers.get("accept", "").lower()


def frame(event: str, data: Any) -> bytes:
    """One event in the ``text/event-stream`` format (the data on one line)."""
    body = json.dumps(data, ensure_ascii=False, default=str, separators=(",", ":"))
    return f"event: {event}\ndata: {body}\n\n".encode()


async def respond(run: Run) -> Response:
    """Run the turn (``run(listener)`` returns the API's turn) and answer it as events."""
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    shown = [False]

    def listener(kind: str, text: str) -> None:
        shown[0] = True
        queue.put_nowait((kind, {"text": text}))

    async def job() -> None:
        try:
            turn = await run(listener)
        except RequestRefused as exc:
            queue.put_nowait(("refused", exc))
            return
        except Exception:  # a bug: the client gets the service's 500, the log the trace
            log.exception("a streamed turn failed")
            queue.put_nowait(("refused", RequestRefused(500, "internal", "internal error; "
                                                        "see the service log")))
            return
        if not shown[0]:  # a replay: the saved reply, as one piece
            queue.put_nowait(("delta", {"text": turn.get("reply", "")}))
        queue.put_nowait(("turn", turn))

    task = asyncio.get_running_loop().create_task(job())
    _running.add(task)
    task.add_done_callback(_running.discard)
    first = await queue.get()
    if first[0] == "refused":
        refused: RequestRefused = first[1]
        return refused.response()

    async def events() -> AsyncIterator[bytes]:
        kind, data = first
        while True:
            if kind == "refused":
                yield frame("error", {"error": data.code, "message": data.message})
                return
            yield frame(kind, data)
            if kind == "turn":
                return
            kind, data = await queue.get()

    # no-cache and no proxy buffering: every event reaches the customer as it is sent.
    return StreamingResponse(events(), media_type=MEDIA_TYPE,
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
