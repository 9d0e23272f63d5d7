"""The customer's language, detected in code, and the language the reply must be in.

A funnel declares its policy under ``language:`` (docs/language.md):

- ``fixed: uk``: always answer in Ukrainian;
- ``follow_customer: [uk, ru, en, pl]`` with ``default: uk``: answer in the
  customer's language when it is one of these, else in the default;
- neither: ``model``, the language the model reports (the old behaviour).

Detection uses `lingua-language-detector` (chosen on measurements, see
docs/language.md and bench/language.py), restricted to the funnel's languages
plus a few common ones so that a message in another language is not forced into
a declared one. A message too short or too ambiguous to tell (``OK``, ``Hi``, a
phone number, transliterated Ukrainian) is *undecided*: the session keeps the
language it had. The reply the model writes is judged the same way, and only
from ``reply_min_length`` characters on, so that "OK" is never a failure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from lingua import IsoCode639_1, Language, LanguageDetector, LanguageDetectorBuilder

from .settings import BASE_LANGUAGES, LanguagePolicy

# Below this confidence (lingua's, 0..1) a message is undecided. Measured on
# tests/data/language_messages.tsv: 0.6 leaves 4% wrong and 6% undecided (docs/language.md).
MIN_CONFIDENCE = 0.6
# A message in another language than the session's moves it only from this confidence
# on: a bare name ("Anna, 066 123 45 67" reads as Polish at 0.71) must not switch it.
SWITCH_CONFIDENCE = 0.8
MIN_LETTERS = 4  # "OK", "Hi!", "Так" tell nothing reliable
# What says nothing about a language: links, handles, SKUs and numbers, e-mail addresses.
_NOISE = re.compile(r"https?://\S+|\S+@\S+|@\w+|\w*\d\w*")

# Ukrainian and Russian share most of their letters and many words, and short messages
# fool the statistical model ("Що порадите?" reads as Russian at 1.0). Letters and
# words only one of them has settle it when the detector is between the two.
_UK_LETTERS = frozenset("іїєґІЇЄҐ")
_RU_LETTERS = frozenset("ыэъёЫЭЪЁ")
_UK_WORDS = frozenset("що це чи як мені мене тебе його вона вони ми ви або дякую будь "
                      "ласка привіт добрий скільки коштує котик собачка".split())
_RU_WORDS = frozenset("что это как мне меня тебя его она они мы вы или спасибо пожалуйста "
                      "привет добрый сколько стоит нет есть очень".split())
_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?")

NAMES = {
    "uk": "Ukrainian", "ru": "Russian", "en": "English", "pl": "Polish", "de": "German",
    "fr": "French", "es": "Spanish", "it": "Italian", "pt": "Portuguese", "ro": "Romanian",
    "cs": "Czech", "sk": "Slovak", "be": "Belarusian", "kk": "Kazakh", "tr": "Turkish",
}


def supported(code: str) -> bool:
    """Whether ``code`` (ISO 639-1, lower case) is a language the detector knows."""
    return code.isalpha() and code.isascii() and hasattr(IsoCode639_1, code.upper())


def name_of(code: str) -> str:
    """``"uk"`` -> ``"Ukrainian"``; unknown codes come back as they are."""
    return NAMES.get(code, code)


@dataclass(frozen=True)
class Detection:
    """What the detector made of a text: ``language`` is ``None`` when undecided."""

    language: str | None
    confidence: float


# One detector per set of languages (sorted ISO codes), built on first use; those
# whose models were all loaded at once (warm).
_DETECTORS: dict[tuple[str, ...], LanguageDetector] = {}
_PRELOADED: set[tuple[str, ...]] = set()


def _detector(languages: tuple[str, ...], preload: bool = False) -> LanguageDetector:
    found = _DETECTORS.get(languages)
    if found is None or preload:
        codes = [getattr(IsoCode639_1, c.upper()) for c in languages if supported(c)]
        builder = LanguageDetectorBuilder.from_languages(
            *(Language.from_iso_code_639_1(c) for c in codes))
        found = (builder.with_preloaded_language_models() if preload else builder).build()
        if len(_DETECTORS) >= 16:
            _DETECTORS.clear()
            _PRELOADED.clear()
        _DETECTORS[languages] = found
    return found


def warm(languages: Iterable[str]) -> None:
    """Load every model the detector of ``languages`` needs, now. Lingua loads them
    piecemeal on the detections that need them, up to 0.8 s of CPU on one customer's
    turn after a start; ``Engine.open`` calls this instead, in a thread."""
    key = tuple(sorted(set(languages)))
    if key not in _PRELOADED:
        _detector(key, preload=True)
        _PRELOADED.add(key)


def detect(text: str, languages: Iterable[str] = BASE_LANGUAGES) -> Detection:
    """Detect the language of a short text among ``languages`` (ISO 639-1 codes).

    Returns ``Detection(None, ...)`` when the text has fewer than four letters once
    links, numbers and SKUs are removed, or the best guess is below ``MIN_CONFIDENCE``.
    """
    cleaned = _NOISE.sub(" ", text[:2000])
    if not _enough_letters(cleaned):
        return Detection(None, 0.0)
    values = _detector(tuple(sorted(set(languages))))\
        .compute_language_confidence_values(cleaned)
    if not values:
        return Detection(None, 0.0)
    top = values[0]
    code = top.language.iso_code_639_1.name.lower()
    if code in ("uk", "ru"):
        marked = _uk_or_ru(cleaned)
        if marked is not None and marked in languages:
            return Detection(marked, max(float(top.value), SWITCH_CONFIDENCE))
    return Detection(code if top.value >= MIN_CONFIDENCE else None, float(top.value))


def _enough_letters(text: str) -> bool:
    """At least MIN_LETTERS letters (counted only that far: this runs twice a turn)."""
    letters = 0
    for ch in text:
        if ch.isalpha():
            letters += 1
            if letters >= MIN_LETTERS:
                return True
    return False


def _uk_or_ru(text: str) -> str | None:
    """"uk" or "ru" when the text has letters or words of only one of them, else None."""
    words = {w.lower() for w in _WORD.findall(text)}
    uk = any(ch in _UK_LETTERS for ch in text) or bool(words & _UK_WORDS)
    ru = any(ch in _RU_LETTERS for ch in text) or bool(words & _RU_WORDS)
    if uk != ru:
        return "uk" if uk else "ru"
    return None


@dataclass(frozen=True)
class Decision:
    """A turn's language decision, before the model answers."""

    detected: str | None  # the customer's message, None when undecided
    response: str | None  # the language the prompt asks for
    accept: frozenset[str]  # the languages a reply may be in (empty: any)


def decide(policy: LanguagePolicy, text: str, current: str | None) -> Decision:
    """Decide the reply's language from the customer's message and the session's language.

    ``current`` is the session's response language so far. With ``follow_customer``
    an undecided message keeps it, and the reply may be in any declared language.
    """
    if policy.mode == "model":
        return Decision(None, current, frozenset())
    detection = detect(text, policy.candidates)
    found = detection.language
    if found is not None and current is not None and found != current \
            and detection.confidence < SWITCH_CONFIDENCE:
        found = None
    if policy.mode == "fixed":
        return Decision(found, policy.default, frozenset(policy.languages))
    if found is not None:
        response = found if found in policy.languages else policy.default
        return Decision(found, response, frozenset({response} if response else ()))
    keep = current if current in policy.languages else policy.default
    return Decision(None, keep, frozenset(policy.languages))


def reply_problem(policy: LanguagePolicy, decision: Decision, reply: str) -> str | None:
    """Why a reply is in the wrong language, or ``None`` (short or undecided replies pass)."""
    if not decision.accept or len(reply.strip()) < policy.reply_min_length:
        return None
    found = detect(reply, policy.candidates).language
    if found is None or found in decision.accept:
        return None
    wanted = " or ".join(f"{name_of(c)} ({c})" for c in sorted(decision.accept))
    return (f"at $.reply: the reply is in {name_of(found)} ({found}) but must be in {wanted}; "
            f"write the same reply in {wanted}")


def record(policy: LanguagePolicy, decision: Decision, state: MutableMapping[str, Any],
           detected_field: str | None, response_field: str | None,
           reply: str | None, model_language: Any) -> None:
    """Write the turn's languages into the state, after the model answered.

    ``model`` policy: both fields take the language the model reports (as before).
    Otherwise the detected field takes the customer's language when decided, and
    the response field the decided language, or for an undecided message the
    language the accepted reply turned out to be in.
    """
    if policy.mode == "model":
        if isinstance(model_language, str):
            for name in (detected_field, response_field):
                if name:
                    state[name] = model_language
        return
    if detected_field and decision.detected:
        state[detected_field] = decision.detected
    response = decision.response
    if decision.detected is None and policy.mode == "follow_customer" and reply \
            and len(reply.strip()) >= policy.reply_min_length:
        found = detect(reply, policy.candidates).language
        if found in policy.languages:
            response = found
    if response_field and response:
        state[response_field] = response
