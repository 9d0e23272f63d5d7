"""A request head that never ends is cut off (slowloris), through uvicorn and a raw socket.

`funnel serve` runs uvicorn with engine.service.protocol's protocol; here a
subclass with a shorter deadline serves a tiny ASGI app. A client that sends half
a request head and waits finds the connection closed by the server; a complete
request on another connection is answered as usual, and a kept-alive connection
serves a second request.
"""

from __future__ import annotations

import socket
from typing import Any

import httpx
from service_support import running

from engine.service.protocol import HeadDeadlineProtocol


class QuickDeadline(HeadDeadlineProtocol):
    head_seconds = 0.5


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_a_half_sent_request_head_is_closed_and_others_are_served() -> None:
    with running(app, http=QuickDeadline) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=20) as slow:
            slow.sendall(b"POST /v1/funnels/x HTTP/1.1\r\nHost: x\r\nContent-")
            assert slow.recv(1024) == b""  # closed by the server, not by our timeout
        with httpx.Client(base_url=url) as client:  # keep-alive: two requests, one connection
            assert client.get("/").text == "ok"
            assert client.get("/").text == "ok"
