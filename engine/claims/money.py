"""Money amounts and percentages in a sentence.

A money amount is a number next to a currency sign or word (``277 UAH``, ``277 грн``,
``277₴``, ``₴277``, ``277,00 грн``, ``1 250 грн``, ``1,250 UAH``), or a bare number
right after a price word (``it costs 99``). A percentage is a number with ``%`` or a
percent word. Any other number (an age, a weight, a phone number, a date) is no claim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import lru_cache

from .lexicon import CURRENCIES, PERCENT_WORDS, PRICE_WORDS, QUANTITY_UNITS
from .text import Sentence, Word

__all__ = ["Amount", "amounts", "matches_word"]

# Thousands grouped by a space, a comma or a dot (three digits each), then up to two
# decimals after a comma or a dot: "1 250", "1,250", "1.250", "277,00", "277.50".
_NUMBER = re.compile(r"(?<![\w.,])(\d{1,3}(?:[ ,.]\d{3})+|\d+)(?:[.,](\d{1,2}))?(?![\d])")


@dataclass(frozen=True)
class Amount:
    """A money amount or a percentage found in a sentence."""

    value: Decimal
    currency: str | None  # ISO code; None: a bare number after a price word
    percent: bool
    start: int
    end: int


@lru_cache(maxsize=8192)  # a reply's words repeat from turn to turn; the lookup is the cost
def matches_word(folded: str, forms: tuple[str, ...]) -> bool:
    """Whether a folded word is one of ``forms`` (a trailing ``*`` is a stem)."""
    for form in forms:
        if form.endswith("*"):
            if folded.startswith(form[:-1]):
                return True
        elif folded == form:
            return True
    return False


def _currency(word: Word | None) -> str | None:
    return _currency_of(word.folded) if word is not None else None


@lru_cache(maxsize=8192)
def _currency_of(folded: str) -> str | None:
    for code, forms in CURRENCIES.items():
        if matches_word(folded, forms):
            return code
    return None


def _value(whole: str, decimals: str | None) -> Decimal | None:
    digits = re.sub(r"[ ,.]", "", whole)
    try:
        return Decimal(f"{digits}.{decimals}" if decimals else digits)
    except InvalidOperation:  # pragma: no cover - the pattern admits digits only
        return None


def amounts(sentence: Sentence) -> list[Amount]:
    """The money amounts and percentages of ``sentence``, in order."""
    words = sentence.words
    out: list[Amount] = []
    for match in _NUMBER.finditer(sentence.text):
        value = _value(match.group(1), match.group(2))
        if value is None:
            continue
        start, end = match.start(), match.end()
        after = next((w for w in words if w.start >= end), None)
        before = next((w for w in reversed(words) if w.end <= start), None)
        near_after = after if after is not None and after.start - end <= 1 else None
        near_before = before if before is not None and start - before.end <= 1 else None
        if near_after is not None and matches_word(near_after.folded, PERCENT_WORDS):
            out.append(Amount(value, None, True, start, near_after.end))
            continue
        code = _currency(near_after)
        if code is not None and near_after is not None:
            out.append(Amount(value, code, False, start, near_after.end))
            continue
        code = _currency(near_before)
        if code is not None and near_before is not None:
            out.append(Amount(value, code, False, near_before.start, end))
            continue
        if near_after is not None and near_after.folded in QUANTITY_UNITS:
            continue
        # "costs 99", "ціна: 99", "price only 99": a price word one or two words before.
        earlier = [w for w in words if w.end <= start][-2:]
        if any(w.folded in PRICE_WORDS for w in earlier):
            out.append(Amount(value, None, False, start, end))
    return out
