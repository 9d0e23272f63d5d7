"""Follow-ups on stalled stages (``follow_up:`` of a stage, or of the funnel as default).

A follow-up is a message the bot sends a customer who went quiet: step by step, each
``after`` a delay since the customer's last message, at most ``max`` times per session
in the stage, never inside the quiet hours (it waits for their end), and only while
its ``when`` holds over the state. docs/follow-ups.md.

This module holds the declaration (built from a schema-valid funnel file) and the
pure time arithmetic the scheduler and `funnel validate` share; it imports nothing
but the format's own modules.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from .settings import parse_duration
from .texts import Localized

__all__ = ["OPT_OUT_WORDS", "FollowUpSpec", "FollowUpStep", "QuietHours", "build_follow_up",
           "declarations", "is_opt_out", "normalize"]

# The longest silence a step may wait for; past it a follow-up reaches no one who
# still remembers the conversation (and is usually a typo: 24d for 24h).
MAX_AFTER_SECONDS = 90 * 86400
# The shortest: a customer who paused to read is not a customer who went quiet.
MIN_AFTER_SECONDS = 60
# `max` per step and session in the stage.
MAX_SENDS = 10
HHMM = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])$")

# What a customer writes to be left alone, by language (a whole message, case, accents
# and punctuation aside); a funnel adds its own phrases with `follow_up.opt_out`.
OPT_OUT_WORDS: Mapping[str, tuple[str, ...]] = {
    "en": ("stop", "unsubscribe", "stop messaging me", "do not write to me",
           "dont write to me", "leave me alone", "no more messages"),
    "uk": ("стоп", "відписатися", "відписатись", "не пишіть", "не пишіть мені",
           "більше не пишіть", "відпишіть мене"),
    "ru": ("стоп", "отписаться", "не пишите", "не пишите мне", "больше не пишите",
           "отпишите меня"),
    "pl": ("stop", "wypisz", "wypisz mnie", "nie piszcie", "nie pisz do mnie",
           "nie piszcie do mnie", "koniec"),
}


def normalize(text: str) -> str:
    """Casefolded, without accents, punctuation or repeated spaces: ``"Stop!"`` ->
    ``"stop"``; the apostrophe of ``"don't"`` goes too."""
    folded = unicodedata.normalize("NFKD", text.casefold())
    kept = "".join(c if c.isalnum() or c.isspace() else (" " if c in "-_/" else "")
                   for c in folded if not unicodedata.combining(c))
    return " ".join(kept.split())


def is_opt_out(text: str, phrases: Iterable[str] = ()) -> bool:
    """Whether a customer message asks for no more follow-ups: the whole message is a
    stop phrase of any language (:data:`OPT_OUT_WORDS`) or one the funnel declares."""
    said = normalize(text)
    if not said:
        return False
    known = {normalize(p) for words in OPT_OUT_WORDS.values() for p in words}
    known.update(normalize(p) for p in phrases)
    return said in known


@dataclass(frozen=True)
class QuietHours:
    """No follow-up is sent from ``start`` to ``end`` (local time in ``zone``); a window
    past midnight (21:00 to 09:00) is the usual one."""

    start: time
    end: time
    zone: str

    def contains(self, at: datetime) -> bool:
        local = at.astimezone(ZoneInfo(self.zone)).time()
        if self.start <= self.end:
            return self.start <= local < self.end
        return local >= self.start or local < self.end

    def release(self, at: datetime) -> datetime:
        """``at`` itself outside the quiet hours, else the moment they end (aware, in UTC
        terms equal); a DST change on the way is read by zoneinfo."""
        if not self.contains(at):
            return at
        tz = ZoneInfo(self.zone)
        local = at.astimezone(tz)
        end = datetime.combine(local.date(), self.end, tzinfo=tz)
        if end <= local:
            end = datetime.combine(local.date() + timedelta(days=1), self.end, tzinfo=tz)
        return end


@dataclass(frozen=True)
class FollowUpStep:
    """One follow-up: ``text`` (a sandboxed Jinja template per language, over the
    state) ``after`` seconds of the customer's silence, while ``when`` holds, at most
    ``max`` times per session in the stage. With ``prompt`` (a template over the state
    too: what to write), the model writes it under the stage's contract, and ``text``,
    when also given, is sent when the model's follow-up fails or claims too much."""

    after: float
    text: Localized | None
    when: str | None = None
    max: int = 1
    line: int = 0
    prompt: str | None = None


@dataclass(frozen=True)
class FollowUpSpec:
    """A stage's follow-ups (or the funnel's default for stages that declare none)."""

    steps: tuple[FollowUpStep, ...]
    quiet_hours: QuietHours | None = None
    opt_out: tuple[str, ...] = ()
    line: int = 0
    webhook: str | None = None  # for sessions no channel of the engine reaches

    def next_step(self, sent: Mapping[str, int], stage: str, after: int = -1
                  ) -> int | None:
        """The first step past ``after`` still under its ``max`` for the session in
        ``stage`` (``sent``: how many of each ``stage:step`` went out), or None."""
        for i in range(after + 1, len(self.steps)):
            if int(sent.get(f"{stage}:{i}", 0)) < self.steps[i].max:
                return i
        return None


def declarations(data: Mapping[str, Any]
                 ) -> list[tuple[tuple[str | int, ...], str | None, dict[str, Any]]]:
    """Where a (raw, maybe invalid) funnel file declares follow-ups: (key path, the stage
    or None for the funnel's default, the ``follow_up`` mapping), for `funnel validate`'s
    checkers (conditions, customer texts, engine.validation.follow_ups)."""
    found: list[tuple[tuple[str | int, ...], str | None, dict[str, Any]]] = []
    if isinstance(data.get("follow_up"), dict):
        found.append((("follow_up",), None, data["follow_up"]))
    stages = data.get("stages")
    for name, raw in (stages.items() if isinstance(stages, dict) else ()):
        follow = raw.get("follow_up") if isinstance(raw, dict) else None
        if isinstance(follow, dict):
            found.append((("stages", name, "follow_up"), str(name), follow))
    return found


def _clock(raw: Any) -> time:
    m = HHMM.match(str(raw))
    if not m:
        raise ValueError(f"not a time of day: {raw!r} (expected HH:MM, e.g. '21:00')")
    return time(int(m.group(1)), int(m.group(2)))


def build_follow_up(raw: Any, line: int = 0,
                    step_line: Any = None) -> FollowUpSpec | None:
    """The declaration of a (validated) ``follow_up:`` mapping, or None without one.
    ``step_line(i)`` gives step ``i``'s line in the funnel file."""
    if not raw:
        return None
    quiet = raw.get("quiet_hours")
    hours = QuietHours(_clock(quiet["from"]), _clock(quiet["to"]),
                       str(quiet.get("timezone", "UTC"))) if quiet else None
    steps = tuple(FollowUpStep(
        after=parse_duration(str(s["after"])),
        text=Localized.of(s["text"]) if s.get("text") is not None else None,
        prompt=str(s["prompt"]) if s.get("prompt") else None,
        when=None if s.get("when") is None else str(s["when"]), max=int(s.get("max", 1)),
        line=step_line(i) if step_line else line)
        for i, s in enumerate(raw.get("steps") or ()))
    return FollowUpSpec(steps=steps, quiet_hours=hours,
                        opt_out=tuple(str(p) for p in raw.get("opt_out") or ()), line=line,
                        webhook=str(raw["webhook"]) if raw.get("webhook") else None)
