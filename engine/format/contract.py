"""A stage's output contract, derived from the funnel (docs/funnel-format.md#output-contract).

A stage declares what the model may write and do: ``updates`` (state fields or
dotted paths into them, ``[pet, customer.name]``) and ``actions`` (declared action
names), with funnel-wide defaults under ``output:``. The contract is the JSON
Schema of the model's answer built from that and from the declarations it names:

- ``reply`` first (streaming reads it first), with the funnel's bounds
  (``output.reply``, default 1 to 1500 characters);
- ``language`` when the funnel detects the customer's language;
- ``updates``: each named field with its own schema from ``state:`` (storage keys
  and the engine's own keywords left out), a dotted path narrowing an object to
  the properties named;
- ``actions``: one ``$defs`` entry per allowed action with its arguments, from its
  builtin or its ``arguments:`` (a small catalog's SKUs as the enum of
  ``present_products``).

One source of truth: change a field's enum in ``state:`` and every stage's contract
follows. A stage that names ``schema:`` keeps that file as its whole contract (as
funnels did before); ``schema_extension:`` names a file merged into the derived one.
Both are checked by ``engine.validation`` against what the stage may write.

Everything here reads the funnel as parsed YAML and never fails on a malformed
one: ``engine.validation`` reports the problems (with file:line) and this module
builds what it can.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["DEFAULT_REPLY", "SKU_ENUM_LIMIT", "derive", "extend", "field_at", "is_derived",
           "stage_actions", "stage_updates", "update_paths"]

DEFAULT_REPLY: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 1500,
                                 "description": "What the customer sees."}
DEFAULT_MAX_ACTIONS = 6
# Up to this many SKUs, the catalog's SKUs are `present_products`' enum: the model
# cannot name a product that does not exist. Past it the list costs more prompt
# than it saves; the engine refuses an unknown SKU either way.
SKU_ENUM_LIMIT = 200
# A state field's keys that describe storage, not the value the model writes.
_STORAGE_KEYS = frozenset({"default", "nullable", "owner", "write_once", "indexed", "column",
                           "description", "retention"})
# Keywords the engine reads from a field's declaration that are not JSON Schema.
_ENGINE_KEYWORDS = frozenset({"country_code"})
_ARGUMENT_KEYS = frozenset({"arguments", "required"})


def _d(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _names(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def is_derived(data: Mapping[str, Any], stage: str) -> bool:
    """Whether ``stage``'s contract is derived (not one hand-written file).

    Derived when the stage declares ``updates``, ``actions`` or ``schema_extension``,
    or the funnel declares ``output:``; a stage naming ``schema:`` keeps its file.
    """
    raw = _d(_d(data.get("stages")).get(stage))
    if "schema" in raw:
        return False
    return bool({"updates", "actions", "schema_extension"} & raw.keys()) or "output" in data


def stage_updates(data: Mapping[str, Any], stage: str) -> list[str]:
    """The update paths a derived stage allows: its own, else ``output.updates``, else none."""
    raw = _d(_d(data.get("stages")).get(stage))
    if "updates" in raw:
        return _names(raw["updates"])
    return _names(_d(data.get("output")).get("updates"))


def stage_actions(data: Mapping[str, Any], stage: str) -> list[str]:
    """The actions a derived stage allows: its own, else ``output.actions``, else none."""
    raw = _d(_d(data.get("stages")).get(stage))
    if "actions" in raw:
        return _names(raw["actions"])
    return _names(_d(data.get("output")).get("actions"))


def field_schema(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A state field's declaration as the JSON Schema of what the model may write there."""
    out = {k: copy.deepcopy(v) for k, v in raw.items()
           if k not in _STORAGE_KEYS and k not in _ENGINE_KEYWORDS}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: field_schema(v) if isinstance(v, dict) else v
                             for k, v in out["properties"].items()}
        out.setdefault("additionalProperties", False)
    if isinstance(out.get("items"), dict):
        out["items"] = field_schema(out["items"])
    if "enum" in out and "type" not in out:
        types = {type(v) for v in out["enum"]}
        if types == {str}:
            out["type"] = "string"
    return out


def field_at(state: Mapping[str, Any], path: str) -> dict[str, Any] | None:
    """The declaration of the state field (or dotted path into one) ``path``, if declared."""
    head, *rest = path.split(".")
    node = state.get(head)
    for part in rest:
        node = _d(_d(node).get("properties")).get(part)
    return node if isinstance(node, dict) else None


def update_paths(state: Mapping[str, Any], paths: Iterable[str]
                 ) -> tuple[dict[str, Any], list[tuple[str, str, list[str]]]]:
    """The ``updates`` properties of ``paths`` and the paths that name nothing.

    Returns:
        (properties, problems): each problem is (path, the part that names nothing,
        the names that part could have been), for a did-you-mean.
    """
    props: dict[str, Any] = {}
    problems: list[tuple[str, str, list[str]]] = []
    for path in paths:
        head, *rest = path.split(".")
        declared = _d(state.get(head))
        if not declared:
            problems.append((path, head, list(state)))
            continue
        node: dict[str, Any] = declared
        target = props
        name = head
        ok = True
        for part in rest:
            subs = _d(node.get("properties"))
            if part not in subs:
                problems.append((path, part, list(subs)))
                ok = False
                break
            # An object already allowed whole stays whole; else it narrows to what is named.
            have = target.get(name)
            if have is not None and "_narrow" not in have:
                ok = False
                break
            if have is None:
                have = target[name] = {"_narrow": True, "_node": node, "properties": {}}
            target = have["properties"]
            node = _d(subs[part])
            name = part
        if ok:
            target[name] = field_schema(node)
    return _finish(props), problems


def _finish(props: dict[str, Any]) -> dict[str, Any]:
    """Turn the narrowed objects of :func:`update_paths` into schemas."""
    out: dict[str, Any] = {}
    for name, value in props.items():
        if "_narrow" in value:
            schema = {k: v for k, v in field_schema(value["_node"]).items() if k != "properties"}
            schema["additionalProperties"] = False
            schema["properties"] = _finish(value["properties"])
            out[name] = schema
        else:
            out[name] = value
    return out


def action_schema(name: str, raw: Mapping[str, Any], data: Mapping[str, Any],
                  skus: list[str] | None = None) -> dict[str, Any]:
    """The JSON Schema of one call of the declared action ``name``.

    ``arguments:`` (each a JSON Schema; all required unless ``required:`` lists
    some) wins; else the builtin's own arguments; a hook or ``append`` without
    ``arguments:`` takes any flat values.
    """
    props: dict[str, Any] = {"type": {"const": name}}
    required = ["type"]
    builtin = raw.get("builtin")
    cart = _d(data.get("cart"))
    presented = _d(data.get("presented"))
    state = _d(data.get("state"))
    arguments = raw.get("arguments")
    if isinstance(arguments, dict):
        # An argument is a JSON Schema, or the path of a state field whose schema it takes.
        props.update({k: field_schema(_d(field_at(state, v) if isinstance(v, str) else v))
                      for k, v in arguments.items()})
        listed = raw.get("required")
        required += _names(listed) if isinstance(listed, list) else list(arguments)
    elif builtin == "present_products":
        items: dict[str, Any] = {"type": "string", "maxLength": 64}
        if skus and len(skus) <= SKU_ENUM_LIMIT:
            items = {"type": "string", "enum": list(skus)}
        props["skus"] = {"type": "array", "minItems": 1,
                         "maxItems": int(presented.get("max_per_turn", 3)), "items": items}
        required.append("skus")
    elif builtin in ("add_to_cart", "remove_from_cart"):
        # Not an enum: an unknown SKU is refused by the engine with a notice that the
        # next prompt relays, a better repair than a schema error.
        props["sku"] = {"type": "string", "maxLength": 64}
        props["qty"] = {"type": "integer", "minimum": 1, "maximum": int(cart.get("max_qty", 20))}
        required.append("sku")
    elif builtin == "set":
        props["value"] = field_schema(_d(state.get(str(raw.get("field")))))
        required.append("value")
    elif builtin == "request_handoff":
        reasons = _names(raw.get("reasons"))
        props["reason"] = {"type": "string", "enum": reasons} if reasons else {"type": "string"}
        required.append("reason")
    elif builtin != "signal":
        return {"type": "object", "required": required, "properties": props,
                "additionalProperties": {"type": ["string", "number", "boolean"]}}
    return {"type": "object", "additionalProperties": False, "required": required,
            "properties": props}


def derive(data: Mapping[str, Any], stage: str, skus: list[str] | None = None
           ) -> dict[str, Any]:
    """The derived output contract of ``stage`` (see the module docstring).

    Args:
        data: the funnel file, parsed.
        stage: the stage's name.
        skus: the catalog's SKUs, when the funnel has a catalog.
    """
    output = _d(data.get("output"))
    reply = {**DEFAULT_REPLY, **{k: v for k, v in _d(output.get("reply")).items()
                                 if k in ("minLength", "maxLength", "description")}}
    props: dict[str, Any] = {"reply": reply}
    if _d(data.get("language")).get("detected"):
        props["language"] = {"type": "string", "pattern": "^[a-z]{2}$",
                             "description": "ISO 639-1 code of the customer's language."}
    updates, _ = update_paths(_d(data.get("state")), stage_updates(data, stage))
    if updates:
        props["updates"] = {"type": "object", "additionalProperties": False,
                            "properties": updates}
    declared = _d(data.get("actions"))
    allowed = [a for a in dict.fromkeys(stage_actions(data, stage)) if a in declared]
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"{data.get('funnel')} {stage} output (derived from the funnel)",
        "type": "object", "additionalProperties": False, "required": ["reply"],
        "properties": props,
    }
    if allowed:
        max_actions = output.get("max_actions", DEFAULT_MAX_ACTIONS)
        props["actions"] = {"type": "array", "maxItems": max_actions, "items": {
            "oneOf": [{"$ref": f"#/$defs/{a}"} for a in allowed]}}
        schema["$defs"] = {a: action_schema(a, _d(declared[a]), data, skus) for a in allowed}
    else:  # `"actions": []` says "none": not worth a repair
        props["actions"] = {"type": "array", "maxItems": 0,
                            "description": "This stage takes no actions."}
    return schema


def extend(contract: Mapping[str, Any], extension: Mapping[str, Any]) -> dict[str, Any]:
    """``contract`` with ``extension`` merged in: mappings merge key by key, ``required``
    lists join, any other value of the extension replaces the contract's."""
    out = copy.deepcopy(dict(contract))
    for key, value in extension.items():
        have = out.get(key)
        if isinstance(have, dict) and isinstance(value, Mapping):
            out[key] = extend(have, value)
        elif key == "required" and isinstance(have, list) and isinstance(value, list):
            out[key] = list(dict.fromkeys([*have, *value]))
        else:
            out[key] = copy.deepcopy(value)
    return out
