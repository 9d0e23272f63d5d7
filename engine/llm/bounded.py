"""What a provider's response may decode to: at most :data:`MAX_RESPONSE_BYTES`.

httpx decodes a ``Content-Encoding: gzip`` body in one piece when it is read, so a
200 KB gzip answer of 200 MB of spaces grows the worker by 200 MB (and then by the
JSON parse of it). Every HTTP transport litellm builds for its asynchronous clients
(the OpenAI SDK's client, its own handler for the other providers, the proxies' mounts)
gets its ``handle_async_request`` wrapped: the request offers only the encodings this
module decodes (``gzip``, ``deflate``), and the response's body is decoded here, a
bounded step at a time, its ``Content-Encoding`` removed so httpx does not decode it
again. Past :data:`MAX_RESPONSE_BYTES` decoded (or raw, for an unencoded body) the read
stops with :class:`~engine.errors.ResponseRefused`: the call fails, the turn takes the
stage's fallback and its record names the bound. An encoding the engine did not offer
is refused the same way. A streamed answer (SSE) counts its whole body.

The transports keep their class (litellm checks it to close their sessions): only the
bound method of each instance is replaced. :func:`install` is idempotent; it is called
by :class:`engine.llm.models.LiteLLMModel` before any request.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx

from ..errors import ResponseRefused

log = logging.getLogger("funnel.models")

#: What one response body may decode to. A chat answer is bounded to 64,000 characters by
#: the sanitizing boundary (a streamed one adds about 200 bytes of SSE framing a token), so
#: 8 MiB is far above any real answer and far below what would strain a worker.
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
ACCEPT_ENCODING = "gzip, deflate"
_STEP = 1024 * 1024  # decoded bytes produced per zlib call: the most a step holds at once
_MARK = "_funnel_bounded"


def install(litellm: Any) -> None:
    """Bound every asynchronous transport litellm builds from now on (idempotent)."""
    try:
        handler = litellm.llms.custom_httpx.http_handler.AsyncHTTPHandler
    except AttributeError:  # a litellm without its handler: the test of the bound fails
        log.warning("litellm has no AsyncHTTPHandler: provider responses are not bounded")
        return
    if getattr(handler, _MARK, False):
        return
    make = handler.create_async_transport
    mounts = handler.create_httpx_proxy_mounts

    def create_async_transport(*args: Any, **kwargs: Any) -> Any:
        transport = make(*args, **kwargs)
        if transport is not None:
            bound(transport)
        return transport

    def create_httpx_proxy_mounts(*args: Any, **kwargs: Any) -> Any:
        result = mounts(*args, **kwargs)
        for transport in (result or {}).values():
            if transport is not None:
                bound(transport)
        return result

    # `_create_async_transport` is an alias litellm keeps: both names are the factory.
    handler.create_async_transport = staticmethod(create_async_transport)
    handler._create_async_transport = staticmethod(create_async_transport)
    handler.create_httpx_proxy_mounts = staticmethod(create_httpx_proxy_mounts)
    setattr(handler, _MARK, True)


def bound(transport: Any, limit: int = MAX_RESPONSE_BYTES) -> Any:
    """Make ``transport``'s responses decode here, to at most ``limit`` bytes."""
    if getattr(transport, _MARK, False):
        return transport
    send: Callable[[httpx.Request], Awaitable[httpx.Response]] = transport.handle_async_request

    async def handle_async_request(request: httpx.Request) -> httpx.Response:
        request.headers["Accept-Encoding"] = ACCEPT_ENCODING
        response = await send(request)
        return bounded_response(response, request, limit)

    transport.handle_async_request = handle_async_request
    setattr(transport, _MARK, True)
    return transport


def bounded_response(response: httpx.Response, request: httpx.Request,
                     limit: int = MAX_RESPONSE_BYTES) -> httpx.Response:
    """``response`` with its body decoded by a bounded stream, its encoding removed."""
    codings = [c.strip().lower() for c in
               response.headers.get_list("content-encoding", split_commas=True)]
    codings = [c for c in codings if c and c != "identity"]
    where = f"{request.method} {request.url.copy_with(query=None)}"
    unknown = [c for c in codings if c not in _DECODERS]
    stream = response.stream
    if not isinstance(stream, httpx.AsyncByteStream):
        return response  # a body read already (not what a transport returns)
    if unknown:
        refusal: ResponseRefused | None = ResponseRefused(
            f"the response of {where} came in Content-Encoding {', '.join(unknown)}, which "
            f"the engine did not offer (it accepts {ACCEPT_ENCODING}) and cannot decode "
            "under its bound: not read")
    else:
        refusal = None
    if codings:
        del response.headers["content-encoding"]
        response.headers.pop("content-length", None)
    response.stream = _BoundedStream(stream, codings, limit, where, refusal)
    return response


class _BoundedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, codings: list[str], limit: int,
                 where: str, refusal: ResponseRefused | None) -> None:
        self._inner = inner
        self._codings = codings
        self._limit = limit
        self._where = where
        self._refusal = refusal

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._refusal is not None:
            log.warning("%s", self._refusal)
            raise self._refusal
        # Content-Encoding lists the codings in the order they were applied.
        decoders = [_DECODERS[c]() for c in reversed(self._codings)]
        received = decoded = 0
        async for chunk in self._inner:
            received += len(chunk)
            for piece in _through(decoders, chunk):
                decoded += len(piece)
                if decoded > self._limit:
                    raise self._too_large(received)
                yield piece
        for piece in _through(decoders, None):
            decoded += len(piece)
            if decoded > self._limit:
                raise self._too_large(received)
            yield piece

    def _too_large(self, received: int) -> ResponseRefused:
        how = (f"{received:,} bytes received as {', '.join(self._codings)}"
               if self._codings else f"{received:,} bytes received")
        error = ResponseRefused(
            f"the response of {self._where} decoded past the engine's bound of "
            f"{self._limit:,} bytes ({how}): read no further (a provider's answer is far "
            "smaller; a proxy or server sending this is broken or hostile)")
        log.warning("%s", error)
        return error

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Zlib:
    """One gzip or deflate layer, decoded at most :data:`_STEP` bytes a call."""

    def __init__(self, wbits: int) -> None:
        self._wbits = wbits
        self._d = zlib.decompressobj(wbits)
        self._started = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        try:
            yield from self._drain(data)
        except zlib.error as exc:
            if self._started or self._wbits != zlib.MAX_WBITS:
                raise ResponseRefused(f"a provider's response is not valid compressed data: "
                                      f"{exc}") from None
            # "deflate" is zlib-wrapped by the standard and raw by some servers (as httpx).
            self._wbits = -zlib.MAX_WBITS
            self._d = zlib.decompressobj(self._wbits)
            yield from self._drain(data)

    def _drain(self, data: bytes) -> Iterator[bytes]:
        while True:
            out = self._d.decompress(data, _STEP)
            data = self._d.unconsumed_tail
            if out:
                self._started = True
                yield out
            if self._d.eof or (not data and len(out) < _STEP):
                return

    def flush(self) -> Iterator[bytes]:
        rest = self._d.flush()
        if rest:
            yield rest


_DECODERS: dict[str, Callable[[], _Zlib]] = {
    "gzip": lambda: _Zlib(zlib.MAX_WBITS | 16),
    "x-gzip": lambda: _Zlib(zlib.MAX_WBITS | 16),
    "deflate": lambda: _Zlib(zlib.MAX_WBITS),
}


def _through(decoders: list[_Zlib], chunk: bytes | None) -> Iterator[bytes]:
    """``chunk`` through every layer in turn (``None``: the end, flush them)."""
    pieces: Iterator[bytes] = iter(() if chunk is None else (chunk,))
    for decoder in decoders:
        pieces = _layer(decoder, pieces, flush=chunk is None)
    yield from pieces


def _layer(decoder: _Zlib, pieces: Iterator[bytes], *, flush: bool) -> Iterator[bytes]:
    for piece in pieces:
        yield from decoder.feed(piece)
    if flush:
        yield from decoder.flush()
