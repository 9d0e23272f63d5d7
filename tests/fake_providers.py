"""Recording fake model servers for every wire format the engine meets (stdlib only).

One class, :class:`FakeProvider`, speaks one wire format chosen at start:

============ ===============================================================
``openai``   ``POST /v1/chat/completions`` (chat.completion, ``tool_calls``)
``azure``    ``POST /openai/deployments/{deployment}/chat/completions``
``anthropic`` ``POST /v1/messages`` (``tool_use`` blocks for a forced tool,
             text blocks otherwise, ``output_format`` accepted)
``ollama``   ``POST /api/chat`` and ``POST /api/generate``
``gemini``   ``POST .../models/{model}:generateContent``
``lmstudio`` OpenAI's, but ``response_format: json_object`` is a 400 (LM Studio's
             wording: ``'response_format.type' must be 'json_schema' or 'text'``)
``llamacpp`` OpenAI's, but ``response_format.type`` other than ``text`` and
             ``json_object`` is a 500 naming ``response_format`` (llama-cpp-python
             turns its request validation error into a 500)
``bedrock``  ``POST /model/{modelId}/converse`` (Converse: ``toolUse`` blocks for a
             forced tool, text blocks otherwise) and ``POST /model/{modelId}/invoke``
             (Claude: Anthropic's Messages shape; Nova: Converse's); requests must
             be SigV4-signed (any key)
============ ===============================================================

As in tests/fake_openai.py, each request takes the next queued behaviour
(``reply``, ``fail``, ``sleep``); with the queue empty the answer is an error,
so an unexpected extra call shows. Every body, path and header set is
recorded. A refusal (``lmstudio``, ``llamacpp``) is answered before the queue
is read. Errors are worded in each provider's own error shape, and ``fail``
can send ``Retry-After``.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from fake_stream import (
    Stream,
    anthropic_events,
    gemini_events,
    ollama_lines,
    openai_chunks,
    send,
    send_raw,
    wants_stream,
)
from loopback import LoopbackServer

WIRES = ("openai", "azure", "anthropic", "ollama", "gemini", "lmstudio", "llamacpp",
         "bedrock")


@dataclass(frozen=True)
class Behaviour:
    kind: str  # "reply" | "fail" | "sleep"
    content: str = ""
    status: int = 200
    message: str = ""
    retry_after: str | None = None
    seconds: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, read from the provider's prompt cache
    written_tokens: int = 0  # of prompt_tokens, written to the provider's prompt cache
    then: Behaviour | None = None
    stream: Stream | None = None  # how a streamed answer is sent (tests/fake_stream.py)
    body: bytes = b""  # "raw": the bytes sent as they are, with ``headers``
    headers: tuple[tuple[str, str], ...] = ()
    # False: an OpenAI-shaped response carries no `usage` (some OpenAI-compatible servers
    # and proxies answer so; litellm then reports zeros).
    usage: bool = True


class FakeProvider(LoopbackServer):
    """A fake server for one wire format; ``start()``/``stop()``, ``api_base`` for clients."""

    def __init__(self, wire: str, *, key: str | None = None, require_key: bool = True) -> None:
        super().__init__()
        self.name = f"fake-{wire}"
        assert wire in WIRES, wire
        self.wire = wire
        self.key = key  # when set, only this key is accepted (401 otherwise)
        self.require_key = require_key
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self._queue: deque[Behaviour] = deque()
        self._lock = threading.Lock()

    # -- programming -------------------------------------------------------------------
    def reply(self, content: str, *, prompt_tokens: int = 120, completion_tokens: int = 30,
              cached_tokens: int = 0, written_tokens: int = 0,
              stream: Stream | None = None, usage: bool = True) -> FakeProvider:
        """Answer with ``content`` (the envelope's JSON text) in the wire's response shape;
        ``cached_tokens`` of the prompt tokens were read from the prompt cache (reported as
        the wire reports it: Anthropic's ``cache_read_input_tokens``, OpenAI's
        ``prompt_tokens_details.cached_tokens``, Bedrock Converse's
        ``cacheReadInputTokens``); ``written_tokens`` were written to it (Anthropic's
        ``cache_creation_input_tokens``, OpenRouter's ``prompt_tokens_details.cache_write_tokens``,
        Bedrock's ``cacheWriteInputTokens``); ``usage=False`` leaves ``usage`` out of an
        OpenAI-shaped response."""
        self._queue.append(Behaviour("reply", content=content, prompt_tokens=prompt_tokens,
                                     completion_tokens=completion_tokens,
                                     cached_tokens=cached_tokens,
                                     written_tokens=written_tokens, stream=stream,
                                     usage=usage))
        return self

    def fail(self, status: int = 500, message: str = "The server had an error.",
             *, retry_after: str | None = None) -> FakeProvider:
        self._queue.append(Behaviour("fail", status=status, message=message,
                                     retry_after=retry_after))
        return self

    def raw(self, body: bytes, headers: dict[str, str], status: int = 200) -> FakeProvider:
        """Answer ``status`` with ``body`` exactly as given (``Content-Length`` added):
        a compressed body and its ``Content-Encoding``, say, whatever the request asked."""
        self._queue.append(Behaviour("raw", status=status, body=body,
                                       headers=tuple(headers.items())))
        return self

    def sleep(self, seconds: float, *, then: str = '{"reply": "too late"}') -> FakeProvider:
        self._queue.append(Behaviour("sleep", seconds=seconds,
                                     then=Behaviour("reply", content=then)))
        return self

    def _next(self, body: dict[str, Any], path: str, headers: dict[str, str]) -> Behaviour | None:
        with self._lock:
            self.requests.append(body)
            self.paths.append(path)
            self.headers.append(headers)
            return self._queue.popleft() if self._queue else None

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.requests)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def api_base(self) -> str:
        """The base a litellm client is given for this wire."""
        root = f"http://127.0.0.1:{self.port}"
        if self.wire in ("openai", "lmstudio", "llamacpp"):
            return root + "/v1"
        return root



class _Handler(BaseHTTPRequestHandler):
    fake: FakeProvider
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0].rstrip("/")
        wire = self.fake.wire
        if not _route_ok(wire, path):
            self._send(404, {"error": {"message": f"no route for {path}"}})
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send(400, {"error": {"message": "the body is not JSON"}})
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        behaviour = self.fake._next(body, path, headers)
        refusal = _refusal(wire, body)
        if self.fake.require_key and not _has_key(wire, headers, self.path, self.fake.key):
            refusal = 401, {}
        if refusal is not None:
            if behaviour is not None:  # a refused request does not use up the programme
                with self.fake._lock:
                    self.fake._queue.appendleft(behaviour)
            if refusal[0] == 401:
                self._error(401, "invalid or missing API key")
            else:
                self._send(*refusal)
            return
        if behaviour is None:
            self._error(500, "fake server: no behaviour queued for this request")
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
            self._error(behaviour.status, behaviour.message, behaviour.retry_after)
            return
        if wants_stream(wire, body, path) and wire != "bedrock":
            self._stream(body, path, behaviour)
            return
        self._send(200, _response(wire, body, path, behaviour))

    def _stream(self, body: dict[str, Any], path: str, b: Behaviour) -> None:
        """The answer as the wire streams it (tests/fake_stream.py)."""
        wire, how = self.fake.wire, b.stream or Stream()
        model, tool = str(body.get("model") or "fake-model"), _forced_tool(body)
        usage: dict[str, Any]
        if wire == "anthropic":
            usage = {"input_tokens": b.prompt_tokens - b.cached_tokens - b.written_tokens,
                     "cache_creation_input_tokens": b.written_tokens,
                     "cache_read_input_tokens": b.cached_tokens,
                     "output_tokens": b.completion_tokens}
            events = anthropic_events(b.content, model, tool, usage, how.piece)
        elif wire == "gemini":
            events = gemini_events(b.content, model, {
                "promptTokenCount": b.prompt_tokens, "candidatesTokenCount": b.completion_tokens,
                "totalTokenCount": b.prompt_tokens + b.completion_tokens}, how.piece)
        elif wire == "ollama":
            send(self, ollama_lines(b.content, model, path == "/api/generate", b.prompt_tokens,
                                    b.completion_tokens, how.piece),
                 how, self.fake._stopping, ndjson=True)
            return
        else:
            include = (body.get("stream_options") or {}).get("include_usage")
            usage = {
                     "prompt_tokens": b.prompt_tokens, "completion_tokens": b.completion_tokens,
                     "total_tokens": b.prompt_tokens + b.completion_tokens,
                     "prompt_tokens_details": {"cached_tokens": b.cached_tokens}}
            events = openai_chunks(b.content, model, tool, usage if include else None,
                                   how.piece, how.lean)
        send(self, events, how, self.fake._stopping)

    def _error(self, status: int, message: str, retry_after: str | None = None) -> None:
        wire = self.fake.wire
        if wire == "anthropic":
            kind = {429: "rate_limit_error", 401: "authentication_error", 529: "overloaded_error",
                    400: "invalid_request_error"}.get(status, "api_error")
            payload: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
        elif wire == "ollama":
            payload = {"error": message}
        elif wire == "bedrock":
            payload = {"message": message}
        elif wire == "gemini":
            payload = {"error": {"code": status, "message": message, "status": {
                429: "RESOURCE_EXHAUSTED", 401: "UNAUTHENTICATED", 400: "INVALID_ARGUMENT",
            }.get(status, "INTERNAL")}}
        else:
            payload = {"error": {"message": message, "type": "server_error", "param": None,
                                 "code": str(status)}}
        extra = {"Retry-After": retry_after} if retry_after is not None else {}
        self._send(status, payload, extra)

    def _raw(self, b: Behaviour) -> None:
        send_raw(self, b.status, b.headers, b.body)

    def _send(self, status: int, payload: dict[str, Any],
              extra: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass


def _route_ok(wire: str, path: str) -> bool:
    if wire in ("openai", "lmstudio", "llamacpp"):
        return path in ("/v1/chat/completions", "/chat/completions")
    if wire == "azure":
        return path.startswith("/openai/deployments/") and path.endswith("/chat/completions")
    if wire == "anthropic":
        return path == "/v1/messages"
    if wire == "bedrock":
        return path.startswith("/model/") and path.endswith(("/converse", "/invoke"))
    if wire == "ollama":
        return path in ("/api/chat", "/api/generate")
    return path.endswith((":generateContent", ":streamGenerateContent"))


def _has_key(wire: str, headers: dict[str, str], full_path: str, key: str | None) -> bool:
    if wire == "ollama":
        return True  # a local Ollama has no keys
    if wire == "bedrock":  # SigV4: the fake checks the scheme, not the signature
        given = headers.get("authorization", "")
        return given.startswith("AWS4-HMAC-SHA256 Credential=") and (
            key is None or f"Credential={key}/" in given)
    if wire == "anthropic":
        given = headers.get("x-api-key", "")
    elif wire == "azure":
        given = headers.get("api-key") or headers.get("authorization", "").removeprefix("Bearer ")
    elif wire == "gemini":
        given = headers.get("x-goog-api-key") or (
            full_path.split("key=", 1)[1].split("&", 1)[0] if "key=" in full_path else "")
    else:
        given = headers.get("authorization", "").removeprefix("Bearer ")
    return given == key if key is not None else bool(given)


def _refusal(wire: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if wire == "lmstudio" and kind == "json_object":
        return 400, {"error": "'response_format.type' must be 'json_schema' or 'text'"}
    if wire == "llamacpp" and kind not in (None, "text", "json_object"):
        # llama-cpp-python's route handler turns FastAPI's validation error into a 500
        # (llama_cpp/server/errors.py), worded as pydantic words it.
        return 500, {"error": {"message": (
            "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', "
            "'response_format', 'type'), 'msg': \"Input should be 'text' or 'json_object'\", "
            f"'input': '{kind}', 'ctx': {{'expected': \"'text' or 'json_object'\"}}}}"),
            "type": "internal_server_error", "param": None, "code": None}}
    return None


def _forced_tool(body: dict[str, Any]) -> str | None:
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") == "tool":  # Anthropic
            return str(choice.get("name"))
        function = choice.get("function")
        if isinstance(function, dict):  # OpenAI
            return str(function.get("name"))
    return None


def _response(wire: str, body: dict[str, Any], path: str, b: Behaviour) -> dict[str, Any]:
    model = str(body.get("model") or "fake-model")
    tool = _forced_tool(body)
    if wire == "bedrock" and path.endswith("/converse"):
        return _converse(body, b)
    if wire == "bedrock" and "anthropic_version" not in body:  # Nova on InvokeModel
        return _converse(body, b, invoke=True)
    if wire == "anthropic" or wire == "bedrock":  # Claude on InvokeModel: Anthropic's shape
        if tool is not None:
            try:
                data = json.loads(b.content)
            except json.JSONDecodeError:
                data = {"raw": b.content}
            content: list[dict[str, Any]] = [{"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}",
                                              "name": tool, "input": data}]
            stop = "tool_use"
        else:
            content, stop = [{"type": "text", "text": b.content}], "end_turn"
        return {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
                "model": model, "content": content, "stop_reason": stop, "stop_sequence": None,
                # Anthropic's input_tokens leaves out what was read from or written to
                # the cache.
                "usage": {"input_tokens": b.prompt_tokens - b.cached_tokens - b.written_tokens,
                          "cache_creation_input_tokens": b.written_tokens,
                          "cache_read_input_tokens": b.cached_tokens,
                          "output_tokens": b.completion_tokens}}
    if wire == "ollama":
        common = {"model": model, "created_at": "2026-12-01T00:00:00Z", "done": True,
                  "done_reason": "stop", "total_duration": 1000, "prompt_eval_count":
                  b.prompt_tokens, "eval_count": b.completion_tokens}
        if path == "/api/generate":
            return {**common, "response": b.content}
        return {**common, "message": {"role": "assistant", "content": b.content}}
    if wire == "gemini":
        return {"candidates": [{"content": {"parts": [{"text": b.content}], "role": "model"},
                                "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": b.prompt_tokens,
                                  "candidatesTokenCount": b.completion_tokens,
                                  "totalTokenCount": b.prompt_tokens + b.completion_tokens},
                "modelVersion": model}
    message: dict[str, Any] = {"role": "assistant", "content": b.content, "refusal": None}
    finish = "stop"
    if tool is not None:
        message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [{
            "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": tool, "arguments": b.content}}]}
        finish = "tool_calls"
    answer = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
              "created": int(time.time()), "model": model, "system_fingerprint": "fp_fake",
              "choices": [{"index": 0, "message": message, "logprobs": None,
                           "finish_reason": finish}],
              "usage": {"prompt_tokens": b.prompt_tokens,
                        "completion_tokens": b.completion_tokens,
                        "total_tokens": b.prompt_tokens + b.completion_tokens,
                        "prompt_tokens_details": {"cached_tokens": b.cached_tokens,
                                                  **({"cache_write_tokens": b.written_tokens}
                                                     if b.written_tokens else {})}}}
    if not b.usage:
        del answer["usage"]
    return answer


def _converse(body: dict[str, Any], b: Behaviour, *, invoke: bool = False) -> dict[str, Any]:
    """Bedrock's Converse response: a forced tool (``toolConfig.toolChoice.tool``) answers
    with a ``toolUse`` block, anything else with a text block. Nova on InvokeModel answers
    in the same shape, but counts cache tokens as ``cacheReadInputTokenCount``."""
    choice = (body.get("toolConfig") or {}).get("toolChoice") or {}
    tool = choice.get("tool", {}).get("name") if isinstance(choice, dict) else None
    if tool:
        try:
            data = json.loads(b.content)
        except json.JSONDecodeError:
            data = {"raw": b.content}
        content: list[dict[str, Any]] = [{"toolUse": {
            "toolUseId": f"tooluse_{uuid.uuid4().hex[:20]}", "name": tool, "input": data}}]
        stop = "tool_use"
    else:
        content, stop = [{"text": b.content}], "end_turn"
    # Like Anthropic's, Converse's inputTokens leaves out what was read from the cache.
    return {"output": {"message": {"role": "assistant", "content": content}},
            "stopReason": stop, "metrics": {"latencyMs": 12},
            "usage": {"inputTokens": b.prompt_tokens - b.cached_tokens - b.written_tokens,
                      "outputTokens": b.completion_tokens,
                      "totalTokens": b.prompt_tokens + b.completion_tokens,
                      **({"cacheReadInputTokenCount": b.cached_tokens,
                          "cacheWriteInputTokenCount": b.written_tokens} if invoke else
                         {"cacheReadInputTokens": b.cached_tokens,
                          "cacheWriteInputTokens": b.written_tokens})}}


FakeProvider.handler = _Handler  # defined after the server class it serves
