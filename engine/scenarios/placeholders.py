"""A recorded scenario without the customer's personal data: placeholders in its place.

A scenario file lives in the funnel's folder, out of retention's reach (`funnel purge`
never sees it): the studio's "Save as scenario" writes it through :func:`without_personal`.
What is personal is what the funnel declares (engine.format.personal: ``retention:
personal``, ``personal: true``): every value the session's model outputs wrote into a
personal part of a field, and every value the session's state holds there now.

- The customer's own facts (a personal part that is also ``grounded``: a name, a phone,
  an address) are replaced word by word, and each phone number by its digits, wherever
  they occur in the scenario: the customer's messages, the replies, the updates, the
  actions' arguments.
- Free text (a personal part that is not grounded: an objection's ``detail``, which the
  model writes and which may quote the customer) is replaced where it occurs whole, by
  ``RedactedTextN``: its words one by one are common words ("expensive", "call"), which
  the funnel's own checks (``confirm:`` phrases) read in the customer's messages.

The replacement keeps the scenario replayable (`funnel test` passes it as it passed the
recording), because it is the same on both sides of grounding (engine.funnel.grounding):

- a word becomes ``RedactedN``, the same N for every form of it the engine's own word
  comparison takes as one word (case, NFKC, the case endings of uk, ru, en, pl: the
  customer's "Мурку" and the model's "Мурка" both become ``Redacted1``), so a value the
  customer's words held is still held, word for word;
- a phone number keeps its length, its separators and its first digits; its last seven
  digits become ``555`` and a four-digit number, wherever the number is written (the
  customer's "066 123 45 67" and the model's "+380661234567" end alike, and grounding
  compares a phone's last nine digits).

Words of the customer's that no personal field holds are kept: declare the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..format.personal import remove_path, value_at
from ..format.spec import FunnelSpec
from ..format.words import cut, is_stop, languages, stems

__all__ = ["Placeholders", "personal_values", "without_personal"]

# A phone number as people write it: digits, with spaces, dots, dashes, parentheses.
_PHONE = re.compile(r"\+?\d[\d\s().\-]{5,}\d")
_PHONE_DIGITS = 7  # a number this long at least is a phone number, not an age or a count
_NATIONAL = 9  # grounding compares these last digits (the country code may differ)
_TAIL = 7  # the digits replaced: the subscriber's number, not the operator's code
_SHORTEST_STEM = 3  # shorter stems would join unrelated words
_SHORTEST_FREE = 4  # free text shorter than this is no quote of anybody ("ok", "no")


def _digits(text: str) -> str:
    return "".join(ch for ch in text if ch.isdigit())


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def personal_values(spec: FunnelSpec, containers: Iterable[Any]
                    ) -> tuple[list[str], list[str]]:
    """The texts at the personal parts of the fields of each of ``containers`` (a
    model output's ``updates``, a state row), however deep: (the grounded ones, the
    customer's facts; the others, free text)."""
    facts: list[str] = []
    free: list[str] = []
    for container in containers:
        if not isinstance(container, Mapping):
            continue
        for f in spec.state.values():
            if f.name not in container or not f.personal_paths:
                continue
            value = container[f.name]
            for path in f.personal_paths:
                inside = [g[len(path):] for g in f.grounded_paths if g[:len(path)] == path]
                if any(path[:len(g)] == g for g in f.grounded_paths):
                    inside = [()]  # the personal part is within a grounded one: all facts
                for part in value_at(value, path):
                    for sub in inside:
                        facts.extend(s for v in value_at(part, sub) for s in _strings(v))
                        part = remove_path(part, sub)
                    free.extend(_strings(part))
    return [s for s in facts if s.strip()], [s for s in free if len(s.strip()) >= _SHORTEST_FREE]


class Placeholders:
    """The replacements of some personal texts: their words and their phone numbers."""

    def __init__(self, facts: Iterable[str], free: Iterable[str] = ()) -> None:
        self.rules = languages()
        self.phones: dict[str, str] = {}  # the last digits of a number -> its new tail
        self.words: dict[str, str] = {}  # a folded word -> its placeholder
        self.by_stem: dict[str, str] = {}  # a stem of one -> the same placeholder
        # Free text, longest first (a quote inside a longer one is replaced within it).
        self.texts = {t: f"RedactedText{i}" for i, t in enumerate(
            sorted(set(free), key=lambda t: (-len(t), t)), 1)}
        self.replaced = 0
        for value in facts:
            digits = _digits(value)
            if len(digits) >= _PHONE_DIGITS and _PHONE.fullmatch(value.strip()):
                self.phones.setdefault(digits[-_NATIONAL:],
                                       f"555{len(self.phones) + 1:04d}"[-_TAIL:])
                continue
            for word in cut(value)[1]:
                folded = word.folded
                if word.mixed or folded.isdigit() or is_stop(folded) or folded in self.words:
                    continue
                placeholder = self.words[folded] = f"Redacted{len(self.words) + 1}"
                for stem in self._stems(folded):
                    self.by_stem.setdefault(stem, placeholder)

    def _stems(self, folded: str) -> Iterable[str]:
        return (s for s in stems(folded, self.rules) if len(s) >= _SHORTEST_STEM)

    def __bool__(self) -> bool:
        return bool(self.phones or self.words or self.texts)

    def _word(self, folded: str) -> str | None:
        if folded.isdigit():
            return None
        found = self.words.get(folded)
        if found is not None:
            return found
        for stem in self._stems(folded):
            if stem in self.by_stem:
                return self.by_stem[stem]
        return None

    def _phone(self, match: re.Match[str]) -> str:
        text = match.group()
        digits = _digits(text)
        tail = None
        for known, new in self.phones.items():
            if len(digits) >= _PHONE_DIGITS and (digits.endswith(known) or known.endswith(digits)):
                tail = new
                break
        if tail is None:
            return text
        self.replaced += 1
        out, left = list(text), list(tail)
        for i in range(len(out) - 1, -1, -1):
            if not left:
                break
            if out[i].isdigit():
                out[i] = left.pop()
        return "".join(out)

    def text(self, text: str) -> str:
        """``text`` with the personal texts, words and numbers replaced (NFKC when any
        word is)."""
        for whole, name in self.texts.items():
            if whole in text:
                self.replaced += text.count(whole)
                text = text.replace(whole, name)
        if self.phones:
            text = _PHONE.sub(self._phone, text)
        if not self.words:
            return text
        normal, words = cut(text)
        parts: list[str] = []
        last = 0
        for word in words:
            placeholder = None if word.mixed else self._word(word.folded)
            if placeholder is not None:
                parts += [normal[last:word.start], placeholder]
                last = word.end
                self.replaced += 1
        return "".join([*parts, normal[last:]]) if parts else text

    def value(self, value: Any) -> Any:
        """``value`` (JSON) with :meth:`text` applied to each string in it."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return value


def _updates(value: Any) -> Iterator[Any]:
    """Every ``updates`` mapping in a scenario turn's ``llm`` (an envelope, an output and
    its repair)."""
    if isinstance(value, Mapping):
        if isinstance(value.get("updates"), Mapping):
            yield value["updates"]
        for item in value.values():
            yield from _updates(item)
    elif isinstance(value, list):
        for item in value:
            yield from _updates(item)


def without_personal(spec: FunnelSpec, scenario: Mapping[str, Any],
                     states: Iterable[Mapping[str, Any]] = ()) -> tuple[dict[str, Any], int]:
    """``scenario`` (engine.scenarios.record) with the personal data its model outputs and
    ``states`` (the session's state rows) hold replaced by placeholders; and how many
    words and numbers were replaced."""
    turns = list(scenario.get("turns") or [])
    facts, free = personal_values(spec, [*(u for t in turns for u in _updates(t.get("llm"))),
                                         *states])
    out = dict(scenario)
    place = Placeholders(facts, free)
    if not place:
        return out, 0
    out["turns"] = [{**turn, "customer": place.text(str(turn.get("customer", ""))),
                     "llm": place.value(turn.get("llm"))} for turn in turns]
    return out, place.replaced
