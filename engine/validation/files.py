"""Checks of the files a funnel names: stage templates, the catalog; output schemas in
:mod:`engine.validation.schemas`."""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, TemplateSyntaxError, meta, nodes

from ..errors import CatalogError, did_you_mean
from ..format.catalog import load_catalog
from ..format.contract import is_derived
from ..format.names import PROMPT_BLOCKS, STATE_BLOCK, STATIC_PROMPT_NAMES, TURN_BLOCK
from ..format.paths import funnel_roots, is_confined
from ..format.settings import MemorySettings
from ..format.spec import PROMPT_NAMES
from ..sandbox.expressions import attribute_paths, make_environment
from .cart import check_cart_total
from .context import check_context
from .contract import check_argument_paths, check_derived, check_override, check_paths_lists
from .diagnostics import Report, as_dict
from .layout import run_together_loops
from .products import product_fields, unknown_product_fields
from .sandbox import refused
from .schemas import check_output_schema
from .semantics import check_paths, engine_owned_names


def stage_paths(data: dict[str, Any], base: Path, stage: str) -> tuple[Path, Path, Path, Path]:
    """(prompt file, prompts folder, schema file, schemas folder) of a stage."""
    raw = as_dict(as_dict(data.get("stages")).get(stage))
    prompts = Path(os.path.normpath(base / str(data.get("prompts", "prompts"))))
    schemas = Path(os.path.normpath(base / str(data.get("schemas", "schemas"))))
    return (
        prompts / str(raw.get("prompt", f"{stage}.j2")),
        prompts,
        schemas / str(raw.get("schema", f"{stage}.json")),
        schemas,
    )


def _outside(report: Report, keys: tuple[str | int, ...], what: str, path: Path) -> None:
    report.at(keys, "error", "F007", f"{what} {path} is outside the funnel's folder (or "
              "hidden): a funnel may only read visible files inside its own project (the "
              "nearest folder above it with `.git` or `pyproject.toml`); move it there, or "
              "list its folder in FUNNEL_ROOT (a copy without `.git`, e.g. a container image: "
              "docs/deploy.md#container-layout)", key=True)


def check_stage_files(data: dict[str, Any], state: dict[str, Any], report: Report) -> None:
    base = report.path.parent
    roots = funnel_roots(report.path)
    declared_actions = set(as_dict(data.get("actions")))
    owned = engine_owned_names(data, state)
    known_names = set(state) | set(PROMPT_NAMES)
    fields = product_fields(data, report.path)
    checked_templates: set[Path] = set()
    static_reported: set[tuple[Path, int, str]] = set()
    stages = as_dict(data.get("stages"))
    # A folder outside the funnel is reported once, at `prompts:`/`schemas:`, not per stage.
    folders_out = {key for key, default in (("prompts", "prompts"), ("schemas", "schemas"))
                   if not is_confined(base / str(data.get(key, default)), roots)}
    for key in sorted(folders_out):
        _outside(report, (key,), f"the {key} folder", base / str(data.get(key, key)))
    for stage in stages:
        prompt, prompts_dir, schema, schemas_dir = stage_paths(data, base, stage)
        raw = as_dict(stages.get(stage))
        if "prompts" in folders_out or not is_confined(prompt, roots):
            if "prompts" not in folders_out:
                _outside(report, ("stages", stage, "prompt"), f"stage '{stage}': template", prompt)
        # At the stage's `prompt:`/`schema:` line when it names the file, else at the stage.
        elif not prompt.is_file():
            report.at(("stages", stage, "prompt"), "error", "F201", f"stage '{stage}': template "
                      f"{prompt} does not exist; create it or set `prompt:` for the stage",
                      key=True)
        else:
            _check_template(prompt, prompts_dir, state, known_names, report, checked_templates,
                            roots, fields)
            _check_static_part(prompt, prompts_dir, roots, report, static_reported)
            _check_budget(data, stage, prompt, prompts_dir, report)
        check_context(data, stage, report)
        if is_derived(data, stage):
            check_derived(data, stage, state, owned, schemas_dir, report)
            continue
        if "schemas" in folders_out or not is_confined(schema, roots):
            if "schemas" not in folders_out:
                _outside(report, ("stages", stage, "schema") if "schema" in raw else
                         ("stages", stage), f"stage '{stage}': output schema", schema)
        elif not schema.is_file():
            report.at(("stages", stage, "schema"), "error", "F301", f"stage '{stage}': output "
                      f"schema {schema} does not exist; declare the stage's `updates:` and "
                      "`actions:` to derive its contract from the funnel "
                      "(docs/funnel-format.md#output-contract), or create the file",
                      key=True)
        else:
            check_output_schema(schema, state, owned, declared_actions, report)
            check_override(data, stage, schema, report)
    check_paths_lists(data, state, owned, report)
    check_argument_paths(data, state, report)


def _check_template(
    path: Path,
    folder: Path,
    state: dict[str, Any],
    known: set[str],
    report: Report,
    seen: set[Path],
    roots: tuple[Path, ...],
    fields: frozenset[str] | None = None,
) -> None:
    if path in seen:
        return
    seen.add(path)
    try:
        source = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        report.add(path, 0, 0, "error", "F201", f"cannot read the template: {exc}")
        return
    tree, error_line, error = _parse_template(source, path.name, str(path))
    if tree is None:
        line, col = syntax_error_position(source, error_line, error)
        report.add(path, line, col, "error", "F202", f"template syntax error: {error}")
        return
    check_paths(tree, state, known, report, None, "template", "F203", file=path,
                paths=_template_names(source, path.name, str(path)))
    lines = source.splitlines()
    for line, message in run_together_loops(tree):
        report.add(path, line, 1, "warning", "F208", message)
    for line, message in unknown_product_fields(tree, fields) if fields is not None else ():
        report.add(path, line, 1, "error", "F211", message)
    for line, token, message in _refused(source, path.name, str(path)):
        report.add(path, line, column(lines, line, token), "error", "F205", message)
    for ref in meta.find_referenced_templates(tree):
        if ref is None:
            continue
        line = next((i for i, text in enumerate(lines, 1) if ref in text), 1)
        col = column(lines, line, ref)
        pieces = ref.replace("\\", "/").split("/")
        included = folder / ref
        if ref.startswith("/") or ".." in pieces or not is_confined(included, roots):
            report.add(path, line, col, "error", "F007", f"included template '{ref}' is outside "
                       f"the prompts folder {folder}: include a template of the funnel's own, "
                       "by a path relative to that folder without `..`")
        elif not included.is_file():
            report.add(path, line, col, "error", "F201", f"included template '{ref}' does not "
                       f"exist in {folder}")
        else:
            _check_template(included, folder, state, known, report, seen, roots, fields)


def _check_static_part(path: Path, folder: Path, roots: tuple[Path, ...], report: Report,
                       reported: set[tuple[Path, int, str]]) -> None:
    """F206: in a template with a top-level ``{% block state %}`` or ``{% block turn %}``,
    the rest (and what it includes) is the prompt's static prefix: it may read only the
    names that do not change from turn to turn (engine.turn.prompts.render_parts)."""
    tree = _tree(path)
    if tree is None or not any(isinstance(n, nodes.Block) and n.name in PROMPT_BLOCKS
                               for n in tree.body):
        return
    static = nodes.Template([n for n in tree.body if not (isinstance(n, nodes.Block)
                                                           and n.name in PROMPT_BLOCKS)])
    seen: set[Path] = set()

    def check(part: nodes.Template, file: Path) -> None:
        for names, line in attribute_paths(part):
            dynamic = names[0] not in STATIC_PROMPT_NAMES or (
                names[0] == "thresholds" and len(names) > 1
                and not names[1].endswith("_threshold"))
            name = ".".join(names[:2]) if names[0] == "thresholds" else names[0]
            if not dynamic or (file, line, name) in reported:
                continue
            reported.add((file, line, name))
            report.add(file, line, 1, "error", "F206", f"'{name}' changes from turn to turn, "
                       f"but it is read outside {{% block {STATE_BLOCK} %}} and {{% block "
                       f"{TURN_BLOCK} %}} (of {path.name}), in the part of the prompt every "
                       "turn of the stage shares; move it into a block (state: what changes "
                       "with the state; turn: what changes every turn), or read only "
                       f"{', '.join(sorted(STATIC_PROMPT_NAMES))} (of thresholds, the "
                       "*_threshold values) there")
        for ref in meta.find_referenced_templates(part):
            included = folder / ref if ref else None
            if included is None or included in seen or not is_confined(included, roots):
                continue
            seen.add(included)
            inner = _tree(included)
            if inner is not None:
                check(inner, included)

    check(static, path)


def _tree(path: Path) -> nodes.Template | None:
    try:
        source = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # F201, reported by _check_template
    return _parse_template(source, path.name, str(path))[0]


def column(lines: list[str], line: int, token: str) -> int:
    """1-based column of ``token`` on ``line`` (1 when it is not there)."""
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    return text.find(token) + 1 if token in text else 1


_BLOCK = re.compile(r"\{%-?\s*(\w+)")
_CLOSES = re.compile(r"innermost block that needs to be closed is '(\w+)'")


def syntax_error_position(source: str, line: int, message: str) -> tuple[int, int]:
    """Where a template syntax error is: the unclosed tag's opening, else the line's first tag.

    Jinja reports a missing ``{% endif %}`` at the end of the file; the
    mistake is the ``{% if %}`` it does not close.
    """
    lines = source.splitlines()
    unclosed = _CLOSES.search(message) if message.startswith("Unexpected end of template") \
        else None
    if unclosed:
        stack: list[tuple[str, int, int]] = []
        for m in _BLOCK.finditer(source):
            tag = m[1]
            at = source.count("\n", 0, m.start()) + 1, m.start() - source.rfind("\n", 0, m.start())
            if tag.startswith("end"):
                for i in range(len(stack) - 1, -1, -1):
                    if stack[i][0] == tag[3:]:
                        del stack[i:]
                        break
            elif tag in ("if", "for", "macro", "block", "call", "filter", "with", "raw",
                         "autoescape", "trans"):
                stack.append((tag, *at))
        for tag, tline, tcol in reversed(stack):
            if tag == unclosed[1]:
                return tline, tcol
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    starts = [i for i in (text.find("{%"), text.find("{{")) if i >= 0]
    return max(line, 1), (min(starts) + 1 if starts else 1)


# Funnels in one repository share templates and schemas (a `_base.j2`, a whole
# prompts folder): what depends only on a file's text is computed once per text.


@lru_cache(maxsize=512)
def _parse_template(source: str, name: str, filename: str) -> tuple[nodes.Template | None, int, str]:
    """(AST, 0, "") or (None, line, message) of a template's source. Callers only read the AST."""
    try:
        return _parse_env().parse(source, name, filename), 0, ""
    except TemplateSyntaxError as exc:
        return None, exc.lineno, exc.message or "invalid syntax"


@lru_cache(maxsize=512)
def _template_names(source: str, name: str, filename: str) -> tuple[tuple[tuple[str, ...], int], ...]:
    """The dotted names a (parsable) template reads, with their lines."""
    tree = _parse_template(source, name, filename)[0]
    return tuple(attribute_paths(tree)) if tree is not None else ()


@lru_cache(maxsize=512)
def _refused(source: str, name: str, filename: str) -> tuple[tuple[int, str, str], ...]:
    """What the sandbox would refuse in a (parsable) template, with its lines."""
    tree = _parse_template(source, name, filename)[0]
    return tuple(refused(tree)) if tree is not None else ()


@lru_cache(maxsize=1)
def _parse_env() -> Environment:
    # Parsing needs no loader: the same sandbox settings as the runtime, minus the folder.
    return make_environment()


def _check_budget(data: dict[str, Any], stage: str, prompt: Path, folder: Path,
                  report: Report) -> None:
    """Warn when a stage's template alone (with its includes) cannot fit its prompt budget,
    and when its observation list may take more than half of it."""
    raw = as_dict(as_dict(data.get("stages")).get(stage))
    memory = {**as_dict(data.get("memory")), **as_dict(raw.get("memory"))}
    budget = memory.get("prompt_budget")
    if not isinstance(budget, int):
        return
    observations = memory.get("observation_budget", MemorySettings.observation_budget)
    if memory.get("summary") and isinstance(observations, int) and observations > budget // 2:
        report.at(("stages", stage), "warning", "F207", f"stage '{stage}': "
                  f"memory.observation_budget ({observations}) is over half its prompt_budget "
                  f"({budget}); a full observation list leaves little room for the template, "
                  "the state and the messages, and is dropped from the prompt when it does "
                  "not fit: lower the observation budget or raise the prompt budget", key=True)
    try:
        source = prompt.read_text("utf-8")
        tree = _parse_template(source, prompt.name, str(prompt))[0]
        if tree is None:
            return
        roots = funnel_roots(report.path)
        for ref in meta.find_referenced_templates(tree):
            if ref and is_confined(folder / ref, roots) and (folder / ref).is_file():
                source += (folder / ref).read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return
    tokens = len(source) // 4
    if tokens > budget:
        report.at(("stages", stage), "warning", "F204", f"stage '{stage}': its template alone "
                  f"is about {tokens} tokens, over its prompt_budget of {budget}; the prompt "
                  "will not fit once the state is added", key=True)


def check_catalog(data: dict[str, Any], report: Report) -> None:
    catalog = data.get("catalog")
    if not isinstance(catalog, str):
        return
    path = report.path.parent / catalog
    if not is_confined(path, funnel_roots(report.path)):
        _outside(report, ("catalog",), "the catalog", path)
        return
    if not path.is_file():
        report.at(("catalog",), "error", "F502", f"catalog {path} does not exist (or is not a "
                  "file); create it or fix `catalog:`")
        return
    try:
        products = load_catalog(path)
    except CatalogError as exc:
        report.add(exc.file or path, exc.line or 0, 1, "error", "F502", str(exc.detail))
        return
    gift = as_dict(as_dict(data.get("cart")).get("gift")).get("sku")
    if isinstance(gift, str) and gift not in products.by_sku:
        report.at(("cart", "gift", "sku"), "error", "F502", f"gift SKU '{gift}' is not in the "
                  f"catalog {path}{did_you_mean(gift, products.by_sku)}")
    check_cart_total(data, [p.price for p in products.products], report)
