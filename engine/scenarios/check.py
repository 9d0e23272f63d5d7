"""Scenario expectations: compare what the engine did on a turn with what the scenario's
``expect`` says (docs/scenarios.md, "Expectations"). Pure functions, no database."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..sandbox.patterns import compile_linear
from ..turn.engine import TurnResult
from ..turn.explain import why_not

_MISSING = object()


def check(expect: Mapping[str, Any], result: TurnResult, row: Mapping[str, Any] | None,
          prompt: str | None, notified: bool) -> list[tuple[str, str]]:
    """Compare one turn's expectations with what the engine did; return (key, message) for
    each that failed, the key naming the expectation's line (``state.<path>`` for a field)."""
    out: list[tuple[str, str]] = []

    def differ(key: str, what: str, want: Any, got: Any) -> None:
        if not _same(want, got):
            out.append((key, f"expected {what} {_show(want)}, got {_show(got)}"))

    if "stage" in expect and not _same(expect["stage"], result.stage_after):
        # Why it did not get there: the exits towards the expected stage, evaluated.
        out.append(("stage", f"expected stage {_show(expect['stage'])}, got "
                    f"{_show(result.stage_after)}: {why_not(result.explain, expect['stage'])}"))
    for path, want in (expect.get("state") or {}).items():
        got = _lookup(row or {}, path)
        missing = got is _MISSING or got is None
        shown = "absent" if got is _MISSING else _show(got)
        if want == "present" or want == "absent":
            if missing != (want == "absent"):
                out.append((f"state.{path}", f"expected state {path} {want}, got {shown}"))
        elif got is _MISSING or not _same(want, got):
            out.append((f"state.{path}", f"expected state {path} {_show(want)}, got {shown}"))
    if "reply" in expect:
        differ("reply", "reply", expect["reply"], result.reply)
    if "reply_matches" in expect and \
            not compile_linear(expect["reply_matches"]).search(result.reply):
        out.append(("reply_matches", f"expected reply matching {_show(expect['reply_matches'])}"
                    f", got {_show(result.reply)}"))
    differences = {
        "actions": [o.type for o in result.actions if o.accepted],
        "refused": [o.type for o in result.actions if not o.accepted],
        "claims": [c["name"] for c in result.reply_claims],
        "fallback": result.fallback, "handoff": result.handoff, "notified": notified,
        "transitions": [f"{t['from']}->{t['to']}" for t in result.transitions],
    }
    for key, got in differences.items():
        if key in expect:
            want = expect[key]
            if key == "transitions":
                want = ["->".join(s.strip() for s in a.split("->")) for a in want]
            differ(key, key, want, got)
    for text in expect.get("prompt_contains") or []:
        if prompt is None or text not in prompt:
            out.append(("prompt_contains", f"expected prompt containing {_show(text)}, got "
                        + ("no prompt" if prompt is None else _closest(prompt, text))))
    for text in expect.get("prompt_not_contains") or []:
        if prompt is not None and text in prompt:
            at = prompt.index(text)
            around = _clip(prompt[max(0, at - 40):at + len(text) + 40], 200)
            out.append(("prompt_not_contains", f"expected prompt without {_show(text)}, got "
                        f"it (in: {_show(around)})"))
    return out


def _lookup(row: Mapping[str, Any], path: str) -> Any:
    value: Any = row
    for part in path.split("."):
        if isinstance(value, Mapping):
            value = value.get(part, _MISSING)
        elif isinstance(value, list) and re.fullmatch(r"-?[0-9]+", part) \
                and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
        if value is _MISSING:
            return value
    return value


def _same(want: Any, got: Any) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return isinstance(want, bool) and isinstance(got, bool) and want == got
    if isinstance(want, int | float) and isinstance(got, int | float):
        return abs(want - got) < 1e-9
    if isinstance(want, str) and isinstance(got, str):
        return want == got or _same_instant(want, got)
    if isinstance(want, dict) and isinstance(got, dict):
        return want.keys() == got.keys() and all(_same(want[k], got[k]) for k in want)
    if isinstance(want, list) and isinstance(got, list):
        return len(want) == len(got) and all(map(_same, want, got))
    return bool(want == got)


def _same_instant(a: str, b: str) -> bool:
    """Two ISO timestamps with offsets that name the same instant (the database answers in
    its own time zone)."""
    try:
        x, y = datetime.fromisoformat(a), datetime.fromisoformat(b)
    except ValueError:
        return False
    return x.tzinfo is not None and y.tzinfo is not None and x == y


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _closest(prompt: str, text: str) -> str:
    """Where the prompt comes closest to the expected text, to show what changed."""
    match = difflib.SequenceMatcher(None, prompt, text, autojunk=False).find_longest_match(
        0, len(prompt), 0, len(text))
    if match.size < 4:
        return "a prompt without it"
    start = max(0, match.a - match.b)
    return f"a prompt without it (closest: {_show(_clip(prompt[start:start + len(text)], 200))})"


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
