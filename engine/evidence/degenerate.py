"""Customer messages a simulation must not take at face value.

A small model playing a customer (``funnel simulate --customer-model``) often writes
no customer at all: an empty message, the brief's placeholder ("What you write"), the
funnel's last reply said back, or the persona's brief itself. A conversation carried
by such messages measures the model's failure, not the funnel. :func:`degenerate`
names what is wrong with one message (or None); :mod:`engine.evidence.simulate`
counts them, and a run where more than a set share of the customer messages is
degenerate is invalid: it prints no rates (docs/evidence.md).
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["KINDS", "degenerate"]

# What each kind means, for the reports.
KINDS = {"empty": "empty or punctuation only",
         "placeholder": "a placeholder (the brief's example, not a customer's words)",
         "echo": "the funnel's last reply said back",
         "brief": "the persona's brief said back"}

# Placeholders small models copy from the brief's JSON example or from templates.
_PLACEHOLDERS = {"what you write", "your message", "message", "customer message",
                 "the customer's message", "text", "string", "your reply", "reply",
                 "your answer", "answer", "...", "…", "n/a", "none", "null", "placeholder",
                 "insert message here", "type your message", "a goodbye", "goodbye message"}
_WORD = re.compile(r"\w+", re.UNICODE)
# A message is an echo of a text when this share of its words, in order, are the
# text's (8 words at least, or the whole of a shorter text).
_ECHO_SHARE = 0.8
_SHINGLE = 8  # words in a row that a customer does not share with a brief by chance


def _words(text: str) -> list[str]:
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def _norm(text: str) -> str:
    return " ".join(_words(text))


def degenerate(message: str | None, last_reply: str | None = None, brief: str = ""
               ) -> str | None:
    """What makes ``message`` no customer's message, or None when it is one.

    Args:
        message: What the simulated customer wrote.
        last_reply: The funnel's reply the customer answers (None before the first).
        brief: What the customer model was told (the persona's brief).

    Returns:
        ``"empty"``, ``"placeholder"``, ``"echo"`` or ``"brief"`` (:data:`KINDS`), or None.
    """
    words = _words(message or "")
    if not words:
        return "empty"
    text = " ".join(words)
    stripped = (message or "").strip().strip("\"'`<>[]{}()").strip().casefold()
    if text in _PLACEHOLDERS or stripped in _PLACEHOLDERS:
        return "placeholder"
    if last_reply and _echo(words, _words(last_reply)):
        return "echo"
    if brief and _from_brief(words, _words(brief)):
        return "brief"
    return None


def _echo(words: list[str], reply: list[str]) -> bool:
    """The message is the reply, or most of it in order (a prefix or a near copy)."""
    if not reply:
        return False
    if words == reply:
        return True
    if len(words) < 4:
        return False
    joined, said = " ".join(words), " ".join(reply)
    if len(words) >= 8 and joined in said:
        return True
    common = _lcs(words, reply)
    return common >= _ECHO_SHARE * len(words) and common >= 0.5 * len(reply)


def _lcs(a: list[str], b: list[str]) -> int:
    """The longest common subsequence's length (both bounded: chat messages)."""
    a, b = a[:200], b[:400]
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def _from_brief(words: list[str], brief: list[str]) -> bool:
    """The message says back the brief: half its runs of :data:`_SHINGLE` words or more
    are the brief's (a shorter message is let be: a customer's "dry skin" may well be in
    the brief)."""
    if len(words) < _SHINGLE:
        return False
    grams = {tuple(brief[i:i + _SHINGLE]) for i in range(len(brief) - _SHINGLE + 1)}
    runs = len(words) - _SHINGLE + 1
    hits = sum(tuple(words[i:i + _SHINGLE]) in grams for i in range(runs))
    return hits * 2 >= runs

