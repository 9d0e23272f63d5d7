"""A funnel version as a bundle: the funnel file and every file it reads (templates with
their includes, output schemas, the catalog, local hook modules), content-hashed.

`funnel deploy` / `funnel migrate` and :meth:`Engine.deploy` store bundles (deployed, or as
trials: docs/versions.md) in the
version store (``funnel_versions``); :func:`compile_bundle` builds a version back
from its stored bundle alone: the files are written to a private temporary folder,
so nothing outside the bundle can be read (docs/versions.md).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from jinja2 import Environment, meta

from ..errors import ConfigError, FunnelInvalid
from ..format.files import hook_files
from ..format.spec import FunnelSpec
from ..funnel.compiled import CompiledFunnel
from ..validation import check_file

__all__ = ["Bundle", "LoadedVersion", "bundle_of", "compile_bundle"]


@dataclass(frozen=True)
class Bundle:
    """The files of one funnel version: ``files`` maps a path relative to the bundle's base
    (the folder holding them all) to the file's text; ``entry`` is the funnel file."""

    name: str
    version: int
    entry: str
    files: dict[str, str]
    digest: str = ""

    @classmethod
    def make(cls, name: str, version: int, entry: str, files: dict[str, str]) -> Bundle:
        blob = orjson.dumps({"entry": entry, "files": files}, option=orjson.OPT_SORT_KEYS)
        return cls(name, version, entry, files, hashlib.sha256(blob).hexdigest())


@dataclass
class LoadedVersion:
    """A version compiled from its bundle; ``folder`` keeps the bundle's files (includes
    are read when a template renders) for as long as the version is loaded."""

    funnel: CompiledFunnel
    digest: str
    folder: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)


def _includes(template: Path, seen: set[Path]) -> None:
    """``template`` and every template it includes (relative to its folder), into ``seen``."""
    folder = template.parent
    pending = [template]
    while pending:
        path = pending.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        try:
            tree = Environment().parse(path.read_text("utf-8"))
        except Exception:  # noqa: BLE001 - validate reports template errors; keep the file
            continue
        for ref in meta.find_referenced_templates(tree):
            if ref:
                pending.append(folder / ref)


def bundle_of(spec: FunnelSpec) -> Bundle:
    """The bundle of a validated funnel, read from its files now.

    Raises:
        ConfigError: a file cannot be read as UTF-8 text.
    """
    paths: set[Path] = {spec.path}
    templates: set[Path] = set()
    for stage in spec.stages.values():
        _includes(stage.prompt, templates)
        if stage.schema is not None:  # a derived contract lives in the funnel file
            paths.add(stage.schema)
    paths |= templates
    if spec.catalog_path is not None:
        paths.add(spec.catalog_path)
    paths.update(hook_files(spec))  # the actions' and handoff.notify's, beside the funnel
    real = {Path(os.path.realpath(p)) for p in paths}
    entry_real = Path(os.path.realpath(spec.path))
    # The knowledge folder's index lives in the database (per funnel, not per version):
    # the bundle keeps the folder's place only ("path/" with no text), for validation.
    knowledge = Path(os.path.realpath(spec.knowledge.folder)) if spec.knowledge else None
    base = Path(os.path.commonpath([str(p.parent) for p in real]
                                   + ([str(knowledge)] if knowledge else [])))
    files: dict[str, str] = {}
    if knowledge is not None:
        files[knowledge.relative_to(base).as_posix() + "/"] = ""
    for path in sorted(real):
        try:
            files[path.relative_to(base).as_posix()] = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {path} for the version store: {exc}") from None
    return Bundle.make(spec.name, spec.version, entry_real.relative_to(base).as_posix(), files)


def compile_bundle(bundle: Bundle) -> LoadedVersion:
    """Compile a stored version from its bundle alone.

    Raises:
        FunnelInvalid: the stored funnel does not validate here (a hook module that
            cannot be imported, say).
        ConfigError: the bundle names a path outside itself.
    """
    folder = tempfile.TemporaryDirectory(prefix=f"funnel-{bundle.name}-v{bundle.version}-")
    root = Path(folder.name)
    # The marker makes the folder the funnel's project (engine.format.paths): its files are the
    # only ones the funnel may read, whatever lies around the temporary folder.
    (root / "pyproject.toml").write_text("", "utf-8")
    for rel, text in bundle.files.items():
        target = root / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            folder.cleanup()
            raise ConfigError(f"version {bundle.version} of funnel '{bundle.name}' in the "
                              f"version store names {rel!r}, outside its bundle; deploy it "
                              "again with `funnel deploy`")
        if rel.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, "utf-8")
    try:
        spec, diagnostics = check_file(root / bundle.entry)
        if spec is None:
            raise FunnelInvalid(diagnostics)
        compiled = CompiledFunnel(spec)
    except BaseException:
        folder.cleanup()
        raise
    return LoadedVersion(compiled, bundle.digest, folder)
