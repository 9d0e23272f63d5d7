"""Static checks of what the sandbox would refuse at render time, found before any turn.

The sandbox refuses ``''.__class__``, ``|attr('__class__')``,
``'{0.__class__}'.format(state)``, ``state.update(...)`` and work past its
limits (``'a' * 10**10``), but only when the template renders: every turn of
the stage would then fail. These checks walk the parsed template or condition
and report each such construct where it is written (F205), and a comparison
of a value that may be missing (``pet.age_years > 30``) which would never hold
(F404, a warning).
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import SecurityError

from ..sandbox.templates import _BINOPS, WorkLimit

# Methods that change a dict, list or set: the immutable sandbox refuses them.
MUTATING = frozenset({"append", "extend", "insert", "pop", "popitem", "remove", "clear",
                      "update", "setdefault", "sort", "reverse", "add", "discard",
                      "difference_update", "intersection_update", "symmetric_difference_update"})
# Attributes the sandbox refuses, or that reach Python internals through a format string.
INTERNAL = frozenset({"mro", "func_globals", "gi_frame", "gi_code", "cr_frame", "cr_code",
                      "ag_frame", "ag_code", "f_globals", "f_locals", "f_builtins"})


def _is_internal(attr: str) -> bool:
    return attr.startswith("_") or attr in INTERNAL


def refused(tree: nodes.Node) -> Iterator[tuple[int, str, str]]:
    """Yield ``(line, token, message)`` for each construct the sandbox refuses at render.

    ``token`` is the text to look for on the line, to give a column.
    """
    for node in tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Filter, nodes.Call)):
        if isinstance(node, nodes.Getattr) and _is_internal(node.attr):
            yield node.lineno, node.attr, (f"`.{node.attr}` reaches Python internals, which "
                                           "the sandbox refuses at render time; remove it")
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and \
                isinstance(node.arg.value, str) and node.arg.value.startswith("_"):
            yield node.lineno, node.arg.value, (
                f"`['{node.arg.value}']` reaches Python internals, which the sandbox refuses "
                "at render time; remove it")
        elif isinstance(node, nodes.Filter) and node.name == "attr":
            arg = node.args[0] if node.args else None
            if not (isinstance(arg, nodes.Const) and isinstance(arg.value, str)
                    and not _is_internal(arg.value)):
                yield node.lineno, "attr", (
                    "`|attr(...)` with an internal or computed name is refused by the sandbox "
                    "at render time; use `value.name` with a declared property")
        elif isinstance(node, nodes.Call) and isinstance(node.node, nodes.Getattr):
            method, owner = node.node.attr, node.node.node
            if method in MUTATING:
                yield node.lineno, method, (
                    f"`.{method}(...)` changes a value, which the immutable sandbox refuses at "
                    "render time; templates and conditions only read the state")
            elif method in ("format", "format_map") and isinstance(owner, nodes.Const) and \
                    isinstance(owner.value, str) and _format_reaches_internals(owner.value):
                yield node.lineno, method, (
                    "a format string that reads an internal attribute (`{0.__class__}`) is "
                    "refused by the sandbox at render time; remove it")
    yield from _bombs(tree)


def _format_reaches_internals(fmt: str) -> bool:
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(fmt) if f]
    except ValueError:
        return False
    return any(re.search(r"(^|\.|\[)_|\.mro\b", f) for f in fields)


class _NotConst(Exception):
    pass


_OPS = {nodes.Pow: "**", nodes.Mul: "*", nodes.Add: "+", nodes.Mod: "%"}


def _fold(node: nodes.Node) -> Any:
    """The value of a constant expression, computed with the sandbox's bounded operators."""
    if isinstance(node, nodes.Const):
        return node.value
    if isinstance(node, nodes.List | nodes.Tuple):
        return [_fold(item) for item in node.items]
    if isinstance(node, nodes.Neg):
        return -_fold(node.node)
    for kind, op in _OPS.items():
        if isinstance(node, kind):
            return _BINOPS[op](_fold(node.left), _fold(node.right))
    raise _NotConst


def _bombs(tree: nodes.Node) -> Iterator[tuple[int, str, str]]:
    """Constant sub-expressions whose value is past the sandbox's limits ('a' * 10**10)."""
    reported: set[int] = set()
    for node in tree.find_all(tuple(_OPS)):
        if node.lineno in reported:
            continue
        try:
            _fold(node)
        except WorkLimit as exc:
            reported.add(node.lineno)
            yield node.lineno, _OPS[type(node)], f"unbounded work: {exc}"
        except (_NotConst, SecurityError, TypeError, ValueError, ArithmeticError):
            continue


_ORDER = frozenset({"gt", "gteq", "lt", "lteq"})


def _path(node: nodes.Node) -> tuple[str, ...] | None:
    chain: list[str] = []
    while isinstance(node, nodes.Getattr):
        chain.append(node.attr)
        node = node.node
    if isinstance(node, nodes.Name):
        return (node.name, *reversed(chain))
    return None


def unguarded_comparisons(tree: nodes.Node, state: dict[str, Any]
                          ) -> Iterator[tuple[tuple[str, ...], str]]:
    """Ordering comparisons (``>``, ``<=``...) of a value that may be missing, unguarded.

    A declared nested property reads as ``None`` until the model sets it, and so
    does a nullable field; ``None > 30`` is an error, so the condition never
    holds. A guard is the same path used elsewhere in the condition outside an
    ordering comparison (``pet.age_years is not none and pet.age_years > 30``,
    ``pet.age_years and ...``).
    """
    compared: dict[tuple[str, ...], str] = {}
    compare_operands: set[int] = set()
    for cmp in tree.find_all(nodes.Compare):
        operands = [cmp.expr, *(op.expr for op in cmp.ops)]
        if not any(op.op in _ORDER for op in cmp.ops):
            continue
        for operand in operands:
            path = _path(operand)
            if path is None or not _may_be_missing(path, state):
                continue
            compare_operands.add(id(operand))
            compared.setdefault(path, cmp.ops[0].op)
    if not compared:
        return
    guarded: set[tuple[str, ...]] = set()
    for node in tree.find_all((nodes.Getattr, nodes.Name)):
        if id(node) in compare_operands:
            continue
        path = _path(node)
        if path is not None:
            guarded.update(path[:n] for n in range(1, len(path) + 1))
    for path, op in compared.items():
        if path not in guarded:
            yield path, op


def _may_be_missing(path: tuple[str, ...], state: dict[str, Any]) -> bool:
    field = state.get(path[0])
    if not isinstance(field, dict):
        return False
    if len(path) == 1:
        temporal = field.get("type") == "string" and field.get("format") in ("date-time", "date")
        return bool(field.get("nullable", temporal and "default" not in field))
    return True  # a nested property is None until set
