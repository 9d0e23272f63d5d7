"""Providers' prompt caches: marking the static prefix, and reading what was cached.

The engine lays every stage prompt out static part first (engine.turn.budget.assemble):
the first system message is the same text on every turn of a stage. Providers
reuse a prefix they have seen:

- OpenAI (and Azure, DeepSeek, Gemini 2.5) cache it by themselves, from about
  1,024 tokens, and report ``usage.prompt_tokens_details.cached_tokens``;
- Claude caches only up to a block marked ``cache_control``, wherever it is
  served. :func:`mark_static_prefix` sets two breakpoints: the first system
  message (the same on every turn of a stage), and the last message the next
  turn repeats (``ModelRequest.stable``: the last window message, else the state
  part or the summary), so that the conversation so far is read from the cache
  and only each turn's additions are written. The turn part, the notices and the
  customer's message, which change every turn, are never marked; a prefix
  shorter than the model's minimum (1,024 or 2,048 tokens) is simply not cached.

Which requests are marked is :func:`cache_marker`'s decision, read off litellm
(its provider resolution, its model map, and the gates its own request
transformations apply), route by route:

- ``anthropic/``: the block keeps ``cache_control`` (Anthropic's Messages API), always;
- ``bedrock/`` on Converse: a ``cachePoint`` block right after it (litellm's
  ``AmazonConverseConfig._transform_system_message``), for a model whose map entry
  says ``supports_prompt_caching`` and that litellm's ``bedrock_model_accepts_cache_points``
  lets through (Claude 3.5 Haiku, 3.7 and 4.x, Nova): Bedrock refuses a cache point
  to any other model;
- ``bedrock/invoke/``: Claude keeps ``cache_control`` (Anthropic's format); Nova gets
  ``cachePoint`` as a key of the text block; ``bedrock/claude_platform/``: Anthropic's
  format, ``cache_control`` kept;
- ``vertex_ai/``: Claude (the map's ``vertex_ai-anthropic_models``), Anthropic's format.
  Not Gemini: litellm turns a mark there into a separate context-cache request, and
  Gemini caches by itself;
- ``openrouter/``: Anthropic's models, where litellm's ``OpenrouterConfig`` keeps the
  block's ``cache_control`` (``openrouter_model_supports_cache_control``) and the map
  says the model caches.

Any other request is sent exactly as before (a plain string system message):
OpenAI-style routes drop ``cache_control`` anyway, and nothing is gained.

The cached tokens a response reports (:func:`cached_tokens`) go into the turn
record (``funnel_turns.cached_prompt_tokens``), :class:`engine.TurnResult`,
the service's ``funnel_cached_prompt_tokens_total`` and ``funnel report``; the
tokens written to the cache (:func:`cache_write_tokens`) likewise, as
``cache_write_tokens`` and ``funnel_cache_write_tokens_total``.
Nothing here imports litellm: the caller hands its module in.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["CACHE_CONTROL", "cache_marker", "cache_write_tokens", "cached_tokens", "forget",
           "mark_static_prefix", "marks_prefix"]

CACHE_CONTROL: dict[str, str] = {"type": "ephemeral"}

# What the mark becomes on each route (cache_marker's answers).
ANTHROPIC_BLOCK = "cache_control"  # Anthropic's Messages format: the block keeps it
BEDROCK_CACHE_POINT = "cachePoint"  # Bedrock Converse: a cachePoint block after it

# (model, api_base) -> cache_marker's answer, for the life of the process: the answer
# depends only on the installed litellm, and a turn must not pay the look-ups twice.
_decided: dict[tuple[str, str], str | None] = {}


def marks_prefix(litellm: Any, model: str, api_base: str | None = None) -> bool:
    """Whether requests to ``model`` get their static prefix marked ``cache_control``."""
    return cache_marker(litellm, model, api_base) is not None


def cache_marker(litellm: Any, model: str, api_base: str | None = None) -> str | None:
    """How a request to ``model`` carries the cache mark (``"cache_control"`` or
    ``"cachePoint"``), or None when the engine leaves the request unmarked (the route
    drops the mark, or the model does not cache what is marked)."""
    key = (model, api_base or "")
    if key not in _decided:
        try:
            _decided[key] = _decide(litellm, model, api_base)
        except Exception:  # a litellm whose internals moved: send nothing extra
            _decided[key] = None
    return _decided[key]


def forget() -> None:
    """Forget every decision (for tests)."""
    _decided.clear()


def _decide(litellm: Any, model: str, api_base: str | None) -> str | None:
    model_id, provider, _, _ = litellm.get_llm_provider(model=model, api_base=api_base)
    provider = str(provider)
    if provider == "anthropic":
        return ANTHROPIC_BLOCK  # every Claude model takes the mark on Anthropic's API
    if provider not in ("bedrock", "vertex_ai", "vertex_ai_beta", "openrouter"):
        return None
    # Elsewhere only a model litellm's map says caches: Bedrock refuses a cache point to a
    # model without prompt caching (Claude 3.5 Sonnet v1), and an unmapped model is unknown.
    supports = _module(litellm, "utils").supports_prompt_caching
    if not supports(model=model):
        return None
    model_id = str(model_id)
    if provider == "bedrock":
        return _bedrock(litellm, model_id)
    if provider == "openrouter":
        gate = _module(litellm, "llms.openrouter.chat.transformation")
        # OpenRouter's id is vendor/model: Claude caches only what is marked; Gemini
        # caches by itself, and a mark there is a billed cache write.
        vendor = model_id.split("/", 1)[0]
        return (ANTHROPIC_BLOCK if vendor == "anthropic"
                and gate.openrouter_model_supports_cache_control(model_id) else None)
    info = litellm.get_model_info(model=model)
    return ANTHROPIC_BLOCK if info.get("litellm_provider") == "vertex_ai-anthropic_models" \
        else None


def _bedrock(litellm: Any, model_id: str) -> str | None:
    common = _module(litellm, "llms.bedrock.common_utils")
    route = common.BedrockModelInfo.get_bedrock_route(model_id)
    bare = common.strip_bedrock_routing_prefix(model_id)
    if route == "converse":
        return BEDROCK_CACHE_POINT if common.bedrock_model_accepts_cache_points(bare) else None
    if route == "claude_platform":  # Anthropic's Messages API behind AWS's gateway
        return ANTHROPIC_BLOCK
    if route == "invoke":
        aws = _module(litellm, "llms.bedrock.base_aws_llm")
        vendor = aws.BaseAWSLLM.get_bedrock_invoke_provider(model_id)
        if vendor == "anthropic":
            return ANTHROPIC_BLOCK
        if vendor == "nova":  # litellm puts the cachePoint on the text block itself
            return BEDROCK_CACHE_POINT
    return None


def _module(litellm: Any, name: str) -> Any:
    return importlib.import_module(f"{litellm.__name__}.{name}")


def mark_static_prefix(messages: Sequence[Mapping[str, Any]], stable: int = 0
                       ) -> list[dict[str, Any]]:
    """``messages`` with the cache's breakpoints marked ``cache_control`` (each marked
    message becomes one text block); the other messages unchanged. The input is not changed.

    The first breakpoint is the first system message (the static prefix). The second is
    the last of the ``stable`` leading messages the next turn repeats (the last window
    message, else the state part or the summary: engine.turn.budget.stable_part), so that the
    next turn reads the conversation so far from the cache and writes only what it adds;
    with ``stable`` 0 or 1 there is none. The customer's message (the last) and what
    follows the stable messages (the turn part, the notices) are never marked. Two marks
    of Anthropic's four: on a read it also looks ~20 blocks back from each for an earlier
    breakpoint's prefix, and the previous turn's end is two messages back.
    """
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        _mark(out, 0)
        if 1 < stable < len(out):  # never the last message: stable counts none past it
            _mark(out, stable - 1)
    return out


def _mark(messages: list[dict[str, Any]], index: int) -> None:
    content = messages[index].get("content")
    # Anthropic refuses an empty text block, and a mark on it; a block list is not ours.
    if isinstance(content, str) and content:
        messages[index]["content"] = [{"type": "text", "text": content,
                                       "cache_control": dict(CACHE_CONTROL)}]


# Where a response's usage says how many prompt tokens came from the cache, first
# found wins. litellm copies each provider's figure into the OpenAI shape
# (prompt_tokens_details.cached_tokens): Anthropic's cache_read_input_tokens,
# Bedrock's cacheReadInputTokens (Converse) and cacheReadInputTokenCount (InvokeModel),
# DeepSeek's prompt_cache_hit_tokens, Gemini's cachedContentTokenCount. The raw names
# are read too, for a usage litellm passed through unconverted.
_CACHED_FIELDS = (("prompt_tokens_details", "cached_tokens"), ("cache_read_input_tokens",),
                  ("cacheReadInputTokens",), ("cacheReadInputTokenCount",),
                  ("prompt_cache_hit_tokens",))


# Where a usage says how many prompt tokens were written to the cache (billed at 1.25
# times the input price by Anthropic, on every Claude route). litellm's Usage keeps them as
# prompt_tokens_details.cache_write_tokens (its canonical name; cache_creation_tokens is
# kept in sync), from Anthropic's cache_creation_input_tokens, Bedrock's
# cacheWriteInputTokens (Converse) and cacheWriteInputTokenCount (InvokeModel), and
# OpenRouter's prompt_tokens_details.cache_write_tokens.
_WRITE_FIELDS = (("prompt_tokens_details", "cache_write_tokens"),
                 ("prompt_tokens_details", "cache_creation_tokens"),
                 ("cache_creation_input_tokens",), ("cacheWriteInputTokens",),
                 ("cacheWriteInputTokenCount",))


def cached_tokens(usage: Any) -> int:
    """The prompt tokens a response's ``usage`` says were read from the provider's
    prompt cache (0 if none or not said)."""
    return _first_count(usage, _CACHED_FIELDS)


def cache_write_tokens(usage: Any) -> int:
    """The prompt tokens a response's ``usage`` says were written to the provider's
    prompt cache (0 if none or not said)."""
    return _first_count(usage, _WRITE_FIELDS)


def _first_count(usage: Any, paths: Sequence[tuple[str, ...]]) -> int:
    for path in paths:
        value = usage
        for name in path:
            value = _get(value, name)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return int(value)
    return 0


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)
