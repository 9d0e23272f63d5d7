"""The contract the provider enforces: each provider's strict form of a stage schema.

A stage's contract (:mod:`engine.format.contract`) reaches a model in one of three forms:

============ ===========================================================================
``openai``   OpenAI's structured outputs with ``strict: true`` (OpenAI, Azure OpenAI,
             ``json_schema`` and ``tool``): the provider compiles the schema into its
             decoder, so the answer cannot leave it. Its rules: every object lists all
             of its properties in ``required`` and has ``additionalProperties: false``;
             an optional property is made nullable (``type: [X, "null"]``, or ``anyOf``
             with ``{"type": "null"}`` for objects, arrays and unions); no keyword strict
             mode refuses (the portable form's bounds are already words in
             ``description``; ``const`` becomes a one-value ``enum``, ``default`` and
             ``title`` go).
``closed``   The portable form with every object closed: what Anthropic's
             ``output_format`` and Gemini's ``response_json_schema`` compile (litellm
             maps ``json_schema`` to them and drops ``strict``). Optional properties
             stay optional: Anthropic refuses a schema with more than 16 union-typed
             properties, which nullable optional ones would be.
``portable`` :func:`engine.llm.portable.portable_schema`, ``strict: false``: a hint the
             model follows as well as it can (self-hosted servers, models litellm does
             not know, strategies without a schema).
============ ===========================================================================

:func:`mode` says which form a model gets with a strategy, and why (``funnel doctor``
prints it). A server that refuses the strict form (an Azure API version before
2024-08-01, a schema its compiler rejects: HTTP 400 naming ``response_format``) gets the
portable form with ``strict: false`` from then on, for the life of the process
(:func:`refuse`; said once on the ``funnel.models`` logger), before its strategy would
step down to one without a schema. A stage whose contract cannot be made strict (an object that takes keys it
does not name, a value of any type) keeps the portable form, and :func:`forms` says
why. The forms are built once per stage schema and kept.

Whatever the form, the engine validates the answer against the stage's own, full
schema. A strict form makes the model write ``null`` for an optional property it has
nothing for; :func:`drop_forced_nulls` removes those nulls first (only where the stage's
schema does not itself allow null), so that a forced null reads exactly as an absent
property.
"""

from __future__ import annotations

import copy
import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .forced_nulls import allows_null, drop_forced_nulls, forget_plans
from .portable import portable_schema

__all__ = ["Forms", "Mode", "drop_forced_nulls", "forget", "forms", "mode", "refuse"]

log = logging.getLogger("funnel.models")

OPENAI, CLOSED, PORTABLE = "openai", "closed", "portable"

# Providers whose chat API takes OpenAI's `strict: true` (litellm passes it as it is).
_OPENAI_WIRE = frozenset({"openai", "azure"})
_GEMINI = frozenset({"gemini", "vertex_ai", "vertex_ai_beta"})
_JSON = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class Forms:
    """A stage schema's forms; ``openai``/``closed`` None when the schema has none, with
    the reason in ``why_not`` (by form)."""

    portable: dict[str, Any]
    openai: dict[str, Any] | None
    closed: dict[str, Any] | None
    why_not: dict[str, str] = field(default_factory=dict)

    def get(self, form: str) -> dict[str, Any] | None:
        """The schema of ``form``, or None when this stage has none."""
        if form == OPENAI:
            return self.openai
        if form == CLOSED:
            return self.closed
        return self.portable


@dataclass(frozen=True)
class Mode:
    """Which form a model gets with a strategy: ``form`` (:data:`OPENAI`, :data:`CLOSED` or
    :data:`PORTABLE`), and why, in words for ``funnel doctor``."""

    form: str
    why: str

    @property
    def strict(self) -> bool:
        """Whether the provider enforces the schema."""
        return self.form != PORTABLE


class _NotStrict(ValueError):
    """The schema has no strict form; the message says where and why."""


# id(schema) -> (the schema, its forms): the schema is held, so its id is never reused
# while it is here. A compiled funnel's stage schemas live as long as the funnel.
_forms: OrderedDict[int, tuple[Mapping[str, Any], Forms]] = OrderedDict()
_FORMS_KEPT = 512
# (model, api_base, strategy) -> its mode, for the life of the process.
_modes: dict[tuple[str, str, str], Mode] = {}
# (model, api_base) -> why its server refused the strict form, for the life of the process.
_refused: dict[tuple[str, str], str] = {}


def forms(schema: Mapping[str, Any]) -> Forms:
    """The forms of a stage schema, built once per schema object and kept."""
    key = id(schema)
    found = _forms.get(key)
    if found is not None and found[0] is schema:
        _forms.move_to_end(key)
        return found[1]
    portable = portable_schema(schema)
    why_not: dict[str, str] = {}
    # A property that can only be an empty array (`actions` of a stage that takes none)
    # is left out of the strict forms: closed objects keep the model from writing it.
    base = portable_schema(_without_empty_arrays(schema))
    built: dict[str, dict[str, Any] | None] = {}
    for form in (OPENAI, CLOSED):
        try:
            built[form] = _strict(base, "$", closed_only=form == CLOSED)
        except _NotStrict as exc:
            built[form] = None
            why_not[form] = str(exc)
    made = Forms(portable, built[OPENAI], built[CLOSED], why_not)
    _forms[key] = (schema, made)
    if len(_forms) > _FORMS_KEPT:
        _forms.popitem(last=False)
    return made


def forget() -> None:
    """Forget the kept forms, plans, modes and refusals (for tests)."""
    _forms.clear()
    forget_plans()
    _modes.clear()
    _refused.clear()


def refuse(model: str, api_base: str | None, reason: str) -> None:
    """``model``'s server refused the strict form: the portable one, ``strict: false``,
    from now on."""
    key = (model, api_base or "")
    if key in _refused:
        return
    _refused[key] = reason[:200]
    for cached in [k for k in _modes if k[:2] == key]:
        del _modes[cached]
    log.warning("model %s%s refused the strict form of the output schema (%s); sending the "
                "portable form with strict: false from now on", model,
                f" at {api_base}" if api_base else "", reason[:200])


def mode(model: str, api_base: str | None, strategy: str, litellm: Any) -> Mode:
    """The form ``model`` (at ``api_base``) is sent with ``strategy``, and why."""
    refused = _refused.get((model, api_base or ""))
    if refused is not None:
        return Mode(PORTABLE, f"the server refused the strict form ({refused}): strict: false")
    key = (model, api_base or "", strategy)
    found = _modes.get(key)
    if found is None:
        found = _modes[key] = _mode(model, api_base, strategy, litellm)
    return found


def _mode(model: str, api_base: str | None, strategy: str, litellm: Any) -> Mode:
    if strategy not in ("json_schema", "tool"):
        return Mode(PORTABLE, f"{strategy} is not a strict form on any provider")
    try:
        provider = str(litellm.get_llm_provider(model=model, api_base=api_base)[1])
    except Exception:
        provider = model.split("/", 1)[0] if "/" in model else "openai"
    known = _known(model, litellm)
    if provider in _OPENAI_WIRE:
        if not known:
            # A self-hosted OpenAI-compatible server: vLLM, llama.cpp and LM Studio each
            # read `strict` their own way (or refuse it); the portable form works on all.
            return Mode(PORTABLE, "a model litellm does not know (a self-hosted server?): "
                                  "strict: false")
        if not _supports(litellm, "supports_response_schema", model):
            return Mode(PORTABLE, "litellm's model map says it has no structured outputs: "
                                  "strict: false")
        where = "response_format" if strategy == "json_schema" else "the tool"
        return Mode(OPENAI, f"{provider} structured outputs: strict: true on {where}, every "
                            "property required, optional ones nullable")
    if provider == "anthropic":
        if strategy == "json_schema" and _anthropic_native(model, litellm):
            return Mode(CLOSED, "Anthropic's output_format: the provider compiles the schema "
                                "(litellm maps json_schema to it)")
        if strategy == "json_schema":
            return Mode(PORTABLE, "litellm sends this Claude a forced json_tool_call, which "
                                  "Anthropic does not enforce")
        return Mode(PORTABLE, "a forced tool: litellm drops `strict` from an OpenAI-style "
                              "tool for Claude, so Anthropic does not enforce it")
    if provider in _GEMINI and strategy == "json_schema":
        if _gemini_json_schema(model):
            return Mode(CLOSED, "Gemini's response_json_schema: the provider constrains its "
                                "decoding to it (litellm drops `strict`)")
        return Mode(PORTABLE, "Gemini before 2.0 takes responseSchema (OpenAPI's subset): "
                              "strict: false")
    return Mode(PORTABLE, f"{provider}: not known to enforce a schema: strict: false")


def _known(model: str, litellm: Any) -> bool:
    try:
        litellm.get_model_info(model=model)
    except Exception:
        return False
    return True


def _supports(litellm: Any, name: str, model: str) -> bool:
    try:
        return bool(getattr(litellm, name)(model=model))
    except Exception:
        return False


def _gemini_json_schema(model: str) -> bool:
    """Whether litellm sends ``model`` ``response_json_schema`` (Gemini 2.0 on), not the
    OpenAPI-subset ``response_schema``: litellm's own test, by the model's name."""
    try:
        from litellm.llms.vertex_ai.common_utils import supports_response_json_schema

        return bool(supports_response_json_schema(model))
    except Exception:
        return False


def _anthropic_native(model: str, litellm: Any) -> bool:
    """Whether litellm sends ``output_format`` (not its json tool) for ``model``."""
    try:
        config = litellm.AnthropicConfig()
        return bool(config.uses_native_structured_output(model.split("/", 1)[-1]))
    except Exception:
        return False


# -- the strict form -----------------------------------------------------------------------


def _strict(node: Any, where: str, *, closed_only: bool) -> dict[str, Any]:
    """``node`` (a portable schema) in strict form; ``closed_only``: objects closed, but
    optional properties left optional (the ``closed`` form)."""
    if not isinstance(node, Mapping):
        raise _NotStrict(f"{where} is not a schema")
    if "allOf" in node:
        raise _NotStrict(f"{where} uses allOf, which strict mode refuses")
    out: dict[str, Any] = {}
    if isinstance(node.get("description"), str):
        out["description"] = node["description"]
    if "anyOf" in node:
        branches = node["anyOf"]
        if not isinstance(branches, list) or not branches:
            raise _NotStrict(f"{where} has an empty anyOf")
        out["anyOf"] = [_strict(b, f"{where}.anyOf[{i}]", closed_only=closed_only)
                        for i, b in enumerate(branches)]
        return out
    kind = node.get("type")
    if "const" in node:
        value = node["const"]
        if not isinstance(value, _JSON):
            raise _NotStrict(f"{where} is a constant object or array")
        out["enum"] = [value]
        kind = kind or _type_of(value)
    elif "enum" in node:
        out["enum"] = list(node["enum"])
    if kind is None and "enum" not in out:
        raise _NotStrict(f"{where} takes a value of any type")
    if kind is not None:
        out["type"] = copy.copy(kind)
    kinds = set(kind) if isinstance(kind, list) else {kind}
    if "object" in kinds:
        props = node.get("properties")
        extra = node.get("additionalProperties")
        if not isinstance(props, Mapping) or not props or (extra is not None
                                                            and extra is not False):
            raise _NotStrict(f"{where} is an object that takes keys it does not name")
        required = node.get("required")
        needed = set(required) if isinstance(required, list) else set()
        out["properties"] = {}
        for name, sub in props.items():
            strict = _strict(sub, f"{where}.{name}", closed_only=closed_only)
            if closed_only or name in needed:
                out["properties"][name] = strict
            elif allows_null(strict):
                # Required in the strict form, its null would clear the field where the
                # model meant to leave it out: the two cannot be told apart.
                raise _NotStrict(f"{where}.{name} is optional and takes null: under a "
                                 "strict form, null (clear it) and absent (leave it) look "
                                 "the same")
            else:
                out["properties"][name] = _nullable(strict)
        if closed_only:
            if isinstance(required, list) and required:
                out["required"] = list(required)
        else:
            out["required"] = list(props)
        out["additionalProperties"] = False
    if "array" in kinds:
        items = node.get("items")
        if not isinstance(items, Mapping):
            raise _NotStrict(f"{where} is an array of any values")
        out["items"] = _strict(items, f"{where}[]", closed_only=closed_only)
    return out


def _without_empty_arrays(node: Mapping[str, Any]) -> dict[str, Any]:
    """``node`` without the optional properties that only an empty array satisfies."""
    out = dict(node)
    props = node.get("properties")
    if isinstance(props, Mapping):
        required = node.get("required")
        needed = set(required) if isinstance(required, list) else set()
        out["properties"] = {
            name: _without_empty_arrays(sub) if isinstance(sub, Mapping) else sub
            for name, sub in props.items()
            if name in needed or not (isinstance(sub, Mapping) and sub.get("maxItems") == 0)}
    return out


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "null" if value is None else "string"


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` that also takes null: a scalar's type list, else an ``anyOf``."""
    if allows_null(schema):
        return schema
    kind = schema.get("type")
    if "anyOf" in schema:
        return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}
    if isinstance(kind, str) and kind not in ("object", "array"):
        out = {**schema, "type": [kind, "null"]}
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        return out
    if kind is None and "enum" in schema:
        return {**schema, "enum": [*schema["enum"], None]}
    described = {k: v for k, v in schema.items() if k != "description"}
    out = {"anyOf": [described, {"type": "null"}]}
    if "description" in schema:
        out["description"] = schema["description"]
    return out
