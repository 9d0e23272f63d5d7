"""Embeddings for semantic recall: any litellm embedding model, as unit vectors.

:class:`LiteLLMEmbedder` calls ``litellm.aembedding`` (OpenAI's ``/v1/embeddings``
wire format for an ``openai/...`` model at an ``api_base``), bounded by a timeout
the caller gives: the turn's query gets the recall's ``deadline``, the background
indexing more. The answer crosses :func:`engine.boundary.vectors.unit_vectors`: finite
numbers only, at most :data:`~engine.boundary.vectors.MAX_DIMS` of them, every vector
of the model's dimension (the first answer this embedder accepted fixes it); anything
else is a failed call (:class:`~engine.errors.ModelError`). The vectors come back
normalized to length 1, so that a dot product is their cosine similarity
(engine.store.recall's fallback relies on it).
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Sequence
from typing import Any, Protocol

from ..boundary.sanitize import Rejected
from ..boundary.vectors import MAX_DIMS, unit_vectors
from ..errors import ModelError
from .client import _KEYLESS_OK, error_detail

__all__ = ["MAX_DIMS", "MAX_INPUT_CHARS", "Embedder", "LiteLLMEmbedder", "unit"]

# An embedding model reads some 8k tokens; a message past this is embedded by its start.
MAX_INPUT_CHARS = 8000


class Embedder(Protocol):
    """What semantic recall needs: texts in, unit vectors out (one per text, in order)."""

    name: str

    async def embed(self, texts: Sequence[str], *, timeout: float) -> list[list[float]]:
        """Raises ModelError: the call failed, timed out or answered something else."""


def unit(vector: Sequence[float]) -> list[float]:
    """``vector`` scaled to length 1 (a zero vector stays zero: it matches nothing)."""
    norm = math.sqrt(sum(x * x for x in vector))
    return [float(x) / norm for x in vector] if norm else [0.0 for _ in vector]


class LiteLLMEmbedder:
    """A litellm embedding model (``openai/text-embedding-3-small``, ...) at ``api_base``."""

    def __init__(self, name: str, *, api_base: str | None = None) -> None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm  # seconds to import: only a funnel with recall on pays it

        litellm.suppress_debug_info = True
        self._litellm = litellm
        self.name = name
        self.api_base = api_base
        self.dims: int | None = None  # the model's dimension, once an answer was accepted

    def _kwargs(self, texts: Sequence[str], timeout: float) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.name, "timeout": timeout, "num_retries": 0,
                                  "input": [t[:MAX_INPUT_CHARS] or " " for t in texts]}
        if self.api_base:
            kwargs["api_base"] = self.api_base
            provider = self.name.split("/", 1)[0] if "/" in self.name else "openai"
            if provider in _KEYLESS_OK and not os.environ.get(f"{provider.upper()}_API_KEY"):
                kwargs["api_key"] = "no-key"  # a self-hosted server says if it needs one
        return kwargs

    async def embed(self, texts: Sequence[str], *, timeout: float) -> list[list[float]]:
        if not texts:
            return []
        try:
            response = await asyncio.wait_for(
                self._litellm.aembedding(**self._kwargs(texts, timeout)), timeout=timeout)
        except TimeoutError:
            raise ModelError(f"embedder {self.name!r} did not answer within {timeout:g} s"
                             ) from None
        except Exception as exc:
            raise ModelError(f"embedder {self.name!r} failed: {error_detail(exc)}") from None
        try:
            vectors = unit_vectors(_embeddings(response, len(texts)), len(texts), self.dims)
        except Rejected as exc:
            raise ModelError(f"embedder {self.name!r} answered no usable vectors: {exc}"
                             ) from None
        self.dims = len(vectors[0])
        return vectors


def _embeddings(response: Any, count: int) -> list[Any]:
    """The answer's embeddings in the order of the texts (``data[].index``)."""
    data = getattr(response, "data", None)
    if not isinstance(data, list):
        raise Rejected(f"its `data` is {type(data).__name__}, not a list")
    if len(data) != count:
        raise Rejected(f"{len(data)} vector(s) for {count} text(s)")
    try:
        items = [(_field(d, "index"), _field(d, "embedding")) for d in data]
    except (AttributeError, TypeError):
        raise Rejected("an item of its `data` is not an embedding object") from None
    indexes = [i for i, _ in items]
    if all(i is None for i in indexes):
        return [e for _, e in items]
    if sorted(i for i in indexes if type(i) is int) != list(range(count)):
        raise Rejected(f"its `data[].index` values are not 0 to {count - 1}")
    return [e for _, e in sorted(items, key=lambda item: int(item[0]))]


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)
