"""Structured output: how each model is asked for the stage's JSON envelope.

A *strategy* is one way to put the (portable) stage schema into a request:

==================== ==============================================================
``json_schema``      ``response_format: {type: json_schema, json_schema: {schema, strict}}``;
                     litellm turns it into Anthropic's ``output_format`` (or a forced
                     ``json_tool_call`` for models without it), Ollama's
                     ``format: <schema>`` and Gemini's ``response_json_schema``.
``json_object_schema`` ``response_format: {type: json_object, schema: <schema>}``: the
                     form llama-cpp-python's server and some vLLM builds accept.
``tool``             one function ``answer`` whose parameters are the schema, forced
                     with ``tool_choice``; its arguments are the answer.
``json_object``      ``response_format: {type: json_object}``: JSON, any shape.
``prompt``           nothing: only the prompt asks for the format.
==================== ==============================================================

Which form of the schema goes, and whether ``strict`` is true, is
:mod:`engine.llm.strict`'s choice per model and strategy.

``auto`` picks a *chain* per model (:func:`auto_chain`) and starts with its
first strategy. When a server refuses a strategy (HTTP 400/422 whose message
names the structured-output parameter), the model moves to the next strategy
of its chain, once per process, and says why in the log (``funnel.models``).
A strategy set in the funnel or on the command line is a chain of one.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from ..format.settings import CHOICES as CHOICES
from ..format.settings import STRATEGIES as STRATEGIES

TOOL_NAME = "answer"

log = logging.getLogger("funnel.models")

_SELF_HOSTED = ("json_schema", "json_object_schema", "tool", "json_object", "prompt")
_SCHEMA_FIRST = ("json_schema", "json_object", "prompt")
_NO_SCHEMA = ("json_object", "prompt")
# Claude 3.x has no native structured output: a forced tool call is the schema's way in.
_OLD_CLAUDE = re.compile(r"claude-(?:3|instant|2)", re.IGNORECASE)
# A refusal of the structured-output part of a request, as servers word it.
_REFUSAL = re.compile(r"response_format|output_format|json_schema|json_object|tool_choice|"
                      r"grammar|guided", re.IGNORECASE)

_NAMED = re.compile(r"response_format|output_format|json_schema", re.IGNORECASE)
_INVALID = re.compile(r"validation error|invalid|not supported|unsupported|must be|should be|"
                      r"not allowed|unknown", re.IGNORECASE)

# (model, api_base) -> index in its chain, for the life of the process.
_chosen: dict[tuple[str, str], int] = {}


def auto_chain(model: str, api_base: str | None, litellm: Any) -> tuple[str, ...]:
    """The strategies ``auto`` tries for ``model``, best first."""
    try:
        _, provider, _, _ = litellm.get_llm_provider(model=model, api_base=api_base)
    except Exception:
        provider = model.split("/", 1)[0] if "/" in model else "openai"
    provider = str(provider)
    if provider == "anthropic":
        return ("tool",) if _OLD_CLAUDE.search(model) else ("json_schema", "tool")
    if provider in ("ollama", "ollama_chat", "gemini", "vertex_ai", "vertex_ai_beta"):
        return _SCHEMA_FIRST
    known = _known(model, litellm)
    if not known and api_base:  # a self-hosted OpenAI-compatible server
        return _SELF_HOSTED
    try:
        structured = bool(litellm.supports_response_schema(model=model))
    except Exception:
        structured = False
    if structured or not known:
        return _SCHEMA_FIRST
    return _NO_SCHEMA


def _known(model: str, litellm: Any) -> bool:
    try:
        litellm.get_model_info(model=model)
    except Exception:
        return False
    return True


def chain_for(model: str, api_base: str | None, setting: str, litellm: Any) -> tuple[str, ...]:
    """``setting`` (``auto`` or one strategy) as the chain of strategies to use."""
    return auto_chain(model, api_base, litellm) if setting == "auto" else (setting,)


def current(model: str, api_base: str | None, chain: tuple[str, ...]) -> str:
    """The strategy in use for this model in this process."""
    return chain[min(_chosen.get((model, api_base or ""), 0), len(chain) - 1)]


def step_down(model: str, api_base: str | None, chain: tuple[str, ...], refused: str,
              reason: str) -> str | None:
    """Move past ``refused`` after the server refused it; the next strategy, or None."""
    key = (model, api_base or "")
    if refused not in chain:
        return None
    index = chain.index(refused) + 1
    if index >= len(chain):
        return None
    if _chosen.get(key, 0) < index:
        _chosen[key] = index
        log.warning("model %s%s refused structured output %r (%s); using %r from now on",
                    model, f" at {api_base}" if api_base else "", refused, reason[:200],
                    chain[index])
    return chain[_chosen[key]]


def forget() -> None:
    """Forget every step down (for tests)."""
    _chosen.clear()


def is_refusal(exc: BaseException, status: int | None) -> bool:
    """Whether ``exc`` is a server refusing the structured-output parameter itself.

    A 400 or 422 that mentions it counts; so does any other error that names the
    parameter while saying the request was invalid: llama-cpp-python answers a
    ``response_format`` it does not know with a 500 carrying the validation error.
    """
    text = error_text(exc)
    names = {cls.__name__ for cls in type(exc).__mro__}
    if status in (400, 422) or names & {"BadRequestError", "UnprocessableEntityError"}:
        return bool(_REFUSAL.search(text))
    return bool(_NAMED.search(text) and _INVALID.search(text))


def error_text(exc: BaseException) -> str:
    """The exception's message and, when it has one, the server's error body."""
    parts = [str(exc)]
    body = getattr(exc, "body", None)
    if body:
        parts.append(str(body))
    response = getattr(exc, "response", None)
    try:
        text = response.text if response is not None else ""
    except Exception:
        text = ""
    if isinstance(text, str) and text:
        parts.append(text[:2000])
    return " ".join(parts)


def request_fields(strategy: str, schema: Mapping[str, Any], stage: str, *,
                   strict: bool = False) -> dict[str, Any]:
    """The litellm ``acompletion`` arguments that ask for ``schema`` with ``strategy``;
    ``strict``: the schema is in its provider's strict form (engine.llm.strict), and the
    provider is asked to enforce it."""
    body = dict(schema)
    if strategy == "json_schema":
        return {"response_format": {"type": "json_schema", "json_schema": {
            "name": f"{stage}_output", "schema": body, "strict": strict}}}
    if strategy == "json_object_schema":
        return {"response_format": {"type": "json_object", "schema": body}}
    if strategy == "tool":
        function: dict[str, Any] = {
            "name": TOOL_NAME, "description": "Your answer, as one object that satisfies "
            "the output schema.", "parameters": body}
        if strict:
            function["strict"] = True
        return {"tools": [{"type": "function", "function": function}],
                "tool_choice": {"type": "function", "function": {"name": TOOL_NAME}}}
    if strategy == "json_object":
        return {"response_format": {"type": "json_object"}}
    return {}


def answer_text(message: Any) -> str:
    """The answer in a response message: a forced tool call's arguments, else its content."""
    calls = getattr(message, "tool_calls", None) or []
    for call in calls:
        function = getattr(call, "function", None)
        arguments = getattr(function, "arguments", None)
        if isinstance(arguments, str) and arguments.strip():
            return arguments
        if isinstance(arguments, Mapping):
            return json.dumps(arguments, ensure_ascii=False)
    content = getattr(message, "content", None)
    return content if isinstance(content, str) else ""
