"""Checks of what guards the customer's own facts: ``grounded:`` marks and ``confirm:`` phrases.

Both declarations fail quietly when written wrong: a ``grounded: true`` on a part that never
holds text grounds nothing, and a ``confirm:`` keyed by a misspelt reason leaves the
hand-off it was meant to guard unconfirmed. So `funnel validate` says so:

- F310 (error): ``grounded: true`` on a part that cannot hold a string (an object, an
  array, a number, a boolean) or on an ``enum`` (its values are the funnel's words, not the customer's);
- F311 (warning): a grounded part that is not personal data (a fact only the customer can
  give is theirs: ``funnel purge --anonymize`` should remove it);
- F507 (error): a ``confirm:`` key that is neither ``*`` nor one of the action's ``reasons``
  (or any key but ``*`` on an action without reasons), a reason with no phrases, a phrase
  that can never match (only spaces and punctuation, a word mixing scripts) or that
  matches nearly any message (only pronouns and function words, a ``*`` stem shorter
  than four letters or a function word, a ``*`` inside a word) (engine.format.words);
- F508 (warning): a phrase listed twice in one language (as the engine compares them: word
  by word, folded), a language key that is not an ISO 639-1 code, or not one of the
  funnel's languages (its phrases are still matched).
"""

from __future__ import annotations

from typing import Any

from ..errors import did_you_mean
from ..format.words import phrase as phrase_words
from ..format.words import phrase_problems
from .diagnostics import Report, as_dict, as_list
from .knowledge import LANGUAGE_CODES

_TEXT_TYPES = {"string"}
_NOT_TEXT = {"object", "array", "integer", "number", "boolean", "null"}


def check_grounding(data: dict[str, Any], report: Report) -> None:
    """F310/F311 on the state's marks, F507/F508 on every action's ``confirm:``."""
    for name, raw in as_dict(data.get("state")).items():
        if isinstance(raw, dict):
            personal = raw.get("retention") == "personal"
            _walk(raw, ("state", name), name, personal, report)
    languages = _languages(as_dict(data.get("language")))
    for name, raw in as_dict(data.get("actions")).items():
        raw = as_dict(raw)
        if "confirm" in raw:
            _check_confirm(name, raw, languages, report)


def _walk(node: dict[str, Any], keys: tuple[str | int, ...], where: str, personal: bool,
          report: Report) -> None:
    personal = personal or node.get("personal") is True
    if node.get("grounded") is True:
        _check_grounded(node, keys, where, personal, report)
    for prop, sub in as_dict(node.get("properties")).items():
        if isinstance(sub, dict):
            _walk(sub, (*keys, "properties", prop), f"{where}.{prop}", personal, report)
    items = node.get("items")
    if isinstance(items, dict):
        _walk(items, (*keys, "items"), f"{where}[]", personal, report)


def _check_grounded(node: dict[str, Any], keys: tuple[str | int, ...], where: str,
                    personal: bool, report: Report) -> None:
    kind = node.get("type")
    kinds = {kind} if isinstance(kind, str) else {k for k in as_list(kind) if isinstance(k, str)}
    if (kinds and not kinds & _TEXT_TYPES) or (not kinds and (
            "properties" in node or "items" in node)):
        what = "/".join(sorted(kinds)) if kinds else "object"
        report.at((*keys, "grounded"), "error", "F310", f"`grounded: true` on {where}, "
                  f"which is {'an' if what[0] in 'aeiou' else 'a'} {what}: only text is "
                  "compared with the customer's messages, so this grounds nothing. Mark the "
                  "string properties that hold the customer's words (`name: {type: string, "
                  "grounded: true}`) instead")
        return
    if "enum" in node or "const" in node:
        report.at((*keys, "grounded"), "error", "F310", f"`grounded: true` on {where}, an "
                  "enum: its values are the funnel's own words, so a customer who wrote "
                  "them otherwise (\"пес\" for `dog`) would have the value dropped every turn. "
                  "Remove `grounded` (the enum already bounds what the model may write)")
        return
    if not personal:
        report.at((*keys, "grounded"), "warning", "F311", f"{where} is grounded (a fact "
                  "only the customer can give) but not personal data: `funnel purge "
                  "--anonymize` would keep it. Add `personal: true` beside `grounded: true`, "
                  "or `retention: personal` on the field")


def _languages(lang: dict[str, Any]) -> list[str]:
    if isinstance(lang.get("fixed"), str):
        return [lang["fixed"]]
    return [c for c in as_list(lang.get("follow_customer")) if isinstance(c, str)]


def _check_confirm(name: str, raw: dict[str, Any], languages: list[str],
                   report: Report) -> None:
    confirm = raw.get("confirm")
    if not isinstance(confirm, dict):
        return  # the format layer's F004
    reasons = [r for r in as_list(raw.get("reasons")) if isinstance(r, str)]
    base: tuple[str | int, ...] = ("actions", name, "confirm")
    for key, by_language in confirm.items():
        where = (*base, key)
        if key != "*" and key not in reasons:
            known = f"its reasons are {', '.join(reasons)}" if reasons else "it declares no `reasons`"
            report.at(where, "error", "F507", f"action '{name}': `confirm: {{{key}: ...}}` "
                      f"names no reason of the action ({known}{did_you_mean(str(key), reasons)})"
                      ": the calls it was meant to guard run unconfirmed. Use one of the "
                      "reasons, or `*` for every call", key=True)
        if not isinstance(by_language, dict):
            continue  # F004
        listed = 0
        for language, phrases in by_language.items():
            seen: dict[str, str] = {}  # per language: a word two languages share is fine
            _check_language(name, key, language, languages, (*where, language), report)
            for i, phrase in enumerate(as_list(phrases)):
                if not isinstance(phrase, str):
                    continue
                listed += 1
                words = " ".join(w.folded + "*" * w.prefix for w in phrase_words(phrase))
                at = (*where, language, i)
                problems = phrase_problems(phrase)
                if not words:
                    report.at(at, "error", "F507", f"action '{name}': the phrase {phrase!r} "
                              "is only spaces and punctuation, which the engine does not "
                              "compare: it can never match. Write the words the customer "
                              "would use")
                elif problems:
                    for problem in problems:
                        report.at(at, "error", "F507", f"action '{name}': the phrase "
                                  f"{phrase!r}: {problem}")
                elif words in seen:
                    report.at(at, "warning", "F508", f"action '{name}': the phrase "
                              f"{phrase!r} is listed already ({seen[words]!r}: phrases are "
                              "compared word by word, case folded, punctuation ignored). "
                              "Remove one")
                else:
                    seen[words] = phrase
        if listed == 0:
            report.at(where, "error", "F507", f"action '{name}': `confirm: {{{key}: ...}}` "
                      "lists no phrase, so no call it covers can ever be confirmed: every one "
                      "is refused. List the customer's words per language "
                      "(`en: [manager, human]`), or remove the entry", key=True)


def _check_language(name: str, key: str, language: Any, languages: list[str],
                    where: tuple[str | int, ...], report: Report) -> None:
    if not isinstance(language, str):
        return
    if language not in LANGUAGE_CODES:
        report.at(where, "warning", "F508", f"action '{name}': `confirm.{key}.{language}` is "
                  f"not an ISO 639-1 language code{did_you_mean(language, LANGUAGE_CODES)}; its "
                  "phrases are matched in any language, but the key reads as a mistake",
                  key=True)
    elif languages and language not in languages:
        report.at(where, "warning", "F508", f"action '{name}': `confirm.{key}.{language}`: "
                  f"the funnel's languages are {', '.join(languages)}; these phrases are "
                  f"matched still (in any language), but no reply is in {language}. Add it "
                  "to `language:` or file the phrases under one of them", key=True)
