"""Checks of a stage's derived output contract (F307, F308 and the F30x of the contract).

The contract comes from the funnel (:mod:`engine.format.contract`): its problems are
the funnel's own and are reported at the funnel's file:line (an ``updates:`` path that
names no field, an action not declared), with a did-you-mean. A
``schema_extension`` file is checked like a hand-written schema, merged with the
derived part; a stage that names ``schema:`` and declares ``updates``/``actions``
too gets its file checked against them.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

from ..errors import CatalogError, did_you_mean
from ..format import contract
from ..format.catalog import load_catalog
from ..format.paths import funnel_roots, is_confined
from .diagnostics import Report, as_dict, as_list
from .schemas import _load_schema, _schema_positions, action_types, check_contract, resolve_local_ref


def check_paths_lists(data: dict[str, Any], state: dict[str, Any], owned: set[str],
                      report: Report) -> None:
    """F307/F304/F305: every `updates:` and `actions:` list (the stages' and `output:`'s)."""
    declared = as_dict(data.get("actions"))
    lists: list[tuple[tuple[str, ...], str, dict[str, Any]]] = [
        (("output",), "the funnel's `output`", as_dict(data.get("output")))]
    lists += [(("stages", s), f"stage '{s}'", as_dict(raw))
              for s, raw in as_dict(data.get("stages")).items()]
    for where, who, raw in lists:
        for i, path in enumerate(as_list(raw.get("updates"))):
            if not isinstance(path, str):
                continue  # the format layer's F004
            keys: tuple[str | int, ...] = (*where, "updates", i)
            head = path.split(".")[0]
            if head in owned:
                report.at(keys, "error", "F304", f"{who}: `updates` lets the model write "
                          f"'{head}', which the engine owns (stage, history, totals, "
                          "completeness, handoff, ...); remove it")
                continue
            _, problems = contract.update_paths(state, [path])
            for _, part, known in problems:
                what = "the funnel's state" if part == head else \
                    f"the state field '{path.rsplit('.' + part, 1)[0]}'"
                report.at(keys, "error", "F307", f"{who}: `updates` names '{path}', but "
                          f"{what} declares no '{part}'{did_you_mean(part, known)}; name a "
                          "declared field (or a dotted path into an object field)")
        for i, name in enumerate(as_list(raw.get("actions"))):
            if isinstance(name, str) and name not in declared:
                report.at((*where, "actions", i), "error", "F305", f"{who}: `actions` names "
                          f"'{name}', which is not declared under `actions` in the funnel"
                          f"{did_you_mean(name, declared)}")


def check_argument_paths(data: dict[str, Any], state: dict[str, Any], report: Report) -> None:
    """F307: an action argument given as a state path must name a declared field."""
    for name, raw in as_dict(data.get("actions")).items():
        for arg, value in as_dict(as_dict(raw).get("arguments")).items():
            if isinstance(value, str) and contract.field_at(state, value) is None:
                _, problems = contract.update_paths(state, [value])
                part, known = (problems[0][1], problems[0][2]) if problems else (value, [])
                report.at(("actions", name, "arguments", arg), "error", "F307",
                          f"action '{name}': argument '{arg}' takes the schema of '{value}', "
                          f"but the state declares no '{part}'{did_you_mean(part, known)}; "
                          "name a declared field, or give the argument's JSON Schema")


def check_derived(data: dict[str, Any], stage: str, state: dict[str, Any], owned: set[str],
                  schemas_dir: Path, report: Report) -> None:
    """The derived contract of ``stage``, merged with its `schema_extension` file if any."""
    raw = as_dict(as_dict(data.get("stages")).get(stage))
    derived = contract.derive(data, stage, _skus(data, report.path))
    declared = set(as_dict(data.get("actions")))
    problem = _contract_problem(derived)
    if problem is not None:
        where, message = problem
        field = where.removeprefix(_FIELDS).split("/") if where.startswith(_FIELDS) else None
        if field is not None and field[0] in as_dict(data.get("state")):
            # A field's own declaration is wrong: said once, at its line, not per stage.
            keys = ("state", *field)
            text = (f"state field '{field[0]}' is not a valid JSON Schema: at "
                    f"`{'/'.join(field[1:]) or '/'}`: {message}; every stage that lets the "
                    "model write it derives its contract from it")
            if not any(d.message == text for d in report.items):
                report.at(keys, "error", "F301", text, key=True)
            return
        report.at(("stages", stage), "error", "F301", f"stage '{stage}': the derived output "
                  f"contract is not a valid JSON Schema: at `{where or '/'}`: {message}; check "
                  "the declarations of the fields it names under `state:` (and the actions' "
                  "`arguments:`)", key=True)
        return
    extension = raw.get("schema_extension")
    if not isinstance(extension, str):
        return
    path = schemas_dir / extension
    keys = ("stages", stage, "schema_extension")
    if not is_confined(path, funnel_roots(report.path)):
        report.at(keys, "error", "F007", f"stage '{stage}': schema extension {path} is outside "
                  "the funnel's folder (or hidden): move it there, or list its folder in "
                  "FUNNEL_ROOT")
        return
    if not path.is_file():
        report.at(keys, "error", "F301", f"stage '{stage}': schema extension {path} does not "
                  "exist; create it or remove `schema_extension:`")
        return
    text = path.read_text("utf-8")
    loaded, json_error, _ = _load_schema(text)
    if json_error is not None:
        report.add(path, json_error[0], json_error[1], "error", "F301", json_error[2])
        return
    if not isinstance(loaded, dict):
        report.add(path, 1, 1, "error", "F301", "a schema extension must be a JSON object "
                   "(the keys to merge into the derived contract)")
        return
    merged = contract.extend(derived, loaded)

    def at(where: tuple[str | int, ...], code: str, msg: str, sev: str = "error") -> None:
        located = _schema_positions(text)
        line, col = located.where(where, key=True) if located else (0, 0)
        report.add(path, line, col, sev, code, f"stage '{stage}' (extended contract): "  # type: ignore[arg-type]
                   f"{msg}")

    error = _schema_error(json.dumps(merged, sort_keys=True))
    if error is not None:
        at((), "F301", f"the merged contract is not a valid JSON Schema: {error}")
        return
    check_contract(merged, at, state, owned, declared)


def check_override(data: dict[str, Any], stage: str, schema_file: Path, report: Report) -> None:
    """F308: a stage's `schema:` file may not allow more than its `updates`/`actions` say."""
    raw = as_dict(as_dict(data.get("stages")).get(stage))
    if not ({"updates", "actions"} & raw.keys()) or not schema_file.is_file():
        return
    schema, _, _ = _load_schema(schema_file.read_text("utf-8"))
    if not isinstance(schema, dict):
        return
    updates = resolve_local_ref(schema, as_dict(as_dict(schema.get("properties")).get("updates")))
    if "updates" in raw:
        allowed = {p.split(".")[0] for p in as_list(raw["updates"]) if isinstance(p, str)}
        for name in as_dict(updates.get("properties")):
            if name not in allowed:
                report.at(("stages", stage, "updates"), "error", "F308", f"stage '{stage}': "
                          f"its schema {schema_file.name} lets the model write '{name}', which "
                          "the stage's `updates` does not list; add it there or remove it from "
                          "the schema")
    if "actions" in raw:
        allowed = {a for a in as_list(raw["actions"]) if isinstance(a, str)}
        for _, action in action_types(schema):
            if action not in allowed:
                report.at(("stages", stage, "actions"), "error", "F308", f"stage '{stage}': "
                          f"its schema {schema_file.name} allows action '{action}', which the "
                          "stage's `actions` does not list; add it there or remove it from "
                          "the schema")


_FIELDS = "properties/updates/properties/"


def _contract_problem(schema: dict[str, Any]) -> tuple[str, str] | None:
    """The metaschema check of a derived contract, as (where, what), in parts: each action's
    definition and each field's schema are checked once however many stages share them,
    then the rest.
    Measured: Puramur's 7 contracts took 0.40 s whole (jsonschema's metaschema check is
    ~60 ms a contract), and most of their parts are the same declarations."""
    parts: list[tuple[str, Any]] = []
    skeleton = dict(schema)
    defs = schema.get("$defs")
    if isinstance(defs, dict):
        parts += [(f"$defs/{k}", v) for k, v in defs.items()]
        skeleton["$defs"] = {k: {} for k in defs}
    props = schema.get("properties")
    updates = props.get("updates") if isinstance(props, dict) else None
    fields = updates.get("properties") if isinstance(updates, dict) else None
    if isinstance(props, dict) and isinstance(updates, dict) and isinstance(fields, dict):
        parts += [(f"properties/updates/properties/{k}", v) for k, v in fields.items()]
        skeleton["properties"] = {**props, "updates": {**updates,
                                                       "properties": {k: {} for k in fields}}}
    for where, part in [*parts, ("", skeleton)]:
        problem = _schema_problem(json.dumps(part, sort_keys=True))
        if problem is not None:
            return "/".join(p for p in (where, problem[0]) if p), problem[1]
    return None


def _schema_error(text: str) -> str | None:
    problem = _schema_problem(text)
    return None if problem is None else f"at `{problem[0] or '/'}`: {problem[1]}"


@lru_cache(maxsize=256)
def _schema_problem(text: str) -> tuple[str, str] | None:
    # The metaschema check costs milliseconds: once per distinct schema.
    try:
        jsonschema.Draft202012Validator.check_schema(json.loads(text))
    except jsonschema.SchemaError as exc:
        return "/".join(map(str, exc.absolute_path)), exc.message
    return None


def _skus(data: dict[str, Any], funnel: Path) -> list[str] | None:
    """The catalog's SKUs, when it loads (its own problems are `check_catalog`'s)."""
    name = data.get("catalog")
    if not isinstance(name, str):
        return None
    path = funnel.parent / name
    if not path.is_file() or not is_confined(path, funnel_roots(funnel)):
        return None
    return _catalog_skus(str(path), path.stat().st_mtime_ns)


@lru_cache(maxsize=32)
def _catalog_skus(path: str, mtime: int) -> list[str] | None:
    try:
        return [p.sku for p in load_catalog(Path(path)).products]
    except (CatalogError, OSError, UnicodeDecodeError, ValueError):
        return None  # the catalog's problems are check_catalog's to report
