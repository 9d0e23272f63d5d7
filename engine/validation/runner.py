"""`funnel validate`: every problem in a funnel, found in one run.

Layers, each on what the previous one could read:

1. the file: YAML syntax (F001), duplicate keys (F002), not a mapping (F004);
2. the format's JSON Schema, ``schemas/funnel.schema.json`` (F003 unknown key,
   F004 wrong type or value) -- the same schema editors use;
3. semantics, one checker after another: names, the stage graph, conditions and
   indexes (`semantics`), actions and hooks (`actions`), templates and output
   schemas (`files`), the catalog (`files`);
4. across funnels (`storage`): table, index and funnel names.

Importing this module imports neither litellm nor psycopg.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from ..format import _yaml
from ..format.build import build_spec
from ..format.spec import FunnelSpec
from .actions import check_actions
from .claims import check_claims
from .context import check_recall
from .diagnostics import Diagnostic, Report, as_dict
from .experiment import check_experiment
from .files import check_catalog, check_stage_files
from .follow_ups import check_follow_ups
from .format import check_format
from .grounding import check_grounding
from .knowledge import check_knowledge, check_language
from .migrations import check_migrations
from .semantics import check_semantics
from .storage import StorageNames
from .texts import check_texts

_FUNNEL_KEY = re.compile(r"^funnel\s*:", re.MULTILINE)
# Scenario files (`funnel test`) name their funnel with `funnel:` too; no funnel has these keys.
_SCENARIO_KEY = re.compile(r"^(scenario|turns)\s*:", re.MULTILINE)


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
    return check_text(path, text, names)


def check_text(
    path: Path, text: str, names: StorageNames | None = None
) -> tuple[FunnelSpec | None, list[Diagnostic]]:
    """Validate ``text`` as the funnel file at ``path`` (the files it names are read from
    beside ``path``): what :func:`check_file` does, for a text not yet saved (the studio's
    editor checks as the product owner types)."""
    report = Report(path)
    try:
        located = _yaml.load(text)
    except _yaml.YamlSyntaxError as exc:
        hint = "" if str(exc).startswith("YAML refused") else "; fix the YAML syntax"
        report.add(path, exc.line, exc.col, "error", "F001", f"{exc}{hint}")
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
    check_format(data, report)
    # Semantic checks read the data defensively: they run even when the format
    # layer found errors, so one run reports everything it can.
    state = {k: v for k, v in as_dict(data.get("state")).items() if isinstance(v, dict)}
    check_semantics(data, state, report)
    check_actions(data, report)
    check_grounding(data, report)
    check_stage_files(data, state, report)
    check_catalog(data, report)
    check_claims(data, state, report)
    check_language(data, report)
    check_texts(data, report)
    check_follow_ups(data, state, report)
    check_knowledge(data, report)
    check_recall(data, report)
    check_migrations(data, state, report)
    check_experiment(data, report)
    (names if names is not None else StorageNames()).check(data, report)
    if report.has_errors:
        return None, sorted(report.items)
    try:
        spec = build_spec(data, path, located)
    except (KeyError, TypeError, ValueError) as exc:  # pragma: no cover - schema should prevent
        report.at((), "error", "F004", f"cannot build the funnel: {exc}")
        return None, sorted(report.items)
    return spec, sorted(report.items)
