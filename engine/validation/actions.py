"""Checks of a funnel's actions: builtins' needs, hooks, and the stages' `on_enter` lists.

Hooks are resolved the way `engine.funnel.actions.load_hook` resolves them at load
(beside the funnel file first, then the Python path), but a hook module is
never run here: its functions are read from its source.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys
from functools import lru_cache
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

from ..errors import closest, did_you_mean
from ..format.names import refused_hook_module
from .diagnostics import Report, as_dict, as_list
from .format import format_schema

BUILTIN_NEEDS_FIELD = {"append", "set"}


def builtin_names() -> list[str]:
    """The builtins an action may use: the format schema's list, which the engine's runner has."""
    action = format_schema()["properties"]["actions"]["additionalProperties"]
    return list(action["properties"]["builtin"]["enum"])


def check_actions(data: dict[str, Any], report: Report) -> None:
    """Check the declared actions, the handoff notifier hook and every stage's `on_enter`."""
    base = report.path.parent
    for name, raw in as_dict(data.get("actions")).items():
        raw = as_dict(raw)
        _check_builtin_needs(data, name, raw, report)
        _check_hook(raw.get("hook"), ("actions", name, "hook"), f"action '{name}'", base, report)
    _check_hook(as_dict(as_dict(data.get("handoff")).get("notify")).get("hook"),
                ("handoff", "notify", "hook"), "the handoff notifier", base, report)
    _check_on_enter(data, report)


def _check_builtin_needs(data: dict[str, Any], name: str, raw: dict[str, Any],
                         report: Report) -> None:
    builtin = raw.get("builtin")
    if builtin in BUILTIN_NEEDS_FIELD and "field" not in raw:
        report.at(("actions", name), "error", "F503", f"action '{name}' uses builtin "
                  f"'{builtin}', which needs `field:` naming the state field it writes")
    if builtin in ("add_to_cart", "remove_from_cart") and not data.get("cart"):
        report.at(("actions", name), "error", "F503", f"action '{name}' needs a `cart:` "
                  "section naming the cart field")
    if builtin == "present_products" and not data.get("presented"):
        report.at(("actions", name), "error", "F503", f"action '{name}' needs a "
                  "`presented:` section naming the field that records presented products")
    if builtin in ("present_products", "add_to_cart") and not data.get("catalog"):
        report.at(("actions", name), "error", "F503", f"action '{name}' needs a `catalog:`")


def _check_hook(hook: Any, keys: tuple[str, ...], what: str, base: Path, report: Report) -> None:
    # A malformed `hook` (no colon, not a string) is the format layer's F004.
    if not isinstance(hook, str) or ":" not in hook:
        return
    module, _, function = hook.partition(":")
    local = (base / (module.replace(".", "/") + ".py")).exists()
    why = None if local else refused_hook_module(module)
    if why is not None:
        report.at(keys, "error", "F506", f"{what}: hook '{hook}': the module {why}")
        return
    if not hook_module_exists(module, base):
        report.at(keys, "error", "F501", f"{what}: hook module '{module}' was not found beside "
                  f"the funnel ({base}) nor on the Python path")
        return
    defined, detail = hook_function_defined(module, function, base)
    if defined is False:
        report.at(keys, "error", "F505", f"{what}: hook '{hook}': {detail}; the engine "
                  "would refuse to load the funnel")


def hook_module_exists(module: str, base: Path) -> bool:
    """Whether ``module`` resolves as the engine's loader resolves it, without running it.

    Beside the funnel only ``<module>.py`` counts: the loader imports nothing
    else from there (a package folder beside it is found only if it is on the
    Python path too).
    """
    if (base / (module.replace(".", "/") + ".py")).exists():
        return True
    if module in sys.modules:
        return True
    return find_spec_without_import(module) is not None


def find_spec_without_import(module: str) -> ModuleSpec | None:
    """``importlib.util.find_spec`` that runs no code, not even a dotted name's parents.

    ``find_spec("this.x")`` imports ``this`` (which prints the Zen of Python):
    here each level is looked up in the previous one's folder instead. A
    namespace or extension module found on the way is looked through the same way.
    """
    spec: ModuleSpec | None = None
    path: list[str] | None = None
    parts = module.split(".")
    for i, part in enumerate(parts):
        if not part.isidentifier():
            return None
        name = ".".join(parts[: i + 1])
        if name in sys.modules:
            loaded = sys.modules[name]
            spec = getattr(loaded, "__spec__", None)
        else:
            try:
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                if spec is None and path is None:
                    spec = importlib.util.find_spec(name)  # top level: built-ins, frozen; no import
            except (ImportError, ValueError):
                return None
        if spec is None:
            return None
        path = list(spec.submodule_search_locations or [])
        if i < len(parts) - 1 and not path:
            return None
    return spec


def hook_function_defined(module: str, function: str, base: Path) -> tuple[bool | None, str]:
    """Whether ``module`` defines ``function``: (True/False, why), or (None, "") if unknowable.

    Unknowable: a module without Python source (compiled, built in), or one
    whose names cannot be read statically (``from x import *``, a module-level
    ``__getattr__``). An imported module is asked directly; no module is run.
    """
    local = base / (module.replace(".", "/") + ".py")
    source_file: Path | None = local if local.exists() else None
    if source_file is None:
        loaded = sys.modules.get(module)
        if loaded is not None:
            if callable(getattr(loaded, function, None)):
                return True, ""
            callables = [n for n, v in vars(loaded).items() if callable(v)]
            return False, (f"module '{module}' has no function "
                           f"'{function}'{did_you_mean(function, callables)}")
        spec = find_spec_without_import(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None, ""
        source_file = Path(spec.origin)
    try:
        source = source_file.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return False, f"cannot read {source_file}: {exc}"
    names, error = _module_names(source, str(source_file))
    if error:
        return False, f"{source_file} does not parse: {error}"
    if names is None or function in names:
        return (None if names is None else True), ""
    return False, (f"module '{module}' ({source_file}) has no function "
                   f"'{function}'{did_you_mean(function, names)}")


@lru_cache(maxsize=64)
def _module_names(source: str, filename: str) -> tuple[frozenset[str] | None, str]:
    """(names bound at a module's top level, "") or (None, "") if unknowable, or (None, error)."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as exc:
        return None, f"{exc.msg} (line {exc.lineno})"
    names: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == "__getattr__":
                return None, ""  # PEP 562: the module makes up its names
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            # `import x` binds a module, which the engine cannot call: it is not counted.
            for alias in node.names:
                if alias.name == "*":
                    return None, ""
                names.add(alias.asname or alias.name)
        elif isinstance(node, ast.If | ast.Try | ast.TryStar | ast.With | ast.For | ast.While):
            # Definitions under `if`/`try` (optional imports, fallbacks) count too.
            for field in ("body", "orelse", "finalbody"):
                todo.extend(getattr(node, field, []))
            for handler in getattr(node, "handlers", []):
                todo.extend(handler.body)
        names.update(n.id for target in _targets(node) for n in ast.walk(target)
                     if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return frozenset(names), ""


def _targets(node: ast.stmt) -> list[ast.expr]:
    """What a module-level statement assigns to (not what its body does)."""
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For):
        return [node.target]
    if isinstance(node, ast.With):
        return [i.optional_vars for i in node.items if i.optional_vars is not None]
    return []


def _check_on_enter(data: dict[str, Any], report: Report) -> None:
    """Each `on_enter` type must be a declared action: the engine runs nothing else."""
    actions = {n: as_dict(a) for n, a in as_dict(data.get("actions")).items()}
    builtins = builtin_names()
    for stage, raw in as_dict(data.get("stages")).items():
        for i, call in enumerate(as_list(as_dict(raw).get("on_enter"))):
            kind = as_dict(call).get("type")
            if not isinstance(kind, str) or kind in actions:
                continue  # a missing or non-string `type` is the format layer's F004
            report.at(("stages", stage, "on_enter", i, "type"), "error", "F504",
                      f"stage '{stage}': on_enter action type '{kind}' is not declared under "
                      f"`actions`{_suggest(kind, actions, builtins)}; the engine would refuse "
                      f"it on every entry. Declared actions: {', '.join(actions) or 'none'}")


def _suggest(kind: str, actions: dict[str, dict[str, Any]], builtins: list[str]) -> str:
    """A did-you-mean over the declared actions, their builtins and their hooks."""
    # `type: append` or `type: mod:fn` names what an action uses, not the action.
    users = [n for n, a in actions.items() if kind in (a.get("builtin"), a.get("hook"))
             or (isinstance(a.get("hook"), str) and a["hook"].partition(":")[2] == kind)]
    if users:
        return f" (did you mean '{users[0]}', the action that uses it?)"
    if kind in builtins:
        return (f" ('{kind}' is a builtin, not an action: declare one that uses it, e.g. "
                f"`{kind}: {{builtin: {kind}}}`)")
    close = closest(kind, [*actions, *builtins])
    if close is not None and close not in actions:
        return (f" (did you mean builtin '{close}'? declare an action that uses it, e.g. "
                f"`{close}: {{builtin: {close}}}`)")
    return did_you_mean(kind, actions)
