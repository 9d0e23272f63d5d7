"""The customer's words: how grounded values and ``confirm:`` phrases are compared.

A grounded value (a name, an address) and a ``confirm:`` phrase are matched against the
customer's messages word by word, never as substrings: "her" is not in "here", and
"Personally" is not "person". Each text is cut into words the same way:

- NFKC (a full-width "ＭＵＲＫＡ" is "MURKA"), then case folded; apostrophe variants
  (’ ‘ ʼ ` ´ ′) are one ``'``, so "Мар’яна" and "Мар'яна" are one word; ``ё`` is
  ``е`` and ``ґ`` is ``г`` (customers write both); stress marks are dropped;
- a word is a run of letters, marks and digits, with an apostrophe inside it; anything
  else (spaces, punctuation, hyphens, emoji) separates words;
- a word whose letters mix Latin, Cyrillic or Greek ("Мурkа", a Cyrillic "а" in "Murka")
  is *mixed*: a look-alike, which never matches anything, not even itself.

Two words are one word when they are equal so folded, or when they are one word
inflected: each, with one of its language's case endings removed (or none), leaves the
same stem ("Мурка" / "Мурку" / "Мурці": ``к`` becomes ``ц`` before ``і``; "Kasia" /
"Kasię"). The endings, the stem-final alternations and the closed lists of pronouns and
function words, per language (uk, ru, en, pl), are data: ``engine/data/words.yaml``. A
function word ("her", "його", "jej") matches only a function word, and a value made of
function words only grounds nothing.

A ``confirm:`` phrase may end a word with ``*``: a word starting with it ("подзвон*":
"подзвоніть", "подзвонити").

Everything here is linear in the text: one pass of a fixed pattern cuts a message, the
scripts of a word that may mix them are read from RE2's Unicode tables, and a word's stems
are a bounded set (a set look-up per possible ending).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, NamedTuple

import re2
import yaml

__all__ = ["ALL", "MIN_PREFIX", "Language", "PhraseWord", "Word", "cut", "fold",
           "is_stop", "languages", "phrase", "phrase_problems", "stems"]

# A word: letters and digits, an apostrophe inside (Мар'яна, O'Neil, Olena's). Python's
# engine, not RE2: a fixed pattern with no ambiguity between its repeats runs in linear
# time there too, and RE2's binding costs ~5 us a match (a turn cuts hundreds of words).
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
# Fast paths for look-alikes: a text with letters of the Latin or the Cyrillic blocks
# only, not both, holds no word mixing scripts; a word of one block's letters (and digits,
# apostrophes) mixes nothing. Anything else is asked of RE2's Unicode script tables.
_LATIN = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f"
_CYRILLIC = "\u0400-\u052f"
_HAS_LATIN = re.compile(f"[{_LATIN}]")
_HAS_CYRILLIC = re.compile(f"[{_CYRILLIC}]")
_HAS_OTHER_LETTER = re.compile(f"(?![{_LATIN}{_CYRILLIC}])[^\\W\\d_]")
_ONE_SCRIPT = (re.compile(f"[{_CYRILLIC}0-9']+"), re.compile(f"[{_LATIN}0-9']+"))
# The scripts whose letters look alike: a word mixing two of them is a look-alike.
_SCRIPTS = tuple(re2.compile(p) for p in (r"\p{Latin}", r"\p{Cyrillic}", r"\p{Greek}"))
# (str.replace, not str.translate: a translate table costs ~5 us on a short text)
_APOSTROPHES = tuple((c, "'") for c in "\u2019\u2018\u02bc`\u00b4\u2032")
# Stress marks (no precomposed letter holds them after NFKC): dropped, not word breaks.
_STRESS = (("\u0301", ""), ("\u0300", ""))
_FOLD = (("ё", "е"), ("ґ", "г"))
# A `confirm:` stem ("подзвон*") keeps at least this many letters: a shorter one
# ("по*") would match half of any message.
MIN_PREFIX = 4


def _replace(text: str, pairs: tuple[tuple[str, str], ...]) -> str:
    for old, new in pairs:
        if old in text:
            text = text.replace(old, new)
    return text


class Word(NamedTuple):
    """One word of a text: as written (NFKC), folded, where, and whether a look-alike."""

    text: str
    folded: str
    start: int
    end: int
    mixed: bool


def fold(word: str) -> str:
    """``word`` as words are compared: NFKC, case folded, ``ё``/``ґ`` as ``е``/``г``."""
    return _replace(_normal(word).casefold(), _FOLD)


def _normal(text: str) -> str:
    return _replace(unicodedata.normalize("NFKC", text), _APOSTROPHES + _STRESS)


def _mixed(word: str) -> bool:
    if word.isascii() or any(one.fullmatch(word) for one in _ONE_SCRIPT):
        return False
    return sum(1 for script in _SCRIPTS if script.search(word)) > 1


def cut(text: str) -> tuple[str, list[Word]]:
    """``text`` NFKC-normalized (apostrophes unified, stress marks dropped), and its
    words, in order."""
    text = _normal(text)
    folded = _replace(text.casefold(), _FOLD)
    aligned = len(folded) == len(text)  # casefold grew no letter ("ß" is "ss")
    mixes = bool(_HAS_OTHER_LETTER.search(text)) or bool(
        _HAS_LATIN.search(text) and _HAS_CYRILLIC.search(text))
    words = []
    for m in _WORD.finditer(text):
        start, end = m.span()
        word = m.group()
        words.append(Word(word, folded[start:end] if aligned
                          else _replace(word.casefold(), _FOLD),
                          start, end, mixes and _mixed(word)))
    return text, words


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one per language
class Language:
    """A language's inflection and function words (engine/data/words.yaml)."""

    code: str
    min_stem: int
    endings: frozenset[str]
    # (seen, base, after): a stem ending in `seen` once `after` is removed is `base` too.
    alternations: tuple[tuple[str, str, str], ...]
    stop: frozenset[str]
    # The alternations by the ending that causes them ("" for the bare word).
    after: dict[str, tuple[tuple[str, str], ...]] = field(init=False, repr=False)
    longest: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        after: dict[str, list[tuple[str, str]]] = {}
        for seen, base, ending in self.alternations:
            after.setdefault(ending, []).append((seen, base))
        object.__setattr__(self, "after", {k: tuple(v) for k, v in after.items()})
        object.__setattr__(self, "longest", max(map(len, self.endings), default=0))


@cache
def _load() -> dict[str, Language]:
    text = resources.files("engine").joinpath("data/words.yaml").read_text("utf-8")
    raw: dict[str, Any] = yaml.safe_load(text)
    return {code: Language(
        code, int(data["min_stem"]),
        frozenset(_strings(data["endings"])),
        tuple((a["seen"], a["base"], after)
              for a in data["alternations"] for after in _strings(a["after"])),
        frozenset(_strings(data["stop"]))) for code, data in raw.items()}


def _strings(items: list[Any]) -> list[str]:
    # YAML reads an unquoted `on`, `no`, `yes` as a boolean: a stop word lost quietly.
    wrong = [item for item in items if not isinstance(item, str)]
    if wrong:
        raise TypeError(f"engine/data/words.yaml: {wrong!r} are not strings: quote them")
    return items


def languages(codes: Iterable[str] | None = None) -> tuple[Language, ...]:
    """The rules of ``codes`` the engine knows (None: every language it knows)."""
    known = _load()
    if codes is None:
        return tuple(known[c] for c in sorted(known))
    return tuple(known[c] for c in sorted(set(codes)) if c in known)


ALL: tuple[str, ...] = tuple(sorted(_load()))


@cache
def _stop() -> frozenset[str]:
    return frozenset().union(*(lang.stop for lang in _load().values()))


def is_stop(folded: str) -> bool:
    """Whether a folded word is a pronoun or a function word, in any language known."""
    return folded in _stop()


def stems(folded: str, rules: tuple[Language, ...], *, bare: bool = True) -> frozenset[str]:
    """The stems a folded word may have under ``rules``: itself without each case ending
    it carries (then with the alternation that ending causes); with ``bare``, also the
    word itself as a stem (a nominative with no ending: "Іван", "Piotr", "Федір")."""
    out = {folded} if bare else set()
    for lang in rules:
        if bare:
            for seen, base in lang.after.get("", ()):
                if folded.endswith(seen):
                    out.add(folded[:-len(seen)] + base)
        # Each possible ending is a suffix of the word: a few set look-ups, not a scan.
        for size in range(1, min(lang.longest, len(folded) - lang.min_stem) + 1):
            ending = folded[-size:]
            if ending not in lang.endings:
                continue
            stem = folded[:-size]
            out.add(stem)
            for seen, base in lang.after.get(ending, ()):
                if stem.endswith(seen):
                    out.add(stem[:-len(seen)] + base)
    return frozenset(out)


class PhraseWord(NamedTuple):
    """A word of a ``confirm:`` phrase; ``prefix``: written with a trailing ``*``."""

    folded: str
    prefix: bool
    mixed: bool


def phrase(text: str) -> tuple[PhraseWord, ...]:
    """A ``confirm:`` phrase's words (``*`` right after a word makes it a prefix)."""
    normal, words = cut(text)
    return tuple(PhraseWord(w.folded, normal[w.end:w.end + 1] == "*", w.mixed) for w in words)


def phrase_problems(text: str) -> list[str]:
    """Why a ``confirm:`` phrase can never match, or matches nearly anything (`funnel
    validate`'s F507); empty when it is fine. A phrase of no word at all is the caller's."""
    normal, words = cut(text)
    problems = []
    for w in words:
        stem = normal[w.end:w.end + 1] == "*"
        if w.mixed:
            problems.append(f"the word {w.text!r} mixes letters of two scripts (Latin, "
                            "Cyrillic, Greek): a look-alike, which never matches a "
                            "customer's word. Retype it in one script")
        elif w.start and normal[w.start - 1] == "*" and normal[:w.start - 1].strip():
            problems.append(f"a `*` inside a word (before {w.text!r}): only a trailing "
                            "`*` means \"a word starting with this\" (`подзвон*`). Remove "
                            "it, or end the word with it")
        elif stem and is_stop(w.folded):
            problems.append(f"the stem {w.text + '*'!r} is a function word: it would "
                            "match nearly any message. Write the word the customer would use")
        elif stem and len(w.folded) < MIN_PREFIX:
            problems.append(f"the stem {w.text + '*'!r} is shorter than {MIN_PREFIX} "
                            "letters: it would match many unrelated words. Write more of "
                            "the word")
    if not problems and words and all(is_stop(w.folded) for w in words):
        problems.append("every word of it is a pronoun or a function word "
                        f"({', '.join(repr(w.text) for w in words)}): it would match nearly "
                        "any message. Write the words that name what the customer asks for")
    return problems
