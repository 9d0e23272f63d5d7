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

Detection runs twice a turn, so it is made cheaper where the answer cannot change
(docs/language.md, "Cost"): only the first ``MAX_LETTERS`` letters of a long text
are read; the engine's own decisions (`decide`, `reply_problem`, `record`) take a
Cyrillic text's Ukrainian or Russian marker, and a short Latin-script text's
confident answer of lingua's low-accuracy mode, without running the full
detector; `detect` always runs it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from lingua import IsoCode639_1, Language, LanguageDetector, LanguageDetectorBuilder

from ..format.settings import BASE_LANGUAGES, LanguagePolicy
from ..format.texts import NAMES as NAMES  # the languages' names, beside the texts
from ..format.texts import name_of as name_of

# Below this confidence (lingua's, 0..1) a message is undecided. Measured on
# tests/data/language_messages.tsv: 0.6 leaves 4% wrong and 6% undecided (docs/language.md).
MIN_CONFIDENCE = 0.6
# A message in another language than the session's moves it only from this confidence
# on: a bare name ("Anna, 066 123 45 67" reads as Polish at 0.71) must not switch it.
SWITCH_CONFIDENCE = 0.8
MIN_LETTERS = 4  # "OK", "Hi!", "Так" tell nothing reliable
# What says nothing about a language: links, handles, SKUs and numbers, e-mail addresses.
# The look-behinds only spare the regex engine a retry at every letter (it was the costly
# part of a long text): such a match would have started at the token's or word's start,
# so the text comes out the same (checked on 400,000 random strings, issue 19).
_NOISE = re.compile(r"https?://\S+|(?<!\S)\S+@\S+|@\w+|(?<!\w)\w*\d\w*")
# Every match of _NOISE holds "http", "@" or a digit: a text without them (most replies)
# comes out of the substitution unchanged, and these checks cost a fraction of the
# regex tried at every position (callgrind, bench/turn_instructions.py).
_DIGIT = re.compile(r"\d")
# Lingua's cost grows with the letters (about 1 µs each, on trigrams alone from 120 on)
# and 150 tell the language of a reply as surely as 1000: on the long-text check no
# answer changed from 60 letters on (docs/language.md). Only the first MAX_LETTERS are
# read (still over 120: trigrams alone), and only the first MAX_CHARS characters are
# cleaned (as before).
MAX_LETTERS = 150
MAX_CHARS = 2000
_HEAD_CHARS = 3 * MAX_LETTERS  # cleaned first: in prose, enough for MAX_LETTERS letters
_LETTERS = re.compile(r"[^\W\d_]+")
_SPACE = re.compile(r"\s")
# Lingua reads a text of this many letters on trigrams alone, as its low-accuracy mode
# does: the quick step below would only repeat the work.
_LINGUA_LONG_TEXT = 120
# A short Latin-script text's answer of the low-accuracy detector (trigrams only, half
# the cost) is taken from this confidence on: on the labelled set it then named the
# language the full detector names on every line (95 of 128 Latin-script lines
# accepted), and the closest miss was at 0.94 (docs/language.md). Measured on the base
# languages only: a funnel with others always runs the full detector.
QUICK_CONFIDENCE = 0.99
_QUICK_LANGUAGES = tuple(sorted(BASE_LANGUAGES))
_NOT_LATIN_LETTER = re.compile(r"[^\W\d_A-Za-z\u00C0-\u024F\u1E00-\u1EFF]")
_NOT_CYRILLIC_LETTER = re.compile(r"[^\W\d_\u0400-\u052F]")
_CYRILLIC = frozenset(lang.iso_code_639_1.name.lower()
                      for lang in Language.all_with_cyrillic_script())
# Lingua's language -> ISO code, and a funnel's candidates -> its detectors' key: both
# run on every detection, where each attribute lingua computes is a call into Rust.
_CODES = {lang: lang.iso_code_639_1.name.lower() for lang in Language.all()}
_KEYS: dict[tuple[str, ...], tuple[str, ...]] = {}

# Ukrainian and Russian share most of their letters and many words, and short messages
# fool the statistical model ("Що порадите?" reads as Russian at 1.0). Letters and
# words only one of them has settle it when the detector is between the two.
_UK_LETTER = re.compile("[іїєґІЇЄҐ]")
_RU_LETTER = re.compile("[ыэъёЫЭЪЁ]")
_UK_WORDS = frozenset("що це чи як мені мене тебе його вона вони ми ви або дякую будь "
                      "ласка привіт добрий скільки коштує котик собачка".split())
_RU_WORDS = frozenset("что это как мне меня тебя его она они мы вы или спасибо пожалуйста "
                      "привет добрый сколько стоит нет есть очень".split())
_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?")


def supported(code: str) -> bool:
    """Whether ``code`` (ISO 639-1, lower case) is a language the detector knows."""
    return code.isalpha() and code.isascii() and hasattr(IsoCode639_1, code.upper())


@dataclass(frozen=True)
class Detection:
    """What the detector made of a text: ``language`` is ``None`` when undecided."""

    language: str | None
    confidence: float


# One detector per set of languages (sorted ISO codes) and accuracy mode (True: low),
# built on first use; the sets whose models were all loaded at once (warm). Lingua
# keeps the models once per process, whatever the number of detectors.
_DETECTORS: dict[tuple[tuple[str, ...], bool], LanguageDetector] = {}
_PRELOADED: set[tuple[str, ...]] = set()
# Lingua loads preloaded models on a pool of threads; a forked process (`funnel serve
# --workers N` warms the models in the master, so that the workers share their pages)
# has none of them, and a preload there waits for them forever (measured: a worker hung
# on a reload that added languages). A forked process loads models on first use instead,
# on its own thread, as lingua does without a preload.
_FORKED = False


def _forked() -> None:
    global _FORKED
    _FORKED = True


os.register_at_fork(after_in_child=_forked)


def _detector(languages: tuple[str, ...], preload: bool = False,
              low_accuracy: bool = False) -> LanguageDetector:
    found = _DETECTORS.get((languages, low_accuracy))
    if found is None or preload:
        codes = [getattr(IsoCode639_1, c.upper()) for c in languages if supported(c)]
        builder = LanguageDetectorBuilder.from_languages(
            *(Language.from_iso_code_639_1(c) for c in codes))
        if low_accuracy:
            builder = builder.with_low_accuracy_mode()
        found = (builder.with_preloaded_language_models() if preload else builder).build()
        if len(_DETECTORS) >= 16:
            _DETECTORS.clear()
            _PRELOADED.clear()
        _DETECTORS[languages, low_accuracy] = found
    return found


def _key(languages: tuple[str, ...]) -> tuple[str, ...]:
    key = _KEYS.get(languages)
    if key is None:
        if len(_KEYS) >= 64:
            _KEYS.clear()
        key = _KEYS[languages] = tuple(sorted(set(languages)))
    return key


def warm(languages: Iterable[str]) -> None:
    """Load every model the detectors of ``languages`` need, now. Lingua loads them
    piecemeal on the detections that need them, up to 0.8 s of CPU on one customer's
    turn after a start; ``Engine.open`` calls this instead, in a thread. Builds the
    low-accuracy detector of the quick step too, when it serves these languages. In a
    process forked from one that ran this, models not loaded yet load on first use."""
    key = tuple(sorted(set(languages)))
    if key not in _PRELOADED:
        _detector(key, preload=not _FORKED)
        if key == _QUICK_LANGUAGES:
            _detector(key, preload=not _FORKED, low_accuracy=True)
        _PRELOADED.add(key)


def detect(text: str, languages: Iterable[str] = BASE_LANGUAGES) -> Detection:
    """Detect the language of a text among ``languages`` (ISO 639-1 codes).

    Returns ``Detection(None, ...)`` when the text has fewer than four letters once
    links, numbers and SKUs are removed, or the best guess is below ``MIN_CONFIDENCE``.
    Of a long text, the first ``MAX_LETTERS`` letters are read.
    """
    cleaned = _analysed(text)
    if not _enough_letters(cleaned):
        return Detection(None, 0.0)
    return _full(cleaned, tuple(languages))


def _full(cleaned: str, languages: tuple[str, ...]) -> Detection:
    """The full (high-accuracy) detector and the rules on an analysed text."""
    values = _detector(_key(languages)).compute_language_confidence_values(cleaned)
    if not values:
        return Detection(None, 0.0)
    top = values[0]
    code = _CODES[top.language]
    if code in ("uk", "ru"):
        marked = _uk_or_ru(cleaned)
        if marked is not None and marked in languages:
            return Detection(marked, max(float(top.value), SWITCH_CONFIDENCE))
    return Detection(code if top.value >= MIN_CONFIDENCE else None, float(top.value))


def _denoised(text: str) -> str:
    """``_NOISE.sub(" ", text)``, without running it on a text it cannot change."""
    if "@" in text or "http" in text or _DIGIT.search(text) is not None:
        return _NOISE.sub(" ", text)
    return text


def _analysed(text: str) -> str:
    """What detection reads of ``text``: its first MAX_CHARS characters without noise,
    cut after the word of the MAX_LETTERS-th letter."""
    head = text[:MAX_CHARS]
    if len(head) <= MAX_LETTERS:  # cannot hold more letters
        return _denoised(head)
    if len(head) > _HEAD_CHARS:
        # Cleaning is the costly part of a long text (a regex tried at every position):
        # try the first words alone. Noise never spans a space: they are cleaned alike.
        space = _SPACE.search(head, _HEAD_CHARS)
        if space is not None:
            cut = _cut(_denoised(head[:space.start()]))
            if cut is not None:
                return cut
    cleaned = _denoised(head)
    return _cut(cleaned) or cleaned


def _cut(cleaned: str) -> str | None:
    """``cleaned`` up to the end of the word of its MAX_LETTERS-th letter, if it has one."""
    letters = 0
    for word in _LETTERS.finditer(cleaned):
        letters += word.end() - word.start()
        if letters >= MAX_LETTERS:
            return cleaned[:word.end()]
    return None


def _long_for_lingua(cleaned: str) -> bool:
    return len(cleaned) >= _LINGUA_LONG_TEXT \
        and sum(map(len, _LETTERS.findall(cleaned))) >= _LINGUA_LONG_TEXT


def _quick(cleaned: str, languages: tuple[str, ...]) -> Detection | None:
    """The full detector's language, found for less, or None when that cannot be done.

    The confidence is a lower bound of the full detector's: ``SWITCH_CONFIDENCE`` for
    a marker (the full detector's answer is then ``max(top, SWITCH_CONFIDENCE)``),
    ``MIN_CONFIDENCE`` for the low-accuracy detector (the full one named the language).
    """
    if not _NOT_CYRILLIC_LETTER.search(cleaned):
        # Only Cyrillic letters: among uk and ru (no other Cyrillic candidate) the full
        # detector's best guess is one of the two, and a marker then decides.
        if {c for c in languages if c in _CYRILLIC} <= {"uk", "ru"}:
            marked = _uk_or_ru(cleaned)
            if marked is not None and marked in languages:
                return Detection(marked, SWITCH_CONFIDENCE)
        return None
    key = _key(languages)
    if key != _QUICK_LANGUAGES or _long_for_lingua(cleaned) \
            or _NOT_LATIN_LETTER.search(cleaned):
        return None
    values = _detector(key, low_accuracy=True).compute_language_confidence_values(cleaned)
    if not values or values[0].value < QUICK_CONFIDENCE:
        return None
    code = _CODES[values[0].language]
    return None if code in ("uk", "ru") else Detection(code, MIN_CONFIDENCE)


def _language(text: str, languages: tuple[str, ...]) -> str | None:
    """``detect(text, languages).language``, by the quick step when it can tell."""
    cleaned = _analysed(text)
    if not _enough_letters(cleaned):
        return None
    quick = _quick(cleaned, languages)
    return (quick or _full(cleaned, languages)).language


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
    words = set(map(str.lower, _WORD.findall(text)))
    uk = _UK_LETTER.search(text) is not None or not words.isdisjoint(_UK_WORDS)
    ru = _RU_LETTER.search(text) is not None or not words.isdisjoint(_RU_WORDS)
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
    found = _customer_language(text, policy.candidates, current)
    if policy.mode == "fixed":
        return Decision(found, policy.default, frozenset(policy.languages))
    if found is not None:
        response = found if found in policy.languages else policy.default
        return Decision(found, response, frozenset({response} if response else ()))
    keep = current if current in policy.languages else policy.default
    return Decision(None, keep, frozenset(policy.languages))


def _customer_language(text: str, languages: tuple[str, ...], current: str | None
                       ) -> str | None:
    """The message's language; one other than ``current`` needs ``SWITCH_CONFIDENCE``."""
    cleaned = _analysed(text)
    if not _enough_letters(cleaned):
        return None
    detection = _quick(cleaned, languages)
    if detection is None or (current is not None and detection.language != current
                             and detection.confidence < SWITCH_CONFIDENCE):
        # The full detector's confidence decides whether the session switches.
        detection = _full(cleaned, languages)
    found = detection.language
    if found is not None and current is not None and found != current \
            and detection.confidence < SWITCH_CONFIDENCE:
        return None
    return found


def reply_problem(policy: LanguagePolicy, decision: Decision, reply: str) -> str | None:
    """Why a reply is in the wrong language, or ``None`` (short or undecided replies pass)."""
    if not decision.accept or len(reply.strip()) < policy.reply_min_length:
        return None
    found = _language(reply, policy.candidates)
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
        found = _language(reply, policy.candidates)
        if found in policy.languages:
            response = found
    if response_field and response:
        state[response_field] = response
