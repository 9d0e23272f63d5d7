"""Streamed answers for the fake model servers, in each provider's wire format (stdlib only).

A request with ``"stream": true`` (OpenAI's and Anthropic's), or to a streaming
route (Gemini's ``:streamGenerateContent``; Ollama's ``"stream": true`` too),
is answered with the same content as a whole answer, cut in pieces of ``piece``
characters:

=============== ============================================================
OpenAI's        ``text/event-stream`` of ``chat.completion.chunk`` objects: content
                deltas, or ``tool_calls`` deltas (``function.arguments`` in pieces) for
                a forced tool; a last chunk with ``usage`` when
                ``stream_options.include_usage``; ``data: [DONE]``
Anthropic's     ``message_start``, ``content_block_start`` (text or ``tool_use``),
                ``content_block_delta`` (``text_delta`` / ``input_json_delta``),
                ``content_block_stop``, ``message_delta`` (stop reason, output tokens),
                ``message_stop``
Gemini's        ``alt=sse``: a ``GenerateContentResponse`` per piece, usage on the last
Ollama's        NDJSON: a chat (or generate) object per piece, then ``done: true``
=============== ============================================================

The body is sent with chunked transfer encoding. ``Stream.cut_after`` ends the
connection after that many characters without finishing the body (a provider that
fails mid-stream: the client sees an incomplete chunked read); ``Stream.hold``, a
``threading.Event``, is waited for once ``hold_after`` characters are out (for tests that look at
what was shown while the model is still writing; a stopping server wakes it).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any


@dataclass(frozen=True)
class Stream:
    """How a streamed answer is sent."""

    piece: int = 6
    cut_after: int | None = None
    hold: threading.Event | None = None
    hold_after: int = 16  # characters sent before ``hold`` is waited for
    # When given: (time.perf_counter(), characters of text sent so far) after each event.
    marks: list[tuple[float, int]] | None = None
    # OpenAI's wire: chunks with only `choices` (and `usage`), as small as a server sends
    # them (some 60 bytes): a long answer a character a chunk stays under the engine's
    # 8 MiB bound on a response (the full chunk is some 240 bytes).
    lean: bool = False


def wants_stream(wire: str, body: dict[str, Any], path: str) -> bool:
    """Whether the request asks for a streamed answer, as each wire says it."""
    if wire == "gemini":
        return ":streamGenerateContent" in path
    return body.get("stream") is True


def pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def openai_chunks(content: str, model: str, tool: str | None, usage: dict[str, Any] | None,
                  size: int, lean: bool = False) -> Iterator[tuple[str | None, Any]]:
    """OpenAI's chat.completion.chunk events (``usage``: the last chunk's, if asked)."""
    ident, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        if lean:
            return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return {"id": ident, "object": "chat.completion.chunk", "created": created,
                "model": model, "system_fingerprint": "fp_fake",
                "choices": [{"index": 0, "delta": delta, "logprobs": None,
                             "finish_reason": finish}]}

    call = f"call_{uuid.uuid4().hex[:24]}"
    if tool is not None:
        yield None, chunk({"role": "assistant", "content": None, "tool_calls": [{
            "index": 0, "id": call, "type": "function",
            "function": {"name": tool, "arguments": ""}}]})
    else:
        yield None, chunk({"role": "assistant", "content": ""})
    for part in pieces(content, size):
        if tool is not None:
            yield None, chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
        else:
            yield None, chunk({"content": part})
    yield None, chunk({}, "tool_calls" if tool is not None else "stop")
    if usage is not None:
        yield None, ({"choices": [], "usage": usage} if lean else
                     {"id": ident, "object": "chat.completion.chunk", "created": created,
                      "model": model, "choices": [], "usage": usage})
    yield None, "[DONE]"


def anthropic_events(content: str, model: str, tool: str | None, usage: dict[str, Any],
                     size: int) -> Iterator[tuple[str | None, Any]]:
    """Anthropic's Messages event stream."""
    start_usage = {**usage, "output_tokens": 1}
    yield "message_start", {"type": "message_start", "message": {
        "id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
        "content": [], "model": model, "stop_reason": None, "stop_sequence": None,
        "usage": start_usage}}
    block: dict[str, Any] = ({"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}",
                              "name": tool, "input": {}} if tool is not None
                             else {"type": "text", "text": ""})
    yield "content_block_start", {"type": "content_block_start", "index": 0,
                                  "content_block": block}
    for part in pieces(content, size):
        delta = ({"type": "input_json_delta", "partial_json": part} if tool is not None
                 else {"type": "text_delta", "text": part})
        yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                      "delta": delta}
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    yield "message_delta", {"type": "message_delta", "delta": {
        "stop_reason": "tool_use" if tool is not None else "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": usage.get("output_tokens", 0)}}
    yield "message_stop", {"type": "message_stop"}


def gemini_events(content: str, model: str, usage: dict[str, Any], size: int
                  ) -> Iterator[tuple[str | None, Any]]:
    parts = pieces(content, size)
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        item: dict[str, Any] = {"candidates": [{"content": {"parts": [{"text": part}],
                                                            "role": "model"}, "index": 0,
                                                **({"finishReason": "STOP"} if last else {})}],
                                "modelVersion": model}
        if last:
            item["usageMetadata"] = usage
        yield None, item


def ollama_lines(content: str, model: str, generate: bool, prompt: int, completion: int,
                 size: int) -> Iterator[tuple[str | None, Any]]:
    common = {"model": model, "created_at": "2026-12-01T00:00:00Z"}
    for part in pieces(content, size):
        yield None, ({**common, "response": part, "done": False} if generate else
                     {**common, "message": {"role": "assistant", "content": part},
                      "done": False})
    end = {**common, "done": True, "done_reason": "stop", "total_duration": 1000,
           "prompt_eval_count": prompt, "eval_count": completion}
    yield None, ({**end, "response": ""} if generate else
                 {**end, "message": {"role": "assistant", "content": ""}})


def send(handler: BaseHTTPRequestHandler, events: Iterator[tuple[str | None, Any]],
         how: Stream, stopping: threading.Event, *, ndjson: bool = False) -> None:
    """Write ``events`` as a chunked ``text/event-stream`` (or NDJSON) response."""
    handler.close_connection = True
    try:
        handler.send_response(200)
        handler.send_header("Content-Type",
                            "application/x-ndjson" if ndjson else "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        sent, held = 0, False
        for event, data in events:
            if ndjson:
                frame = json.dumps(data) + "\n"
            else:
                text = data if isinstance(data, str) else json.dumps(data)
                frame = (f"event: {event}\n" if event else "") + f"data: {text}\n\n"
            raw = frame.encode()
            handler.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            handler.wfile.flush()
            sent += _text_in(data)
            if how.marks is not None:
                how.marks.append((time.perf_counter(), sent))
            if how.cut_after is not None and sent >= how.cut_after:
                return  # no terminating chunk: the body is incomplete
            if not held and sent >= how.hold_after and how.hold is not None:
                held = True
                while not how.hold.wait(0.05):
                    if stopping.is_set():
                        return
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the client went away


def _text_in(data: Any) -> int:
    """Characters of answer text an event carries (for ``cut_after`` and ``hold``)."""
    if not isinstance(data, dict):
        return 0
    found = 0
    for choice in data.get("choices") or []:
        delta = choice.get("delta") or {}
        found += len(delta.get("content") or "")
        for call in delta.get("tool_calls") or []:
            found += len((call.get("function") or {}).get("arguments") or "")
    delta = data.get("delta")
    if isinstance(delta, dict):
        found += len(delta.get("text") or delta.get("partial_json") or "")
    for candidate in data.get("candidates") or []:
        for part in (candidate.get("content") or {}).get("parts") or []:
            found += len(part.get("text") or "")
    if not data.get("done", True):
        found += len(data.get("response") or (data.get("message") or {}).get("content") or "")
    return found


def send_raw(handler: BaseHTTPRequestHandler, status: int,
             headers: Iterable[tuple[str, str]], body: bytes) -> None:
    """Write ``body`` as it is, with ``headers`` (a gzip bomb, an odd encoding): the fake
    servers' ``raw`` behaviour. A client that stops reading (a bound reached) is fine."""
    try:
        handler.send_response(status)
        for name, value in headers:
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
        handler.wfile.flush()
    except (BrokenPipeError, ConnectionResetError):
        pass
