"""The studio's editor: a funnel's files, read, checked as they are typed, saved safely.

The files are those the funnel reads (:func:`engine.format.files.watched_files`: the
funnel file, its prompts, catalog, output schemas and knowledge) and its scenarios, and
only those: a request names one by its id (its path relative to the funnel file's folder)
and anything else, or a file that resolves outside the funnel's roots
(:func:`engine.format.paths.confine`), is refused.

- :func:`lint` checks a text not yet saved: the funnel file with the whole validator
  (:func:`engine.validation.check_text`, the files it names read from disk), a scenario as
  `funnel test` loads it, the other files for their own syntax (YAML, a Jinja template,
  JSON); a save then gets the whole validator over every file (the studio's watcher).
- :func:`save` writes atomically (a temporary file beside it, fsynced, renamed over it)
  and only when the file on disk is still the one the page opened (its SHA-256); else it
  refuses and shows the other change as a diff.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import TemplateSyntaxError

from ..errors import Diagnostic, InvalidInput
from ..format import _yaml
from ..format.files import watched_files
from ..format.paths import OutsideFunnel, confine, funnel_roots, is_confined
from ..format.spec import FunnelSpec
from ..sandbox.expressions import make_environment
from ..scenarios.load import load_scenario
from ..validation import check_text
from .broken import LooseSpec, loose_files

__all__ = ["EditorFile", "Opened", "editor_files", "lint", "read", "save"]

TEXT = (".yaml", ".yml", ".j2", ".jinja", ".jinja2", ".md", ".txt", ".json")
MODES = {".yaml": "yaml", ".yml": "yaml", ".j2": "jinja2", ".jinja": "jinja2",
         ".jinja2": "jinja2", ".md": "markdown", ".json": "yaml", ".txt": "text"}
MAX_TEXT = 400_000  # characters: a funnel file is tens of kilobytes
_KEPT = 64  # opened versions kept to show what changed on disk since


@dataclass(frozen=True)
class EditorFile:
    """One file the editor shows: ``id`` (its path from the funnel file's folder), its kind."""

    id: str
    path: Path
    kind: str  # funnel, prompt, catalog, schema, knowledge, scenario

    def view(self) -> dict[str, str]:
        return {"id": self.id, "kind": self.kind, "mode": MODES.get(self.path.suffix, "text")}


def _kind(spec: FunnelSpec, path: Path) -> str:
    if path == spec.path:
        return "funnel"
    if spec.catalog_path is not None and path == spec.catalog_path:
        return "catalog"
    if spec.knowledge is not None and path.is_relative_to(spec.knowledge.folder):
        return "knowledge"
    if path.suffix == ".json":
        return "schema"
    return "prompt"


def _scenarios(spec: FunnelSpec) -> list[Path]:
    """The funnel's scenario files: ``scenarios/`` beside the funnel file (what `funnel new`
    writes) and ``<name>/scenarios/`` (the repository's layout)."""
    found: list[Path] = []
    for folder in (spec.path.parent / "scenarios", spec.path.parent / spec.name / "scenarios"):
        if folder.is_dir():
            found += sorted(p for p in folder.iterdir()
                            if p.suffix in (".yaml", ".yml") and not p.name.startswith("."))
    return found


Spec = FunnelSpec | LooseSpec  # a funnel that does not validate has no spec yet


def editor_files(spec: Spec) -> list[EditorFile]:
    """The files of ``spec`` the editor opens: the funnel file first, text files only
    (of a funnel that does not validate: its folder's, engine.studio.broken)."""
    base = spec.path.parent
    roots = funnel_roots(spec.path)
    out: dict[str, EditorFile] = {}
    if isinstance(spec, LooseSpec):
        listed = loose_files(spec)
    else:
        listed = [(p, _kind(spec, p)) for p in watched_files(spec)]
        listed += [(p, "scenario") for p in _scenarios(spec)]
    for path, kind in listed:
        if path.suffix not in TEXT or not path.is_file():
            continue
        if not is_confined(path, roots):  # the compiler confined them; a symlink since
            continue
        # Relative to the funnel file's folder (`../prompts/x.j2` in a repository's layout)
        # within its project; a FUNNEL_ROOT folder's file by its whole path.
        inside = Path(os.path.realpath(path)).is_relative_to(roots[0])
        ident = os.path.relpath(path, base) if inside else str(path)
        out.setdefault(ident, EditorFile(ident, path, kind))
    order = {"funnel": 0, "prompt": 1, "catalog": 2, "schema": 3, "knowledge": 4, "scenario": 5}
    return sorted(out.values(), key=lambda f: (order[f.kind], f.id))


def _file(spec: Spec, ident: str) -> EditorFile:
    for f in editor_files(spec):
        if f.id == ident:
            try:
                confine(f.path, funnel_roots(spec.path))  # a symlink swapped in since
            except OutsideFunnel as exc:
                raise InvalidInput(str(exc)) from None
            return f
    raise InvalidInput(f"`file`: {ident!r} is not one of funnel '{spec.name}''s files; the "
                       "editor opens the funnel file, its prompts, catalog, schemas, knowledge "
                       "and scenarios (GET /api/editor/files lists them)")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Opened:
    """The versions the page opened, by path and hash (a few dozen, the newest kept), so
    that a refused save can show what changed on disk since."""

    def __init__(self) -> None:
        self._texts: OrderedDict[tuple[str, str], str] = OrderedDict()
        # One save at a time (they run in threads): two pages saving the same version of a
        # file cannot both pass the check; the second is refused with the first's change.
        self.saving = threading.Lock()

    def keep(self, path: Path, text: str) -> str:
        key = (str(path), digest(text))
        self._texts[key] = text
        self._texts.move_to_end(key)
        while len(self._texts) > _KEPT:
            self._texts.popitem(last=False)
        return key[1]

    def get(self, path: Path, hashed: str) -> str | None:
        return self._texts.get((str(path), hashed))


def _read_text(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{path} is not UTF-8 text; the editor opens text files") from None


def read(spec: Spec, ident: str, opened: Opened) -> dict[str, Any]:
    """The file's text, its hash (the save's ``base``) and its editor mode."""
    f = _file(spec, ident)
    text = _read_text(f.path)
    return {**f.view(), "text": text, "hash": opened.keep(f.path, text)}


def save(spec: Spec, ident: str, text: str, base: str, opened: Opened
         ) -> tuple[Path, dict[str, Any] | None]:
    """Write ``text`` over the file when it is still the version ``base`` (its hash).

    Returns:
        (the path, ``None``) once written; (the path, the conflict) when the file changed on
        disk since it was opened: its text, its hash, and the other change as a unified diff
        (nothing written).
    """
    if len(text) > MAX_TEXT:
        raise InvalidInput(f"`text`: {len(text)} characters, over the {MAX_TEXT} a file may have")
    f = _file(spec, ident)
    with opened.saving:
        return f.path, _write(f, ident, text, base, opened)


def _write(f: EditorFile, ident: str, text: str, base: str, opened: Opened
           ) -> dict[str, Any] | None:
    disk = _read_text(f.path)
    if digest(disk) != base:
        was = opened.get(f.path, base)
        diff = "".join(difflib.unified_diff(
            (was or "").splitlines(keepends=True), disk.splitlines(keepends=True),
            f"{ident} (as opened)", f"{ident} (on disk now)")) if was is not None else ""
        return {"file": ident, "text": disk, "hash": opened.keep(f.path, disk), "diff": diff}
    # Beside it (one file system, so the rename is atomic), hidden (no watcher reads it).
    tmp = f.path.with_name(f".{f.path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8", newline="") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, f.path.stat().st_mode & 0o777)
        os.replace(tmp, f.path)
    finally:
        tmp.unlink(missing_ok=True)
    opened.keep(f.path, text)
    return None


_NOT_ONE_OF = re.compile(r"'([^']*)' is not one of \[(.*)\]")


def suggestion(message: str) -> tuple[str, str]:
    """(what is wrong, the fix): the validator's messages say both, the fix after ``; ``;
    a value not among the schema's choices gets the nearest one."""
    what, sep, fix = message.partition("; ")
    if sep:
        return what, fix
    found = _NOT_ONE_OF.search(message)
    if found:
        choices = re.findall(r"'([^']*)'", found[2])
        near = difflib.get_close_matches(found[1], choices, n=1)
        return message, (f"did you mean '{near[0]}'?" if near
                         else f"use one of {', '.join(choices)}")
    return message, ""


def annotate(spec: Spec, diagnostics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each diagnostic with its editor tab (``tab``: the file's id, when the editor has the
    file) and its message split into ``problem`` and ``suggestion``."""
    ids = {os.path.realpath(f.path): f.id for f in editor_files(spec)}
    out = []
    for d in diagnostics:
        problem, fix = suggestion(str(d.get("message", "")))
        out.append({**d, "tab": ids.get(os.path.realpath(str(d.get("file", "")))),
                    "problem": problem, "suggestion": fix})
    return out


def lint(spec: Spec, ident: str, text: str) -> list[dict[str, Any]]:
    """The diagnostics of ``text`` as the file ``ident`` (nothing is written)."""
    if len(text) > MAX_TEXT:
        raise InvalidInput(f"`text`: {len(text)} characters, over the {MAX_TEXT} a file may have")
    f = _file(spec, ident)
    found: list[Diagnostic] = []
    if f.kind == "funnel":
        found = check_text(spec.path, text)[1]
    elif f.kind == "scenario":
        found = _scenario(f.path, text)
    elif f.path.suffix in (".yaml", ".yml"):
        try:
            _yaml.load(text)
        except _yaml.YamlSyntaxError as exc:
            found = [Diagnostic(str(f.path), exc.line, exc.col, "error", "F001",
                                f"{exc}; fix the YAML syntax")]
    elif f.path.suffix == ".json":
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            found = [Diagnostic(str(f.path), exc.lineno, exc.colno, "error", "F004",
                                f"not JSON: {exc.msg}; fix the JSON syntax")]
    elif MODES.get(f.path.suffix) == "jinja2":
        found = _template(f.path, text)
    return annotate(spec, [d.as_dict() for d in found])


def _template(path: Path, text: str) -> list[Diagnostic]:
    try:
        make_environment().parse(text, path.name, str(path))
    except TemplateSyntaxError as exc:
        return [Diagnostic(str(path), exc.lineno, 1, "error", "F202",
                           f"template syntax error: {exc.message or 'invalid syntax'}; close "
                           "the tag or expression ({% ... %}, {{ ... }})")]
    return []


def _scenario(path: Path, text: str) -> list[Diagnostic]:
    """A scenario file's text checked as `funnel test` loads it (its format, its turns):
    written to a hidden file beside it for the loader (its `funnel:` path is relative to it),
    then removed. Column 1: the loader tells lines."""
    tmp = path.with_name(f".{path.stem}.{secrets.token_hex(4)}.lint{path.suffix}")
    try:
        tmp.write_text(text, "utf-8")
        failures = load_scenario(tmp)[1]
    finally:
        tmp.unlink(missing_ok=True)
    return [Diagnostic(str(path), f.line, 1, "error", "S001",
                       f.message.replace(str(tmp), str(path))) for f in failures]
