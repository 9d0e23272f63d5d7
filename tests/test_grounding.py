"""What a weak model writes must not become the customer's data (issue 29).

The envelopes of a small local model were valid and their content invented: a
customer's name nobody gave, the pet named after the shop, hand-offs for
`explicit_request` nobody asked for. Puramur declares its customer's own facts
(`grounded: true`) and the phrases that confirm a hand-off; these turns run the
whole engine (offline scripted model, real PostgreSQL) and check what is stored.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import PURAMUR

from engine import Engine, ScriptedModel
from engine.funnel.actions import ActionRunner, TurnScratch
from engine.funnel.compiled import load_funnel
from engine.funnel.grounding import confirmed, ground, words_hold
from engine.store.ddl import OUTBOX, TURNS

pytestmark = pytest.mark.postgres

TABLE = "puramur_sessions_state"
INVENTED = {"reply": "Nice to meet you!",
            "updates": {"customer": {"name": "Pramesh Kumar Singh"},
                        "pet": {"type": "cat", "name": "Puramur"}}}
HANDOFF = {"reply": "A manager will contact you.",
           "actions": [{"type": "request_handoff", "reason": "explicit_request"}]}


async def _turn(db_url: str, text: str, output: dict[str, Any], sid: str = "s1") -> Any:
    model = ScriptedModel.from_data({"default": output})
    async with await Engine.open(PURAMUR, db=db_url, model=model) as engine:
        return await engine.handle(sid, text)


async def test_invented_facts_are_refused_with_a_notice_and_counted(db_url: str,
                                                                    sql: Any) -> None:
    result = await _turn(db_url, "Hi, I have a cat", INVENTED)
    [(customer, pet, notices)] = sql(f"SELECT customer, pet, notices FROM {TABLE}")
    assert customer == {} and pet == {"type": "cat"}  # the type is not a grounded fact
    assert any("customer.name" in n and "not in the customer's messages" in n for n in notices)
    assert any("pet.name" in n for n in result.notices)
    [(refused,)] = sql(f"SELECT refused FROM {TURNS}")
    assert {"type": "ungrounded", "reason": "customer.name"} in refused
    assert {"type": "ungrounded", "reason": "pet.name"} in refused


async def test_facts_the_customer_wrote_are_kept_as_they_wrote_them(
        db_url: str, sql: Any) -> None:
    """Case and spacing do not matter to the match; what is stored is the customer's
    text (their words, their separators), not the model's rewrite of it."""
    await _turn(db_url, "hi, i'm PRAMESH   kumar-singh; my cat is puramur!", INVENTED)
    [(customer, pet)] = sql(f"SELECT customer, pet FROM {TABLE}")
    assert customer == {"name": "PRAMESH kumar-singh"}
    assert pet == {"type": "cat", "name": "puramur"}


async def test_a_pronoun_is_never_a_name(db_url: str, sql: Any) -> None:
    """Issue 38: "her" from "her skin is very dry" was stored as the customer's name."""
    result = await _turn(db_url, "Hi! My cat is 3, her skin is very dry",
                         {"reply": "Thank you!", "updates": {"customer": {"name": "her"},
                                                             "pet": {"name": "Her"}}})
    [(customer, pet, notices)] = sql(f"SELECT customer, pet, notices FROM {TABLE}")
    assert customer == {} and "name" not in pet
    assert any("customer.name: 'her' is only pronouns or function words" in n
               for n in notices), notices
    assert any("pet.name" in n for n in result.notices)
    [(refused,)] = sql(f"SELECT refused FROM {TURNS}")
    assert {"type": "ungrounded", "reason": "customer.name"} in refused


async def test_a_look_alike_is_stored_in_the_customers_letters(db_url: str, sql: Any) -> None:
    """Issue 38: a full-width "ＭＵＲＫＡ" of the customer's "Murka" was stored as the
    model typed it; a word mixing Latin and Cyrillic letters is refused."""
    await _turn(db_url, "My cat is Murka, I'm Olena",
                {"reply": "Hi!", "updates": {"pet": {"name": "ＭＵＲＫＡ"},
                                             "customer": {"name": "Оlena"}}})  # Cyrillic О
    [(customer, pet, notices)] = sql(f"SELECT customer, pet, notices FROM {TABLE}")
    assert pet == {"name": "Murka"} and customer == {}
    assert any("mixes letters of two scripts" in n for n in notices), notices


async def test_an_inflected_name_is_kept_in_the_models_nominative(db_url: str,
                                                                 sql: Any) -> None:
    """Ukrainian names are inflected: the customer's "Мурку" (accusative) grounds the
    model's "Мурка", which is stored (its stem is the customer's, its ending a case's)."""
    await _turn(db_url, "Хочу підібрати шампунь для кішки, звуть Мурку",
                {"reply": "Добре!", "updates": {"pet": {"name": "Мурка"}}})
    [(pet,)] = sql(f"SELECT pet FROM {TABLE}")
    assert pet == {"name": "Мурка"}


async def test_a_handoff_nobody_asked_for_is_unconfirmed_and_alerts_no_one(
        db_url: str, sql: Any) -> None:
    result = await _turn(db_url, "Hello, what shampoo for a cat?", HANDOFF)
    assert not result.handoff and result.stage_after != "handoff"
    assert sql(f"SELECT COUNT(*) FROM {OUTBOX}") == [(0,)]
    [(refused,)] = sql(f"SELECT refused FROM {TURNS}")
    assert refused[0]["type"] == "request_handoff"
    assert refused[0]["reason"].startswith("unconfirmed")
    # The model is told, and asks on the next turn.
    [(notices,)] = sql(f"SELECT notices FROM {TABLE}")
    assert any("ask the customer whether they want it" in n for n in notices)


@pytest.mark.parametrize(("text", "reply"), [
    ("Can I talk to a real person?", "A manager will contact you."),
    ("Покличте менеджера, будь ласка", "Менеджер скоро зв'яжеться з вами."),
    ("Позовите МЕНЕДЖЕРА, пожалуйста", "Менеджер скоро свяжется с вами.")])
async def test_a_handoff_the_customer_asked_for_goes_through(db_url: str, sql: Any,
                                                             text: str, reply: str) -> None:
    result = await _turn(db_url, text, {**HANDOFF, "reply": reply})
    assert result.error is None, result.error
    assert result.handoff and result.stage_after == "handoff"
    assert sql(f"SELECT kind FROM {OUTBOX}") == [("handoff",)]


async def test_personally_is_not_a_request_for_a_person(db_url: str, sql: Any) -> None:
    """Issue 38: "Personally, I..." confirmed a hand-off as it contains "person"."""
    result = await _turn(db_url, "Personally, I prefer dry food for my cat", HANDOFF)
    assert not result.handoff
    assert sql(f"SELECT COUNT(*) FROM {OUTBOX}") == [(0,)]


def test_words_not_substrings() -> None:
    assert words_hold("+380671234567", ["мій номер 067 123-45-67"], phone=True)
    assert not words_hold("+380671234599", ["мій номер 067 123-45-67"], phone=True)
    assert words_hold("Olena", ["Olena's cat"]) and not words_hold("Lena", ["Olena"])
    assert not words_hold("Olen", ["Olenka"]) and not words_hold("", ["anything"])
    assert ground("Murka", ["her name is MURKA"]) == ("MURKA", "")
    assert ground("Olena Petrenko", ["Olena, my surname is Petrenko"])[0] == "Olena Petrenko"
    # Between words the customer wrote apart: the model's punctuation, never its symbols.
    assert ground("olena@example.com", ["olena at example dot com"])[0] == "olena@example.com"
    assert ground("Olena 💋 Petrenko", ["Olena, surname Petrenko"])[0] == "Olena Petrenko"
    # Words given apart are not joined into one fact.
    assert not words_hold("Olena Petrenko", ["Olena here", "Petrenko is my vet"])
    confirm = {"explicit_request": {"en": ["manager", "call me"], "uk": ["подзвон*"]}}
    assert confirmed(confirm, {"reason": "complaint"}, ["hi"]) is None  # not declared
    assert confirmed(confirm, {"reason": "explicit_request"}, ["a Manager please"]) is True
    assert confirmed(confirm, {"reason": "explicit_request"}, ["yes"]) is False
    assert confirmed(confirm, {"reason": "explicit_request"}, ["the managerial part"]) is False
    assert confirmed(confirm, {"reason": "explicit_request"}, ["call them, me too"]) is False
    assert confirmed(confirm, {"reason": "explicit_request"}, ["Подзвоніть мені"]) is True


def test_a_handoff_without_a_reason_needs_the_explicit_requests_phrases() -> None:
    """A call that names no reason is an explicit request (its default reason): the
    `confirm:` phrases of `explicit_request` apply to it, not only those of ``*``."""
    compiled = load_funnel(PURAMUR)
    runner = ActionRunner(compiled.spec, compiled.catalog)

    def call(words: tuple[str, ...]) -> tuple[str | None, list[tuple[str, str]]]:
        scratch = TurnScratch(session_id="s", stage="discovery", stage_iteration=1,
                              now=datetime.now(UTC), words=words)
        runner.run({"type": "request_handoff"}, {}, scratch)
        return scratch.handoff_requested, scratch.ungrounded

    assert call(("what shampoo for a cat?",)) == (
        None, [("action request_handoff", "explicit_request")])
    assert call(("can I talk to a manager?",)) == ("explicit_request", [])
