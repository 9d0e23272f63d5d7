"""Products a sentence names: the catalog's, by name, alias or SKU; and invented ones.

A catalog name splits into its *key* (the capitalized words that are not product
words: "Exotic Spa" of "Exotic Spa moisturising lotion") and its *kinds* (the
product words: ``lotion``). A reply names a product when its key appears, in any
language's word order and case ending ("шампунь Exotic Spa", "szamponu Exotic Spa");
a product word next to a capitalized name that is no catalog key ("Silk Touch
shampoo", "шампунь Royal Groom"), or a key with a kind it does not have ("Exotic Spa
serum"), is an invented product. Products may declare ``aliases:`` (a list, or a
list per language) for names in other scripts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..format.catalog import Catalog, Product
from .lexicon import PRODUCT_WORDS
from .text import Sentence, Word, fold

__all__ = ["Mention", "ProductIndex"]

_WORD = re.compile(r"[^\W_]+(?:['\-][^\W_]+)*")
_SKU_LIKE = re.compile(r"^([a-z]{1,6})[-_]?(\d{3,10})$")
# Words between a name and its product word that do not break the name: descriptors
# ("Exotic Spa *moisturising* lotion") are fine, these are not (they join two names).
_JOINERS = frozenset({
    "and", "or", "a", "an", "the", "with", "for", "to", "of", "than", "your", "our", "any",
    "і", "й", "та", "або", "чи", "для", "з", "із", "до", "ніж", "и", "или", "с", "со",
    "чем", "i", "lub", "albo", "oraz", "dla", "z", "ze", "niż", "do", "jak"})
_MAX_DESCRIPTORS = 2


@lru_cache(maxsize=8192)  # a reply's words repeat from turn to turn; the lookup is the cost
def _kinds(folded: str) -> frozenset[str]:
    found = set()
    for kind, stems in PRODUCT_WORDS.items():
        for stem in stems:
            if folded.startswith(stem) and (len(stem) >= 4 or folded == stem):
                found.add(kind)
                break
    return frozenset(found)


@dataclass(frozen=True)
class _Name:
    key: tuple[str, ...]
    kinds: frozenset[str]
    product: Product


@dataclass
class Mention:
    """What one sentence names: catalog products, and names the catalog does not have."""

    products: list[Product] = field(default_factory=list)
    invented: list[tuple[str, str]] = field(default_factory=list)  # (quote, why)
    # Products of a kind named without a name ("the lotion (420 UAH)"): any of them.
    generic: list[Product] = field(default_factory=list)


def _split(name: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """A catalog name's key (capitalized non-product words) and kinds (its product words)."""
    words = _WORD.findall(name)
    kinds: set[str] = set()
    key: list[str] = []
    plain: list[str] = []
    for word in words:
        folded = fold(word)
        word_kinds = _kinds(folded)
        if word_kinds:
            kinds |= word_kinds
            continue
        plain.append(folded)
        if word[:1].isupper() or word[:1].isdigit():
            key.append(folded)
    return tuple(key or plain), frozenset(kinds)


def _aliases(raw: Any) -> Iterable[str]:
    if isinstance(raw, str):
        yield raw
    elif isinstance(raw, Mapping):
        for value in raw.values():
            yield from _aliases(value)
    elif isinstance(raw, list):
        for value in raw:
            yield from _aliases(value)


class ProductIndex:
    """The catalog's names, keys and SKUs, built once per funnel."""

    def __init__(self, catalog: Catalog, not_products: Iterable[str] = ()) -> None:
        self.by_key: dict[tuple[str, ...], list[_Name]] = {}
        self.skus = {p.sku.casefold(): p for p in catalog.products}
        self.sku_prefixes = {m.group(1) for s in self.skus if (m := _SKU_LIKE.match(s))}
        for product in catalog.products:
            for name in (product.name, *_aliases(product.attributes.get("aliases"))):
                key, kinds = _split(name)
                if key:
                    self.by_key.setdefault(key, []).append(_Name(key, kinds, product))
        # Whole names as folded text: a claim word inside one ("Calm Skin *hypoallergenic*
        # shampoo") is the product's name, not a claim about it.
        self.full_names = sorted({fold(n) for p in catalog.products
                                  for n in (p.name, *_aliases(p.attributes.get("aliases")))},
                                 key=len, reverse=True)
        self.by_kind: dict[str, list[Product]] = {}
        for entries in self.by_key.values():
            for entry in entries:
                for kind in entry.kinds:
                    if entry.product not in self.by_kind.setdefault(kind, []):
                        self.by_kind[kind].append(entry.product)
        self.longest = max((len(k) for k in self.by_key), default=0)
        self.first = {k[0] for k in self.by_key}
        self.ignored = frozenset(fold(w) for w in not_products)

    def name_spans(self, folded: str) -> list[tuple[int, int]]:
        """Where ``folded`` (a folded sentence) spells a catalog name in full."""
        spans = []
        for name in self.full_names:
            at = folded.find(name)
            while at >= 0:
                spans.append((at, at + len(name)))
                at = folded.find(name, at + len(name))
        return spans

    def names(self) -> list[str]:
        return sorted({n.product.name for names in self.by_key.values() for n in names})

    def mention(self, sentence: Sentence, known_words: frozenset[str] = frozenset()
                ) -> Mention:
        """What ``sentence`` names. ``known_words``: folded words of the session's own
        facts (a pet's breed or name), never taken for invented product names."""
        words = sentence.words
        out = Mention()
        hits: dict[int, tuple[int, list[_Name]]] = {}  # first word -> (end word, names)
        i = 0
        while i < len(words):
            if words[i].folded in self.first:
                for n in range(min(self.longest, len(words) - i), 0, -1):
                    key = tuple(w.folded for w in words[i:i + n])
                    if key in self.by_key:
                        hits[i] = (i + n, self.by_key[key])
                        i += n - 1
                        break
            i += 1
        narrowed: dict[int, list[_Name]] = {}  # a key with its product word beside it
        covered = {j for s, (e, _) in hits.items() for j in range(s, e)}
        for k, word in enumerate(words):
            kinds = _kinds(word.folded)
            if kinds and k not in covered:
                self._named(sentence, k, kinds, hits, covered, known_words, out, narrowed)
        for start, (_, names) in hits.items():
            for name in narrowed.get(start, names):
                if name.product not in out.products:
                    out.products.append(name.product)
        for w in words:
            sku = w.folded
            product = self.skus.get(sku)
            if product is not None:
                if product not in out.products:
                    out.products.append(product)
            elif (m := _SKU_LIKE.match(sku)) and m.group(1) in self.sku_prefixes:
                out.invented.append((w.text, f"no product in the catalog has the SKU {w.text}"))
        return out

    def _named(self, sentence: Sentence, k: int, kinds: frozenset[str],
               hits: dict[int, tuple[int, list[_Name]]], covered: set[int],
               known_words: frozenset[str], out: Mention,
               narrowed: dict[int, list[_Name]]) -> None:
        """The product word at ``k``: with a catalog key beside it, a catalog product (of
        that kind); with another capitalized name beside it, an invented one."""
        words = sentence.words
        for start, (end, names) in hits.items():
            before = 0 <= k - end <= _MAX_DESCRIPTORS and self._descriptors(words[end:k])
            after = 0 <= start - k - 1 <= _MAX_DESCRIPTORS and self._descriptors(
                words[k + 1:start])
            if not (before or after):
                continue
            fitting = [n for n in names if not n.kinds or n.kinds & kinds]
            if fitting:
                narrowed[start] = [*narrowed.get(start, []), *fitting]
                return
            quote = sentence.quote(min(words[start].start, words[k].start),
                                   max(words[end - 1].end, words[k].end))
            have = ", ".join(sorted({n.product.name for n in names}))
            out.invented.append((quote, f"the catalog has no such product; it has {have}"))
            return
        run = self._run(words, k, -1, covered, known_words) or self._run(
            words, k, 1, covered, known_words)
        if not run:
            for kind in kinds:
                out.generic += [p for p in self.by_kind.get(kind, ()) if p not in out.generic]
        else:
            first, last = min(run), max(run)
            quote = sentence.quote(min(words[first].start, words[k].start),
                                   max(words[last].end, words[k].end))
            out.invented.append((quote, "the catalog has no product of that name"))

    def _descriptors(self, between: list[Word]) -> bool:
        return all(not w.capitalized and w.folded not in _JOINERS and w.folded.isalpha()
                   for w in between)

    def _run(self, words: list[Word], k: int, step: int, covered: set[int],
             known_words: frozenset[str]) -> list[int]:
        """The capitalized words right beside the product word at ``k`` (before it for
        ``step`` -1, after it for 1) that could be an invented name."""
        j = k + step
        skipped = 0
        while 0 <= j < len(words) and not words[j].capitalized and skipped < _MAX_DESCRIPTORS \
                and words[j].folded not in _JOINERS and words[j].folded.isalpha() \
                and step < 0:
            j += step  # descriptors between a name and its product word, before it
            skipped += 1
        run: list[int] = []
        while 0 <= j < len(words) and words[j].capitalized and j not in covered \
                and not _kinds(words[j].folded):
            run.append(j)
            j += step
        if step < 0 and run and min(run) == 0:
            run.remove(0)  # a sentence's first word is capitalized anyway
        return [j for j in run if words[j].folded not in self.ignored
                and words[j].folded not in known_words and words[j].folded.isalpha()
                and not (len(words[j].folded) == 1)]
