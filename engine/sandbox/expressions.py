"""Conditions and templates: one sandboxed Jinja language, compiled once.

Conditions (``discovery_completeness >= 60``, ``pet.type and pet.problems``)
are Jinja expressions compiled with ``SandboxedEnvironment.compile_expression``
at load time; templates render in the same sandbox with ``StrictUndefined``,
so a funnel author's typo fails loudly and no funnel file can reach Python
internals. There is no ``eval`` anywhere.
"""

from __future__ import annotations

import json
from collections import ChainMap
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson
from jinja2 import StrictUndefined, Template, TemplateSyntaxError, nodes
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .templates import BoundedSandbox, ConfinedLoader, bounded_render

Condition = Callable[[Mapping[str, Any]], bool]


def compact_json(value: Any) -> str:
    """Compact JSON text, non-ASCII kept, anything unknown as ``str``: what a prompt shows.

    orjson writes the same text several times faster; the standard library takes
    what orjson refuses (integers past 64 bits).
    """
    try:
        return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def make_environment(template_dir: Path | None = None,
                     roots: tuple[Path, ...] | None = None) -> ImmutableSandboxedEnvironment:
    """The sandbox every funnel template and condition runs in.

    Args:
        template_dir: the folder ``{% include %}`` and ``get_template`` read from.
        roots: the folders the funnel may read (see :mod:`engine.format.paths`); a
            template that resolves outside them (``..``, a symlink) is refused.
            Defaults to ``template_dir`` itself.
    """
    env = BoundedSandbox(
        loader=ConfinedLoader(template_dir, roots or (template_dir,)) if template_dir else None,
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=False,
        trim_blocks=True,
        lstrip_blocks=True,
        # Built once per funnel: never stat template files again on each render.
        auto_reload=False,
    )
    env.filters["compact_json"] = compact_json
    return env


_ENV = make_environment()


def _expression(source: str) -> Template:
    """An expression as a template that stores its value in ``result``.

    What ``Environment.compile_expression`` builds, but evaluated directly (see
    :func:`_evaluate`): its wrapper costs several times the expression itself,
    and conditions run several times per turn.
    """
    parser = Parser(_ENV, source, state="variable")
    expr = parser.parse_expression()
    if not parser.stream.eos:
        raise TemplateSyntaxError("chunk after expression", parser.stream.current.lineno,
                                  None, None)
    expr.set_environment(_ENV)
    body = [nodes.Assign(nodes.Name("result", "store"), expr, lineno=1)]
    return _ENV.from_string(nodes.Template(body, lineno=1))


def _evaluate(template: Template, context: Mapping[str, Any]) -> Any:
    return bounded_render(lambda: _run(template, context))


def _run(template: Template, context: Mapping[str, Any]) -> Any:
    # shared=True: read the context where it is instead of copying it into a new dict.
    ctx = template.new_context(ChainMap(context, template.globals), shared=True)  # type: ignore[arg-type]
    for _ in template.root_render_func(ctx):
        pass
    return ctx.vars["result"]


def compile_condition(source: str) -> Condition:
    """Compile a condition once; the result maps a context to a bool.

    Raises:
        jinja2.TemplateSyntaxError: the expression does not parse.
    """
    template = _expression(source)

    def condition(context: Mapping[str, Any]) -> bool:
        return bool(_evaluate(template, context))

    condition.__doc__ = source
    return condition


def compile_condition_list(sources: list[str]) -> Callable[[Mapping[str, Any]], list[bool]]:
    """Compile several conditions into one expression that returns their truth values."""
    template = _expression("[" + ", ".join(f"({s})" for s in sources) + "]")

    def conditions(context: Mapping[str, Any]) -> list[bool]:
        values = _evaluate(template, context)
        return [bool(v) for v in values or ()]

    return conditions


def parse_expression(source: str) -> nodes.Template:
    """Parse a condition as a template AST (for static checks of the names it uses)."""
    return _ENV.parse("{{ (" + source + ") }}")


def attribute_paths(tree: nodes.Node) -> Iterator[tuple[tuple[str, ...], int]]:
    """Yield each variable a template or expression reads as a dotted path.

    ``pet.age_years is not none`` yields ``(("pet", "age_years"), line)``.
    Names bound inside the template (``{% set %}``, loop targets) are
    not yielded.
    """
    bound: set[str] = set()
    for node in tree.find_all((nodes.Assign, nodes.For, nodes.Macro, nodes.With)):
        targets: list[nodes.Node] = []
        if isinstance(node, nodes.Assign | nodes.For):
            targets.append(node.target)
        if isinstance(node, nodes.With):
            targets.extend(node.targets)
        if isinstance(node, nodes.Macro):
            targets.extend(node.args)
        for target in targets:
            for name in target.find_all(nodes.Name):
                bound.add(name.name)
            if isinstance(target, nodes.Name):
                bound.add(target.name)
    bound.add("loop")
    seen: set[int] = set()
    for getattr_node in tree.find_all((nodes.Getattr, nodes.Name)):
        if id(getattr_node) in seen:
            continue
        chain: list[str] = []
        current: nodes.Node = getattr_node
        while isinstance(current, nodes.Getattr):
            seen.add(id(current))
            chain.append(current.attr)
            current = current.node
        if isinstance(current, nodes.Name):
            seen.add(id(current))
            if current.ctx != "load" or current.name in bound:
                continue
            yield (current.name, *reversed(chain)), getattr_node.lineno


def declared_view(value: Any, schema: Mapping[str, Any]) -> Any:
    """Fill declared-but-missing object properties with ``None``, recursively.

    State is partial (the customer has not said the pet's breed yet), while
    templates and conditions run with ``StrictUndefined``: a declared field
    reads as ``None``, an undeclared one is a loud error.
    """
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        out = dict(value)
        for key, sub in schema["properties"].items():
            out[key] = declared_view(out.get(key), sub) if key in out else None
        return out
    return value


@lru_cache(maxsize=1024)
def condition_names(source: str) -> tuple[str, ...]:
    """The dotted names a condition reads, in order, without repeats."""
    try:
        paths = attribute_paths(parse_expression(source))
    except Exception:  # validated funnels parse; this is only an explanation
        return ()
    return tuple(dict.fromkeys(".".join(p) for p, _ in paths))
