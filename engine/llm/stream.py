"""Streamed model calls: the answer's text as it arrives, and which routes stream.

A request with :attr:`~engine.llm.request.ModelRequest.on_text` is sent with
``stream=True`` (and ``stream_options.include_usage``, for the token counts)
where the route streams. :func:`consume` reads litellm's chunks: the answer text
is the content's deltas, or on the ``tool`` strategy the forced tool call's
argument deltas (litellm turns Anthropic's ``input_json_delta`` and Bedrock's
``toolUse`` deltas into the same ``tool_calls`` shape). After each chunk that adds
to it, ``on_text`` gets the answer so far; the chunks are then built into one
response (``litellm.stream_chunk_builder``) so that usage, cost and the answer are
read exactly as for a call that did not stream.

A route that cannot stream answers in one piece, and the caller shows it as one
event: a model whose price map says ``supports_native_streaming: false``, and a
server that refused ``stream`` once (HTTP 400/422 naming it): that one is not asked
to stream again in this process, and the log says why.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

log = logging.getLogger("funnel.models")

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
                  on_text: Callable[[str], None]) -> Any:
    """Read a litellm stream to its end, telling ``on_text`` the answer so far.

    Returns:
        The chunks built into one response, as ``acompletion`` without ``stream``
        returns it.
    """
    chunks: list[Any] = []
    content: list[str] = []
    arguments: list[str] = []
    async for chunk in stream:
        chunks.append(chunk)
        grew = False
        for choice in getattr(chunk, "choices", None) or []:
            delta = getattr(choice, "delta", None)
            piece = getattr(delta, "content", None)
            if isinstance(piece, str) and piece:
                content.append(piece)
                grew = True
            for call in getattr(delta, "tool_calls", None) or []:
                if (getattr(call, "index", 0) or 0) != 0:
                    continue  # the answer is the first (the forced) tool call
                part = getattr(getattr(call, "function", None), "arguments", None)
                if isinstance(part, str) and part:
                    arguments.append(part)
                    grew = True
        if grew:
            on_text("".join(arguments) if arguments else "".join(content))
    return litellm.stream_chunk_builder(chunks, messages=messages)
