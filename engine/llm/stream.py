"""Streamed model calls: the answer's text as it arrives, and which routes stream.

A request with :attr:`~engine.llm.request.ModelRequest.on_text` is sent with
``stream=True`` (and ``stream_options.include_usage``, for the token counts)
where the route streams. :func:`consume` reads the stream; ``on_text`` gets each
piece the answer grows by (the content's deltas, or on the ``tool`` strategy the
forced tool call's argument deltas), never the whole text again: the cost of a
stream is linear in its length, however small its chunks.

- **OpenAI's wire** (OpenAI, Azure, and the OpenAI-compatible servers litellm reaches
  through the OpenAI SDK): the body of the response litellm opened is read here, its
  Server-Sent Events parsed strictly (each ``data:`` a JSON object, orjson), and the
  answer, its finish reason and its ``usage`` built into one response, as a call that
  did not stream returns it. litellm's per-chunk objects (some 450 µs of CPU a chunk)
  are never made: bench/stream_chunks.py.
- **Other wires** (Anthropic, Gemini, Ollama, Bedrock): litellm's chunks, then
  ``litellm.stream_chunk_builder`` for usage and cost, run in a worker thread so that
  the event loop is not held by it, on the chunks it needs only (each run of chunks
  that only add text merged into its first).

Either way a stream of more than :data:`MAX_CHUNKS` chunks is refused
(:class:`~engine.errors.ResponseRefused`: not retried, the turn takes the stage's
fallback), and the read gives the event loop a turn at least every
:data:`YIELD_SECONDS` of work, so that other sessions, ``/healthz`` and the turn's own
deadline are never held up by a fast stream of small chunks.

A route that cannot stream answers in one piece, and the caller shows it as one
event: a model whose price map says ``supports_native_streaming: false``, and a
server that refused ``stream`` once (HTTP 400/422 naming it): that one is not asked
to stream again in this process, and the log says why.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import httpx

from . import sse
from .sse import MAX_CHUNKS

__all__ = ["MAX_CHUNKS", "YIELD_SECONDS", "consume", "forget", "refused", "stop_streaming",
           "streams"]

log = logging.getLogger("funnel.models")

#: The most a stream is read without giving the event loop a turn.
YIELD_SECONDS = 0.005

# (model, api_base) of servers that refused to stream, for the life of the process.
_refused: set[tuple[str, str]] = set()
_NAMES_STREAM = re.compile(r"\bstream(?:ing|_options)?\b", re.IGNORECASE)


def streams(litellm: Any, model: str, api_base: str | None, provider: str) -> bool:
    """Whether a call to ``model`` is sent with ``stream=True``."""
    if (model, api_base or "") in _refused:
        return False
    try:
        return bool(litellm.supports_native_streaming(model=model,
                                                      custom_llm_provider=provider))
    except Exception:  # a litellm without the helper: every route it knows streams
        return True


def refused(exc: BaseException, status: int | None, text: str) -> bool:
    """Whether ``exc`` is a server refusing the ``stream`` parameter itself."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    invalid = status in (400, 422) or bool(names & {"BadRequestError",
                                                    "UnprocessableEntityError"})
    return invalid and bool(_NAMES_STREAM.search(text))


def stop_streaming(model: str, api_base: str | None, reason: str) -> None:
    """Ask ``model`` for whole answers from now on (its server refused to stream)."""
    key = (model, api_base or "")
    if key not in _refused:
        _refused.add(key)
        log.warning("model %s%s refused to stream (%s); asking for whole answers from now on",
                    model, f" at {api_base}" if api_base else "", reason[:200])


def forget() -> None:
    """Forget every refusal (for tests)."""
    _refused.clear()


async def consume(litellm: Any, stream: Any, messages: list[dict[str, Any]],
                  on_text: Callable[[str], None], model: str = "") -> Any:
    """Read a litellm stream to its end, telling ``on_text`` each piece of the answer.

    Returns:
        The stream built into one response, as ``acompletion`` without ``stream``
        returns it.

    Raises:
        ResponseRefused: more than :data:`MAX_CHUNKS` chunks, or (OpenAI's wire) an
            event that is not a JSON object.
    """
    response = _raw_response(stream)
    try:
        if response is not None:
            return await _read_openai(litellm, response, on_text, model)
        return await _read_chunks(litellm, stream, messages, on_text, model)
    finally:
        await _close(stream, response)


class _Breather:
    """Gives the event loop a turn after :data:`YIELD_SECONDS` of reading without one."""

    def __init__(self) -> None:
        self._since = time.perf_counter()

    async def __call__(self) -> None:
        if time.perf_counter() - self._since >= YIELD_SECONDS:
            await asyncio.sleep(0)
            self._since = time.perf_counter()


class _Answer:
    """The answer's pieces, and ``on_text`` told each one. A forced tool call's
    arguments are the answer once they come: content before them is void."""

    def __init__(self, on_text: Callable[[str], None]) -> None:
        self.content: list[str] = []
        self.arguments: list[str] = []
        self._on_text = on_text

    def add(self, content: str, arguments: str) -> None:
        """One chunk's content and tool-call arguments (either may be empty)."""
        if arguments:
            if not self.arguments and self.content:
                self._on_text("")
            self.arguments.append(arguments)
            self._on_text(arguments)
        elif content:
            self.content.append(content)
            if not self.arguments:
                self._on_text(content)


def _raw_response(stream: Any) -> httpx.Response | None:
    """The unread HTTP response under litellm's stream when it is OpenAI's wire (the
    OpenAI SDK's ``AsyncStream``), else None."""
    inner = getattr(stream, "completion_stream", None)
    response = getattr(inner, "response", None)
    if (type(inner).__name__ == "AsyncStream" and type(inner).__module__.startswith("openai")
            and isinstance(response, httpx.Response) and not response.is_stream_consumed):
        return response
    return None


async def _read_openai(litellm: Any, response: httpx.Response,
                       on_text: Callable[[str], None], model: str) -> Any:
    reader = sse.ChunkReader(model, MAX_CHUNKS)
    answer = _Answer(on_text)
    breathe = _Breather()
    try:
        async for data in response.aiter_bytes():
            for content, arguments in reader.feed(data):
                answer.add(content, arguments)
            await breathe()
        for content, arguments in reader.end():
            answer.add(content, arguments)
    except sse.ErrorEvent as exc:
        raise litellm.InternalServerError(message=str(exc), llm_provider="openai",
                                          model=model) from None
    except httpx.TimeoutException as exc:
        raise litellm.Timeout(message=f"the stream stopped: {type(exc).__name__}",
                              model=model, llm_provider="openai") from None
    except httpx.TransportError as exc:
        raise litellm.APIConnectionError(
            message=f"the stream broke: {type(exc).__name__}: {exc}", llm_provider="openai",
            model=model) from None
    body = reader.response("".join(answer.content), "".join(answer.arguments))
    # A stream without usage answers none (zeros): the caller counts the tokens itself.
    return litellm.ModelResponse(**body)


async def _read_chunks(litellm: Any, stream: Any, messages: list[dict[str, Any]],
                       on_text: Callable[[str], None], model: str) -> Any:
    chunks = _Chunks()
    answer = _Answer(on_text)
    breathe = _Breather()
    count = 0
    async for chunk in stream:
        count += 1
        if count > MAX_CHUNKS:
            raise sse.refused_chunks(model, MAX_CHUNKS)
        content: list[str] = []
        arguments: list[str] = []
        for choice in getattr(chunk, "choices", None) or []:
            delta = getattr(choice, "delta", None)
            piece = getattr(delta, "content", None)
            if isinstance(piece, str) and piece:
                content.append(piece)
            for call in getattr(delta, "tool_calls", None) or []:
                if (getattr(call, "index", 0) or 0) != 0:
                    continue  # the answer is the first (the forced) tool call
                part = getattr(getattr(call, "function", None), "arguments", None)
                if isinstance(part, str) and part:
                    arguments.append(part)
        chunks.add(chunk)
        answer.add("".join(content), "".join(arguments))
        await breathe()
    # Linear, but some ms a hundred chunks: off the loop, so that it holds no other session.
    return await asyncio.to_thread(litellm.stream_chunk_builder, chunks.done(),
                                   messages=messages)


class _Chunks:
    """The chunks ``stream_chunk_builder`` needs, with each run of chunks that only add
    text merged into the run's first: the others are not kept (thousands of small
    chunks kept alive set off full garbage collections, which stall the loop)."""

    def __init__(self) -> None:
        self.kept: list[Any] = []
        self._head: Any = None  # the first delta of the current run
        self._field = ""  # what the run adds to: "content" or "arguments"
        self._run: list[str] = []

    def add(self, chunk: Any) -> None:
        field, delta, text = _plain(chunk)
        if field and field == self._field:
            self._run.append(text)  # the chunk itself is dropped
            return
        self._close()
        self.kept.append(chunk)
        if field:
            self._head, self._field, self._run = delta, field, [text]

    def done(self) -> list[Any]:
        self._close()
        return self.kept

    def _close(self) -> None:
        if self._head is not None and len(self._run) > 1:
            text = "".join(self._run)
            if self._field == "content":
                self._head.content = text
            else:
                self._head.tool_calls[0].function.arguments = text
        self._head, self._field, self._run = None, "", []


def _plain(chunk: Any) -> tuple[str, Any, str]:
    """("content" or "arguments", its delta, its text) for a chunk that only adds text
    to the answer (one choice, no finish, no usage, nothing else); else ("", None, "")."""
    choices = getattr(chunk, "choices", None)
    if (not isinstance(choices, list) or len(choices) != 1
            or getattr(chunk, "usage", None) is not None):
        return "", None, ""
    choice = choices[0]
    delta = getattr(choice, "delta", None)
    if delta is None or getattr(choice, "finish_reason", None) is not None or any(
            getattr(delta, name, None) for name in _OTHER_DELTA_FIELDS):
        return "", None, ""
    content = getattr(delta, "content", None)
    calls = getattr(delta, "tool_calls", None)
    if not calls:
        return ("content", delta, content) if isinstance(content, str) and content else (
            "", None, "")
    if content or not isinstance(calls, list) or len(calls) != 1:
        return "", None, ""
    call = calls[0]
    function = getattr(call, "function", None)
    arguments = getattr(function, "arguments", None)
    if ((getattr(call, "index", 0) or 0) != 0 or getattr(call, "id", None)
            or getattr(function, "name", None) or not isinstance(arguments, str)
            or not arguments):
        return "", None, ""
    return "arguments", delta, arguments


# A delta holding any of these is kept as it is (what the builder makes of them is its own).
_OTHER_DELTA_FIELDS = ("function_call", "reasoning_content", "thinking_blocks", "audio",
                       "annotations", "images", "provider_specific_fields")


async def _close(stream: Any, response: httpx.Response | None) -> None:
    """Release the connection (a stream given up mid-way, at the deadline or refused)."""
    try:
        if response is not None:
            await response.aclose()
        else:
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()
    except Exception:  # closing a broken stream: nothing left to tell
        return
