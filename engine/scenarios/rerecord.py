"""Accept a scenario's new behaviour: play it through and re-record, from what the engine
did, the expectations that no longer hold (the studio's "accept", docs/studio.md).

Only the failing expectations change, in place: the file keeps its comments, its
order and its other lines, so that the diff shown before accepting is the change
accepted. Every turn is played (a failing turn does not stop the run, as it does
in `funnel test`), so later turns are re-recorded from the new behaviour too.
"""

from __future__ import annotations

import asyncio
import difflib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import InvalidInput
from ..format import _yaml
from ..sandbox.patterns import compile_linear
from ..store import open_store
from ..store.connect import temporary_schema
from ..turn.engine import TurnResult
from .check import _MISSING, _lookup, check
from .load import Scenario, check_against, load_scenario
from .run import CHANNEL, Runner

__all__ = ["Rerecorded", "rerecord", "rewritten"]


@dataclass
class Rerecorded:
    """A scenario file as it is (``old``) and with its failing expectations re-recorded
    (``new``); ``changes``: each expectation changed (turn, key, was, now); ``failing``:
    the re-recorded expectations checked on the same play, those that still fail (none
    unless the file could not say what the engine did)."""

    file: Path
    old: str
    new: str
    changes: list[dict[str, Any]] = field(default_factory=list)
    failing: list[str] = field(default_factory=list)
    name: str = ""  # the scenario's
    turns: int = 0

    def diff(self) -> str:
        """The unified diff from ``old`` to ``new``."""
        return "".join(difflib.unified_diff(
            self.old.splitlines(keepends=True), self.new.splitlines(keepends=True),
            fromfile=f"{self.file.name} (now)", tofile=f"{self.file.name} (accepted)"))


def rerecord(path: Path, db: str | None) -> Rerecorded:
    """Play the scenario at ``path`` in a temporary schema of ``db`` and re-record its
    failing expectations; nothing is written.

    Raises:
        InvalidInput: the file does not load, its names do not match the funnel, or the
            engine fails on it (nothing to re-record from: fix the file first).
    """
    scenario, problems = load_scenario(path)
    if scenario is None:
        raise InvalidInput(f"{path.name} cannot be re-recorded: {problems[0].format()}")
    old = path.read_text("utf-8")
    with temporary_schema(db, prefix="funnel_tmp_accept") as url:
        expects, failing = asyncio.run(_observe(url, scenario))
    out = Rerecorded(path, old, old, failing=failing, name=scenario.name,
                     turns=len(scenario.turns))
    for turn, new in zip(scenario.turns, expects, strict=True):
        before, after = _flat(turn.expect), _flat(new)
        for key in dict.fromkeys([*before, *after]):
            was, now = before.get(key, _MISSING), after.get(key, _MISSING)
            if was != now:
                out.changes.append({"turn": turn.number, "key": key,
                                    "was": None if was is _MISSING else was,
                                    "now": None if now is _MISSING else now})
    out.new = rewritten(old, scenario, expects)
    return out


def rewritten(text: str, scenario: Scenario, expects: list[dict[str, Any]]) -> str:
    """``text`` (the scenario's file as loaded) with each turn's ``expect`` made the one
    in ``expects``: only the lines of the expectations that differ change (a block
    ``state:`` path by path; one written in flow style, on its one line), an expectation
    gone loses its lines, a new one is added after the block; comments stay."""
    # From the last turn up: an edit moves the lines below it only, and the positions
    # read from the file stay right for the turns above.
    for index in reversed(range(len(scenario.turns))):
        if expects[index] != scenario.turns[index].expect:
            text = _rewrite(text, scenario, index, expects[index])
    return text


def _flat(expect: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` as ``state.<path>`` keys, as the failures name them."""
    out = {k: v for k, v in expect.items() if k != "state"}
    out.update({f"state.{p}": v for p, v in (expect.get("state") or {}).items()})
    return out


async def _observe(url: str, scenario: Scenario) -> tuple[list[dict[str, Any]], list[str]]:
    """Each turn's expectations, those that failed replaced by what the engine did; and
    those of the new ones that fail still, on the same play (``turn N: message``)."""
    store = await open_store(url)
    try:
        runner = Runner(store, secrets.token_hex(6))
        engine = await runner.engine(scenario)
        if isinstance(engine, str):
            raise InvalidInput(f"{Path(scenario.file).name}: {engine}")
        mismatched = check_against(scenario, engine.funnel)
        if mismatched:
            raise InvalidInput(f"{Path(scenario.file).name} cannot be re-recorded: "
                               f"{mismatched[0].format()}")
        session = f"accept-{runner.token}"
        runner.clock.now = scenario.clock
        if scenario.start is not None:
            await runner.seed(engine, session, scenario.start)
        out, failing = [], []
        for turn in scenario.turns:
            if turn.at is not None:
                runner.clock.now = turn.at
            if turn.after is not None:
                runner.clock.now += turn.after
            runner.model.play(turn.llm)
            runner.notifications.sent.clear()
            try:
                result = await engine.handle(session, turn.customer, channel=CHANNEL)
            except Exception as exc:
                raise InvalidInput(f"turn {turn.number} of {Path(scenario.file).name}: the "
                                   f"engine raised {type(exc).__name__}: {exc}") from None
            await engine.drain()
            row = await engine.state(session)
            prompt, notified = runner.model.prompt, bool(runner.notifications.sent)
            failed = {key for key, _ in check(turn.expect, result, row, prompt, notified)}
            new = _expected(turn.expect, failed, result, row, prompt, notified)
            out.append(new)
            failing += [f"turn {turn.number}: {message}"
                        for _, message in check(new, result, row, prompt, notified)]
        return out, failing
    finally:
        await store.close()


def _expected(expect: Mapping[str, Any], failed: set[str], result: TurnResult,
              row: Mapping[str, Any] | None, prompt: str | None, notified: bool
              ) -> dict[str, Any]:
    """``expect`` with each failed expectation replaced by what the turn did."""
    observed: dict[str, Any] = {
        "stage": result.stage_after, "reply": result.reply,
        "actions": [o.type for o in result.actions if o.accepted],
        "refused": [o.type for o in result.actions if not o.accepted],
        "claims": [c["name"] for c in result.reply_claims],
        "fallback": result.fallback, "handoff": result.handoff, "notified": notified,
        "transitions": [f"{t['from']}->{t['to']}" for t in result.transitions]}
    new: dict[str, Any] = {}
    for key, want in expect.items():
        if key == "state":
            new[key] = {path: _state(path, value, row, f"state.{path}" in failed)
                        for path, value in want.items()}
        elif key not in failed:
            new[key] = want
        elif key == "reply_matches":  # a pattern cannot be re-recorded: the reply can
            if not compile_linear(want).search(result.reply):
                new["reply"] = result.reply
        elif key == "prompt_contains":
            kept = [t for t in want if prompt is not None and t in prompt]
            if kept:
                new[key] = kept
        elif key == "prompt_not_contains":
            kept = [t for t in want if prompt is None or t not in prompt]
            if kept:
                new[key] = kept
        else:
            new[key] = observed[key]
    return new


def _state(path: str, want: Any, row: Mapping[str, Any] | None, failed: bool) -> Any:
    if not failed:
        return want
    got = _lookup(row or {}, path)
    if want in ("present", "absent"):
        return "absent" if want == "present" else "present"
    return "absent" if got is _MISSING else got


# -- the file, edited in place -------------------------------------------------------------


def _flow(value: Any) -> str:
    """``value`` as one line of flow YAML."""
    text: str = yaml.safe_dump([value], default_flow_style=True, allow_unicode=True,
                               width=2**31 - 1, sort_keys=False)
    return text.strip()[1:-1]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _content(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


_KEY = re.compile(r"^\s*(?:-\s+)?([A-Za-z_][\w.]*)\s*:")


def _block(lines: list[str], at: int, indent: int) -> tuple[list[int], int]:
    """The lines of the block under line ``at`` (a key at column ``indent``): those after
    it up to its last line indented deeper; and the indent of its keys."""
    last, i = at, at + 1
    while i < len(lines):
        if _content(lines[i]):
            if _indent(lines[i]) <= indent:
                break
            last = i
        i += 1
    body = list(range(at + 1, last + 1))
    child = min((_indent(lines[j]) for j in body if _content(lines[j])), default=indent + 2)
    return body, child


def _spans(lines: list[str], body: list[int], child: int) -> dict[str, list[int]]:
    """Each key of a block mapping: its content lines (its own and those nested deeper)."""
    spans: dict[str, list[int]] = {}
    current: str | None = None
    for i in body:
        if not _content(lines[i]):
            continue
        match = _KEY.match(lines[i])
        if match and _indent(lines[i]) == child:
            current = match[1]
            spans[current] = [i]
        elif current is not None:
            spans[current].append(i)
    return spans


_COMMENT = re.compile(r"\s+#[^\"']*$")


def _line(pad: str, key: str, value: Any, was: str) -> str:
    """``key: value`` on one line, keeping the trailing comment of the line it replaces
    when it has one outside any quotes."""
    comment = _COMMENT.search(was.rstrip("\n"))
    return f"{pad}{key}: {_flow(value)}{comment[0] if comment else ''}\n"


def _edit(lines: list[str], at: int, indent: int, old: Mapping[str, Any],
          new: Mapping[str, Any], edits: dict[int, list[str]]) -> None:
    """Make the block mapping under line ``at`` say ``new`` (it says ``old``): each key
    that changed rewritten on one line (a block ``state:`` path by path), each key gone
    dropped, each new key added after the block; the other lines untouched."""
    body, child = _block(lines, at, indent)
    spans = _spans(lines, body, child)
    pad = " " * child
    for key, span in spans.items():
        if key not in new:
            edits.update({i: [] for i in span})
        elif new[key] != old.get(key):
            if key == "state" and len(span) > 1 and isinstance(old.get(key), dict):
                _edit(lines, span[0], child, old[key], new[key], edits)
            else:
                edits.update({i: [] for i in span})
                edits[span[0]] = [_line(pad, key, new[key], lines[span[0]])]
    tail = body[-1] if body else at
    for key in (k for k in new if k not in spans):
        if tail not in edits:
            edits[tail] = [lines[tail]]
        edits[tail].append(f"{pad}{key}: {_flow(new[key])}\n")


def _rewrite(text: str, scenario: Scenario, index: int, new: Mapping[str, Any]) -> str:
    """``text`` with turn ``index``'s ``expect`` made ``new`` (:func:`_edit`)."""
    lines = text.splitlines(keepends=True)
    line, col = scenario.located.where(("turns", index, "expect"), key=True)
    at, indent = line - 1, col - 1
    head = lines[at]
    colon = head.index(":", indent) + 1
    edits: dict[int, list[str]] = {}
    if _content(head[colon:]):  # `expect: {...}` on one line: written out as a block
        child = " " * (indent + 2)
        edits[at] = [head[:colon] + "\n", *(f"{child}{k}: {_flow(v)}\n" for k, v in new.items())]
    else:
        _edit(lines, at, indent, _normal(scenario.located.data["turns"][index].get("expect")),
              new, edits)
    out = [x for i, original in enumerate(lines) for x in edits.get(i, [original])]
    return _checked(text, "".join(out), index, new)


def _normal(expect: Any) -> dict[str, Any]:
    """An ``expect`` as the loader reads it (a lone ``prompt_contains`` text: a list)."""
    out = dict(expect or {})
    for key in ("prompt_contains", "prompt_not_contains"):
        if isinstance(out.get(key), str):
            out[key] = [out[key]]
    return out


def _checked(old: str, new: str, index: int, expect: Mapping[str, Any]) -> str:
    """``new`` when it reads back with ``expect`` at turn ``index``; else the whole file
    written anew (comments lost, never a wrong file)."""
    try:
        data = _yaml.load(new).data
        if _normal(data["turns"][index].get("expect")) == dict(expect):
            return new
    except (_yaml.YamlSyntaxError, KeyError, IndexError, TypeError, AttributeError):
        pass
    whole = _yaml.load(old).data
    whole["turns"][index]["expect"] = dict(expect)
    dumped: str = yaml.safe_dump(whole, sort_keys=False, allow_unicode=True, width=100)
    return dumped
