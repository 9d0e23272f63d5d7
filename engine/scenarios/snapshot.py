"""Snapshots of what the model reads: each stage's contract and its prompt (every message
of the first model call) at the funnel's fixture states, stored as text in the funnel's
folder (``<funnel>/snapshots/<stage>.txt``) so that a pull request shows what a template,
``updates:`` or catalog edit does to them.

The fixture states are the states of the funnel's scenarios at each turn (played by
:mod:`engine.scenarios.run`, which keeps each turn's first request) and the states of a
declared fixtures file, ``<funnel>/snapshots/fixtures.yaml`` (:mod:`.fixtures`). Nothing
in a snapshot depends on the machine or the run: scenarios run on a fixed clock, the
contract is written with sorted keys, entries are sorted by their source.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..funnel.compiled import CompiledFunnel
from ..llm.request import ModelRequest
from .coverage_report import shown_path
from .run import ScenarioResult

FOLDER = "snapshots"
FIXTURES = "fixtures.yaml"  # in FOLDER
_HEADER = re.compile(r"^=== (.+) ===$")
_CONTRACT = "contract"


@dataclass(frozen=True)
class Entry:
    """One fixture state's prompt in one stage."""

    stage: str
    source: str  # the scenario or fixtures file, relative to the funnel's folder
    order: int  # the turn (0 for a fixtures file's entry)
    name: str  # "turn 3", or the fixture's name
    text: str  # the messages, as rendered

    @property
    def label(self) -> str:
        return f"{self.source} {self.name}"


@dataclass
class Difference:
    """A stage file whose stored text is not what the funnel renders now."""

    file: str  # the snapshot file
    stage: str
    diff: str  # unified, stored -> rendered
    status: str  # "changed", "missing" (not stored) or "stale" (no such stage any more)
    # Where the change comes from, when known: (file, line) of a template or the funnel.
    cause: tuple[str, int] | None = None


def folder(funnel: CompiledFunnel) -> Path:
    """``funnels/puramur.yaml`` -> ``funnels/puramur/snapshots``."""
    return funnel.spec.path.with_suffix("") / FOLDER


def source_of(funnel: CompiledFunnel, file: str | Path) -> str:
    """A scenario or fixtures file as the snapshots name it: relative to the funnel's folder."""
    base = funnel.spec.path.with_suffix("").resolve()
    path = Path(file).resolve()
    return path.relative_to(base).as_posix() if path.is_relative_to(base) else path.name


def render_messages(request: ModelRequest) -> str:
    """Every message of the request, role by role, as the model reads them."""
    parts = [f"--- {m['role']} ---\n{m['content'].rstrip()}" for m in request.messages]
    return "\n".join(parts)


def entries(funnel: CompiledFunnel, results: Iterable[ScenarioResult]) -> list[Entry]:
    """The entries of the results that ran on ``funnel``: one per turn that called the model."""
    out = []
    for r in results:
        if r.funnel is None or r.funnel.spec.path.resolve() != funnel.spec.path.resolve():
            continue
        source = source_of(funnel, r.file)
        fixture = r.name if source == f"{FOLDER}/{FIXTURES}" else None
        for number, request in r.requests:
            name = fixture if fixture is not None else f"turn {number}"
            out.append(Entry(request.stage, source, 0 if fixture else number, name,
                             render_messages(request)))
    return out


def contract_text(funnel: CompiledFunnel, stage: str) -> str:
    return json.dumps(funnel.stage(stage).schema, indent=2, sort_keys=True, ensure_ascii=False)


def render_stage(funnel: CompiledFunnel, stage: str, found: Sequence[Entry]) -> str:
    """One stage's snapshot file."""
    lines = [f"# funnel snapshot: stage {stage} of funnel {funnel.spec.name}: its output "
             "contract, then the prompt",
             "# (every message) at each fixture state. Written by `funnel snapshot FUNNEL "
             "--update`; checked by `funnel test --snapshots`.", "",
             f"=== {_CONTRACT} ===", contract_text(funnel, stage), ""]
    mine = sorted((e for e in found if e.stage == stage), key=lambda e: (e.source, e.order, e.name))
    if not mine:
        lines += ["(no fixture state calls the model in this stage)", ""]
    for e in mine:
        lines += [f"=== {e.label} ===", e.text, ""]
    return "\n".join(lines)


def render_all(funnel: CompiledFunnel, found: Sequence[Entry]) -> dict[str, str]:
    """Every stage's file name and text."""
    return {f"{s}.txt": render_stage(funnel, s, found) for s in funnel.spec.stages}


def _blocks(text: str) -> tuple[list[str], dict[str, str]]:
    """A stored file's head (up to the contract) and its entries by label."""
    head: list[str] = []
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.split("\n"):
        m = _HEADER.match(line)
        if m:
            current = blocks.setdefault(m.group(1), [])
            continue
        (head if current is None else current).append(line)
    return head, {k: "\n".join(v) for k, v in blocks.items()}


def expected(funnel: CompiledFunnel, stage: str, found: Sequence[Entry], stored: str | None,
             played: set[str]) -> str:
    """What the stage file should hold when only the sources in ``played`` ran: their
    entries rendered now, the stored entries of the sources that did not run kept."""
    if stored is None:
        return render_stage(funnel, stage, found)
    _, blocks = _blocks(stored)
    kept = list(found)
    base = funnel.spec.path.with_suffix("")
    for label, body in blocks.items():
        m = re.fullmatch(r"(\S+) turn (\d+)", label)
        source, _, name = label.partition(" ")
        # A source that ran renders its entries anew; one that is gone has none.
        if label == _CONTRACT or source in played or not (base / source).is_file():
            continue
        kept.append(Entry(stage, source, int(m.group(2)) if m else 0, name, body.rstrip("\n")))
    return render_stage(funnel, stage, kept)


def compare(funnel: CompiledFunnel, found: Sequence[Entry], played: set[str] | None = None
            ) -> list[Difference]:
    """The stage files that differ from what is stored; ``played``: the sources that ran
    (None: all of them, so that stored entries of no source are stale)."""
    where = folder(funnel)
    out: list[Difference] = []
    for name in sorted(funnel.spec.stages):
        path = where / f"{name}.txt"
        stored = path.read_text("utf-8") if path.is_file() else None
        want = render_stage(funnel, name, found) if played is None \
            else expected(funnel, name, found, stored, played)
        if stored == want:
            continue
        shown = _shown(path)
        diff = "".join(difflib.unified_diff(
            (stored or "").splitlines(keepends=True), want.splitlines(keepends=True),
            fromfile=f"{shown} (stored)", tofile=f"{shown} (rendered now)"))
        out.append(Difference(shown, name, diff, "missing" if stored is None else "changed",
                              cause(funnel, name, stored or "", want)))
    if where.is_dir():
        for path in sorted(where.glob("*.txt")):
            if path.stem not in funnel.spec.stages:
                out.append(Difference(_shown(path), path.stem, "", "stale"))
    return out


def write(funnel: CompiledFunnel, found: Sequence[Entry], only: set[str] | None = None
          ) -> list[str]:
    """Store every stage's snapshot (``only``: those stages') and drop those of stages
    that are gone; return the files written or removed."""
    where = folder(funnel)
    where.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, text in render_all(funnel, found).items():
        if only is not None and name.removesuffix(".txt") not in only:
            continue
        path = where / name
        if not path.is_file() or path.read_text("utf-8") != text:
            path.write_text(text, "utf-8")
            changed.append(_shown(path))
    for path in sorted(where.glob("*.txt")) if only is None else ():
        if path.stem not in funnel.spec.stages:
            path.unlink()
            changed.append(_shown(path))
    return changed


def cause(funnel: CompiledFunnel, stage: str, stored: str, want: str) -> tuple[str, int] | None:
    """The template line (or the funnel's stage line, for the contract) a change comes
    from, when one line of the stage's template explains the first changed line."""
    before, after = stored.splitlines(), want.splitlines()
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    changed = [line for tag, _i1, _i2, j1, j2 in matcher.get_opcodes() if tag != "equal"
               for line in after[j1:j2]]
    changed += [line for tag, i1, i2, _j1, _j2 in matcher.get_opcodes() if tag != "equal"
                for line in before[i1:i2]]
    head = stored.split("\n=== ", 2)
    if len(head) > 1 and head[1].startswith(_CONTRACT) and \
            contract_text(funnel, stage) not in stored:
        line = funnel.spec.stages[stage].line
        return (_shown(funnel.spec.path), line) if line else None
    own = funnel.spec.stages[stage].prompt
    # The stage's template first, then the others beside it (the ones it includes).
    for template in [own, *sorted(p for p in own.parent.glob("*.j2") if p != own)]:
        try:
            source = template.read_text("utf-8").splitlines()
        except OSError:
            continue
        for text in changed:
            found = template_line(source, text)
            if found:
                return _shown(template), found
    return None


_JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}")


def template_line(source: Sequence[str], rendered: str) -> int | None:
    """The 1-based line of the template whose literal text best explains ``rendered``: every
    literal piece of the line appears in it, in order; the most literal text wins."""
    best: tuple[int, int] | None = None
    for number, line in enumerate(source, start=1):
        pieces = [p for p in _JINJA.split(line) if p.strip()]
        size = sum(len(p.strip()) for p in pieces)
        if size < 6:
            continue
        at, ok = 0, True
        for piece in pieces:
            found = rendered.find(piece.strip() if len(pieces) > 1 else piece.rstrip("\n"), at)
            if found < 0:
                ok = False
                break
            at = found + len(piece.strip())
        if ok and (best is None or size > best[0]):
            best = (size, number)
    return best[1] if best else None


def _shown(path: Path) -> str:
    return shown_path(path)


def summary(differences: Sequence[Difference], funnels: Mapping[str, int]) -> str:
    """``snapshots: 2 of 14 stage files differ``."""
    total = sum(funnels.values())
    if not differences:
        return f"snapshots: {total} stage file(s) match"
    return f"snapshots: {len(differences)} of {total} stage file(s) differ"
