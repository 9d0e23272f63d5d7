"""Checks of the texts the engine sends instead of the model, by language (F704, F705).

A stage's ``fallback``, ``memory.too_long_reply`` (funnel and stage), ``handoff.
holding_reply`` and an approval's ``holding_reply`` reach customers in every language
the funnel answers in (engine.format.texts): each needs a text in each of them.

- F704 (warning): a text lacks one of the funnel's languages (a plain string is the
  default language's only); a customer answered in it would get the default language's.
  Also a language of the funnel that the engine's own texts (the ones a funnel leaves
  out) do not ship in.
- F705 (error): a text map names a language the funnel does not declare.
"""

from __future__ import annotations

from typing import Any

from ..errors import did_you_mean
from ..format.follow_up import declarations as follow_up_declarations
from ..format.texts import BUILTIN_LANGUAGES, name_of
from .diagnostics import Report, as_dict, as_list
from .knowledge import LANGUAGE_CODES

Keys = tuple[str | int, ...]


def _policy(data: dict[str, Any]) -> tuple[list[str], str | None]:
    """The languages a (raw) ``language:`` section answers in, and its default."""
    lang = as_dict(data.get("language"))
    if isinstance(lang.get("fixed"), str):
        return [lang["fixed"]], lang["fixed"]
    follow = [c for c in as_list(lang.get("follow_customer")) if isinstance(c, str)]
    default = lang.get("default")
    return follow, default if isinstance(default, str) else (follow[0] if follow else None)


def _texts(data: dict[str, Any]) -> list[tuple[Keys, str, Any]]:
    """(where, what, value) of every customer text the funnel gives."""
    found: list[tuple[Keys, str, Any]] = []
    memory = as_dict(data.get("memory"))
    if "too_long_reply" in memory:
        found.append((("memory", "too_long_reply"), "`memory.too_long_reply`",
                      memory["too_long_reply"]))
    handoff = as_dict(data.get("handoff"))
    if "holding_reply" in handoff:
        found.append((("handoff", "holding_reply"), "`handoff.holding_reply`",
                       handoff["holding_reply"]))
    for name, raw in as_dict(data.get("stages")).items():
        stage = as_dict(raw)
        if "fallback" in stage:
            found.append((("stages", name, "fallback"), f"stage '{name}': `fallback`",
                          stage["fallback"]))
        memory = as_dict(stage.get("memory"))
        if "too_long_reply" in memory:
            found.append((("stages", name, "memory", "too_long_reply"),
                          f"stage '{name}': `memory.too_long_reply`", memory["too_long_reply"]))
        approval = as_dict(stage.get("approval"))
        if "holding_reply" in approval:
            found.append((("stages", name, "approval", "holding_reply"),
                          f"stage '{name}': `approval.holding_reply`",
                          approval["holding_reply"]))
    for keys, owner, follow in follow_up_declarations(data):
        for i, step in enumerate(as_list(follow.get("steps"))):
            if "text" in as_dict(step):
                where = f"stage '{owner}': " if owner else ""
                found.append(((*keys, "steps", i, "text"),
                              f"{where}`follow_up.steps[{i}].text`", as_dict(step)["text"]))
    return found


def check_texts(data: dict[str, Any], report: Report) -> None:
    """F704, F705: every customer text the engine may send has each of the funnel's
    languages, and no other."""
    languages, default = _policy(data)
    for keys, what, value in _texts(data):
        if isinstance(value, str):
            given: list[str] = [default] if default else []
            missing = [c for c in languages if c not in given]
            for code in missing:
                report.at(keys, "warning", "F704", f"{what} is a plain string, the default "
                          f"language's ({_named(default)}): a customer answered in "
                          f"{_named(code)} gets it in {_named(default)}. Write it by "
                          f"language, `{{{default}: \"...\", {code}: \"...\"}}`")
            continue
        if not isinstance(value, dict) or not value:
            continue  # the format layer's F004
        for code in value:
            if isinstance(code, str) and code not in languages:
                report.at((*keys, code), "error", "F705", _undeclared(what, code, languages),
                          key=True)
        keyed = [c for c in value if isinstance(c, str)]
        instead = default if default in keyed else (keyed[0] if keyed else None)
        for code in languages:
            if code not in value:
                report.at(keys, "warning", "F704", f"{what} has no {_named(code)} text: a "
                          f"customer answered in {_named(code)} gets the "
                          f"{_named(instead)} one. Add `{code}: \"...\"`", key=True)
    _check_builtin(data, languages, default, report)


def _check_builtin(data: dict[str, Any], languages: list[str], default: str | None,
                   report: Report) -> None:
    """F704 for a funnel's language that the engine's own texts do not ship in, when the
    funnel leaves one of them to the engine."""
    # A code the detector does not know is F701's already.
    other = [c for c in languages if c not in BUILTIN_LANGUAGES and c in LANGUAGE_CODES]
    if not other:
        return
    left = [f"stage '{name}': `fallback`" for name, raw in as_dict(data.get("stages")).items()
            if "fallback" not in as_dict(raw)]
    if "too_long_reply" not in as_dict(data.get("memory")):
        left.append("`memory.too_long_reply`")
    if not left:
        return
    lang = as_dict(data.get("language"))
    for code in other:
        keys: Keys = ("language", "fixed") if isinstance(lang.get("fixed"), str) else (
            "language", "follow_customer", as_list(lang.get("follow_customer")).index(code))
        report.at(keys, "warning", "F704", f"{_named(code)} is not among the languages of the "
                  f"engine's own texts ({', '.join(BUILTIN_LANGUAGES)}), which the funnel "
                  f"leaves to the engine for {', '.join(left)}: a customer answered in "
                  f"{_named(code)} gets them in {_named(default)}. Declare them, each with "
                  f"a `{code}:` text")


def _undeclared(what: str, code: str, languages: list[str]) -> str:
    if code not in LANGUAGE_CODES:
        hint = did_you_mean(code, languages) or did_you_mean(code, LANGUAGE_CODES)
        return (f"{what} gives a text under {code!r}, which is not an ISO 639-1 language "
                f"code{hint}: no customer is answered in it. Key it by one of the funnel's "
                f"languages ({', '.join(languages) or 'it declares none'})")
    if not languages:
        return (f"{what} gives a {_named(code)} text, but the funnel declares no languages "
                "(its `language:` has neither `fixed` nor `follow_customer`), so a plain "
                "string is all it can send. Write a plain string, or declare the languages")
    return (f"{what} gives a {_named(code)} text, but {code!r} is not one of the funnel's "
            f"languages ({', '.join(languages)}){did_you_mean(code, languages)}: no customer "
            f"is answered in it. Remove it, or add {code} to `language:`")


def _named(code: str | None) -> str:
    if not code:
        return "the first language it gives"
    return f"{name_of(code)} ({code})" if name_of(code) != code else code
