"""The studio's scenarios: the funnel's own scenarios folder (the one `funnel test` runs),
run whole from the page, a failing one accepted (re-recorded, the diff shown first), a
playground session saved into it under the name the product owner chooses.

The folder: ``<folder>/<funnel file's stem>/scenarios/`` when the funnel file sits
beside a folder of its name (the shipped layout: ``funnels/puramur.yaml`` and
``funnels/puramur/scenarios/``), else ``<folder>/scenarios/`` (what `funnel new`
writes: ``NAME/funnel.yaml`` and ``NAME/scenarios/``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from typing import Any

from ..errors import FunnelError, InvalidInput
from ..format.spec import FunnelSpec
from ..scenarios.load import Failure, discover, load_scenario
from ..scenarios.placeholders import without_personal
from ..scenarios.record import recorded_scenario, scenario_yaml
from ..scenarios.rerecord import Rerecorded, rerecord
from ..scenarios.run import ScenarioResult, run_all
from ..store import Store
from ..turn.engine import Engine

__all__ = ["ScenarioExists", "accept", "folder_of", "run_folder", "save"]

_NAME = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class ScenarioExists(FunnelError):
    """A scenario file of that name is there already (409: the page asks first)."""

    def __init__(self, file: Path) -> None:
        self.file = file
        super().__init__(f"a scenario named {file.stem!r} exists in {file.parent}; overwrite "
                         "it, or choose another name")


def folder_of(spec: FunnelSpec) -> Path:
    """The funnel's own scenarios folder (the module docstring)."""
    parent, stem = spec.path.parent, spec.path.stem
    for folder in (parent / stem / "scenarios", parent / "scenarios"):
        if folder.is_dir():
            return folder
    return parent / stem / "scenarios" if (parent / stem).is_dir() else parent / "scenarios"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _schema_comment(folder: Path) -> str:
    """The editor's schema line, when the project has the scenario schema."""
    for up in [folder, *folder.parents][:6]:
        schema = up / "schemas" / "scenario.schema.json"
        if schema.is_file():
            rel = Path(os.path.relpath(schema, folder)).as_posix()
            return f"# yaml-language-server: $schema={rel}\n"
    return ""


def _stem(name: str | None, session: str) -> str:
    stem = (name or session).strip().removesuffix(".yaml").removesuffix(".yml")
    if not stem or any(c not in _NAME for c in stem) or stem.startswith("."):
        raise InvalidInput(f"a scenario name is letters, digits, `-`, `_` and `.` (not first); "
                           f"got {stem!r:.120}")
    return stem


async def save(engine: Engine, session: str, name: str | None = None, *,
               overwrite: bool = False) -> dict[str, Any]:
    """Write ``session`` as a scenario (what ``funnel record`` writes) named ``name``
    (default: the session id) into the funnel's scenarios folder, with the personal data
    the funnel declares replaced by placeholders (engine.scenarios.placeholders).

    Raises:
        InvalidInput: nothing to save, or a name that is not a plain file name.
        ScenarioExists: the file is there and ``overwrite`` is not set.
    """
    spec = engine.spec
    folder = folder_of(spec)
    stem = _stem(name, session)
    target = folder / f"{stem}.yaml"
    if target.exists() and not overwrite:
        raise ScenarioExists(target)
    records = await engine.store.turn_records(spec, session, limit=1000)
    funnel_ref = Path(os.path.relpath(spec.path, folder)).as_posix()
    scenario, replaced = without_personal(
        spec, recorded_scenario(spec, session, records, funnel_ref),
        [await engine.state(session) or {}])
    scenario["scenario"] = stem
    note = (f"# {replaced} personal word(s) and number(s) the funnel declares are "
            "placeholders (RedactedN, 555...): docs/studio.md.\n" if replaced else "")
    text = (_schema_comment(folder) + f"# Saved from the studio's playground (session "
            f"{session}).\n" + note + scenario_yaml(scenario))
    folder.mkdir(parents=True, exist_ok=True)
    _write(target, text)
    return {"file": str(target), "name": stem, "yaml": text, "turns": len(records),
            "placeholders": replaced, "overwritten": overwrite}


def _write(target: Path, text: str) -> None:
    """Atomically: a temporary file beside it, then a rename."""
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(text, "utf-8")
    os.replace(temporary, target)


def _failure(f: Failure, lines: list[str], customers: dict[int, str]) -> dict[str, Any]:
    """A failure with the expectation's line as written and the turn's customer message."""
    written = lines[f.line - 1].strip() if 0 < f.line <= len(lines) else ""
    return {"line": f.line, "turn": f.turn, "message": f.message, "kind": f.kind,
            "expectation": written.removeprefix("- "),
            "customer": customers.get(f.turn or 0)}


def _result(r: ScenarioResult) -> dict[str, Any]:
    path = Path(r.file)
    try:
        lines = path.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    scenario, _ = load_scenario(path) if r.failures else (None, [])
    customers = {t.number: t.customer for t in scenario.turns} if scenario else {}
    return {"file": r.file, "name": r.name, "passed": r.passed, "errored": r.errored,
            "turns": r.turns, "failures": [_failure(f, lines, customers) for f in r.failures]}


async def run_folder(spec: FunnelSpec, store: Store) -> dict[str, Any]:
    """Play every scenario of the funnel's folder (``funnel test FOLDER``), in a temporary
    schema of the studio's database, in a thread (it runs its own loop)."""
    folder = folder_of(spec)
    files, _missing = discover([folder]) if folder.is_dir() else ([], [])
    url = getattr(store, "url", None)
    results = await asyncio.to_thread(run_all, [(f, *load_scenario(f)) for f in files], url)
    return {"folder": str(folder), "results": [_result(r) for r in results]}


def _inside(spec: FunnelSpec, file: str) -> Path:
    folder = folder_of(spec).resolve()
    path = Path(file).resolve()
    if path.parent != folder and folder not in path.parents or not path.is_file():
        raise InvalidInput(f"{file!r:.200} is not a scenario file of funnel '{spec.name}''s "
                           f"folder {folder}")
    return path


# Diffs shown and not yet accepted: (file, digest of the text shown) -> the re-recording.
_SHOWN: dict[tuple[Path, str], Rerecorded] = {}
_SHOWN_MAX = 32


async def accept(spec: FunnelSpec, store: Store, file: str, confirm: str | None = None
                 ) -> dict[str, Any]:
    """Re-record the failing expectations of ``file`` (engine.scenarios.rerecord): without
    ``confirm``, the diff and the file's digest, nothing written; with ``confirm`` (the
    digest shown), the file re-recorded as shown, unless it changed since, and played
    again (``result``, as :func:`run_folder` lists it).

    Raises:
        InvalidInput: not a file of the funnel's scenarios folder, one that cannot be
            re-recorded, or one that changed since the diff was shown.
    """
    path = _inside(spec, file)
    url = getattr(store, "url", None)
    if confirm is None:
        found: Rerecorded = await asyncio.to_thread(rerecord, path, url)
        digest = _digest(found.old)
        while len(_SHOWN) >= _SHOWN_MAX:
            del _SHOWN[next(iter(_SHOWN))]
        _SHOWN[(path, digest)] = found
        return {"file": str(path), "diff": found.diff(), "changes": found.changes,
                "digest": digest, "written": False}
    if _digest(path.read_text("utf-8")) != confirm:
        raise InvalidInput(f"{path.name} changed since its diff was shown; look at the diff "
                           "again before accepting")
    shown = _SHOWN.pop((path, confirm), None)
    found = shown if shown is not None else await asyncio.to_thread(rerecord, path, url)
    if found.new != found.old:
        _write(path, found.new)
    # The new expectations were checked on the play they come from (a scenario plays
    # the same every time: scripted outputs, its own clock): no second play is needed.
    result = {"file": str(path), "name": found.name, "passed": not found.failing,
              "errored": False, "turns": found.turns, "failures": [
                  {"line": 0, "turn": None, "message": m, "kind": "fail", "expectation": "",
                   "customer": None} for m in found.failing]}
    return {"file": str(path), "diff": found.diff(), "changes": found.changes,
            "digest": _digest(found.new), "written": found.new != found.old,
            "result": result}
