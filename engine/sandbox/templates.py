"""The Jinja sandbox with bounded work, and a template loader confined to the funnel.

Jinja's ``ImmutableSandboxedEnvironment`` keeps funnel files away from Python
internals, but not from work: ``'a' * 10**10`` allocates 10 GB, ``10**10**10``
never ends, ``'{:>999999999}'.format(1)`` allocates a gigabyte. Here every
operator that builds a value checks the size of what it would build first
(strings, lists and integers), ``str.format``/``%`` refuse huge widths, the
filters that pad or repeat (``center``, ``indent``, ``replace``, ``format``,
``wordwrap``) check their arguments, and every ``{% for %}`` of a render
counts against one budget of iterations. What exceeds a limit raises
:class:`WorkLimit` (a ``SecurityError``), which a turn treats as any other
template or condition error.
"""

from __future__ import annotations

import os
import posixpath
import re
import string
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

from jinja2 import Environment, FileSystemLoader, Template, nodes, pass_context
from jinja2.exceptions import SecurityError
from jinja2.filters import FILTERS, sync_do_join
from jinja2.loaders import split_template_path
from jinja2.runtime import Context, LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from ..format.paths import OutsideFunnel, is_confined

__all__ = ["MAX_BITS", "MAX_BUILT", "MAX_ITERATIONS", "MAX_SIZE", "MAX_WIDTH",
           "BoundedSandbox", "BoundedTemplate", "ConfinedLoader", "WorkLimit", "bounded_render",
           "charge", "render_block", "render_without"]

MAX_SIZE = 100_000  # characters of a string, items of a list an operator builds
MAX_BITS = 8_192  # bits of an integer an operator builds (2**8192 has 2,467 digits)
MAX_WIDTH = 1_000  # a format width or precision, a padding width
MAX_ITERATIONS = 100_000  # loop iterations in one render, all loops together

MAX_BUILT = 2_000_000  # characters and items all operators of one render build together

_LOOP = "_funnel_bounded_loop"
_JOIN = "_funnel_bounded_join"

# What the operators of the render in progress have built so far: bounded too, so
# that `range(100000)|map('center', 999)` (each call small) cannot add up to gigabytes.
_BUILT: ContextVar[list[int] | None] = ContextVar("funnel_sandbox_built", default=None)


T = TypeVar("T")
_SYNC_JOIN = sync_do_join


class WorkLimit(SecurityError):
    """A template or condition tried to build or loop past the sandbox's limits."""


def _size(value: Any) -> int | None:
    return len(value) if isinstance(value, str | bytes | list | tuple) else None


def _weight(value: Any) -> int:
    """What a value costs to repeat or render: its length, its items' lengths for a list."""
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, list | tuple):
        return len(value) + sum(len(v) for v in value if isinstance(v, str | bytes | list | tuple))
    return 1


def charge(size: int) -> None:
    """Count ``size`` against the current render's budget (none outside a render)."""
    built = _BUILT.get()
    if built is not None:
        built[0] += size
        if built[0] > MAX_BUILT:
            raise WorkLimit(f"this render built more than {MAX_BUILT:,} characters and items "
                            "in all, the sandbox's limit")


def bounded_render(run: Callable[[], T]) -> T:
    """Run one render or evaluation with a fresh budget; deep recursion is a WorkLimit."""
    token = _BUILT.set([0])
    try:
        return run()
    except RecursionError:
        raise WorkLimit("a macro or expression recursed too deeply; the sandbox stopped it"
                        ) from None
    finally:
        _BUILT.reset(token)


def _too_big(what: str, size: int, limit: int) -> WorkLimit:
    return WorkLimit(f"{what} would be {size:,} long, over the sandbox's limit of {limit:,}; "
                     "funnel templates and conditions cannot build values that large")


def _check_format(fmt: str) -> None:
    """Refuse a ``%``/``str.format`` format string with a huge or computed width."""
    for m in re.finditer(r"%[-+ #0]*(\*|\d+)?(?:\.(\*|\d+))?", fmt):
        for part in m.groups():
            if part == "*" or (part and int(part) > MAX_WIDTH):
                raise WorkLimit(f"format width {part!r} is over the sandbox's limit of "
                                f"{MAX_WIDTH}")
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # str.format will raise its own error
    for _, _, spec, _ in fields:
        if spec and ("{" in spec or any(int(d) > MAX_WIDTH for d in re.findall(r"\d+", spec))):
            raise WorkLimit(f"format spec {spec!r} is over the sandbox's width limit of "
                            f"{MAX_WIDTH}")


def _power(base: Any, exp: Any) -> Any:
    if isinstance(base, int) and isinstance(exp, int) and exp > 0 and abs(base) > 1:
        bits = (abs(base).bit_length() - 1) * exp
        if bits > MAX_BITS:
            raise WorkLimit(f"{base} ** {exp} has about {bits:,} bits, over the sandbox's limit "
                            f"of {MAX_BITS:,}")
    return base**exp


def _times(left: Any, right: Any) -> Any:
    for seq, n in ((left, right), (right, left)):
        size = _size(seq)
        if size is not None and isinstance(n, int) and not isinstance(n, bool):
            weight = _weight(seq) * n  # `[s] * n` renders n copies of s
            if max(size * n, weight) > MAX_SIZE:
                raise _too_big("a repeated string or list", max(size * n, weight), MAX_SIZE)
            charge(weight)
    if isinstance(left, int) and isinstance(right, int) and \
            left.bit_length() + right.bit_length() > MAX_BITS:
        raise WorkLimit(f"a product of {left.bit_length() + right.bit_length():,} bits is over "
                        f"the sandbox's limit of {MAX_BITS:,}")
    return left * right


def _plus(left: Any, right: Any) -> Any:
    a, b = _size(left), _size(right)
    if a is not None and b is not None:
        if a + b > MAX_SIZE:
            raise _too_big("a concatenation", a + b, MAX_SIZE)
        charge(a + b)
    return left + right


def _modulo(left: Any, right: Any) -> Any:
    if isinstance(left, str):
        _check_format(left)
    return left % right


_BINOPS: dict[str, Callable[[Any, Any], Any]] = {"**": _power, "*": _times, "+": _plus,
                                                 "%": _modulo}


def _bounded_filter(name: str, check: Callable[..., None]) -> Callable[..., Any]:
    original = FILTERS[name]
    # A filter marked @pass_eval_context (or environment, context) gets that first.
    skip = 1 if getattr(original, "jinja_pass_arg", None) is not None else 0

    def bounded(*args: Any, **kwargs: Any) -> Any:
        check(*args[skip:], **kwargs)
        result = original(*args, **kwargs)
        if isinstance(result, str):
            charge(len(result))
        return result

    for attr in ("jinja_pass_arg",):  # keep @pass_eval_context and the like
        if hasattr(original, attr):
            setattr(bounded, attr, getattr(original, attr))
    bounded.__name__ = name
    return bounded


def _width_arg(position: int, keyword: str) -> Callable[..., None]:
    def check(*args: Any, **kwargs: Any) -> None:
        values = [kwargs.get(keyword)] + list(args[position:position + 1])
        for value in values:
            if isinstance(value, int) and value > MAX_WIDTH:
                raise WorkLimit(f"width {value:,} is over the sandbox's limit of {MAX_WIDTH:,}")
            size = _size(value)
            if size is not None and isinstance(args[0], str) and \
                    len(args[0]) + size > MAX_SIZE:
                raise _too_big("an indented text", len(args[0]) + size, MAX_SIZE)
    return check


def _replace_check(*args: Any, **kwargs: Any) -> None:
    # (s, old, new, count): at most len(s)+1 replacements of len(new) each.
    s, old, new = (list(args[0:3]) + [None, None, None])[:3]
    if isinstance(s, str) and isinstance(new, str) and isinstance(old, str):
        grows = (s.count(old) if old else len(s) + 1) * max(len(new) - len(old), 0)
        if len(s) + grows > MAX_SIZE:
            raise _too_big("a replaced text", len(s) + grows, MAX_SIZE)


def _format_check(*args: Any, **kwargs: Any) -> None:
    if args and isinstance(args[0], str):
        _check_format(args[0])


class _BoundLoops(NodeTransformer):
    """Route every loop's iterable and every ``~`` through the sandbox's counters."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Call(nodes.Name(_LOOP, "load", lineno=node.lineno), [node.iter], [],
                               None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Call(nodes.Name(_JOIN, "load", lineno=node.lineno), [node], [], None,
                          None, lineno=node.lineno)


@pass_context
def _bounded_loop(context: Context, iterable: Iterable[Any]) -> Iterator[Any]:
    steps = getattr(context, "_funnel_steps", 0)
    for item in iterable:
        steps += 1
        if steps > MAX_ITERATIONS:
            raise WorkLimit(f"more than {MAX_ITERATIONS:,} loop iterations in one render, the "
                            "sandbox's limit")
        context._funnel_steps = steps  # type: ignore[attr-defined]
        yield item


def _bounded_join(value: str) -> str:
    if len(value) > MAX_SIZE:
        raise _too_big("a `~` concatenation", len(value), MAX_SIZE)
    charge(len(value))
    return value


def _join_filter(*args: Any, **kwargs: Any) -> str:
    """``|join``, with what it would build checked before it builds it."""
    eval_ctx, value, rest = args[0], args[1], args[2:]
    items = list(value)
    sep = rest[0] if rest else kwargs.get("d", "")
    total = sum(_weight(i) for i in items) + len(str(sep)) * max(len(items) - 1, 0)
    if total > MAX_SIZE:
        raise _too_big("a joined text", total, MAX_SIZE)
    charge(total)
    return _SYNC_JOIN(eval_ctx, items, *rest, **kwargs)


def _count_arg(position: int, keyword: str) -> Callable[..., None]:
    """``|slice(n)``, ``|batch(n)``: they loop or fill ``n`` times."""
    def check(*args: Any, **kwargs: Any) -> None:
        values = [kwargs.get(keyword)] + list(args[position:position + 1])
        for value in values:
            if isinstance(value, int) and value > MAX_WIDTH:
                raise WorkLimit(f"{keyword} {value:,} is over the sandbox's limit of "
                                f"{MAX_WIDTH:,}")
    return check


_DICT_ATTRIBUTES = frozenset(dir(dict))
# The loop variable's values (``loop.last`` in every list a prompt joins): plain
# properties, as safe as the sandbox's own checks would find them, read directly.
_LOOP_VALUES = frozenset({"first", "last", "index", "index0", "length", "revindex",
                          "revindex0", "depth", "depth0", "previtem", "nextitem"})


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """An immutable sandbox in which every operator and loop does bounded work."""

    intercepted_binops = frozenset(_BINOPS)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals.pop("lipsum", None)  # lipsum(n=10**5) writes megabytes
        self.globals[_LOOP] = _bounded_loop
        self.globals[_JOIN] = _bounded_join
        self.filters["center"] = _bounded_filter("center", _width_arg(1, "width"))
        self.filters["indent"] = _bounded_filter("indent", _width_arg(1, "width"))
        self.filters["wordwrap"] = _bounded_filter("wordwrap", _width_arg(1, "width"))
        self.filters["replace"] = _bounded_filter("replace", _replace_check)
        self.filters["format"] = _bounded_filter("format", _format_check)
        self.filters["slice"] = _bounded_filter("slice", _count_arg(1, "slices"))
        self.filters["batch"] = _bounded_filter("batch", _count_arg(1, "linecount"))
        join = _join_filter
        join.jinja_pass_arg = FILTERS["join"].jinja_pass_arg  # type: ignore[attr-defined]
        self.filters["join"] = join
        self.template_class = BoundedTemplate

    def make_globals(self, d: MutableMapping[str, Any] | None) -> MutableMapping[str, Any]:
        # A plain dict instead of Jinja's ChainMap over the environment's globals: every
        # render, include and condition copies or iterates its template's globals
        # (Context, new_context), and a ChainMap does that in Python, key by key. Measured
        # in bench/turn_instructions.py's turn (callgrind, 100 turns, runs vary by
        # ~0.1 M): 3.68-3.70 -> 3.49-3.59 M instructions per turn. The environment's
        # globals are all set in __init__, before any template is loaded (as Jinja's
        # documentation of make_globals asks), so the snapshot holds what the ChainMap
        # would have shown.
        return {**self.globals, **(d or {})}

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        return _BINOPS[operator](left, right)

    def getattr(self, obj: Any, attribute: str) -> Any:
        # ``p.sku`` on a dict (the state, the catalog, every template's loop) first asks
        # for a Python attribute, which raises AttributeError, and only then reads the
        # key: a raised exception per access, most of a prompt's render time. A name no
        # dict has as an attribute reads the key directly: the same value, the same
        # sandbox (item access is not checked there either), attributes win as before.
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                pass
        elif type(obj) is LoopContext and attribute in _LOOP_VALUES:
            return getattr(obj, attribute)
        return super().getattr(obj, attribute)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            _check_format(fmt)
            return wrapped(*args, **kwargs)

        return checked

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        # str methods that pad or repeat by an argument: ljust, rjust, center, zfill, expandtabs.
        if getattr(__obj, "__self__", None).__class__ is str and \
                getattr(__obj, "__name__", "") in ("ljust", "rjust", "center", "zfill",
                                                   "expandtabs", "replace", "join"):
            for value in (*args, *kwargs.values()):
                if isinstance(value, int) and value > MAX_WIDTH:
                    raise WorkLimit(f"width {value:,} is over the sandbox's limit of "
                                    f"{MAX_WIDTH:,}")
            if getattr(__obj, "__name__", "") == "join" and args:
                items = list(args[0])
                total = sum(_weight(i) for i in items) + len(__obj.__self__) * len(items)
                if total > MAX_SIZE:
                    raise _too_big("a joined text", total, MAX_SIZE)
                args = (items, *args[1:])
            result = super().call(__context, __obj, *args, **kwargs)
            if _size(result) is not None:
                if len(result) > MAX_SIZE:
                    raise _too_big("a string", len(result), MAX_SIZE)
                charge(len(result))
            return result
        return super().call(__context, __obj, *args, **kwargs)

    def _generate(self, source: nodes.Template, name: str | None, filename: str | None,
                  defer_init: bool = False) -> str:
        _BoundLoops().visit(source)
        return super()._generate(source, name, filename, defer_init)


class BoundedTemplate(Template):
    """A template whose every render runs with a fresh budget (see :func:`bounded_render`)."""

    def render(self, *args: Any, **kwargs: Any) -> str:
        return bounded_render(lambda: super(BoundedTemplate, self).render(*args, **kwargs))


def render_block(template: Template, name: str, variables: Mapping[str, Any],
                 without: Sequence[str] = ()) -> str:
    """Only the block ``name`` of ``template`` (Jinja's documented ``Template.blocks``),
    with the blocks ``without`` rendered empty should it hold them, with a fresh budget
    like every render."""
    def body(context: Context) -> Iterator[str]:
        for other in without:
            context.blocks[other] = [_nothing]
        return template.blocks[name](context)

    return bounded_render(lambda: _concat(template, body, variables))


def render_without(template: Template, names: Sequence[str],
                   variables: Mapping[str, Any]) -> str:
    """The whole ``template`` with its top-level blocks ``names`` rendered empty."""
    def body(context: Context) -> Iterator[str]:
        for name in names:
            context.blocks[name] = [_nothing]
        return template.root_render_func(context)

    return bounded_render(lambda: _concat(template, body, variables))


def _concat(template: Template, body: Callable[[Context], Iterator[str]],
            variables: Mapping[str, Any]) -> str:
    # What Template.render does, for one of the template's render functions.
    context = template.new_context(dict(variables))
    try:
        return "".join(body(context))
    except Exception:
        template.environment.handle_exception()
    raise AssertionError("handle_exception always raises")  # pragma: no cover


def _nothing(context: Context) -> Iterator[str]:
    return iter(())


class ConfinedLoader(FileSystemLoader):
    """A ``FileSystemLoader`` that refuses any template resolving outside the funnel's roots.

    Jinja already refuses ``..`` in a template name; this also refuses a
    symlink (or a hard-coded folder) that leads out of the funnel's project.
    """

    def __init__(self, folder: Path, roots: tuple[Path, ...]) -> None:
        super().__init__(str(folder))
        self.roots = tuple(Path(os.path.realpath(r)) for r in roots)

    def get_source(self, environment: Environment, template: str
                   ) -> tuple[str, str, Callable[[], bool]]:
        pieces = split_template_path(template)
        for searchpath in self.searchpath:
            candidate = posixpath.join(searchpath, *pieces)
            if os.path.isfile(candidate):
                if not is_confined(Path(candidate), self.roots):
                    raise OutsideFunnel(f"template '{template}' ({candidate}) resolves outside "
                                        "the funnel's folder; a funnel may only read files "
                                        "inside its own project")
                break
        return super().get_source(environment, template)
