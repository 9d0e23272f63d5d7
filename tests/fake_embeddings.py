"""A small OpenAI-compatible embeddings server for tests (stdlib only).

It answers ``POST /v1/embeddings`` (and ``/embeddings``) on 127.0.0.1 in OpenAI's wire
format, with deterministic vectors: a hashed bag of words (:func:`vector`), so that
texts sharing words get similar vectors and texts sharing none get orthogonal ones
(barring a hash collision in :data:`DIMS` dimensions). Every request body is recorded
in ``requests``; ``sleep(seconds)`` makes the next requests that slow, ``fail(n)``
makes the next ``n`` answer HTTP 500, ``serve(make)`` answers with ``make(texts)`` as
the ``data`` (an embedder answering strings, NaN, the wrong dimension...) until
``serve(None)``.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from loopback import LoopbackServer

PATHS = ("/v1/embeddings", "/embeddings")
DIMS = 256
# Words too common to say what a message is about (their weight would make any two
# messages look alike).
STOP = frozenset("a an and are as at be but by do does for from have has i i'm is it its "
                 "me my of on or our so that the their them they this to was we what when "
                 "where which who will with you your can could would please thanks".split())
_WORD = re.compile(r"[a-z0-9']+")


def vector(text: str) -> list[float]:
    """The hashed bag of words of ``text`` (counts, not normalized: the engine does it)."""
    out = [0.0] * DIMS
    for word in _WORD.findall(text.lower()):
        if word in STOP or len(word) < 2:
            continue
        h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "big")
        out[h % DIMS] += 1.0
    if not any(out):
        out[0] = 1e-3  # an empty text: a vector still (OpenAI never answers zeros)
    return out


class FakeEmbeddings(LoopbackServer):
    """The server. ``start()`` / ``stop()``; ``api_base`` for litellm."""

    def __init__(self) -> None:
        super().__init__()
        self.name = "fake-embeddings"
        self.requests: list[dict[str, Any]] = []
        self.delay = 0.0
        self.failures = 0
        self.make: Callable[[list[str]], Any] | None = None
        self._lock = threading.Lock()

    def sleep(self, seconds: float) -> FakeEmbeddings:
        self.delay = seconds
        return self

    def fail(self, times: int = 1) -> FakeEmbeddings:
        self.failures = times
        return self

    def serve(self, make: Callable[[list[str]], Any] | None) -> FakeEmbeddings:
        """Answer ``make(texts)`` as the ``data`` from now on (None: the real vectors)."""
        with self._lock:
            self.make = make
        return self

    @property
    def texts(self) -> list[str]:
        """Every text embedded so far, in order."""
        with self._lock:
            return [t for r in self.requests for t in _inputs(r)]

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def _inputs(body: dict[str, Any]) -> list[str]:
    raw = body.get("input")
    return [raw] if isinstance(raw, str) else [str(x) for x in raw or []]


class _Handler(BaseHTTPRequestHandler):
    fake: FakeEmbeddings
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path.split("?", 1)[0].rstrip("/") not in PATHS:
            self._send(404, {"error": {"message": "no such route", "type": "invalid_request"}})
            return
        fake = self.fake
        with fake._lock:
            fake.requests.append(body)
            failing = fake.failures > 0
            fake.failures -= 1 if failing else 0
            delay = fake.delay
            make = fake.make
        if delay and fake._stopping.wait(delay):
            return
        if failing:
            self._send(500, {"error": {"message": "fake embedder down", "type": "server_error",
                                       "param": None, "code": "500"}})
            return
        texts = _inputs(body)
        self._send(200, {
            "object": "list",
            "model": str(body.get("model") or "fake-embed"),
            "data": make(texts) if make is not None else [
                {"object": "embedding", "index": i, "embedding": vector(t)}
                for i, t in enumerate(texts)],
            "usage": {"prompt_tokens": sum(len(t.split()) for t in texts),
                      "total_tokens": sum(len(t.split()) for t in texts)},
        })

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            # Head and body in one write: two small writes on loopback wait out the
            # client's delayed ACK (Nagle), ~40 ms a response that are no embedder's.
            self._headers_buffer.extend([b"\r\n", data])  # type: ignore[attr-defined]
            self.flush_headers()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its deadline)


FakeEmbeddings.handler = _Handler
