"""A small OpenAI-compatible chat server for tests (stdlib only).

It listens on 127.0.0.1 on a free port, in a background thread, and answers
``POST /v1/chat/completions`` (and ``/chat/completions``). Each request takes
the next behaviour from a queue the test fills:

    server.reply('{"reply": "Hi"}', prompt_tokens=120, completion_tokens=9)
    server.fail(500)                  # an OpenAI-style error body
    server.sleep(5, then='{"reply": "late"}')   # for timeouts
    gate = server.hold('{"reply": "Hi"}')       # waits until gate.release()
    server.trickle(60)                 # a 200 whose body comes a space at a time
    server.reply('{"reply": "Hi"}', stream=Stream(cut_after=4))  # how a stream is sent

A request with ``"stream": true`` gets the content as OpenAI's chunk stream
(tests/fake_stream.py), ``Stream()`` unless the behaviour says otherwise.

With the queue empty it asks the responder, if one is set
(``server.respond_with(lambda body: ...)``: the content to answer, or ``None``),
and otherwise answers HTTP 500 ("no behaviour queued"), so an unexpected extra
call shows up as a failure. Every request body is recorded in
``server.requests`` (parsed JSON), in arrival order.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler
from typing import Any

from fake_stream import Stream, openai_chunks, send, send_raw, wants_stream
from loopback import LoopbackServer

PATHS = ("/v1/chat/completions", "/chat/completions")


@dataclass(frozen=True)
class Behaviour:
    kind: str  # "reply" | "fail" | "sleep" | "hold" | "trickle"
    content: str | None = None
    status: int = 200
    message: str = ""
    seconds: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    then: Behaviour | None = None
    gate: Gate | None = None
    stream: Stream | None = None
    body: bytes = b""  # "raw": the bytes sent as they are, with ``headers``
    headers: tuple[tuple[str, str], ...] = ()


class Gate:
    """A held request: ``arrived`` is set when it reaches the server, and it is
    answered once the test calls :meth:`release` (or the server stops)."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.released = threading.Event()

    def release(self) -> None:
        self.released.set()

    def wait_arrived(self, timeout: float = 30.0) -> None:
        if not self.arrived.wait(timeout):
            raise AssertionError(f"no request reached the held behaviour in {timeout} s")


class FakeOpenAI(LoopbackServer):
    """The server and its programme. ``start()`` / ``stop()``; ``api_base`` for clients."""

    def __init__(self) -> None:
        super().__init__()
        self.name = "fake-openai"
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self._queue: deque[Behaviour] = deque()
        self._lock = threading.Lock()
        self._responder: Callable[[dict[str, Any]], str | None] | None = None
        self._prompt_counter: Callable[[list[dict[str, Any]]], int] | None = None
        # Set when a client closed a trickling response before its end.
        self.client_closed = threading.Event()

    # -- programming -------------------------------------------------------------------
    def reply(self, content: str, *, prompt_tokens: int = 120,
              completion_tokens: int = 30, stream: Stream | None = None) -> FakeOpenAI:
        """Answer with a chat.completion whose message content is ``content`` (streamed
        as ``stream`` says, when the request streams)."""
        self._push(Behaviour("reply", content=content, prompt_tokens=prompt_tokens,
                             completion_tokens=completion_tokens, stream=stream))
        return self

    def fail(self, status: int = 500, message: str = "The server had an error "
             "while processing your request.") -> FakeOpenAI:
        """Answer with an HTTP error and an OpenAI-style ``{"error": {...}}`` body."""
        self._push(Behaviour("fail", status=status, message=message))
        return self

    def raw(self, body: bytes, headers: dict[str, str], status: int = 200) -> FakeOpenAI:
        """Answer ``status`` with ``body`` exactly as given (``Content-Length`` added):
        a compressed body and its ``Content-Encoding``, say, whatever the request asked."""
        self._push(Behaviour("raw", status=status, body=body,
                                       headers=tuple(headers.items())))
        return self

    def sleep(self, seconds: float, *, then: str = '{"reply": "too late"}') -> FakeOpenAI:
        """Wait ``seconds`` (cut short when the server stops), then reply with ``then``."""
        self._push(Behaviour("sleep", seconds=seconds,
                             then=Behaviour("reply", content=then, prompt_tokens=1,
                                            completion_tokens=1)))
        return self

    def hold(self, content: str, *, prompt_tokens: int = 120,
             completion_tokens: int = 30) -> Gate:
        """Hold the next request until the returned gate is released, then reply with
        ``content``: the test decides what happens while the model "thinks"."""
        gate = Gate()
        self._push(Behaviour("hold", gate=gate, then=Behaviour(
            "reply", content=content, prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens)))
        return gate

    def trickle(self, seconds: float) -> FakeOpenAI:
        """Answer 200 at once, then one byte of the body (JSON's leading whitespace) every
        0.1 s for ``seconds``, as a server still generating does: no read ever times out.
        A client that gives up and closes the connection sets :attr:`client_closed`."""
        self._push(Behaviour("trickle", seconds=seconds))
        return self

    def respond_with(self, responder: Callable[[dict[str, Any]], str | None]) -> FakeOpenAI:
        """Answer requests the queue has nothing for with ``responder(body)`` (a model
        played by the test); ``None`` from it answers HTTP 500, like an empty queue."""
        self._responder = responder
        return self

    def count_prompts(self, counter: Callable[[list[dict[str, Any]]], int]) -> FakeOpenAI:
        """Report ``counter(messages)`` as every reply's ``usage.prompt_tokens``, as a
        provider counts what it received with its own tokenizer."""
        self._prompt_counter = counter
        return self

    def _push(self, behaviour: Behaviour) -> None:
        with self._lock:
            self._queue.append(behaviour)

    def _next(self, body: dict[str, Any], path: str) -> Behaviour | None:
        found = self._behaviour(body, path)
        if found is not None and found.kind == "reply" and self._prompt_counter is not None:
            found = replace(found, prompt_tokens=self._prompt_counter(body["messages"]))
        return found

    def _behaviour(self, body: dict[str, Any], path: str) -> Behaviour | None:
        with self._lock:
            self.requests.append(body)
            self.paths.append(path)
            if self._queue:
                return self._queue.popleft()
            responder = self._responder
        content = responder(body) if responder is not None else None
        return Behaviour("reply", content=content, prompt_tokens=100, completion_tokens=20) \
            if content is not None else None

    @property
    def pending(self) -> int:
        """Behaviours queued but not used yet."""
        with self._lock:
            return len(self._queue)

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.requests)

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"



class _Handler(BaseHTTPRequestHandler):
    fake: FakeOpenAI
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0].rstrip("/")
        if path not in PATHS:
            self._send(404, _error(f"no route for {path}", "invalid_request_error", 404))
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send(400, _error("the body is not JSON", "invalid_request_error", 400))
            return
        behaviour = self.fake._next(body, path)
        if behaviour is None:
            self._send(500, _error("fake server: no behaviour queued for this request",
                                   "server_error", 500))
            return
        if behaviour.kind == "hold":
            assert behaviour.gate is not None and behaviour.then is not None
            behaviour.gate.arrived.set()
            while not behaviour.gate.released.wait(0.05):
                if self.fake._stopping.is_set():
                    return
            behaviour = behaviour.then
        if behaviour.kind == "trickle":
            self._trickle(behaviour.seconds)
            return
        if behaviour.kind == "sleep":
            if self.fake._stopping.wait(behaviour.seconds):
                return
            assert behaviour.then is not None
            behaviour = behaviour.then
        if behaviour.kind == "raw":
            self._raw(behaviour)
            return
        if behaviour.kind == "fail":
            self._send(behaviour.status, _error(behaviour.message, "server_error",
                                                behaviour.status))
            return
        if wants_stream("openai", body, path):
            options = body.get("stream_options") or {}
            usage = {"prompt_tokens": behaviour.prompt_tokens,
                     "completion_tokens": behaviour.completion_tokens,
                     "total_tokens": behaviour.prompt_tokens + behaviour.completion_tokens}
            how = behaviour.stream or Stream()
            send(self, openai_chunks(behaviour.content or "", str(body.get("model") or "fake"),
                                     None, usage if options.get("include_usage") else None,
                                     how.piece), how, self.fake._stopping)
            return
        self._send(200, {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model") or "fake-model"),
            "system_fingerprint": "fp_fake",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": behaviour.content,
                            "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }],
            "usage": {
                "prompt_tokens": behaviour.prompt_tokens,
                "completion_tokens": behaviour.completion_tokens,
                "total_tokens": behaviour.prompt_tokens + behaviour.completion_tokens,
            },
        })

    def _trickle(self, seconds: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end and not self.fake._stopping.is_set():
                self.wfile.write(b"1\r\n \r\n")
                self.wfile.flush()
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            self.fake.client_closed.set()  # the client closed the request: stop generating
            return
        self.close_connection = True

    def _raw(self, b: Behaviour) -> None:
        send_raw(self, b.status, b.headers, b.body)

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout): nothing to answer


def _error(message: str, kind: str, status: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None,
                      "code": str(status)}}


FakeOpenAI.handler = _Handler  # defined after the server class it serves
