"""A reply as the checker reads it: sentences, each folded and cut into words.

Folding is NFKC (full-width digits and letters become plain ones), case folding,
ё as е, every apostrophe as ``'``, and runs of spaces as one. Word positions are
kept, so that a claim is quoted back as the reply wrote it.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

__all__ = ["Sentence", "Word", "fold", "sentences"]

_APOSTROPHES = str.maketrans({"’": "'", "ʼ": "'", "`": "'", "‘": "'", "ʹ": "'", "ё": "е",
                              "Ё": "Е", "\u00a0": " ", "\u202f": " ", "\u2009": " "})
_SPACES = re.compile(r"\s+")
# A sentence ends at . ! ? … or a line break, when a space, a quote or the end follows;
# "277.00" and "e.g." inside a sentence do not end it (no space after the dot, or a
# lower-case letter after it).
_END = re.compile(r"(?:[.!?…]+[\"'»”)]*(?=\s+[^a-zа-яёіїєґąćęłńóśźż]|\s*$)|\n+)")
_WORD = re.compile(r"[^\W_]+(?:['\-][^\W_]+)*|[₴$€£₽%]")


def fold(text: str) -> str:
    """``text`` as patterns read it: NFKC, case folded, one kind of apostrophe and space."""
    text = unicodedata.normalize("NFKC", text).translate(_APOSTROPHES).casefold()
    return _SPACES.sub(" ", text).replace("ё", "е")


@dataclass(frozen=True)
class Word:
    """One word of a sentence: as written, folded, and where it is."""

    text: str
    folded: str
    start: int  # in the sentence's normalized text
    end: int

    @property
    def capitalized(self) -> bool:
        return self.text[:1].isupper()


@dataclass
class Sentence:
    """One sentence of a reply: its text (NFKC), folded text and words."""

    text: str
    folded: str
    words: list[Word] = field(default_factory=list)

    @property
    def asks(self) -> bool:
        """Whether it is a question (an offer, never a promise)."""
        return self.text.rstrip(" \"'»”)").endswith("?")

    def quote(self, start: int, end: int, limit: int = 80) -> str:
        """The sentence's text from ``start`` to ``end``, widened to whole words, bounded."""
        start = max(0, start)
        while start > 0 and self.text[start - 1].isalnum():
            start -= 1
        while end < len(self.text) and self.text[end].isalnum():
            end += 1
        return self.text[start:end].strip()[:limit]


def sentences(reply: str) -> list[Sentence]:
    """The reply cut into sentences, each with its words."""
    text = unicodedata.normalize("NFKC", reply).translate(_APOSTROPHES)
    out: list[Sentence] = []
    start = 0
    for match in _END.finditer(text):
        _add(out, text[start:match.end()])
        start = match.end()
    _add(out, text[start:])
    return out


def _add(out: list[Sentence], raw: str) -> None:
    text = _SPACES.sub(" ", raw).strip()
    if not text:
        return
    # Folding keeps the length of these texts (NFKC is done): positions stay valid,
    # except for the rare letter whose case folding is longer ("ß" -> "ss").
    folded = text.casefold().replace("ё", "е")
    if len(folded) != len(text):
        folded = "".join(ch.casefold()[:1] for ch in text).replace("ё", "е")
    words = [Word(m.group(), folded[m.start():m.end()], m.start(), m.end())
             for m in _WORD.finditer(text)]
    out.append(Sentence(text, folded, words))
