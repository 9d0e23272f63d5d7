"""Truthful replies through the engine: a reply's claims are checked before it is sent
(engine.turn.truth), on a real PostgreSQL, offline and on the real litellm HTTP path.

A refused reply goes back to the model once with each conflict quoted; a repair that
is refused too gives the stage's fallback. The turn record keeps every refused claim,
the notices tell the model, and a streamed reply ends with the text that was sent.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import PURAMUR
from fake_providers import FakeProvider
from test_litellm_path import close_litellm_clients, loopback_only  # noqa: F401
from test_providers import open_engine
from test_streaming import Events, keys  # noqa: F401  (autouse: the providers' keys)

from engine.llm.models import ScriptedModel
from engine.turn.engine import Engine

pytestmark = pytest.mark.postgres

SID = "truth-1"
GREET = {"reply": "Hello! Is your pet a cat or a dog?", "language": "en"}
PROFILE = {"reply": "A Sphynx with dry skin needs gentle care. How old is she?",
           "updates": {"pet": {"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"]}}}
LIE = "Exotic Spa shampoo is only 99 UAH today, and a 50% discount on the lotion!"
TRUE = "Exotic Spa shampoo costs 277 UAH and suits dry Sphynx skin."
FALLBACK = "Sorry, I lost my train of thought. Would you like me to recommend something for your pet?"


def claims(sql: Any, session: str = SID) -> list[list[dict[str, Any]]]:
    return [r[0] for r in sql("SELECT claims FROM funnel_turns WHERE session_id = %s "
                              "ORDER BY id", (session,))]


async def play(db_url: str, outputs: list[Any], *texts: str, stream: Events | None = None
               ) -> list[Any]:
    model = ScriptedModel.from_data({"turns": outputs})
    results = []
    async with await Engine.open(PURAMUR, db=db_url, model=model) as engine:
        for i, text in enumerate(texts):
            results.append(await engine.handle(
                SID, text, stream=stream if i == len(texts) - 1 else None))
    return results


async def test_a_false_price_and_discount_go_back_once_with_the_conflicts(
        db_url: str, sql: Any) -> None:
    lie = {"output": {"reply": LIE}, "repair": {"reply": TRUE}}
    *_, result = await play(db_url, [GREET, PROFILE, lie], "Hi", "Sphynx, dry skin",
                            "What do you recommend?")
    assert result.reply == TRUE and not result.fallback and result.repaired
    assert [(c["kind"], c["text"]) for c in result.reply_claims] == [
        ("price", "99 UAH"), ("discount", "50%")]
    [_, _, record] = claims(sql)
    assert record[0] == {"kind": "price", "name": "price", "text": "99 UAH", "attempt": 0,
                         "expected": "the catalog says Exotic Spa shampoo costs 277 UAH"}
    assert record[1]["kind"] == "discount" and "no discount" in record[1]["expected"]
    # The repair call quoted the conflict exactly; what the customer read is the repair.
    [(raw,)] = sql("SELECT raw_output FROM funnel_turns WHERE session_id = %s ORDER BY id "
                   "DESC LIMIT 1", (SID,))
    assert len(raw) == 2
    [(reply,)] = sql("SELECT content FROM funnel_messages WHERE role = 'assistant' "
                     "ORDER BY id DESC LIMIT 1")
    assert reply == TRUE and LIE not in reply
    # The model is told on the next turn what was not sent, and why.
    [(notices,)] = sql("SELECT notices FROM puramur_sessions_state")
    assert any("99 UAH" in n and "277 UAH" in n for n in notices)


async def test_a_repair_that_claims_too_much_again_gets_the_fallback(db_url: str,
                                                                     sql: Any) -> None:
    lie = {"output": {"reply": LIE}, "repair": {"reply": "Only 150 UAH for you!"}}
    *_, result = await play(db_url, [GREET, PROFILE, lie], "Hi", "Sphynx, dry skin",
                            "What do you recommend?")
    assert result.fallback and result.reply == FALLBACK
    assert [(c["kind"], c["attempt"]) for c in result.reply_claims] == [
        ("price", 0), ("discount", 0), ("price", 1)]
    [(fallback, error)] = sql("SELECT fallback, error FROM funnel_turns ORDER BY id DESC "
                              "LIMIT 1")
    assert fallback and "150 UAH" in error


async def test_the_report_counts_the_refused_claims_per_stage(db_url: str) -> None:
    from engine.report.build import build_report, render_table

    lie = {"output": {"reply": LIE}, "repair": {"reply": "Only 150 UAH for you!"}}
    await play(db_url, [GREET, PROFILE, lie], "Hi", "Sphynx, dry skin", "Recommend?")
    report = await build_report(PURAMUR, db=db_url)
    assert [(c["stage"], c["kind"], c["refused"], c["turns"], c["fallback_turns"])
            for c in report["claims"]] == [("presentation", "price", 2, 1, 1),
                                           ("presentation", "discount", 1, 1, 1)]
    assert "Claims refused" in render_table(report)


async def test_an_order_confirmed_with_an_empty_cart_is_refused_and_the_effects_stand(
        db_url: str, sql: Any) -> None:
    """The words are replaced; what code allowed of the answer (the pet's age) stays."""
    confirm = {"reply": "Your request has been approved. Confirming order.",
               "updates": {"pet": {"age_years": 3}}}
    *_, result = await play(db_url, [GREET, PROFILE, confirm], "Hi", "Sphynx, dry skin",
                            "She is 3")
    assert result.fallback and {c["name"] for c in result.reply_claims} == {"order_confirmed"}
    [(pet,)] = sql("SELECT pet FROM puramur_sessions_state")
    assert pet["age_years"] == 3


async def test_a_total_is_checked_on_the_cart_the_turn_leaves(db_url: str) -> None:
    """"Added: your cart is 554 UAH" is true only after the turn's add_to_cart."""
    show = {"reply": f"{TRUE} Shall I add it?",
            "actions": [{"type": "present_products", "skus": ["PR251010"]}]}
    take = {"reply": "Added two bottles: your cart is 554 UAH; add 446 UAH more for a gift.",
            "actions": [{"type": "add_to_cart", "sku": "PR251010", "qty": 2}]}
    wrong = {"reply": "Done, your cart is 600 UAH.", "actions": [
        {"type": "add_to_cart", "sku": "PR251010", "qty": 1}]}
    *_, added, refused = await play(
        db_url, [GREET, PROFILE, show, take, {"output": wrong, "repair": wrong}],
        "Hi", "Sphynx, dry skin", "Recommend?", "Two please", "One more")
    assert added.reply_claims == [] and added.reply.startswith("Added two bottles")
    assert refused.fallback and refused.reply_claims[0]["text"] == "600 UAH"
    assert "831" in refused.reply_claims[0]["expected"]  # the cart's total after the turn
    assert refused.state["cart_total"] == 831  # the add stood; only the words were replaced


async def test_offline_streaming_ends_with_the_text_that_was_sent(db_url: str) -> None:
    events = Events()
    lie = {"output": {"reply": LIE}, "repair": {"reply": TRUE}}
    *_, result = await play(db_url, [GREET, PROFILE, lie], "Hi", "Sphynx, dry skin",
                            "Recommend?", stream=events)
    assert "replace" in events.kinds and LIE[:20] in "".join(t for _, t in events)
    assert events.shown == result.reply == TRUE


async def test_a_stage_can_turn_the_check_off(tmp_path: Any, db_url: str) -> None:
    import yaml
    from conftest import puramur_data

    data = puramur_data()
    data["stages"]["presentation"]["claims"] = {"check": False}
    path = tmp_path / "puramur.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False))
    model = ScriptedModel.from_data({"turns": [GREET, PROFILE, {"reply": LIE}]})
    async with await Engine.open(path, db=db_url, model=model) as engine:
        for text in ("Hi", "Sphynx, dry skin"):
            await engine.handle(SID, text)
        result = await engine.handle(SID, "Recommend?")
    assert result.reply == LIE and result.reply_claims == []


# -- the real litellm HTTP path, streamed ------------------------------------------------

async def test_a_streamed_reply_with_a_false_price_is_replaced_over_http(
        db_url: str, sql: Any) -> None:
    with FakeProvider("openai") as fake:
        engine = await open_engine(PURAMUR, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            for output in (GREET, PROFILE, {"reply": LIE}, {"reply": TRUE}):
                fake.reply(json.dumps(output))
            await engine.handle(SID, "Hi")
            await engine.handle(SID, "Sphynx, dry skin")
            events = Events()
            result = await engine.handle(SID, "Recommend?", stream=events)
        finally:
            await engine.close()
        repair = fake.requests[-1]
    assert events.shown == result.reply == TRUE
    assert events.kinds.count("replace") >= 1
    said = repair["messages"][-1]["content"]
    assert "99 UAH" in said and "277 UAH" in said and "50%" in said
    [_, _, record] = claims(sql)
    assert [c["kind"] for c in record] == ["price", "discount"]
