"""The customer's words (engine.format.words) and the data they are compared with
(engine/data/words.yaml): folded as the engine folds, closed, cut in linear time."""

from __future__ import annotations

import time
from importlib import resources

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.format.words import ALL, cut, fold, is_stop, languages, phrase, phrase_problems, stems
from engine.funnel.grounding import Said, ground

DATA = yaml.safe_load(resources.files("engine").joinpath("data/words.yaml").read_text("utf-8"))
# Given names a stop list must not hold: each is a function word or a common word too
# ("Will", "May", "Hope"; "Віра", "Надія", "Люба"; "Вера", "Ника"; "Ida", "Ola").
NAMES = ["will", "may", "hope", "віра", "надія", "люба", "вера", "ника", "ida", "ola", "anna",
         "olena", "мурка", "kasia"]


def test_the_data_is_written_folded_and_knows_four_languages() -> None:
    assert ALL == ("en", "pl", "ru", "uk")
    for code, data in DATA.items():
        for key in ("stop", "endings"):
            for word in data[key]:
                assert fold(str(word)) == word, (code, key, word)
        for alternation in data["alternations"]:
            assert all(fold(alternation[k]) == alternation[k] for k in ("seen", "base"))
            assert all(after == "" or after in data["endings"] for after in alternation["after"])
        assert len(set(data["stop"])) == len(data["stop"]), code
    assert not [name for name in NAMES if is_stop(name)]


def test_words_are_cut_folded_and_look_alikes_marked() -> None:
    text, words = cut("Мар’яна, ＭＵＲＫＡ i Мурkа; Семён")
    assert text.startswith("Мар'яна, MURKA")
    assert [w.folded for w in words] == ["мар'яна", "murka", "i", "мурkа", "семен"]
    assert [w.mixed for w in words] == [False, False, False, True, False]
    assert [w.text for w in words][1] == "MURKA"  # as written, NFKC


def test_stems_remove_one_known_ending_and_apply_its_alternation() -> None:
    uk = languages(["uk"])
    assert "мурк" in stems("мурка", uk) & stems("мурці", uk, bare=False)
    assert "мурка" not in stems("мурка", uk, bare=False)
    assert not stems("ром", languages(["ru"]), bare=False)  # "р" is too short a stem
    assert stems("personally", languages(["en"])) == {"personally"}


def test_phrases_and_their_problems() -> None:
    assert [(w.folded, w.prefix) for w in phrase("Подзвон* мені")] == [
        ("подзвон", True), ("мені", False)]
    assert phrase_problems("call me") == [] and phrase_problems("подзвон*") == []
    assert phrase_problems("me") and phrase_problems("по*") and phrase_problems("the*")
    assert phrase_problems("подз*вон") and phrase_problems("менеджeр")  # Latin e


def test_a_turns_words_are_cut_once_and_in_linear_time() -> None:
    """The cost bound of issue 38: a turn reads up to the window's messages; grounding a
    value and a phrase is a few look-ups once they are cut."""
    message = "Добрий день, мене звати Олена Петренко, кішку звуть Мурка. " * 20
    start = time.perf_counter()
    said = Said([message] * 10)
    for _ in range(20):
        assert ground("Мурка", said)[0] == "Мурка"
        assert ground("Олена Петренко", said)[0] == "Олена Петренко"
        assert ground("Оксана", said)[0] is None
    small = time.perf_counter() - start
    start = time.perf_counter()
    said = Said([message * 10] * 10)
    for _ in range(20):
        ground("Мурка", said)
        ground("Оксана", said)
    large = time.perf_counter() - start
    assert large < small * 30, (small, large)  # 10x the words: about 10x the time


# Letters that look alike across scripts, some that do not, apostrophes, separators.
_ALPHABET = "aoeiкМурkаoеіOlenaЛенаΟ'’ʼ -,.!ＭＵ5"
_TEXTS = st.text(alphabet=_ALPHABET, max_size=40)


@settings(max_examples=400, deadline=None)
@given(_TEXTS, _TEXTS, st.data())
def test_what_is_stored_is_the_customers_words(value: str, said: str, data: st.DataObject
                                                ) -> None:
    """Whatever the model writes: a value stored is made of the customer's words (or the
    model's form of one of them in another case), never a look-alike; and the customer's
    own consecutive words, as a value, are stored as they wrote them."""
    stored, why = ground(value, [said])
    customer = {w.folded for w in cut(said)[1] if not w.mixed}
    if stored is not None:
        rules = languages()
        for word in cut(stored)[1]:
            assert not word.mixed
            assert word.folded in customer or any(
                stems(word.folded, rules) & stems(c, rules, bare=False) for c in customer)
    else:
        assert why
    text, words = cut(said)
    if words:
        i = data.draw(st.integers(0, len(words) - 1))
        j = data.draw(st.integers(i + 1, len(words)))
        span = words[i:j]
        if not any(w.mixed for w in span) and not all(is_stop(w.folded) for w in span):
            # The model rewrote their words in other letter case: stored in theirs.
            again = ground(text[span[0].start:span[-1].end].swapcase(), [said])[0]
            assert again is not None
            written = {w.text for w in words}
            assert [w.folded for w in cut(again)[1]] == [w.folded for w in span]
            assert all(w.text in written for w in cut(again)[1])
