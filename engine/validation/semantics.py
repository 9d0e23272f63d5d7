"""Semantic checks of a funnel: names, the stage graph, conditions and indexes.

Templates and output schemas are checked in `files`, actions and hooks in
`actions`. Every check reads the raw data defensively, so a funnel with format
errors still gets every other problem reported in the same run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import TemplateSyntaxError, nodes

from ..errors import did_you_mean
from ..format.build import implied_engine_fields
from ..format.follow_up import declarations as follow_up_declarations
from ..format.names import SHARED_TABLES
from ..format.spec import (
    APPROVAL_CHOICES,
    COLUMN_TYPE,
    CONDITION_NAMES,
    ENGINE_COLUMNS,
    SQL_IDENTIFIER,
)
from ..sandbox.expressions import attribute_paths, parse_expression
from ..sandbox.patterns import problem as pattern_problem
from ..sandbox.patterns import schema_patterns
from .claims import claim_conditions
from .diagnostics import Report, as_dict, as_list
from .format import format_schema
from .phones import check_phones
from .sandbox import refused, unguarded_comparisons


def check_semantics(data: dict[str, Any], state: dict[str, Any], report: Report) -> None:
    """Names, stage references, the stage graph, conditions and indexes.

    Args:
        data: the funnel file's raw data.
        state: its declared state fields (those given as mappings).
        report: where problems go.
    """
    stages = as_dict(data.get("stages"))
    stage_names = [s for s in stages if isinstance(s, str)]

    table = data.get("table")
    if isinstance(table, str) and not SQL_IDENTIFIER.fullmatch(table):
        report.at(("table",), "error", "F005", f"table name {table!r} is not a valid SQL "
                  "identifier: use letters, digits and _ (not starting with a digit), at most 63")
    elif isinstance(table, str) and table.lower() in SHARED_TABLES:
        report.at(("table",), "error", "F005", f"table name {table!r} is one of the tables "
                  f"the engine shares between funnels ({', '.join(SHARED_TABLES)}): give the "
                  "funnel a table of its own, e.g. '<funnel>_sessions_state'")
    for name, raw in state.items():
        for keys, pattern in schema_patterns(raw, ("state", name)):
            why = pattern_problem(pattern)
            if why is not None:
                report.at(keys, "error", "F309", f"`{'.'.join(map(str, keys))}`: {why}",
                          key=keys[-2] == "patternProperties")
        if name in ENGINE_COLUMNS:
            report.at(("state", name), "error", "F006", f"state field '{name}' is a column the "
                      "engine owns already; remove it or rename it", key=True)
        column = raw.get("column")
        if isinstance(column, str) and not COLUMN_TYPE.match(column.strip()):
            report.at(("state", name, "column"), "error", "F006", f"column type {column!r} is "
                      "not supported; use text, int, bigint, numeric(p,s), boolean, jsonb, "
                      "timestamptz, date, double precision or varchar(n)")

    check_phones(state, report)
    _check_stage_refs(data, stages, stage_names, report)
    _check_feature_fields(data, state, report)
    _check_graph(data, stages, stage_names, report)
    _check_conditions(data, state, report)
    _check_indexes(data, state, report)



def _check_stage_refs(
    data: dict[str, Any], stages: dict[str, Any], names: list[str], report: Report
) -> None:
    def ref(keys: tuple[str | int, ...], value: Any, code: str = "F101") -> None:
        if isinstance(value, str) and value not in stages:
            report.at(keys, "error", code, f"unknown stage '{value}'{did_you_mean(value, names)}; "
                      f"stages are: {', '.join(names)}")

    ref(("initial",), data.get("initial"), "F102")
    ref(("handoff", "stage"), as_dict(data.get("handoff")).get("stage"))
    ref(("memory", "idle_return_stage"), as_dict(data.get("memory")).get("idle_return_stage"))
    for i, t in enumerate(as_list(data.get("global_transitions"))):
        ref(("global_transitions", i, "to"), as_dict(t).get("to"))
    for old, new in as_dict(data.get("removed_stages")).items():
        ref(("removed_stages", old), new)
    for name, raw in stages.items():
        raw = as_dict(raw)
        for i, t in enumerate(as_list(raw.get("transitions"))):
            ref(("stages", name, "transitions", i, "to"), as_dict(t).get("to"))
        limit = as_dict(raw.get("max_iterations"))
        ref(("stages", name, "max_iterations", "to"), limit.get("to"))
        if limit.get("to") is not None and limit.get("offer") is not None:
            report.at(("stages", name, "max_iterations", "offer"), "error", "F405", f"stage "
                      f"'{name}': `max_iterations` has both `to` and `offer`; the session moves "
                      "at the end of the turn that reaches the limit, so the offer never reaches "
                      "the prompt: keep one of them", key=True)
        _check_approval(data, stages, names, name, as_dict(raw.get("approval")), report)
        if raw.get("final") and raw.get("transitions"):
            report.at(("stages", name, "transitions"), "warning", "F106", f"stage '{name}' is "
                      "final, so its transitions never fire; remove them or `final: true`")


def _check_approval(data: dict[str, Any], stages: dict[str, Any], names: list[str], name: str,
                    approval: dict[str, Any], report: Report) -> None:
    """A stage's ``approval.on_timeout``: a known choice or stage (F406); ``handoff`` needs
    the funnel's ``handoff`` section (F407); the initial stage is never entered by a move,
    so its gate never waits (F408)."""
    if not approval:
        return
    keys = ("stages", name, "approval", "on_timeout")
    choice = approval.get("on_timeout")
    if isinstance(choice, str) and choice not in APPROVAL_CHOICES and choice not in stages:
        report.at(keys, "error", "F406", f"stage '{name}': `approval.on_timeout: {choice}` is "
                  f"neither {', '.join(APPROVAL_CHOICES)} nor a stage"
                  f"{did_you_mean(choice, [*APPROVAL_CHOICES, *names])}; stages are: "
                  f"{', '.join(names)}")
    if choice == "handoff" and not as_dict(data.get("handoff")).get("stage"):
        report.at(keys, "error", "F407", f"stage '{name}': `approval.on_timeout: handoff` needs "
                  "the funnel's `handoff:` section (its stage is where the session goes); "
                  "declare it or name a stage")
    if name == data.get("initial"):
        report.at(("stages", name, "approval"), "warning", "F408", f"stage '{name}' is the "
                  "initial stage: a session starts there without a move, so its approval "
                  "never waits; put it on the stage the approved change leads to", key=True)


def _stage_names(values: Iterable[Any]) -> set[str]:
    # Only strings: a malformed `to: [..]` is reported by the format layer, and
    # must not crash the graph walk (lists and dicts are not hashable).
    return {v for v in values if isinstance(v, str)}


def _successors(data: dict[str, Any], stages: dict[str, Any]) -> dict[str, set[str]]:
    globals_to = _stage_names(as_dict(t).get("to") for t in as_list(data.get("global_transitions")))
    out: dict[str, set[str]] = {}
    for name, raw in stages.items():
        raw = as_dict(raw)
        nxt = _stage_names(as_dict(t).get("to") for t in as_list(raw.get("transitions")))
        nxt |= _stage_names([as_dict(raw.get("max_iterations")).get("to")])
        if not raw.get("final"):
            nxt |= globals_to
        out[name] = {s for s in nxt if s in stages}
    idle = as_dict(data.get("memory")).get("idle_return_stage")
    if isinstance(idle, str) and idle in stages:
        for name in out:
            out[name].add(idle)
    # A move held for approval may time out into another stage, from where it was held.
    handoff = as_dict(data.get("handoff")).get("stage")
    for nxt in out.values():
        for gated in list(nxt):
            target = as_dict(as_dict(stages.get(gated)).get("approval")).get("on_timeout")
            target = handoff if target == "handoff" else target
            if isinstance(target, str) and target in stages:
                nxt.add(target)
    return out


def _check_graph(
    data: dict[str, Any], stages: dict[str, Any], names: list[str], report: Report
) -> None:
    initial = data.get("initial")
    if not stages or not isinstance(initial, str) or initial not in stages:
        return
    # A stage with a mistyped key (`transitons:`, F003) has transitions the graph
    # cannot see: every stage after it would be reported too. F003 says it all.
    stage_keys = set(format_schema()["properties"]["stages"]["additionalProperties"]["properties"])
    if any(set(as_dict(raw)) - stage_keys for raw in stages.values()):
        return
    succ = _successors(data, stages)
    reachable = {initial}
    todo = [initial]
    while todo:
        for nxt in succ[todo.pop()]:
            if nxt not in reachable:
                reachable.add(nxt)
                todo.append(nxt)
    for name in names:
        if name not in reachable:
            report.at(("stages", name), "error", "F103", f"stage '{name}' cannot be reached "
                      f"from the initial stage '{initial}'; add a transition to it or remove it",
                      key=True)
    finals = {n for n in names if as_dict(stages[n]).get("final")}
    if not finals:
        report.at(("stages",), "error", "F105", "no stage is `final: true`; mark the stage "
                  "where a conversation ends (usually the handoff)", key=True)
        return
    # Stages from which some final stage is reachable: walk the graph backwards.
    pred: dict[str, set[str]] = {n: set() for n in names}
    for src, dsts in succ.items():
        for dst in dsts:
            pred[dst].add(src)
    can_finish = set(finals)
    todo = list(finals)
    while todo:
        for prev in pred[todo.pop()]:
            if prev not in can_finish:
                can_finish.add(prev)
                todo.append(prev)
    for name in names:
        if name in reachable and name not in can_finish:
            report.at(("stages", name), "error", "F104", f"no final stage can be reached from "
                      f"stage '{name}'; add a transition towards {', '.join(sorted(finals))}",
                      key=True)


def _check_feature_fields(data: dict[str, Any], state: dict[str, Any], report: Report) -> None:
    fields = list(state)
    pairs: list[tuple[tuple[str | int, ...], Any]] = []
    comp = as_dict(data.get("completeness"))
    pairs.append((("completeness", "field"), comp.get("field")))
    cart = as_dict(data.get("cart"))
    pairs += [(("cart", k), cart.get(k)) for k in ("field", "count", "total")]
    pairs += [(("cart", s, "flag"), as_dict(cart.get(s)).get("flag")) for s in ("gift", "free_delivery")]
    pairs.append((("presented", "field"), as_dict(data.get("presented")).get("field")))
    pairs.append((("memory", "summary"), as_dict(data.get("memory")).get("summary")))
    lang = as_dict(data.get("language"))
    pairs += [(("language", k), lang.get(k)) for k in ("detected", "response")]
    handoff = as_dict(data.get("handoff"))
    pairs += [(("handoff", k), handoff.get(k)) for k in ("triggered_at", "reason", "channel")]
    for name, action in as_dict(data.get("actions")).items():
        pairs.append((("actions", name, "field"), as_dict(action).get("field")))
        for i, written in enumerate(as_list(as_dict(action).get("writes"))):
            pairs.append((("actions", name, "writes", i), written))
    for keys, value in pairs:
        if isinstance(value, str) and value not in state:
            report.at(keys, "error", "F110", f"`{'.'.join(map(str, keys))}` names '{value}', "
                      f"which is not a state field{did_you_mean(value, fields)}; declare it "
                      "under `state`")
    if comp and isinstance(comp.get("field"), str) and comp["field"] in state:
        if as_dict(state[comp["field"]]).get("type") not in ("integer", "number"):
            report.at(("state", comp["field"], "type"), "error", "F110", "the completeness "
                      "field must be an integer or a number")


def _condition_names(data: dict[str, Any], state: dict[str, Any]) -> set[str]:
    return set(state) | set(CONDITION_NAMES) | {"stage_history", "session_id"}


def _check_conditions(data: dict[str, Any], state: dict[str, Any], report: Report) -> None:
    conditions: list[tuple[tuple[str | int, ...], Any]] = []
    for i, rule in enumerate(as_list(as_dict(data.get("completeness")).get("rules"))):
        conditions.append((("completeness", "rules", i, "when"), as_dict(rule).get("when")))
    for i, t in enumerate(as_list(data.get("global_transitions"))):
        conditions.append((("global_transitions", i, "when"), as_dict(t).get("when")))
    for name, raw in as_dict(data.get("stages")).items():
        for i, t in enumerate(as_list(as_dict(raw).get("transitions"))):
            conditions.append((("stages", name, "transitions", i, "when"), as_dict(t).get("when")))
        conditions.append((("stages", name, "approval", "when"),
                           as_dict(as_dict(raw).get("approval")).get("when")))
    for keys, _, follow in follow_up_declarations(data):  # each step's `when`
        for i, step in enumerate(as_list(follow.get("steps"))):
            conditions.append(((*keys, "steps", i, "when"), as_dict(step).get("when")))
    conditions += claim_conditions(data)  # what backs a reply's promises and promotions
    known = _condition_names(data, state)
    max_points = sum(
        max(0, int(as_dict(r).get("points", 0)))
        for r in as_list(as_dict(data.get("completeness")).get("rules"))
        if isinstance(as_dict(r).get("points"), int)
    )
    comp_field = as_dict(data.get("completeness")).get("field")
    for keys, source in conditions:
        if source is None:
            continue
        if not isinstance(source, str | int | float | bool):
            continue
        source = str(source)
        try:
            tree = _parse_condition(source)
        except TemplateSyntaxError as exc:
            report.at(keys, "error", "F401", f"condition {source!r} does not parse: "
                      f"{exc.message}; {_parse_hint(source)}")
            continue
        check_paths(tree, state, known, report, keys, "condition", "F402")
        for message in _refused_condition(source):
            report.at(keys, "error", "F205", f"condition {source!r}: {message}")
        for path, _ in unguarded_comparisons(tree, state):
            dotted = ".".join(path)
            report.at(keys, "warning", "F404", f"condition {source!r} compares '{dotted}', which "
                      "is None until it is known, and a comparison with None is an error: the "
                      f"condition never holds then; guard it (`{dotted} is not none and ...`) "
                      f"or give a default (`{dotted}|default(0)`)")
        if comp_field and data.get("completeness"):
            _check_threshold(tree, comp_field, max_points, keys, report)


@lru_cache(maxsize=1024)
def _parse_condition(source: str) -> nodes.Template:
    # Funnels repeat conditions (`handoff_requested == 'complaint'`); callers only read the AST.
    return parse_expression(source)


@lru_cache(maxsize=1024)
def _refused_condition(source: str) -> tuple[str, ...]:
    return tuple(message for _, _, message in refused(_parse_condition(source)))


def check_paths(
    tree: nodes.Node,
    state: dict[str, Any],
    known: set[str],
    report: Report,
    keys: tuple[str | int, ...] | None,
    what: str,
    code: str,
    *,
    file: Path | None = None,
    line_offset: int = 0,
    paths: Iterable[tuple[tuple[str, ...], int]] | None = None,
) -> None:
    """Report names (and nested properties) that neither the state nor the context declares.

    ``paths``: ``attribute_paths(tree)`` when the caller has it already.
    """
    def problem(lineno: int, msg: str) -> None:
        if file is not None:
            report.add(file, lineno + line_offset, 1, "error", code, msg)
        else:
            report.at(keys or (), "error", code, msg)

    for path, lineno in attribute_paths(tree) if paths is None else paths:
        head = path[0]
        if head not in known:
            problem(lineno, f"{what} uses '{head}', which is neither a state field nor a "
                    f"documented name{did_you_mean(head, known)}")
            continue
        schema = as_dict(state.get(head))
        for depth, part in enumerate(path[1:], start=1):
            props = schema.get("properties")
            if not isinstance(props, dict) or schema.get("additionalProperties") is True:
                break
            if part not in props:
                dotted = ".".join(path[: depth + 1])
                problem(lineno, f"{what} uses '{dotted}', but '{'.'.join(path[:depth])}' "
                        f"declares no property '{part}'{did_you_mean(part, props)}")
                break
            schema = as_dict(props[part])


def _check_threshold(
    tree: nodes.Node, field: str, max_points: int, keys: tuple[str | int, ...], report: Report
) -> None:
    for cmp in tree.find_all(nodes.Compare):
        if not (isinstance(cmp.expr, nodes.Name) and cmp.expr.name == field and cmp.ops):
            continue
        op = cmp.ops[0]
        if isinstance(op.expr, nodes.Const) and isinstance(op.expr.value, int | float):
            need = op.expr.value
            if (op.op == "gteq" and need > max_points) or (op.op == "gt" and need >= max_points):
                report.at(keys, "warning", "F403", f"`{field}` can reach at most {max_points} "
                          f"points, so this condition never holds; lower the threshold or add "
                          "completeness rules")


def _check_indexes(data: dict[str, Any], state: dict[str, Any], report: Report) -> None:
    columns = set(state) | set(ENGINE_COLUMNS)
    for i, ix in enumerate(as_list(data.get("indexes"))):
        col = as_dict(ix).get("column")
        if isinstance(col, str) and col not in columns:
            report.at(("indexes", i, "column"), "error", "F601", f"index on unknown column "
                      f"'{col}'{did_you_mean(col, columns)}")


# A lone `=` (not part of `==`, `!=`, `<=`, `>=`): the assignment an author meant as a test.
_LONE_EQUALS = re.compile(r"(?<![=!<>])=(?!=)")


def _parse_hint(source: str) -> str:
    """What to write instead of a condition that does not parse."""
    # Quoted text keeps its `=`: split it off, fix the rest.
    parts = re.split(r"('[^']*'|\"[^\"]*\")", source)
    fixed = "".join(p if i % 2 else _LONE_EQUALS.sub("==", p) for i, p in enumerate(parts))
    if fixed != source:
        return f"did you mean `==`? `=` does not compare: write `{fixed}`"
    return "write a Jinja expression such as `pet.type and pet.breed`"


def engine_owned_names(data: dict[str, Any], state: dict[str, Any]) -> set[str]:
    declared = {n for n, raw in state.items() if as_dict(raw).get("owner") == "engine"}
    return declared | implied_engine_fields(data) | set(ENGINE_COLUMNS)
