"""Checks of a stage's output schema (F3xx): JSON, a valid JSON Schema, local ``$ref`` only,
what it lets the model update and which actions it offers."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

from ..errors import did_you_mean
from ..format import _yaml
from ..sandbox.patterns import problem as pattern_problem
from ..sandbox.patterns import schema_patterns
from .diagnostics import Report, as_dict, as_list


@lru_cache(maxsize=512)
def _load_schema(text: str) -> tuple[Any, tuple[int, int, str] | None, tuple[tuple[Any, ...], str] | None]:
    """(schema, JSON error, JSON Schema error) of an output schema's text.

    Checking a schema against the 2020-12 metaschema costs milliseconds, more
    than everything else about it. Callers only read the schema.
    """
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, _json_error(text, exc), None
    except RecursionError:  # `[[[[...]]]]` thousands deep: the decoder recurses
        return None, (1, 1, "not valid JSON here: nested far too deeply; an output schema "
                      "needs a dozen levels at most"), None
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return schema, None, (tuple(exc.absolute_path), exc.message)
    return schema, None, None


@lru_cache(maxsize=64)
def _schema_positions(text: str) -> _yaml.Located | None:
    # JSON is YAML: this gives every key's line. Only needed to report a problem.
    try:
        return _yaml.load(text)
    except _yaml.YamlSyntaxError:
        return None


def check_output_schema(
    path: Path, state: dict[str, Any], owned: set[str], declared_actions: set[str], report: Report
) -> None:
    """Check one stage output schema file: JSON, valid JSON Schema, and the envelope rules."""
    text = path.read_text("utf-8")
    schema, json_error, schema_error = _load_schema(text)
    if json_error is not None:
        line, col, message = json_error
        report.add(path, line, col, "error", "F301", message)
        return

    def at(keys: tuple[str | int, ...], code: str, msg: str, sev: str = "error") -> None:
        located = _schema_positions(text)
        line, col = located.where(keys, key=True) if located else (0, 0)
        report.add(path, line, col, sev, code, msg)  # type: ignore[arg-type]

    if schema_error is not None:
        keys, message = schema_error
        at(keys, "F301", f"not a valid JSON Schema at `{'/'.join(map(str, keys)) or '/'}`: "
           f"{message}")
        return
    if not isinstance(schema, dict):
        return
    check_contract(schema, at, state, owned, declared_actions)


Where = Callable[..., None]


def check_contract(schema: dict[str, Any], at: Where, state: dict[str, Any], owned: set[str],
                   declared_actions: set[str]) -> None:
    """The envelope rules of a contract (hand-written, or derived and extended).

    ``at(keys, code, message)`` reports a problem at a key path of the schema.
    """
    for keys, ref, problem in _dangling_refs(schema, schema, ()):
        at(keys, "F306", f"`$ref` {ref!r} {problem}")
    for keys, pattern in schema_patterns(schema):
        why = pattern_problem(pattern)
        if why is not None:
            at(keys, "F309", why)
    props = as_dict(schema.get("properties"))
    if "reply" not in props or "reply" not in as_list(schema.get("required")):
        at(("properties",), "F302", "the output schema must declare `reply` (a string) under "
           "`properties` and list it in `required`: it is what the customer sees")
    updates = resolve_local_ref(schema, as_dict(props.get("updates")))
    if updates:
        if updates.get("additionalProperties") is not False:
            at(("properties", "updates"), "F303", "`updates` must set `additionalProperties: "
               "false`, or the model could write any state field")
        for name, sub in as_dict(updates.get("properties")).items():
            keys = ("properties", "updates", "properties", name)
            if name in owned:
                at(keys, "F304", f"`updates` lets the model write '{name}', which the engine "
                   "owns (stage, history, totals, completeness, handoff, ...); remove it")
            elif name not in state:
                at(keys, "F303", f"`updates` writes '{name}', which the funnel's state does not "
                   f"declare{did_you_mean(name, state)}")
            else:
                _check_nested(resolve_local_ref(schema, as_dict(sub)), as_dict(state[name]), keys, name, at)
    for keys, action in action_types(schema):
        if action not in declared_actions:
            at(keys, "F305", f"action type '{action}' is not declared under `actions` in the "
               f"funnel{did_you_mean(action, declared_actions)}")


def _json_error(text: str, exc: json.JSONDecodeError) -> tuple[int, int, str]:
    """(line, col, message) of a JSON syntax error.

    A trailing comma is reported where the comma is, not at the ``}``/``]``
    (possibly lines later) where the decoder noticed it.
    """
    before = text[: exc.pos].rstrip()
    if before.endswith(",") and text[exc.pos : exc.pos + 1] in ("}", "]"):
        comma = len(before) - 1
        line = text.count("\n", 0, comma) + 1
        col = comma - text.rfind("\n", 0, comma)
        return line, col, (
            f"not valid JSON: trailing comma (before the '{text[exc.pos]}' on line "
            f"{exc.lineno}); JSON allows none: remove it")
    return exc.lineno, exc.colno, f"not valid JSON: {exc.msg}"


def _check_nested(sub: dict[str, Any], field: dict[str, Any], keys: tuple[Any, ...],
                  dotted: str, at: Any) -> None:
    declared = field.get("properties")
    if not isinstance(declared, dict) or field.get("additionalProperties") is True:
        return
    for name in as_dict(sub.get("properties")):
        if name not in declared:
            at((*keys, "properties", name), "F303", f"`updates.{dotted}` writes '{name}', which "
               f"the state field '{dotted}' does not declare{did_you_mean(name, declared)}")


def _dangling_refs(root: Any, node: Any, keys: tuple[str | int, ...]
                   ) -> list[tuple[tuple[str | int, ...], str, str]]:
    """Every ``$ref`` that does not resolve inside the schema itself, with where it is."""
    found: list[tuple[tuple[str | int, ...], str, str]] = []
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            if not ref.startswith("#"):
                found.append(((*keys, "$ref"), ref, "points outside this file; an output schema "
                              "must be self-contained: use `#/$defs/<name>`"))
            elif _pointer(root, ref[1:]) is _MISSING:
                defs = as_dict(root.get("$defs")) if isinstance(root, dict) else {}
                name = ref.rsplit("/", 1)[-1]
                found.append(((*keys, "$ref"), ref, "points at nothing in this schema"
                              f"{did_you_mean(name, defs)}; fix the name or add the definition "
                              "under `$defs`"))
        for k, v in node.items():
            if k not in ("const", "enum", "default", "examples"):
                found.extend(_dangling_refs(root, v, (*keys, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found.extend(_dangling_refs(root, v, (*keys, i)))
    return found


_MISSING = object()


def _pointer(root: Any, pointer: str) -> Any:
    """Resolve a JSON pointer (``/$defs/x``) in ``root``; ``_MISSING`` when it does not."""
    target = root
    for raw in pointer.split("/")[1:] if pointer else []:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return _MISSING
    return target


def resolve_local_ref(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """Follow a ``{"$ref": "#/$defs/x"}`` inside the same document (one level)."""
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = as_dict(target).get(part)
        return as_dict(target)
    return node


def action_types(schema: dict[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
    """Every action ``type`` the schema allows, with where it is written."""
    actions = resolve_local_ref(schema, as_dict(as_dict(schema.get("properties")).get("actions")))
    items = resolve_local_ref(schema, as_dict(actions.get("items")))
    base: tuple[str | int, ...] = ("properties", "actions", "items")
    branches: list[tuple[tuple[str | int, ...], dict[str, Any]]] = []
    for key in ("oneOf", "anyOf"):
        for i, branch in enumerate(as_list(items.get(key))):
            branches.append(((*base, key, i), resolve_local_ref(schema, as_dict(branch))))
    if not branches:
        branches.append((base, items))
    found: list[tuple[tuple[str | int, ...], str]] = []
    for keys, branch in branches:
        type_schema = as_dict(as_dict(branch.get("properties")).get("type"))
        tkeys = (*keys, "properties", "type")
        if isinstance(type_schema.get("const"), str):
            found.append((tkeys, type_schema["const"]))
        found.extend((tkeys, v) for v in as_list(type_schema.get("enum")) if isinstance(v, str))
    return found
