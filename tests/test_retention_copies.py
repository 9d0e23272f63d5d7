"""Every copy of the customer's words follows retention, or holds none of them.

After `funnel purge --anonymize` (issue 40): a manager's rejection note is anonymized in
``funnel_control_events``; the studio drops the prompts it kept in memory for the
prompt panel; and a scenario saved from the studio never held the customer's name,
pet's name or phone (placeholders, engine.scenarios.placeholders), yet replays green.
Real parts: the studio and the engine on a real PostgreSQL schema, `funnel purge` and
`funnel test` as the CLI runs them.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import run_funnel
from projects import copy_puramur

from engine import Engine
from engine.funnel.compiled import load_funnel
from engine.llm.models import ScriptedModel
from engine.scenarios.placeholders import without_personal
from engine.studio import Studio
from engine.turn import manager

pytestmark = [pytest.mark.postgres]
DEMO = Path(__file__).resolve().parent.parent / "funnels" / "puramur" / "demo.yaml"

NAME, SURNAME, PET, STREET = "Olena", "Petrenko", "Мурка", "Хрещатик"
SAID = [  # what the customer types, and the model's answer (the page's "I am the model")
    (f"Hi! I am {NAME} {SURNAME}, my cat is called {PET}",
     {"reply": f"Hello {NAME}! What worries you about {PET}?", "language": "en",
      "updates": {"customer": {"name": f"{NAME} {SURNAME}"},
                  "pet": {"type": "cat", "name": PET}}}),
    ("Мурку itches, her skin is very dry; she is a Sphynx",
     {"reply": f"Poor {PET}! A Sphynx needs gentle care.",
      "updates": {"pet": {"problems": ["dry_skin"], "breed": "Sphynx"}}}),
]


def _purge(funnel: Path, db: str, *extra: str) -> None:
    time.sleep(1.2)  # idle for longer than the period below
    done = run_funnel("purge", str(funnel), "--older-than", "1s", *extra, "--db", db)
    assert done.returncode == 0, done


async def test_the_saved_scenario_holds_placeholders_and_replays(db_url: str, tmp_path: Path
                                                                ) -> None:
    funnel = copy_puramur(tmp_path)
    studio = await Studio.open([funnel], db=db_url)
    try:
        for text, answer in SAID:
            view = await studio.turn("puramur", "p1", text, answer=answer)
            assert not view["result"]["fallback"], view["result"]
        assert view["state"]["customer"]["name"] == f"{NAME} {SURNAME}"  # grounded, kept
        assert view["state"]["pet"]["name"] == PET
        saved = await studio.save_scenario("puramur", "p1", "with-placeholders")
    finally:
        await studio.close()
    text = Path(saved["file"]).read_text("utf-8")
    assert text == saved["yaml"]
    for word in (NAME, SURNAME, "Мурк", "мурк"):
        assert word not in text, word
    assert saved["placeholders"] >= 7
    scenario = yaml.safe_load(text)
    first = scenario["turns"][0]
    assert first["customer"] == "Hi! I am Redacted1 Redacted2, my cat is called Redacted3"
    assert first["llm"]["updates"]["customer"]["name"] == "Redacted1 Redacted2"
    assert scenario["turns"][1]["customer"].startswith("Redacted3 itches")  # "Мурку", inflected
    # The placeholders ground as the words did: the scenario replays green.
    replay = run_funnel("test", saved["file"], "--db", db_url)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert replay.stdout.strip().endswith("1 passed, 0 failed")


def test_a_whole_sale_saved_from_the_studio_replays_without_name_or_phone(
        db_url: str, tmp_path: Path) -> None:
    """The demo's sale (a pet's name, then the customer's name and phone at checkout),
    played on the real engine and opened from the studio's sessions list, saved."""
    funnel = copy_puramur(tmp_path)
    demo = yaml.safe_load(DEMO.read_text("utf-8"))
    chat = run_funnel("chat", str(funnel), "--model", f"scripted:{DEMO}", "--session", "d1",
                      "--db", db_url, stdin="\n".join(demo["customer"]) + "\n")
    assert chat.returncode == 0, chat.stderr

    async def save() -> dict[str, Any]:
        studio = await Studio.open([funnel], db=db_url)
        try:
            return await studio.save_scenario("puramur", "d1")
        finally:
            await studio.close()

    saved = asyncio.run(save())
    text = saved["yaml"]
    for personal in ("Anna", "Murka", "123 45 67", "661234567"):
        assert personal not in text, personal
    assert "customer: Redacted2, 066 555 00 01" in text and saved["turns"] == len(demo["customer"])
    replay = run_funnel("test", saved["file"], "--db", db_url)
    assert replay.returncode == 0, replay.stdout + replay.stderr


def test_a_phone_and_an_address_become_placeholders_on_both_sides(tmp_path: Path) -> None:
    spec = load_funnel(copy_puramur(tmp_path)).spec
    scenario: dict[str, Any] = {"scenario": "s", "funnel": "../../puramur.yaml", "turns": [
        {"customer": f"{NAME}, 066 123 45 67, вул. {STREET} 22",
         "llm": {"reply": "Thanks!", "updates": {"customer": {
             "name": NAME, "phone": "+380661234567",
             "delivery_address": f"вул. {STREET} 22"}}},
         "expect": {"stage": "contact_collection"}}]}
    out, replaced = without_personal(spec, scenario)
    turn = out["turns"][0]
    assert turn["customer"] == "Redacted1, 066 555 00 01, Redacted2. Redacted3 22"
    assert turn["llm"]["updates"]["customer"] == {
        "name": "Redacted1", "phone": "+380665550001", "delivery_address": "Redacted2. Redacted3 22"}
    assert turn["expect"] == {"stage": "contact_collection"} and replaced == 8
    assert scenario["turns"][0]["customer"].startswith(NAME)  # the input is left as it was


def test_free_text_is_replaced_whole_and_its_common_words_stay(tmp_path: Path) -> None:
    """An objection's detail (personal, not grounded: the model's words, which may quote
    the customer) is replaced where it occurs whole; "call" and "manager", which the
    hand-off's `confirm:` phrases read in the customer's words, stay everywhere else."""
    spec = load_funnel(copy_puramur(tmp_path)).spec
    detail = f"too expensive for {NAME}'s budget"
    scenario: dict[str, Any] = {"scenario": "s", "funnel": "../../puramur.yaml", "turns": [
        {"customer": f"Hmm, {detail}. Call me, I want a manager",
         "llm": {"reply": "I will call a manager.", "actions": [
             {"type": "record_objection", "objection": "price", "detail": detail},
             {"type": "request_handoff", "reason": "explicit_request"}]},
         "expect": {"stage": "handoff"}}]}
    state = {"customer": {"name": NAME},
             "objections_raised": [{"objection": "price", "detail": detail}]}
    out, replaced = without_personal(spec, scenario, [state])
    turn = out["turns"][0]
    assert turn["customer"] == "Hmm, RedactedText1. Call me, I want a manager"
    assert turn["llm"]["actions"][0]["detail"] == "RedactedText1"
    assert turn["llm"]["reply"] == "I will call a manager." and replaced == 2


@pytest.mark.parametrize("anonymize", [True, False])
async def test_a_purge_reaches_the_studio_prompts_in_memory(db_url: str, tmp_path: Path,
                                                            anonymize: bool) -> None:
    funnel = copy_puramur(tmp_path)
    studio = await Studio.open([funnel], db=db_url)
    try:
        for session in ("p1", "p2"):
            await studio.turn("puramur", session, SAID[0][0], answer=SAID[0][1])
        view = await studio.view("puramur", "p1")
        assert any(NAME in m["content"] for s in view["prompt"] for m in s["messages"])
        assert studio.model.sent("p1") and studio.model.sent("p2")
        await asyncio.to_thread(_purge, funnel, db_url, *(["--anonymize"] if anonymize else []))
        # Read: the session's prompts are dropped before they are shown.
        view = await studio.view("puramur", "p1")
        assert view["prompt"] == [] and studio.model.sent("p1") == []
        # Not read: the studio's watcher drops them too (its look, run here at once).
        assert studio.model.sent("p2")
        assert await studio.forget_retired() == ["p2"]
        assert studio.model.kept() == []
        # A session still live keeps its prompts.
        await studio.turn("puramur", "p3", SAID[0][0], answer=SAID[0][1])
        assert await studio.forget_retired() == [] and studio.model.kept() == ["p3"]
    finally:
        await studio.close()


async def test_a_first_turn_in_flight_keeps_its_prompt(db_url: str, tmp_path: Path) -> None:
    """The watcher's look while a new session's first turn waits for its model (prompt
    sent, no row saved yet) leaves that prompt alone."""
    funnel = copy_puramur(tmp_path)
    slow = tmp_path / "slow.yaml"
    slow.write_text(yaml.safe_dump({"delay": 1.0, "default": SAID[0][1]}), "utf-8")
    studio = await Studio.open([funnel], db=db_url)
    try:
        turn = asyncio.create_task(studio.turn("puramur", "f1", SAID[0][0],
                                               model=f"scripted:{slow}"))
        while not studio.model.sent("f1"):
            await asyncio.sleep(0.02)
        assert await studio.forget_retired() == []
        view = await turn
        assert view["prompt"] and studio.model.kept() == ["f1"]
    finally:
        await studio.close()


HOLD = "A manager checks this and confirms in a few minutes."


async def test_a_rejection_note_is_anonymized(db_url: str, tmp_path: Path, sql: Any) -> None:
    path = copy_puramur(tmp_path)
    data = yaml.safe_load(path.read_text("utf-8"))
    data["stages"]["discovery"]["approval"] = {
        "when": "pet.type == 'cat'", "timeout": "15m", "on_timeout": "reject", "holding_reply": HOLD,
        "reason": "cats need the vet's word"}
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    model = ScriptedModel.from_data({"default": {
        "reply": "A cat!", "updates": {"pet": {"type": "cat"}}}})
    async with await Engine.open(path, db=db_url, model=model) as engine:
        assert (await engine.handle("r1", "I have a cat")).approval == "discovery"
        await manager.reject(engine, "r1", "Taras", f"{NAME} {SURNAME} sent no vet record")
    note = "SELECT event, manager, detail->>'note' FROM funnel_control_events WHERE " \
           "session_id = 'r1' AND event = 'rejected'"
    assert sql(note) == [("rejected", "Taras", f"{NAME} {SURNAME} sent no vet record")]
    await asyncio.to_thread(_purge, path, db_url, "--anonymize")
    assert sql(note) == [("rejected", "Taras", "[anonymized]")]
    assert sql("SELECT count(*) FROM funnel_control_events WHERE detail::text LIKE %s",
               (f"%{SURNAME}%",)) == [(0,)]
