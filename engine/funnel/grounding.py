"""The customer's own facts must come from the customer: grounding in their messages.

A weak model writes envelopes that are valid and content that is invented (a name
nobody gave, a hand-off nobody asked for). Two declarations stop that at the apply
step, in code:

- a state field's part marked ``grounded: true`` (engine.format.personal) keeps a
  model's value only when the customer's own messages contain it;
- an action's ``confirm:`` lists, per ``reason`` (or ``"*"``: any call) and per
  language, the phrases one of which the customer's words must contain; otherwise
  the action is refused as unconfirmed and the model is told to ask.

Both compare *normalized* text: case folded, accents kept, every run of spaces and
punctuation one space; a phone number by its digits (its last nine, since the
engine adds the country code to a national number).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..format.personal import EVERY_ITEM, Path, normalized

__all__ = ["confirmed", "normalized", "unground", "words_hold"]

_PHONE_DIGITS = 9  # the national part of a number, whatever code was added to it


def _digits(text: str) -> str:
    return "".join(ch for ch in text if ch.isdigit())


def words_hold(value: str, words: Sequence[str], *, phone: bool = False) -> bool:
    """Whether the customer's ``words`` (their messages) contain ``value``."""
    if phone:
        digits = _digits(value)[-_PHONE_DIGITS:]
        return bool(digits) and any(digits in _digits(w) for w in words)
    wanted = normalized(value).rstrip()  # a word's start: "Olen" in "Olena's", inflections
    return wanted != "" and any(wanted in normalized(w) for w in words)


def unground(patch: Any, paths: Iterable[Path], schema: Mapping[str, Any],
             words: Sequence[str]) -> tuple[Any, list[tuple[str, str]]]:
    """``patch`` without the values at ``paths`` the customer's ``words`` do not hold;
    and the (path, value) pairs taken out."""
    dropped: list[tuple[str, str]] = []

    def walk(node: Any, path: Path, sub: Mapping[str, Any], where: str) -> Any:
        if not path:
            if isinstance(node, str) and node and not words_hold(
                    node, words, phone=sub.get("format") == "phone"):
                dropped.append((where, node))
                return _DROP
            return node
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


def confirmed(confirm: Mapping[str, Any], args: Mapping[str, Any],
              words: Sequence[str]) -> bool | None:
    """Whether the customer's ``words`` confirm a call with ``args`` of an action that
    declares ``confirm`` (``{reason or "*": {language: [phrases]}}``); None when the
    declaration does not cover this call."""
    phrases = confirm.get(str(args.get("reason"))) if "reason" in args else None
    if phrases is None:
        phrases = confirm.get("*")
    if not isinstance(phrases, Mapping):
        return None
    said = [normalized(w) for w in words]
    for listed in phrases.values():
        for phrase in listed or ():
            wanted = normalized(str(phrase)).rstrip()  # "менеджер" in "менеджера"
            if wanted and any(wanted in s for s in said):
                return True
    return False
