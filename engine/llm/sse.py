"""OpenAI's streamed chat answer, read from the bytes of its body: strict and linear.

A streamed chat completion on OpenAI's wire is a ``text/event-stream`` of
``chat.completion.chunk`` objects, ``data: [DONE]`` at the end. :class:`ChunkReader`
takes the body's bytes as they arrive (:meth:`~ChunkReader.feed`), splits the events
(lines ending in LF or CRLF, a blank line between events, ``data:`` fields joined,
other fields and comments ignored), and reads each ``data`` as one JSON object
(orjson: nothing but strict JSON). What it keeps is what the answer is: the first
choice's content deltas, the first tool call's id, name and argument deltas, the
finish reason, and the last ``usage``. Each byte is handled once.

Refused (:class:`~engine.errors.ResponseRefused`, the read stops): an event that is
not a JSON object, a field of the wrong type, more than :data:`MAX_CHUNKS` events, a
line longer than :data:`MAX_LINE_BYTES`. An ``error`` object in the stream (a
provider failing mid-answer) is :class:`ErrorEvent`, which the caller retries like a
server error.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..boundary.sanitize import excerpt, token_count
from ..errors import ResponseRefused

__all__ = ["MAX_CHUNKS", "MAX_LINE_BYTES", "ChunkReader", "ErrorEvent"]

#: Chunks one streamed answer may take. A 64,000-character answer (the most the engine
#: takes) sent a token a chunk is some 16,000; a character a chunk, 64,000.
MAX_CHUNKS = 100_000
#: The longest line of an event stream (one chunk's JSON is some hundreds of bytes).
MAX_LINE_BYTES = 1024 * 1024


class ErrorEvent(Exception):
    """The stream carried an ``error`` object: the provider failed mid-answer."""


def refused_chunks(model: str, limit: int) -> ResponseRefused:
    return ResponseRefused(
        f"the stream of model {model!r} went past {limit:,} chunks: read no further (an "
        "answer the engine takes is far fewer; a server sending this is broken or hostile)")


class ChunkReader:
    """The answer in an OpenAI chunk stream, from its bytes (:meth:`feed`, :meth:`end`)."""

    def __init__(self, model: str, limit: int = MAX_CHUNKS) -> None:
        self.model = model
        self.limit = limit
        self.chunks = 0
        self.done = False  # data: [DONE] came
        self.ident: str | None = None
        self.created: int | None = None
        self.served_by: str | None = None
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.tool_id: str | None = None
        self.tool_name: str | None = None
        self._line: list[bytes] = []  # the start of a line cut between reads
        self._line_bytes = 0
        self._data: list[bytes] = []  # the data fields of the event being read

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        """The next bytes of the body: what each chunk they finish adds to the answer,
        as (content, tool-call arguments); chunks that add nothing are left out."""
        pieces: list[tuple[str, str]] = []
        end = data.rfind(b"\n")
        if end < 0:
            self._partial(data)
            return pieces
        head = data[:end]
        if self._line:
            head = b"".join(self._line) + head
            self._line, self._line_bytes = [], 0
        self._partial(data[end + 1:])
        if b"\r" in head:  # CRLF line ends (a CR cut from its LF ends the head)
            head = head.replace(b"\r\n", b"\n").removesuffix(b"\r")
        for line in head.split(b"\n"):
            if not line:
                if self._data:
                    self._event(self._data[0] if len(self._data) == 1
                                else b"\n".join(self._data), pieces)
                    self._data = []
            elif line.startswith(b"data:"):
                if len(line) > MAX_LINE_BYTES:
                    raise self._refused(f"a line of {len(line):,} bytes")
                value = line[5:]
                self._data.append(value[1:] if value[:1] == b" " else value)
            # event:, id:, retry: fields and ": comments" say nothing about the answer
        return pieces

    def end(self) -> list[tuple[str, str]]:
        """The body ended: an event it did not close with a blank line is read too."""
        pieces = self.feed(b"\n") if self._line else []
        if self._data:
            self._event(b"\n".join(self._data), pieces)
            self._data = []
        return pieces

    def _partial(self, piece: bytes) -> None:
        if piece:
            self._line.append(piece)
            self._line_bytes += len(piece)
            if self._line_bytes > MAX_LINE_BYTES:
                raise self._refused(f"a line longer than {MAX_LINE_BYTES:,} bytes")

    def _event(self, payload: bytes, pieces: list[tuple[str, str]]) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        self.chunks += 1
        if self.chunks > self.limit:
            raise refused_chunks(self.model, self.limit)
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise self._refused(f"an event that is not JSON: {_bytes(payload)}") from None
        if type(chunk) is not dict:
            raise self._refused(f"an event that is not a JSON object: {_bytes(payload)}")
        error = chunk.get("error")
        if error:
            message = error.get("message") if isinstance(error, dict) else error
            raise ErrorEvent(f"the stream of model {self.model!r} ended with an error: "
                             f"{excerpt(message, 200)}")
        if self.chunks == 1:
            self.ident = _text(chunk.get("id"))
            created = chunk.get("created")
            self.created = created if type(created) is int else None
            self.served_by = _text(chunk.get("model"))
        choices = chunk.get("choices")
        if choices:
            if type(choices) is not list:
                raise self._refused("`choices` that is not a list")
            content = arguments = ""
            for choice in choices:
                # The answer is the first choice (index 0, or none said).
                if type(choice) is dict and not choice.get("index"):
                    more, args = self._choice(choice)
                    content += more
                    arguments += args
            if content or arguments:
                pieces.append((content, arguments))
        usage = chunk.get("usage")
        if usage is not None and type(usage) is dict:
            self.usage = usage

    def _choice(self, choice: dict[str, Any]) -> tuple[str, str]:
        finish = choice.get("finish_reason")
        if finish is not None and type(finish) is str:
            self.finish = finish[:40]
        delta = choice.get("delta")
        if not delta:
            return "", ""
        if type(delta) is not dict:
            raise self._refused("a `delta` that is not an object")
        content = delta.get("content") or ""
        if type(content) is not str:
            raise self._refused("a `content` delta that is not a string")
        calls = delta.get("tool_calls")
        if not calls:
            return content, ""
        if type(calls) is not list:
            raise self._refused("`tool_calls` that is not a list")
        arguments = ""
        for call in calls:
            if type(call) is dict and not call.get("index"):
                arguments += self._call(call)
        return content, arguments

    def _call(self, call: dict[str, Any]) -> str:
        if self.tool_id is None:
            self.tool_id = _text(call.get("id"))
        function = call.get("function")
        if type(function) is not dict:
            return ""
        if self.tool_name is None:
            self.tool_name = _text(function.get("name"))
        part = function.get("arguments") or ""
        if type(part) is not str:
            raise self._refused("tool-call `arguments` that are not a string")
        return part

    def response(self, content: str, arguments: str) -> dict[str, Any]:
        """The answer as a ``chat.completion`` (what a call that did not stream returns),
        its ``usage`` reduced to counts (None when the stream said none: litellm's
        response then says zeros, which the caller knows for counts it must make)."""
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if arguments or self.tool_name:
            message["tool_calls"] = [{
                "id": self.tool_id or "call_0", "type": "function",
                "function": {"name": self.tool_name or "", "arguments": arguments}}]
        default = "tool_calls" if "tool_calls" in message else "stop"
        return {"id": self.ident or "chatcmpl-stream", "object": "chat.completion",
                "created": self.created or 0, "model": self.served_by or self.model,
                "choices": [{"index": 0, "message": message,
                             "finish_reason": self.finish or default}],
                "usage": counts(self.usage) if self.usage is not None else None}

    def _refused(self, what: str) -> ResponseRefused:
        return ResponseRefused(f"the stream of model {self.model!r} sent {what}: read no "
                               "further")


def counts(usage: dict[str, Any]) -> dict[str, Any]:
    """A stream's ``usage`` with only its counts (and their details' counts), bounded."""
    out: dict[str, Any] = {}
    for key, value in list(usage.items())[:40]:
        if isinstance(value, dict):
            inner = {k: token_count(v) for k, v in list(value.items())[:40] if _count(v)}
            if inner:
                out[str(key)[:60]] = inner
        elif _count(value):
            out[str(key)[:60]] = token_count(value)
    return out


def _count(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _text(value: Any) -> str | None:
    return value[:200] if isinstance(value, str) and value else None


def _bytes(payload: bytes) -> str:
    return excerpt(payload[:200].decode("utf-8", "replace"))
