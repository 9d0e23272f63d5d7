"""The customer's own facts must come from the customer: grounding in their messages.

A weak model writes envelopes that are valid and content that is invented (a name
nobody gave, a hand-off nobody asked for). Two declarations stop that at the apply
step, in code:

- a state field's part marked ``grounded: true`` (engine.format.personal) keeps a
  model's value only when the customer's own messages hold its words;
- an action's ``confirm:`` lists, per ``reason`` (or ``"*"``: any call) and per
  language, the phrases one of which the customer's words must hold; otherwise the
  action is refused as unconfirmed and the model is told to ask.

Both compare whole words (engine.format.words: NFKC, case folded, apostrophes unified,
look-alikes refused, case endings of uk, ru, en, pl allowed), never substrings:

- a value's words must appear in one message, in order, at most :data:`GAP` other
  words between two of them ("Olena, surname Petrenko" holds "Olena Petrenko"); a value
  made only of pronouns and function words ("her", "його") is refused; a phone number is
  compared by its digits (its last nine: the engine adds the country code);
- a phrase's words must appear consecutively ("call me"); a word written ``подзвон*``
  matches a word starting with it.

What is stored is the customer's text, never the model's: each word as the customer
wrote it (NFKC: their "Murka" even when the model wrote "ＭＵＲＫＡ"), the customer's own
separators between words that follow each other in their message (between words they
wrote apart, the model's punctuation, or a space). One exception: a word
matched through inflection keeps the model's form (NFKC), so that the customer's
"Мурку" stores the model's nominative "Мурка". That form is safe to keep: it is in the
customer's script (a mixed word never matches), and it differs from the customer's word
only by a known case ending.

The customer's messages of a turn are cut once (:class:`Said`, kept on the turn's
``TurnScratch``); each value and phrase is then a few dictionary look-ups.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any

from ..format.personal import EVERY_ITEM, Path
from ..format.words import ALL, Language, PhraseWord, Word, cut, is_stop, languages, phrase, stems

__all__ = ["GAP", "Confirm", "Said", "confirmed", "ground", "unground", "words_hold"]

_PHONE_DIGITS = 9  # the national part of a number, whatever code was added to it
# Words of the customer's that may stand between two words of a value ("Olena, my
# surname is Petrenko"): enough for a phrase around a surname, too few to join two
# facts given apart.
GAP = 3
_SPACES = re.compile(r"\s+")
_Pos = tuple[int, int]  # (message, word)

# Why a value was not grounded: the notice's words.
ABSENT = "is not in the customer's messages"
FUNCTION_WORDS = "is only pronouns or function words, not a fact the customer gave"
LOOK_ALIKE = "mixes letters of two scripts (a look-alike of the customer's words)"


def _digits(text: str) -> str:
    return "".join(ch for ch in text if ch.isdigit())


class Said:
    """A turn's customer messages, cut into words once; what grounding reads."""

    def __init__(self, messages: Iterable[str]) -> None:
        self.raw = tuple(messages)
        self._exact: dict[str, list[_Pos]] | None = None
        self._by_stem: dict[tuple[Language, ...], dict[str, list[_Pos]]] = {}

    @cached_property
    def messages(self) -> list[tuple[str, list[Word]]]:
        # Cut on first use: a turn whose model writes no grounded value and calls no
        # confirmed action never pays for it.
        return [cut(m) for m in self.raw]

    def word(self, pos: _Pos) -> Word:
        return self.messages[pos[0]][1][pos[1]]

    def _words(self) -> Iterable[tuple[_Pos, Word]]:
        for i, (_, words) in enumerate(self.messages):
            for j, w in enumerate(words):
                if not w.mixed:  # a look-alike matches nothing
                    yield (i, j), w

    def exact(self, folded: str) -> list[_Pos]:
        """Where the customer wrote ``folded`` itself."""
        if self._exact is None:
            self._exact = {}
            for pos, w in self._words():
                self._exact.setdefault(w.folded, []).append(pos)
        return self._exact.get(folded, [])

    def inflected(self, folded: str, rules: tuple[Language, ...]) -> list[_Pos]:
        """Where the customer wrote ``folded``, or a word with a case ending whose stem is
        one of ``folded``'s under ``rules``. The customer's word must carry the ending: a
        model's inflection of a word the customer wrote bare is not theirs (their "ром",
        rum, does not hold "Рома"; their "Іван" holds "Іван", not the model's "Івана")."""
        index = self._by_stem.get(rules)
        if index is None:
            index = self._by_stem[rules] = {}
            known: dict[str, frozenset[str]] = {}  # a word said twice is stemmed once
            for pos, w in self._words():
                its = known.get(w.folded)
                if its is None:
                    its = known[w.folded] = stems(w.folded, rules, bare=False)
                for stem in its:
                    index.setdefault(stem, []).append(pos)
        found: set[_Pos] = set(self.exact(folded))
        for stem in stems(folded, rules):
            found.update(index.get(stem, ()))
        return sorted(found)

    def starting(self, prefix: str) -> list[_Pos]:
        """Where the customer wrote a word starting with ``prefix`` (not a function word)."""
        return [pos for pos, w in self._words()
                if w.folded.startswith(prefix) and not is_stop(w.folded)]


def _as_said(words: Said | Sequence[str]) -> Said:
    return words if isinstance(words, Said) else Said(words)


def _chain(found: list[list[_Pos]], gap: int) -> list[_Pos] | None:
    """Positions, one per value word, in one message, in order, at most ``gap`` words
    apart; the latest message first. Linear in the positions (one bisect each)."""
    by_message: list[dict[int, list[int]]] = []
    for positions in found:
        grouped: dict[int, list[int]] = {}
        for i, j in positions:
            grouped.setdefault(i, []).append(j)
        by_message.append(grouped)
    shared = set(by_message[0]).intersection(*by_message[1:])
    for i in sorted(shared, reverse=True):
        reach = sorted(by_message[0][i])
        back: list[dict[int, int]] = []
        for k in range(1, len(found)):
            step: dict[int, int] = {}
            for j in by_message[k][i]:
                before = bisect_left(reach, j) - 1  # the nearest earlier word of the chain
                if before >= 0 and j - reach[before] <= gap + 1:
                    step[j] = reach[before]
            if not step:
                break
            back.append(step)
            reach = sorted(step)
        else:
            chain = [reach[-1]]
            for step in reversed(back):
                chain.append(step[chain[-1]])
            return [(i, j) for j in reversed(chain)]
    return None


def _stored(value: str, value_words: list[Word], chain: list[_Pos], said: Said) -> str:
    """The customer's text for the matched words (see the module's docstring)."""
    i = chain[0][0]
    text, words = said.messages[i]
    value_text = cut(value)[0]
    out: list[str] = []
    for k, (vw, (_, j)) in enumerate(zip(value_words, chain, strict=True)):
        if k:
            prev = chain[k - 1][1]
            if j == prev + 1:  # the customer's own separator
                between = text[words[prev].end:words[j].start]
            else:  # words apart: the model's, when it is only punctuation and spaces
                between = value_text[value_words[k - 1].end:vw.start]
                if not all(unicodedata.category(c)[0] in "PZ" for c in between):
                    between = " "
            out.append(_SPACES.sub(" ", between) or " ")
        cw = words[j]
        out.append(cw.text if cw.folded == vw.folded else vw.text)
    return "".join(out)


def ground(value: str, words: Said | Sequence[str], *, phone: bool = False,
           rules: tuple[Language, ...] | None = None) -> tuple[str | None, str]:
    """What to store of the model's ``value`` given the customer's ``words``: the
    customer's form of it, or None and why not (the notice's words).

    Args:
        value: The model's value.
        words: The customer's messages (or a turn's :class:`Said`).
        phone: Compare digits (a ``format: phone`` part): the value is kept as it is.
        rules: The languages whose endings an inflected word may carry (None: all known).
    """
    said = _as_said(words)
    if phone:
        digits = _digits(value)[-_PHONE_DIGITS:]
        held = bool(digits) and any(digits in _digits(m) for m in said.raw)
        return (value, "") if held else (None, ABSENT)
    value_words = cut(value)[1]
    if not value_words:
        return None, ABSENT
    if any(w.mixed for w in value_words):
        return None, LOOK_ALIKE
    if all(is_stop(w.folded) for w in value_words):
        return None, FUNCTION_WORDS
    rules = languages(ALL) if rules is None else rules
    # The customer's own spelling first; their word in another case only when none.
    for inflect in (False, True):
        found = [_positions(said, w, rules, inflect) for w in value_words]
        if all(found):
            chain = _chain(found, GAP)
            if chain is not None:
                return _stored(value, value_words, chain, said), ""
    return None, ABSENT


def _positions(said: Said, w: Word | PhraseWord, rules: tuple[Language, ...],
               inflect: bool) -> list[_Pos]:
    """Where the customer wrote the value's or phrase's word ``w``; a function word
    matches only a function word (a pronoun never grounds a name's inflected form)."""
    if isinstance(w, PhraseWord) and w.prefix:
        return said.starting(w.folded)
    stop = is_stop(w.folded)
    found = said.inflected(w.folded, rules) if inflect else said.exact(w.folded)
    return [p for p in found if is_stop(said.word(p).folded) == stop]


def words_hold(value: str, words: Said | Sequence[str], *, phone: bool = False) -> bool:
    """Whether the customer's ``words`` (their messages) hold ``value``."""
    return ground(value, words, phone=phone)[0] is not None


def unground(patch: Any, paths: Iterable[Path], schema: Mapping[str, Any],
             words: Said | Sequence[str]) -> tuple[Any, list[tuple[str, str, str]]]:
    """``patch`` with the values at ``paths`` replaced by the customer's form of them,
    those the customer's ``words`` do not hold taken out; and the (path, value, why)
    of those taken out."""
    said = _as_said(words)
    dropped: list[tuple[str, str, str]] = []

    def walk(node: Any, path: Path, sub: Mapping[str, Any], where: str) -> Any:
        if not path:
            if not isinstance(node, str) or not node:
                return node
            stored, why = ground(node, said, phone=sub.get("format") == "phone")
            if stored is None:
                dropped.append((where, node, why))
                return _DROP
            return stored
        head, rest = path[0], path[1:]
        if head == EVERY_ITEM:
            if not isinstance(node, list):
                return node
            items: Mapping[str, Any] = sub["items"] if isinstance(sub.get("items"),
                                                                   Mapping) else {}
            kept = [walk(v, rest, items, f"{where}[{i}]") for i, v in enumerate(node)]
            return [v for v in kept if v is not _DROP]
        if not isinstance(node, dict) or head not in node:
            return node
        props: Mapping[str, Any] = sub["properties"] if isinstance(sub.get("properties"),
                                                                     Mapping) else {}
        child = walk(node[head], rest, props.get(head) or {}, f"{where}.{head}")
        if child is _DROP:
            return {k: v for k, v in node.items() if k != head}
        return {**node, head: child}

    for path in paths:
        patch = walk(patch, path, schema, "")
        if patch is _DROP:
            return None, dropped
    return patch, dropped


_DROP = object()


class Confirm:
    """An action's ``confirm:`` (``{reason or "*": {language: [phrases]}}``), its
    phrases cut once per funnel."""

    def __init__(self, confirm: Mapping[str, Any]) -> None:
        self.phrases: dict[str, list[tuple[tuple[Language, ...], tuple[PhraseWord, ...]]]] = {}
        for key, by_language in confirm.items():
            if not isinstance(by_language, Mapping):
                continue
            listed = self.phrases.setdefault(str(key), [])
            for language, texts in by_language.items():
                # A phrase is inflected by the endings of the language it is listed
                # under (none for a language the engine has no rules for).
                rules = languages([str(language)])
                for text in texts or ():
                    words = phrase(str(text))
                    if words and not any(w.mixed for w in words):
                        listed.append((rules, words))

    def holds(self, args: Mapping[str, Any], words: Said | Sequence[str]) -> bool | None:
        """Whether the customer's ``words`` confirm a call with ``args``; None when the
        declaration does not cover this call."""
        listed = self.phrases.get(str(args.get("reason"))) if "reason" in args else None
        if listed is None:
            listed = self.phrases.get("*")
        if listed is None:
            return None
        said = _as_said(words)
        for rules, words_ in listed:
            found = [_positions(said, w, rules, True) for w in words_]
            if all(found) and _chain(found, 0) is not None:
                return True
        return False


def confirmed(confirm: Mapping[str, Any], args: Mapping[str, Any],
              words: Said | Sequence[str]) -> bool | None:
    """Whether the customer's ``words`` confirm a call with ``args`` of an action that
    declares ``confirm``; None when the declaration does not cover this call."""
    return Confirm(confirm).holds(args, words)
