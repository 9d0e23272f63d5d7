"""A recorded population of Puramur sessions for `funnel replay`: real engine turns.

:func:`record` plays the shipped scenarios that start from a new session (through the
scenario runner, on the engine) and ``n`` synthetic customers whose scripted model
answers follow the stage the engine put them in (the engine decides; the script only
proposes, as a model would): the turn records, messages, versions and orders are the
engine's own. The bench (bench/replay.py) and tests/test_evidence.py read it.
"""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path
from typing import Any

from engine.funnel.compiled import load_funnel
from engine.scenarios.load import load_scenario
from engine.scenarios.run import Runner, ScenarioModel
from engine.store import open_store
from engine.turn.engine import Engine

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
# The shipped scenarios that start from a new session, with no clock of their own.
SCENARIOS = ["happy_path.yaml", "manager_request.yaml", "ukrainian_sphynx.yaml"]

PETS = [("cat", "Sphynx", ["dry_skin"]), ("cat", "Persian", ["tangles", "shedding"]),
        ("dog", "Yorkie", ["dull_coat"]), ("dog", "Husky", ["shedding"]),
        ("dog", None, ["odor"]), ("cat", None, ["sensitive_skin"])]
SKUS = [("PR251010", 277), ("PR251020", 420), ("PR243587", 380), ("PR260200", 560),
        ("PR270400", 450), ("PR290600", 1250)]


def _output(stage: str, step: int, rng: random.Random, memo: dict[str, Any]
            ) -> tuple[str, dict[str, Any]]:
    """(the customer's message, the model's answer) for a customer now in ``stage``."""
    if rng.random() < 0.03 and stage not in ("handoff", "greeting"):
        return ("I want to talk to a manager", {"reply": "I'll connect you with a manager.",
                "actions": [{"type": "request_handoff", "reason": "explicit_request"}]})
    if stage == "greeting":
        return "Hi!", {"reply": "Hello! Is your pet a cat or a dog?", "language": "en"}
    if stage == "discovery":
        kind, breed, problems = memo.setdefault("pet", rng.choice(PETS))
        if "told" not in memo:
            memo["told"] = True
            pet: dict[str, Any] = {"type": kind, "problems": problems}
            if breed and rng.random() < 0.7:
                pet["breed"] = breed
            return (f"I have a {breed or kind}", {"reply": "Tell me more: age, name?",
                                                   "updates": {"pet": pet}})
        extra: dict[str, Any] = {"age_years": rng.randint(1, 12)}
        if rng.random() < 0.6:
            extra["name"] = rng.choice(["Murka", "Rex", "Bella", "Tom"])
        if breed and rng.random() < 0.5:
            extra["breed"] = breed
        return ("She is a few years old", {"reply": "Thanks! Anything else?",
                                           "updates": {"pet": extra}})
    if stage == "presentation":
        if "shown" not in memo:
            memo["shown"] = rng.sample(SKUS, 2)
            return ("What would you recommend?", {"reply": "I recommend these two.",
                    "actions": [{"type": "present_products",
                                 "skus": [s for s, _ in memo["shown"]]}]})
        if rng.random() < 0.3 and "objected" not in memo:
            memo["objected"] = True
            return ("Isn't that expensive?", {"reply": "It lasts three months.",
                    "actions": [{"type": "record_objection", "objection": "price"}]})
        return ("I'll take it", _add(rng, memo))
    if stage == "objection_handling":
        if rng.random() < 0.5:
            return ("OK, I'll take it", _add(rng, memo))
        return ("Still not sure", {"reply": "I understand.",
                "actions": [{"type": "record_objection", "objection": "doubt"}]})
    if stage == "cart_building":
        if rng.random() < 0.25:
            sku, _ = rng.choice(SKUS)
            return ("And one more", {"reply": "Added.", "actions": [
                {"type": "add_to_cart", "sku": sku, "qty": 1}]})
        return ("That's everything", {"reply": "Your name and phone?",
                                      "actions": [{"type": "confirm_cart"}]})
    if stage == "contact_collection":
        if "phone_first" not in memo and rng.random() < 0.25:
            memo["phone_first"] = True  # the number first, the name when asked
            return ("066 765 43 21", {"reply": "And your name?",
                                      "updates": {"customer": {"phone": "066 765 43 21"}}})
        phone = "066 123 45 67" if rng.random() < 0.85 else "12"
        return ("Anna, " + phone, {"reply": "Thank you, Anna!",
                                   "updates": {"customer": {"name": "Anna", "phone": phone}}})
    return "Thank you!", {"reply": "You're welcome!"}


def _add(rng: random.Random, memo: dict[str, Any]) -> dict[str, Any]:
    shown = memo.get("shown") or SKUS[:2]
    lines = [{"type": "add_to_cart", "sku": s, "qty": rng.randint(1, 2)}
             for s, _ in shown[:rng.randint(1, 2)]]
    return {"reply": "Added to your cart.", "actions": lines}


async def record(url: str, n: int = 40, seed: int = 7, turns: int = 10,
                 orders: bool = True, full: bool = False) -> list[str]:
    """Record the shipped scenarios and ``n`` synthetic sessions of up to ``turns`` turns
    (all ``turns`` with ``full``: no customer leaves early) on the database at ``url``
    (migrated here); return the session ids."""
    store = await open_store(url)
    ids: list[str] = []
    try:
        runner = Runner(store, "pop")
        for name in SCENARIOS:
            scenario, problems = load_scenario(ROOT / "funnels" / "puramur" / "scenarios" / name)
            assert scenario is not None, problems
            played = await runner.run(scenario)
            assert played.passed, played.failures
            ids.append(f"scenario-pop-{runner.sessions}")
        model = ScenarioModel()
        engine = await Engine.open(load_funnel(PURAMUR), store=store, model=model)
        rng = random.Random(seed)
        try:
            for i in range(n):
                sid, stage, memo = f"synthetic-{seed}-{i}", "greeting", {}
                for step in range(turns):
                    text, llm = _output(stage, step, rng, memo)
                    model.play(llm)
                    result = await engine.handle(sid, text, channel="replay-test")
                    stage = result.stage_after
                    # Some customers leave on the way; most stop soon after the hand-off.
                    if not full and rng.random() < (0.6 if stage == "handoff" else 0.06):
                        break
                state = await engine.state(sid)
                assert state is not None
                if orders and state["handoff_triggered_at"] and state["cart_total"]:
                    await engine.record_conversion(sid, f"ORD-{seed}-{i}",
                                                   Decimal(str(state["cart_total"])), "UAH")
                ids.append(sid)
            await engine.drain()
        finally:
            await engine.close()
    finally:
        await store.close()
    return ids
