"""Providers' prompt caches: marking the static prefix, and reading what was cached.

The engine lays every stage prompt out static part first (engine.budget.assemble):
the first system message is the same text on every turn of a stage. Providers
reuse a prefix they have seen:

- OpenAI (and Azure, DeepSeek, Gemini 2.5) cache it by themselves, from about
  1,024 tokens, and report ``usage.prompt_tokens_details.cached_tokens``;
- Anthropic caches only up to a block marked ``cache_control`` and reports
  ``usage.cache_read_input_tokens`` (litellm copies it into
  ``prompt_tokens_details.cached_tokens`` too). :func:`mark_static_prefix`
  marks the first system message, and nothing else: what follows changes from
  turn to turn, and a prefix shorter than the model's minimum (1,024 or 2,048
  tokens) is simply not cached.

The turn record keeps the cached tokens (``funnel_turns.cached_prompt_tokens``)
and ``funnel report`` shows their share of the prompt tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["CACHE_CONTROL", "cached_tokens", "mark_static_prefix", "marks_prefix"]

CACHE_CONTROL: dict[str, str] = {"type": "ephemeral"}

# The litellm providers that cache only what a request marks with cache_control.
_MARKED = frozenset({"anthropic"})


def marks_prefix(provider: str) -> bool:
    """Whether requests to ``provider`` must mark the prefix to cache it."""
    return provider in _MARKED


def mark_static_prefix(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with the first system message (the static prefix) as one text block
    marked ``cache_control``; the other messages unchanged. The input is not changed."""
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str) \
            and out[0]["content"]:
        out[0]["content"] = [{"type": "text", "text": out[0]["content"],
                              "cache_control": dict(CACHE_CONTROL)}]
    return out


def cached_tokens(usage: Any) -> int:
    """The prompt tokens a response's ``usage`` says were read from the cache (0 if none
    or not said): OpenAI's ``prompt_tokens_details.cached_tokens``, else Anthropic's
    ``cache_read_input_tokens``."""
    details = _get(usage, "prompt_tokens_details")
    for value in (_get(details, "cached_tokens"), _get(usage, "cache_read_input_tokens")):
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return int(value)
    return 0


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)
