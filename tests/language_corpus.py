"""The language corpora and the detection before issue 19, for tests/test_language.py and
bench/language.py alike (one reading, so that the bench measures what the tests pin)."""

from __future__ import annotations

import random
import re
from collections import defaultdict
from pathlib import Path

from engine.turn import language
from engine.turn.language import Detection

DATA = Path(__file__).with_name("data") / "language_messages.tsv"
LONG = Path(__file__).with_name("data") / "language_long_replies.tsv"
LANGS = ("uk", "ru", "en", "pl", "de")
# engine.turn.language._NOISE before issue 19: the same matches, found slower.
NOISE_BEFORE = re.compile(r"https?://\S+|\S+@\S+|@\w+|\w*\d\w*")


def _rows(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text("utf-8").splitlines()
            if line and not line.startswith("#")]


def labelled() -> list[tuple[str, str, str]]:
    """(language, kind, text) of the labelled set of short messages."""
    return [(lang, kind, text) for lang, kind, text in _rows(DATA)]


def long_replies() -> list[tuple[str, str]]:
    """(language, text) of the long consultant replies."""
    return [(lang, text) for lang, text in _rows(LONG)]


def long_texts(seed: int = 19) -> list[tuple[str, str]]:
    """(language, text): paragraphs of 3-8 labelled messages of one language (20 per
    language), the long replies, and each long reply followed by the next of its language."""
    rng = random.Random(seed)
    plain: dict[str, list[str]] = defaultdict(list)
    for lang, kind, text in labelled():
        if kind == "plain":
            plain[lang].append(text)
    texts = [(lang, " ".join(rng.sample(lines, rng.randint(3, min(8, len(lines))))))
             for lang, lines in sorted(plain.items()) for _ in range(20)]
    replies = long_replies()
    texts += replies
    for lang, text in replies:
        same = [other for other_lang, other in replies if other_lang == lang]
        texts.append((lang, f"{text} {same[(same.index(text) + 1) % len(same)]}"))
    return texts


def before_issue_19(text: str, languages: tuple[str, ...] = LANGS) -> Detection:
    """`engine.turn.language.detect` as it was: the full detector on up to 2000 characters."""
    cleaned = NOISE_BEFORE.sub(" ", text[:2000])
    if not language._enough_letters(cleaned):
        return Detection(None, 0.0)
    return language._full(cleaned, languages)
