"""Embeddings for semantic recall: any litellm embedding model, as unit vectors.

:class:`LiteLLMEmbedder` calls ``litellm.aembedding`` (OpenAI's ``/v1/embeddings``
wire format for an ``openai/...`` model at an ``api_base``), bounded by a timeout
the caller gives: the turn's query gets the recall's ``deadline``, the background
indexing more. The vectors come back normalized to length 1, so that a dot product
is their cosine similarity (engine.store.recall's fallback relies on it).
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Sequence
from typing import Any, Protocol

from ..errors import ModelError
from .client import _KEYLESS_OK, error_detail

__all__ = ["MAX_INPUT_CHARS", "Embedder", "LiteLLMEmbedder", "unit"]

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
        data = sorted(response.data, key=lambda d: _field(d, "index"))
        vectors = [_field(d, "embedding") for d in data]
        if len(vectors) != len(texts) or not all(isinstance(v, list) and v for v in vectors):
            raise ModelError(f"embedder {self.name!r} answered {len(vectors)} vector(s) for "
                             f"{len(texts)} text(s)")
        return [unit(v) for v in vectors]


def _field(item: Any, name: str) -> Any:
    return item[name] if isinstance(item, dict) else getattr(item, name)
