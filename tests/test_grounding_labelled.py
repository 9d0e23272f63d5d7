"""Grounding and `confirm:` on words, not substrings, measured (issue 38 section 3).

tests/data/grounding_labelled.yaml holds labelled cases in uk, ru, en and pl (see its
header): pronouns and function words, parts of words, look-alikes, inflected names,
multi-word values, apostrophes, phones, and hand-off requests for puramur's `confirm:`
phrases. Each runs through engine.funnel.grounding as a turn does; the test prints
precision, recall and the share of false cases refused (overall, per language,
per category; `-s` shows them) and asserts that every case
is right but the few listed in ALLOWED_MISSES, each with why.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PURAMUR

from engine.funnel.compiled import load_funnel
from engine.funnel.grounding import Confirm, Said, ground

CASES: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "data" / "grounding_labelled.yaml").read_text("utf-8"))

# Cases the rule gets wrong, knowingly, keyed (lang, value or what was said):
# - a model's value that is the customer's word without its last letter: a name with no
#   ending is a masculine nominative in Polish and Ukrainian ("Jan" of the customer's
#   "Jana", "Іван" of "Івана"), and the rule cannot tell it from a feminine name cut short.
#   What is stored is still made of the customer's letters, never an invented name;
# - puramur's verb stems (`перезвон*`, `передзвон*`, `zadzwo*`, kept from the substring
#   days on purpose: "передзвоніть", "передзвони", "передзвонити" all ask for a call) also
#   hold the customer's own "I will call back". Listing the imperatives as whole words
#   instead (the last case of the file) refuses it, and misses the informal singular.
ALLOWED_MISSES: dict[tuple[str, str], str] = {
    ("en", "Bell"): "Polish genitive plural of 'Bella' by the rule (cf. 'Jan' / 'Jana')",
    ("en", "Ann"): "Polish genitive plural of 'Anna' by the rule (cf. 'Jan' / 'Jana')",
    ("ru", "Я перезвоню вам позже"): "the stem перезвон* holds the first person",
    ("uk", "Я вам передзвоню пізніше"): "the stem передзвон* holds the first person",
    ("pl", "Zadzwonię później"): "the stem zadzwo* holds the first person",
}


def _said(case: dict[str, Any]) -> list[str]:
    said = case["said"]
    return [said] if isinstance(said, str) else list(said)


@pytest.fixture(scope="module")
def handoff_phrases() -> dict[str, Any]:
    spec = load_funnel(PURAMUR).spec
    return dict(spec.actions["request_handoff"].options["confirm"]["explicit_request"])


def _run(case: dict[str, Any], phrases: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether the case came out positive (grounded, confirmed), and what was stored."""
    said = Said(_said(case))
    if case.get("kind") == "confirm":
        confirm = Confirm({"explicit_request": case.get("phrases") or phrases})
        return bool(confirm.holds({"reason": "explicit_request"}, said)), None
    stored, _ = ground(str(case["value"]), said, phone=bool(case.get("phone")))
    return stored is not None, stored


def _key(case: dict[str, Any]) -> tuple[str, str]:
    return case["lang"], str(case.get("value") or case["said"])


def test_the_labelled_file_covers_what_the_issue_lists() -> None:
    assert len(CASES) >= 200
    languages = Counter(c["lang"] for c in CASES)
    categories = Counter(c["cat"] for c in CASES)
    assert set(languages) == {"uk", "ru", "en", "pl"}
    assert min(languages.values()) >= 40, languages
    for category in ("function_word", "substring", "invented", "look_alike", "inflected",
                     "exact", "multi_word", "apostrophe", "phone", "confirm"):
        assert categories[category] >= 5 or category == "apostrophe" and \
            categories[category] >= 3, (category, categories)
    for case in CASES:
        # YAML reads an unquoted Yes, No, On as a boolean: a case testing nothing.
        assert all(isinstance(v, str) for v in [case.get("value", ""), *_said(case),
                                                case.get("stored", "")]), case
        assert case["expect"] in ({"confirmed", "refused"} if case.get("kind") == "confirm"
                                  else {"grounded", "refused"}), case
        assert ("stored" in case) == (case["expect"] == "grounded"), case
    assert len({_key(c) + (str(c.get("phrases")), str(c["said"])) for c in CASES}) \
        == len(CASES), "a case listed twice"


def test_precision_and_recall_over_the_labelled_cases(handoff_phrases: dict[str, Any]
                                                      ) -> None:
    counts: dict[str, Counter[str]] = {}
    wrong: list[str] = []
    missed_on_purpose: set[tuple[str, str]] = set()
    for case in CASES:
        positive = case["expect"] in ("grounded", "confirmed")
        got, stored = _run(case, handoff_phrases)
        outcome = ("tp" if got else "fn") if positive else ("fp" if got else "tn")
        bad = got != positive or (positive and stored is not None
                                  and stored != str(case["stored"]))
        if bad and outcome in ("tp", "tn"):
            outcome = "stored_wrong"
        for scope in ("all", case["lang"], case["cat"]):
            counts.setdefault(scope, Counter())[outcome] += 1
        if bad:
            if _key(case) in ALLOWED_MISSES:
                missed_on_purpose.add(_key(case))
            else:
                wrong.append(f"{case['lang']} {case['cat']}: {case.get('value', '')!r} in "
                             f"{case['said']!r}: expected {case['expect']} "
                             f"{case.get('stored', '')!r}, got {got} {stored!r}")
    print(f"\n{'scope':<14}{'cases':>6}{'precision':>10}{'recall':>8}{'refused':>9}"
          "   tp  fp  fn   tn  stored wrong")
    order = ["all", "uk", "ru", "en", "pl"]
    for scope in order + sorted(set(counts) - set(order)):
        c = counts[scope]
        tp, fp, fn, tn = c["tp"] + c["stored_wrong"], c["fp"], c["fn"], c["tn"]
        figures = [f"{tp / (tp + fp):.3f}" if tp + fp else "-",
                   f"{tp / (tp + fn):.3f}" if tp + fn else "-",
                   f"{tn / (tn + fp):.3f}" if tn + fp else "-"]
        print(f"{scope:<14}{sum(c.values()):>6}{figures[0]:>10}{figures[1]:>8}{figures[2]:>9}"
              f"{c['tp']:>5}{fp:>4}{fn:>4}{tn:>5}{c['stored_wrong']:>6}")
    assert not wrong, "\n".join(wrong)
    assert missed_on_purpose == set(ALLOWED_MISSES), \
        f"allowed misses that no longer miss: {set(ALLOWED_MISSES) - missed_on_purpose}"
