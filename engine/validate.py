"""`funnel validate`: every problem in a funnel, found in one run.

Layers, each on what the previous one could read:

1. the file: YAML syntax (F001), duplicate keys (F002), not a mapping (F004);
2. the format's JSON Schema, ``schemas/funnel.schema.json`` (F003 unknown key,
   F004 wrong type or value) -- the same schema editors use;
3. semantics (`engine.checks`): names, stages, conditions, templates, output
   schemas, actions, catalog;
4. across funnels (`engine.checks_storage`): table, index and funnel names.

Importing this module imports neither litellm nor psycopg.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema

from . import _yaml
from .diagnostics import Diagnostic, Severity
from .errors import did_you_mean
from .spec import FunnelSpec, build_spec

if TYPE_CHECKING:
    from .checks_storage import StorageNames

_FUNNEL_KEY = re.compile(r"^funnel\s*:", re.MULTILINE)
# Scenario files (`funnel test`) name their funnel with `funnel:` too; no funnel has these keys.
_SCENARIO_KEY = re.compile(r"^(scenario|turns)\s*:", re.MULTILINE)


@cache
def packaged_validator(name: str) -> jsonschema.Draft202012Validator:
    """A validator for a JSON Schema shipped in ``engine/data`` (``funnel``, ``scenario``)."""
    text = resources.files("engine").joinpath(f"data/{name}.schema.json").read_text("utf-8")
    return jsonschema.Draft202012Validator(json.loads(text))


def format_schema() -> dict[str, Any]:
    """The funnel format's JSON Schema (2020-12), shipped inside the package."""
    return dict(packaged_validator("funnel").schema)  # type: ignore[arg-type]


def _format_validator() -> jsonschema.Draft202012Validator:
    return packaged_validator("funnel")


class Report:
    """Collects diagnostics for one funnel file and the files it names."""

    def __init__(self, path: Path, located: _yaml.Located | None = None) -> None:
        self.path = path
        self.located = located
        self.items: list[Diagnostic] = []

    def at(
        self,
        keys: Iterable[str | int],
        severity: Severity,
        code: str,
        message: str,
        *,
        key: bool = False,
    ) -> None:
        """Report at a position in the funnel file, given as a key path."""
        line, col = self.located.where(tuple(keys), key=key) if self.located else (0, 0)
        self.add(self.path, line, col, severity, code, message)

    def add(
        self, file: Path | str, line: int, col: int, severity: Severity, code: str, message: str
    ) -> None:
        self.items.append(Diagnostic(str(file), line, col, severity, code, message))

    @property
    def has_errors(self) -> bool:
        return any(d.severity == "error" for d in self.items)


def discover(paths: Iterable[str | Path]) -> tuple[list[Path], list[Diagnostic]]:
    """Expand files and folders into the funnel files to check.

    A named file is always checked; in a folder, ``*.yaml``/``*.yml`` files
    with a top-level ``funnel:`` key are (catalogs and scenarios are not).
    """
    found, missing = _yaml.find_files(
        paths, lambda text: bool(_FUNNEL_KEY.search(text) and not _SCENARIO_KEY.search(text)))
    return found, [Diagnostic(p, 0, 0, "error", "F000", "no such file or folder")
                   for p in missing]


def validate_paths(paths: Iterable[str | Path]) -> list[Diagnostic]:
    """Validate every funnel under ``paths``; return all diagnostics, sorted by file and line.

    The funnels are checked together too: no two may name the same table or
    index, or have the same funnel name (F602, F603, F604, reported on the later file).
    """
    from .checks_storage import StorageNames

    files, out = discover(paths)
    names = StorageNames()
    for path in files:
        out.extend(check_file(path, names)[1])
    return out


def check_file(
    path: Path, names: StorageNames | None = None
) -> tuple[FunnelSpec | None, list[Diagnostic]]:
    """Validate one funnel file; return its spec (``None`` when it has errors) and diagnostics.

    Args:
        path: the funnel file.
        names: the funnel, table and index names of the funnels checked before
            this one in the same run, to which this one's are added; ``None`` checks
            the funnel's names against its own only.
    """
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, [Diagnostic(str(path), 0, 0, "error", "F000", f"cannot read the file: {exc}")]
    report = Report(path)
    try:
        located = _yaml.load(text)
    except _yaml.YamlSyntaxError as exc:
        report.add(path, exc.line, exc.col, "error", "F001", f"{exc}; fix the YAML syntax")
        return None, report.items
    report.located = located
    for keys, line, col, first in located.duplicates:
        report.add(
            path,
            line,
            col,
            "error",
            "F002",
            f"duplicate key '{keys[-1]}' (first defined on line {first}); YAML keeps only one "
            "of them: remove or rename this one",
        )
    data = located.data
    if not isinstance(data, dict):
        report.at((), "error", "F004", "a funnel file must be a mapping with `funnel`, "
                  "`version`, `table`, `initial`, `state` and `stages`")
        return None, report.items
    _check_format(data, report)
    # Semantic checks read the data defensively: they run even when the format
    # layer found errors, so one run reports everything it can.
    from .checks import check_semantics
    from .checks_storage import StorageNames

    check_semantics(data, report)
    (names if names is not None else StorageNames()).check(data, report)
    if report.has_errors:
        return None, sorted(report.items)
    try:
        spec = build_spec(data, path, located)
    except (KeyError, TypeError, ValueError) as exc:  # pragma: no cover - schema should prevent
        report.at((), "error", "F004", f"cannot build the funnel: {exc}")
        return None, sorted(report.items)
    return spec, sorted(report.items)


def _check_format(data: dict[str, Any], report: Report) -> None:
    for error in sorted(_format_validator().iter_errors(data), key=lambda e: list(e.path)):
        keys = tuple(error.absolute_path)
        if error.validator == "additionalProperties":
            allowed = set(error.schema.get("properties", {}))
            extra = [k for k in error.instance if k not in allowed] if isinstance(
                error.instance, dict
            ) else []
            for name in extra:
                report.at(
                    (*keys, name),
                    "error",
                    "F003",
                    f"unknown key '{name}' in {_where(keys)}{did_you_mean(str(name), allowed)}; "
                    f"expected one of: {', '.join(sorted(allowed))}",
                    key=True,
                )
            continue
        if error.validator == "required":
            report.at(keys, "error", "F004", f"{_where(keys)}: {error.message}")
            continue
        if error.validator == "oneOf" and keys and keys[0] == "actions":
            report.at(keys, "error", "F004", f"action '{keys[-1]}' needs exactly one of "
                      "`builtin` or `hook`")
            continue
        if error.validator == "pattern" and error.schema is format_schema()["$defs"]["stage_name"]:
            report.at(keys, "error", "F004", f"{_where(keys)}: {error.instance!r} is not a valid "
                      "stage name (lowercase letters, digits and _)")
            continue
        if error.validator == "propertyNames":
            name = error.instance
            report.at((*keys, name), "error", "F004", f"{_where(keys)}: {name!r} is not a valid "
                      "name (lowercase letters, digits and _, at most 63)", key=True)
            continue
        report.at(keys, "error", "F004", f"{_where(keys)}: {error.message}")


def _where(keys: tuple[Any, ...]) -> str:
    if not keys:
        return "the funnel"
    return "`" + ".".join(str(k) for k in keys) + "`"
