"""F951-F957: follow-ups (``follow_up:`` of a stage or of the funnel, docs/follow-ups.md).

- F951 a step's ``after`` that is no duration, shorter than a minute or longer than 90
  days, or not longer than the step before it (steps count from the same silence);
- F952 quiet hours that are no HH:MM times, or start and end at the same minute;
- F953 a ``timezone`` zoneinfo does not know;
- F954 a text that does not parse as a template, or names a field the state does not
  declare (the template runs with ``StrictUndefined``: it would fail when due);
- F955 a ``max`` below 1 or above 10;
- F956 a follow-up on a final stage or on the hand-off's stage: no one is waited for
  there (a funnel-wide default skips them by itself);
- F957 a step with neither ``text`` nor ``prompt`` (a step says what is sent: ``text``,
  or ``prompt`` for the model to write it, or both, ``text`` then being the fallback);
  a ``prompt`` is a template over the state, checked as a text is (F954).

A step's ``when`` is a condition like any other (F401, F402, F205: engine.validation.
semantics reads it); its text a customer text like any other (F704, F705:
engine.validation.texts).
"""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from jinja2 import TemplateSyntaxError

from ..format.follow_up import HHMM, MAX_AFTER_SECONDS, MAX_SENDS, MIN_AFTER_SECONDS
from ..format.follow_up import declarations as follow_up_declarations
from ..format.names import CONDITION_NAMES
from ..format.settings import parse_duration
from ..sandbox.expressions import make_environment
from .diagnostics import Report, as_dict, as_list
from .semantics import check_paths

Keys = tuple[str | int, ...]
_ENV = make_environment()


def check_follow_ups(data: dict[str, Any], state: dict[str, Any], report: Report) -> None:
    """Every ``follow_up:`` of the funnel: durations, quiet hours, zones, texts, bounds."""
    handoff = as_dict(data.get("handoff")).get("stage")
    known = set(state) | set(CONDITION_NAMES) | {"stage_history", "session_id"}
    for keys, stage, raw in follow_up_declarations(data):
        if stage is not None:
            spec = as_dict(as_dict(data.get("stages")).get(stage))
            if spec.get("final") is True or stage == handoff:
                why = "a final stage" if spec.get("final") is True else "the hand-off's stage"
                report.at(keys, "error", "F956", f"stage '{stage}' is {why}: no customer is "
                          "waited for there, so a follow-up would never be sent; move it to "
                          "the stage before, or remove it", key=True)
        _check_quiet(keys, as_dict(raw.get("quiet_hours")), report)
        before = 0.0
        for i, step in enumerate(as_list(raw.get("steps"))):
            step = as_dict(step)
            where = (*keys, "steps", i)
            before = _check_after(where, step.get("after"), before, report)
            count = step.get("max", 1)
            if isinstance(count, int) and not 1 <= count <= MAX_SENDS:
                report.at((*where, "max"), "error", "F955", f"`max: {count}`: a step is sent "
                          f"1 to {MAX_SENDS} times per session in the stage; more is spam")
            prompt = step.get("prompt")
            if step.get("text") is None and prompt is None:
                report.at(where, "error", "F957", "the step says nothing to send: give it a "
                          "`text` (sent as written), a `prompt` (the model writes the "
                          "follow-up), or both (`text` is sent when the model's fails)",
                          key=True)
            if isinstance(prompt, str):
                _check_text((*where, "prompt"), prompt, state, known, report, "prompt")
            text = step.get("text")
            texts = text.items() if isinstance(text, dict) else [("", text)]
            for lang, body in texts:
                if isinstance(body, str):
                    _check_text((*where, "text", *((lang,) if lang else ())), body, state,
                                known, report)


def _check_after(keys: Keys, raw: Any, before: float, report: Report) -> float:
    if raw is None:
        return before
    text = str(raw).strip()
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        hint = ("; a follow-up waits for a silence, so its delay is positive"
                if text.startswith("-") else "")
        report.at((*keys, "after"), "error", "F951", f"`after: {text}`: {exc}{hint}")
        return before
    if seconds < MIN_AFTER_SECONDS or seconds > MAX_AFTER_SECONDS:
        report.at((*keys, "after"), "error", "F951", f"`after: {text}` is outside 1m to 90d: "
                  "a customer who paused for less has not gone quiet, and one silent for "
                  "longer no longer remembers the conversation (24d for 24h?)")
        return before
    if seconds <= before:
        report.at((*keys, "after"), "error", "F951", f"`after: {text}` is not longer than the "
                  "step before it: every step counts from the customer's last message, so "
                  "give the steps increasing delays (24h, then 72h)")
    return max(seconds, before)


def _check_quiet(keys: Keys, quiet: dict[str, Any], report: Report) -> None:
    if not quiet:
        return
    times = []
    for end in ("from", "to"):
        value = quiet.get(end)
        if value is not None and not HHMM.match(str(value)):
            report.at((*keys, "quiet_hours", end), "error", "F952",
                      f"`quiet_hours.{end}: {value}` is not a time of day: write HH:MM, 00:00 "
                      "to 23:59 (quote it in YAML: \"21:00\")")
        times.append(str(value))
    if len(times) == 2 and times[0] == times[1] and HHMM.match(times[0]):
        report.at((*keys, "quiet_hours"), "error", "F952", "`quiet_hours` starts and ends at "
                  f"{times[0]}: give a window (from \"21:00\" to \"09:00\")")
    zone = quiet.get("timezone")
    if zone is not None:
        try:
            ZoneInfo(str(zone))
        except (ZoneInfoNotFoundError, ValueError):
            report.at((*keys, "quiet_hours", "timezone"), "error", "F953",
                      f"`timezone: {zone}` is no IANA time zone zoneinfo knows: write one "
                      "like Europe/Kyiv, Europe/Warsaw or UTC")


def _check_text(keys: Keys, body: str, state: dict[str, Any], known: set[str],
                report: Report, what: str = "text") -> None:
    try:
        tree = _ENV.parse(body)
    except TemplateSyntaxError as exc:
        report.at(keys, "error", "F954", f"the follow-up's {what} does not parse as a "
                  f"template: {exc.message} (line {exc.lineno} of the text)")
        return
    check_paths(tree, state, known, report, keys, f"the follow-up's {what}", "F954")
