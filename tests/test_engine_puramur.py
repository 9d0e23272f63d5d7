"""The turn engine end to end on the Puramur funnel, a real PostgreSQL and the scripted model.

Every test drives :class:`engine.turn.engine.Engine` the way an integration would
(``handle`` one customer message at a time) and checks what the engine decided:
the stage, the state row, the cart, the prompt the model saw, the turn record,
the message log and the handoff outbox.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import CliResult, run_funnel, said

from engine.errors import FunnelError
from engine.funnel.compiled import CompiledFunnel, load_funnel
from engine.llm.models import Completion, ModelRequest, ScriptedModel
from engine.records.messages import estimate_tokens
from engine.scenarios.run import prompt_messages
from engine.sync import SyncEngine
from engine.turn.engine import Engine, TurnResult

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
DEMO = ROOT / "funnels" / "puramur" / "demo.yaml"
TABLE = "puramur_sessions_state"
STAGES = ["greeting", "discovery", "presentation", "objection_handling", "cart_building",
          "contact_collection", "handoff"]

# -- scripted model outputs that walk a session along the funnel ------------------------
GREET = {"reply": "Hello! I'm the Puramur consultant. Is your pet a cat or a dog?"}
PROFILE = {  # 25 type + 25 problems + 25 breed = 75 -> presentation
    "reply": "Sphynx skin needs gentle care. How old is she?",
    "updates": {"pet": {"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"]}},
}
SHOW = {
    "reply": "I recommend Exotic Spa shampoo and Exotic Spa moisturising lotion.",
    "actions": [{"type": "present_products", "skus": ["PR251010", "PR251020"]}],
}
CONFIRM = {"reply": "Great! Your name and phone, please?", "actions": [{"type": "confirm_cart"}]}
CONTACT = {"reply": "Thank you, Anna!",
           "updates": {"customer": {"name": "Anna", "phone": "066 123 45 67"}}}
OK = {"reply": "Of course."}


def add(sku: str, qty: int | None = None, reply: str = "Added.") -> dict[str, Any]:
    action: dict[str, Any] = {"type": "add_to_cart", "sku": sku}
    if qty is not None:
        action["qty"] = qty
    return {"reply": reply, "actions": [action]}


def remove(sku: str, qty: int | None = None) -> dict[str, Any]:
    action: dict[str, Any] = {"type": "remove_from_cart", "sku": sku}
    if qty is not None:
        action["qty"] = qty
    return {"reply": "Removed.", "actions": [action]}


# -- test doubles -----------------------------------------------------------------------
class Clock:
    """Real time plus an adjustable offset.

    The engine writes ``last_message_at`` with this clock, so a step between two
    messages is the idle gap the engine sees at the second one.
    """

    def __init__(self) -> None:
        self.offset = timedelta(0)
        self.calls: list[datetime] = []

    def __call__(self) -> datetime:
        now = datetime.now(UTC) + self.offset
        self.calls.append(now)
        return now

    def advance(self, **delta: float) -> None:
        self.offset += timedelta(**delta)


class Notifier:
    """Records every handoff payload; raises while ``fail`` is set."""

    def __init__(self, *, fail: bool = False) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail = fail

    async def __call__(self, payload: Mapping[str, Any]) -> None:
        self.calls.append(dict(payload))
        if self.fail:
            raise RuntimeError("CRM is down")


class RecordingModel:
    """Wraps a model and keeps every request, so tests can read the rendered prompts."""

    def __init__(self, inner: ScriptedModel) -> None:
        self.inner = inner
        self.name = inner.name
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> Completion:
        self.requests.append(request)
        return await self.inner.complete(request)

    def first_calls(self, session_id: str) -> list[ModelRequest]:
        return [r for r in self.requests if r.session_id == session_id and r.attempt == 0]

    def prompt(self, session_id: str, turn: int) -> str:
        """The prompt of the session's N-th turn (1-based) before the window: the static
        system message, the summary, the turn part, the notices (engine.turn.budget.assemble)."""
        [request] = [r for r in self.first_calls(session_id) if r.turn == turn]
        assert request.messages[0]["role"] == "system"
        return "\n".join(m["content"] for m in prompt_messages(request.messages))


@dataclasses.dataclass
class Harness:
    engine: Engine
    model: RecordingModel
    notifier: Notifier
    clock: Clock

    async def say(self, session_id: str, *texts: str, step: timedelta | None = None
                  ) -> list[TurnResult]:
        """Send messages one by one; the clock moves ``step`` (1 minute) before each."""
        out = []
        for text in texts:
            self.clock.offset += step if step is not None else timedelta(minutes=1)
            out.append(await self.engine.handle(session_id, text))
            await self.engine.drain()  # the handoff alert goes out after the reply
        return out

    async def state(self, session_id: str) -> dict[str, Any]:
        row = await self.engine.state(session_id)
        assert row is not None
        return row


Factory = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def make(db_url: str, puramur: CompiledFunnel) -> AsyncIterator[Factory]:
    """Open engines on the test's schema; every one is closed at the end."""
    engines: list[Engine] = []

    async def factory(script: Mapping[str, Any] | list[Any], *,
                      funnel: CompiledFunnel | None = None,
                      notifier: Notifier | None = None) -> Harness:
        data = {"turns": script} if isinstance(script, list) else script
        model = RecordingModel(ScriptedModel.from_data(data))
        notifier = notifier or Notifier()
        clock = Clock()
        engine = await Engine.open(funnel or puramur, db=db_url, model=model,
                                   notifier=notifier, clock=clock)
        engines.append(engine)
        return Harness(engine, model, notifier, clock)

    yield factory
    for engine in engines:
        await engine.close()


@pytest.fixture(scope="module")
def permissive() -> CompiledFunnel:
    """Puramur with output schemas that accept any ``{reply, ...}`` object.

    The stage schemas are the first guard; this funnel shows that the engine's
    own checks (allowed updates, engine-owned fields, catalog prices, quantity
    limits, phone numbers) hold even when an output gets past the schema.
    """
    funnel = load_funnel(PURAMUR)
    loose = jsonschema.Draft202012Validator({"type": "object", "required": ["reply"]})
    for name, stage in list(funnel.stages.items()):
        funnel.stages[name] = dataclasses.replace(stage, validator=loose)
    return funnel


def seed_score(pet: Mapping[str, Any], customer: Mapping[str, Any]) -> int:
    """The seed's completeness formula, written out independently of the funnel file."""
    return (25 * bool(pet.get("type")) + 25 * bool(pet.get("problems"))
            + 25 * bool(pet.get("breed")) + 15 * (pet.get("age_years") is not None)
            + 5 * bool(pet.get("name")) + 5 * bool(customer.get("name")))


def when(value: str) -> datetime:
    return datetime.fromisoformat(value)


def run_cli(*args: str, db_url: str, stdin: str | None = None) -> CliResult:
    return run_funnel(*args, env={"FUNNEL_DB": db_url, "FUNNEL_MODEL": None}, stdin=stdin or "")


# -- a new session -----------------------------------------------------------------------
async def test_new_session_starts_with_defaults_in_greeting(make: Factory, sql: Any) -> None:
    h = await make([GREET, OK])
    assert await h.engine.state("s1") is None

    [first] = await h.say("s1", "Hi!")
    request = h.model.first_calls("s1")[0]
    assert request.turn == 1 and request.stage == "greeting"
    # the static prefix, the turn part, the message: empty history
    assert [m["role"] for m in request.messages] == ["system", "system", "user"]
    assert request.messages[2]["content"] == "Hi!"
    assert "Stage: greeting." in request.messages[0]["content"]
    assert "Greet the customer" in request.messages[0]["content"]
    assert first.reply == GREET["reply"] and not first.fallback
    assert (first.stage_before, first.stage_after) == ("greeting", "discovery")
    assert first.transitions == [{"from": "greeting", "to": "discovery", "trigger": "advance",
                                  "when": None}]

    state = await h.state("s1")
    assert state["stage"] == "discovery" and state["stage_iteration"] == 0
    assert state["turns"] == 1 and state["row_version"] == 1
    assert state["customer"] == {} and state["pet"] == {}
    assert state["discovery_completeness"] == 0
    assert state["presented_products"] == [] and state["objections_raised"] == []
    assert state["cart"] == [] and state["cart_total"] == 0 and state["cart_item_count"] == 0
    assert state["cart_gift_eligible"] is False and state["cart_free_delivery"] is False
    # "Hi!" is too short to tell: the detected language keeps its default, and the
    # reply (English, any of the declared languages was accepted) sets the response's.
    assert state["detected_language"] == "uk" and state["response_language"] == "en"
    assert state["conversation_summary"] == ""
    assert state["handoff_triggered_at"] is None and state["handoff_reason"] is None
    assert state["handoff_channel"] is None
    assert state["notices"] == [] and state["funnel_version"] == 1

    [second] = await h.say("s1", "A cat")
    request = h.model.first_calls("s1")[1]
    assert request.stage == "discovery" and "Stage: discovery." in request.messages[0]["content"]
    # Discovery's facts change every turn: its turn part follows the recent messages.
    assert [m["role"] for m in request.messages] == ["system", "user", "assistant", "system",
                                                     "user"]
    assert request.messages[1:3] == [{"role": "user", "content": "Hi!"},
                                     {"role": "assistant", "content": GREET["reply"]}]
    assert (second.stage_before, second.stage_after) == ("discovery", "discovery")
    assert (await h.state("s1"))["stage_iteration"] == 1
    assert sql(f"SELECT count(*) FROM {TABLE}") == [(1,)]


# -- discovery completeness ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("updates", "stage"),
    [
        ({"pet": {"type": "cat", "problems": ["dry_skin"]}}, "discovery"),  # 50
        ({"pet": {"type": "cat", "problems": ["dry_skin"], "name": "Murka"}}, "discovery"),  # 55
        ({"pet": {"type": "cat", "problems": ["dry_skin"], "name": "Murka"},
          "customer": {"name": "Anna"}}, "presentation"),  # 60: the threshold itself
        ({"pet": {"type": "dog", "problems": ["odor"], "breed": "Beagle"}}, "presentation"),  # 75
        ({"pet": {"age_years": 0, "name": "Rex"}, "customer": {"name": "Ann"}}, "discovery"),  # 25
        ({"pet": {"type": "dog", "breed": "Pug", "age_years": 2, "problems": ["odor"],
                  "name": "Rex"}, "customer": {"name": "Ann"}}, "presentation"),  # 100
    ],
)
async def test_completeness_follows_the_seed_formula(make: Factory, updates: dict[str, Any],
                                                     stage: str) -> None:
    h = await make([GREET, {"reply": "Noted.", "updates": updates}])
    _, result = await h.say("s1", "Hi", "Facts: Murka, Anna, Rex, Ann")  # grounded names
    expected = seed_score(updates.get("pet", {}), updates.get("customer", {}))
    state = await h.state("s1")
    assert state["discovery_completeness"] == expected
    assert result.stage_after == stage
    assert (expected >= 60) == (stage == "presentation")


async def test_discovery_moves_to_presentation_when_the_score_reaches_60(make: Factory) -> None:
    h = await make([
        GREET,
        {"reply": "A cat with dry skin. Which breed?",
         "updates": {"pet": {"type": "cat", "problems": ["dry_skin"]}}},
        {"reply": "A Sphynx!", "updates": {"pet": {"breed": "Sphynx"}}},  # merged, not replaced
        {"reply": "Murka, 3 years.", "updates": {"pet": {"age_years": 3, "name": "Murka"}}},
    ])
    _, fifty, seventy_five, ninety_five = await h.say("s1", "Hi", "Cat, dry skin", "Sphynx",
                                                      "Murka, 3")
    assert fifty.stage_after == "discovery" and fifty.state["discovery_completeness"] == 50
    assert fifty.updated == ["pet"] and not fifty.transitions
    assert "Profile completeness: 50/100" in h.model.prompt("s1", 3)
    assert seventy_five.state["discovery_completeness"] == 75
    assert (seventy_five.stage_before, seventy_five.stage_after) == ("discovery", "presentation")
    assert seventy_five.transitions == [{"from": "discovery", "to": "presentation",
                                         "trigger": "advance",
                                         "when": "discovery_completeness >= 60"}]
    state = await h.state("s1")
    assert state["pet"] == {"type": "cat", "problems": ["dry_skin"], "breed": "Sphynx",
                            "age_years": 3, "name": "Murka"}
    assert ninety_five.stage_after == "presentation"
    assert state["discovery_completeness"] == 95 == seed_score(state["pet"], state["customer"])


# -- the model cannot write what the engine owns -----------------------------------------
@pytest.mark.parametrize("updates", [{"stage": "handoff"}, {"cart_total": 1},
                                     {"handoff_reason": "explicit_request"},
                                     {"discovery_completeness": 100}])
async def test_engine_owned_fields_fail_the_stage_schema(make: Factory, sql: Any,
                                                         updates: dict[str, Any]) -> None:
    bad = {"reply": "Done, you are with a manager now.", "updates": updates}
    h = await make([GREET, {"output": bad, "repair": bad}])
    await h.say("s1", "Hi")
    before = await h.state("s1")
    [result] = await h.say("s1", "Put me through")

    assert result.fallback and not result.repaired and result.validation_failures == 2
    assert result.reply == said(h.engine.funnel.stage("discovery").spec.fallback, result.state)
    assert result.error and "additional" in result.error.lower()
    repair = [r for r in h.model.requests if r.attempt == 1]
    assert len(repair) == 1
    assert repair[0].messages[-1]["role"] == "user"
    assert "rejected" in repair[0].messages[-1]["content"]
    assert repair[0].messages[-2] == {"role": "assistant", "content": json.dumps(bad)}

    after = await h.state("s1")
    kept = [*h.engine.spec.state, "stage", "stage_history", "notices", "funnel_version"]
    assert {k: after[k] for k in kept} == {k: before[k] for k in kept}
    assert after["stage"] == "discovery" and after["cart_total"] == 0
    assert after["handoff_reason"] is None and after["discovery_completeness"] == 0
    assert sql("SELECT fallback, validation_failures, repaired FROM funnel_turns "
               "ORDER BY id DESC LIMIT 1") == [(True, 2, False)]


async def test_a_valid_repair_is_used(make: Factory) -> None:
    h = await make([GREET, {"output": {"reply": "x", "updates": {"stage": "handoff"}},
                            "repair": {"reply": "A dog, noted.",
                                       "updates": {"pet": {"type": "dog"}}}}])
    _, result = await h.say("s1", "Hi", "A dog")
    assert result.repaired and not result.fallback and result.validation_failures == 1
    assert result.reply == "A dog, noted."
    state = await h.state("s1")
    assert state["stage"] == "discovery" and state["pet"] == {"type": "dog"}


async def test_the_engine_ignores_fields_a_stage_may_not_update(make: Factory,
                                                              permissive: CompiledFunnel) -> None:
    sneaky = {
        "reply": "Sure.",
        "updates": {
            "stage": "handoff", "stage_iteration": 7, "cart_total": 1, "cart": [{"sku": "X"}],
            "discovery_completeness": 100, "handoff_reason": "complaint",
            "handoff_triggered_at": "2020-01-01T00:00:00+00:00",
            "presented_products": [{"sku": "PR251010"}], "undeclared": 1,
            "customer": {"name": "Anna"}, "pet": {"type": "dog"},
        },
    }
    presentation_update = {"reply": "Noted.", "updates": {"customer": {"name": "Bob"},
                                                          "pet": {"name": "Rex"}}}
    h = await make([GREET, sneaky, PROFILE, presentation_update, OK], funnel=permissive)
    _, result = await h.say("s1", "Hi", "Hack. I am Anna")  # a grounded name
    assert not result.fallback and result.updated == ["customer", "pet"]
    for name in ("stage", "stage_iteration", "cart_total", "cart", "discovery_completeness",
                 "handoff_reason", "handoff_triggered_at", "presented_products", "undeclared"):
        assert f"the field '{name}' cannot be updated at this stage" in result.notices
    state = await h.state("s1")
    assert state["stage"] == "discovery" and state["stage_iteration"] == 1
    assert state["cart"] == [] and state["cart_total"] == 0
    assert state["presented_products"] == []
    assert state["handoff_reason"] is None and state["handoff_triggered_at"] is None
    assert state["discovery_completeness"] == 30  # computed: 25 type + 5 customer name
    assert state["customer"] == {"name": "Anna"} and state["pet"] == {"type": "dog"}

    # presentation lets the model update the pet, not the customer
    await h.say("s1", "Cat, Sphynx, dry skin")
    assert "the field 'stage' cannot be updated" in h.model.prompt("s1", 3)
    [result] = await h.say("s1", "I'm Bob, the cat is Rex")
    assert result.stage_before == "presentation" and result.updated == ["pet"]
    assert "the field 'customer' cannot be updated at this stage" in result.notices
    state = await h.state("s1")
    assert state["customer"] == {"name": "Anna"} and state["pet"]["name"] == "Rex"


@pytest.mark.parametrize("bad", [{"reply": "x", "updates": ["pet"]},
                                 {"reply": "x", "actions": ["present_products"]},
                                 {"reply": "x", "actions": "present_products"}])
async def test_a_malformed_envelope_is_repaired_not_a_crash(
        make: Factory, permissive: CompiledFunnel, bad: dict[str, Any]) -> None:
    # A schema that passes `funnel validate` need not type `updates` or the action items.
    good = {"reply": "A cat, noted.", "updates": {"pet": {"type": "cat"}}}
    h = await make([GREET, {"output": bad, "repair": good}, {"output": bad, "repair": bad}],
                   funnel=permissive)
    _, repaired, failed = await h.say("s1", "Hi", "A cat", "Hm")
    assert repaired.repaired and repaired.reply == "A cat, noted."
    repair = [r for r in h.model.requests if r.attempt == 1][0]
    assert "must be" in repair.messages[-1]["content"]
    assert failed.fallback and failed.actions == [] and failed.updated == []
    assert (await h.state("s1"))["pet"] == {"type": "cat"}


# -- presenting products ---------------------------------------------------------------
async def test_presented_products_are_recorded_in_order_without_duplicates(
        make: Factory) -> None:
    again = {"reply": "Also Calm Skin shampoo.",
             "actions": [{"type": "present_products", "skus": ["PR251020", "PR260100"]}]}
    h = await make([GREET, PROFILE, SHOW, again, OK])
    results = await h.say("s1", "Hi", "Sphynx, dry skin", "What do you recommend?",
                          "Anything else?", "Thanks")
    show_time, again_time = h.clock.calls[2], h.clock.calls[3]
    assert results[2].stage_before == "presentation"
    assert [(o.type, o.accepted) for o in results[2].actions] == [("present_products", True)]

    state = await h.state("s1")
    assert state["presented_products"] == [
        {"sku": "PR251010", "presented_at": show_time.isoformat(), "stage_iteration": 0},
        {"sku": "PR251020", "presented_at": show_time.isoformat(), "stage_iteration": 0},
        {"sku": "PR260100", "presented_at": again_time.isoformat(), "stage_iteration": 1},
    ]

    def recommended(prompt: str) -> list[str]:
        # The catalog is in the static prefix; what the model may choose now is in the turn.
        [line] = [x for x in prompt.splitlines() if x.startswith("Products you may recommend")]
        return line.split(": ", 1)[1].rstrip(".").split(", ")

    first = h.model.prompt("s1", 3)
    assert "Already shown" not in first
    assert {"PR251010", "PR251020", "PR260100"} <= set(recommended(first))
    assert not {"PR280500", "PR100999"} & set(recommended(first))  # dog-only; the gift

    second = h.model.prompt("s1", 4)
    assert "1. PR251010 Exotic Spa shampoo: 277 UAH" in second
    assert "2. PR251020 Exotic Spa moisturising lotion: 420 UAH" in second
    assert second.index("1. PR251010") < second.index("2. PR251020")
    assert not {"PR251010", "PR251020"} & set(recommended(second))
    assert "PR260100" in recommended(second)

    third = h.model.prompt("s1", 5)
    assert "3. PR260100 Calm Skin hypoallergenic shampoo: 310 UAH" in third
    assert not {"PR251010", "PR251020", "PR260100"} & set(recommended(third))


async def test_the_first_one_resolves_to_the_first_presented_sku(make: Factory) -> None:
    take = add("PR251010", 2, reply="Two Exotic Spa shampoos at 277 UAH each, done!")
    h = await make([GREET, PROFILE, SHOW, take, OK])
    *_, result, _ = await h.say("s1", "Hi", "Sphynx, dry skin", "Recommend?",
                                "I'll take the first one, two bottles", "Good")
    prompt = h.model.prompt("s1", 4)
    assert "1. PR251010 Exotic Spa shampoo" in prompt and "2. PR251020" in prompt
    assert '"The first one"' in prompt
    assert [(o.type, o.args, o.accepted) for o in result.actions] == \
        [("add_to_cart", {"sku": "PR251010", "qty": 2}, True)]
    assert (result.stage_before, result.stage_after) == ("presentation", "cart_building")

    state = await h.state("s1")
    [line] = state["cart"]
    assert {k: line[k] for k in ("sku", "name", "price", "qty", "line_total")} == \
        {"sku": "PR251010", "name": "Exotic Spa shampoo", "price": 277, "qty": 2,
         "line_total": 554}
    assert "is_gift" not in line and line["added_at"] == h.clock.calls[3].isoformat()
    assert state["cart_total"] == 554 and state["cart_item_count"] == 2
    cart_prompt = h.model.prompt("s1", 5)
    assert "- PR251010 Exotic Spa shampoo x2 = 554 UAH" in cart_prompt
    assert "Total: 554 UAH." in cart_prompt and "Add 446 UAH more for a free gift." in cart_prompt


async def test_catalog_prices_win_over_the_model(make: Factory,
                                                 permissive: CompiledFunnel) -> None:
    cheap = {"reply": "Yours for 1 UAH!", "actions": [
        {"type": "add_to_cart", "sku": "PR290600", "qty": 1, "price": 1, "name": "Free kit",
         "line_total": 1}]}
    h = await make([GREET, PROFILE, cheap], funnel=permissive)
    *_, result = await h.say("s1", "Hi", "Sphynx", "The kit for 1 UAH?")
    assert result.actions[0].accepted
    state = await h.state("s1")
    assert [(x["sku"], x["name"], x["price"], x["line_total"]) for x in state["cart"]] == [
        ("PR290600", "Professional grooming kit", 1250, 1250),
        ("PR100999", "Brilliant Gloss (gift)", 0, 0)]
    assert state["cart_total"] == 1250


# -- refused actions ------------------------------------------------------------------------
async def test_an_unknown_sku_is_refused_and_the_model_is_told(make: Factory, sql: Any) -> None:
    h = await make([GREET, PROFILE, add("PR251010"), add("PR000000"), OK, OK])
    results = await h.say("s1", "Hi", "Sphynx", "The shampoo", "And PR000000", "Hm?", "Ok")
    refused = results[3]
    [outcome] = refused.actions
    assert outcome.type == "add_to_cart" and outcome.accepted is False
    assert outcome.reason is not None and "PR000000" in outcome.reason
    assert refused.stage_after == "cart_building" and not refused.fallback
    assert refused.state["notices"] == [f"add_to_cart refused: {outcome.reason}"]
    state = await h.state("s1")
    assert [(x["sku"], x["qty"]) for x in state["cart"]] == [("PR251010", 1)]
    assert state["cart_total"] == 277 and state["cart_item_count"] == 1
    assert state["notices"] == []  # cleared once the model was told

    assert "PR000000" not in h.model.prompt("s1", 4)
    told = h.model.prompt("s1", 5)
    assert f"<data>\nNotes from the business (it refused these last turn):\n- add_to_cart " \
        f"refused: {outcome.reason}" in told
    assert "PR000000" not in h.model.prompt("s1", 6)  # told once
    assert sql("SELECT actions, refused FROM funnel_turns ORDER BY id")[3] == (
        [], [{"type": "add_to_cart", "reason": outcome.reason}])


@pytest.mark.parametrize("qty", [0, 99])
async def test_a_bad_quantity_fails_the_schema(make: Factory, qty: int) -> None:
    bad = add("PR251020", qty)
    h = await make([GREET, PROFILE, add("PR251010"), {"output": bad, "repair": bad}])
    *_, result = await h.say("s1", "Hi", "Sphynx", "The shampoo", f"{qty} lotions")
    assert result.fallback and result.actions == []
    state = await h.state("s1")
    assert [(x["sku"], x["qty"]) for x in state["cart"]] == [("PR251010", 1)]


@pytest.mark.parametrize("qty", [0, 99, -1, True, "2", 2.5])
async def test_a_bad_quantity_is_refused_by_the_engine(make: Factory, permissive: CompiledFunnel,
                                                       qty: Any) -> None:
    h = await make([GREET, PROFILE, add("PR251010"), add("PR251020", qty), OK],
                   funnel=permissive)
    *_, result, _ = await h.say("s1", "Hi", "Sphynx", "The shampoo", "Lotions", "Ok")
    [outcome] = result.actions
    assert outcome.accepted is False and "quantity" in (outcome.reason or "")
    assert repr(qty) in (outcome.reason or "")
    state = await h.state("s1")
    assert [(x["sku"], x["qty"]) for x in state["cart"]] == [("PR251010", 1)]
    assert state["cart_total"] == 277
    assert f"add_to_cart refused: {outcome.reason}" in h.model.prompt("s1", 5)


async def test_the_quantity_limit_holds_across_turns(make: Factory) -> None:
    h = await make([GREET, PROFILE, add("PR251010", 15), add("PR251010", 10),
                    add("PR251010", 5)])
    *_, too_many, exactly = await h.say("s1", "Hi", "Sphynx", "15", "10 more", "5 more")
    assert too_many.actions[0].accepted is False
    assert "at most 20 of PR251010" in (too_many.actions[0].reason or "")
    assert too_many.state["cart_item_count"] == 15
    assert exactly.actions[0].accepted
    state = await h.state("s1")
    assert [(x["sku"], x["qty"], x["line_total"]) for x in state["cart"] if not x.get("is_gift")] \
        == [("PR251010", 20, 5540)]


async def test_removing_a_sku_not_in_the_cart_is_refused(make: Factory) -> None:
    h = await make([GREET, PROFILE, add("PR251010"), remove("PR251020"), OK])
    *_, result, _ = await h.say("s1", "Hi", "Sphynx", "The shampoo", "Drop the lotion", "Ok")
    [outcome] = result.actions
    assert (outcome.type, outcome.accepted) == ("remove_from_cart", False)
    assert outcome.reason == "'PR251020' is not in the cart"
    assert [x["sku"] for x in (await h.state("s1"))["cart"]] == ["PR251010"]
    assert "remove_from_cart refused: 'PR251020' is not in the cart" in h.model.prompt("s1", 5)


async def test_the_gift_cannot_be_added_by_the_model(make: Factory) -> None:
    h = await make([GREET, PROFILE, add("PR251010"), add("PR100999")])
    *_, result = await h.say("s1", "Hi", "Sphynx", "The shampoo", "And the free gift")
    assert result.actions[0].accepted is False and "gift" in (result.actions[0].reason or "")
    assert [x["sku"] for x in (await h.state("s1"))["cart"]] == ["PR251010"]


# -- cart totals, gift and free delivery ------------------------------------------------
async def test_gift_and_free_delivery_follow_the_cart_total(make: Factory) -> None:
    # Detangling spray costs 250: 3 -> 750, 4 -> 1000 (gift), 6 -> 1500 (free delivery).
    h = await make([GREET, PROFILE, add("PR270300", 3), add("PR270300", 1),
                    add("PR270300", 2), remove("PR270300", 1), remove("PR270300", 2), OK])
    results = await h.say("s1", "Hi", "Sphynx", "3 sprays", "one more", "two more",
                          "one less", "two less", "ok")
    expected = [  # (total, count, gift, free delivery) after turns 3..7
        (750, 3, False, False), (1000, 4, True, False), (1500, 6, True, True),
        (1250, 5, True, False), (750, 3, False, False)]
    gift_added = None
    for result, (total, count, gift, free) in zip(results[2:7], expected, strict=True):
        s = result.state
        assert all(o.accepted for o in result.actions)
        assert (s["cart_total"], s["cart_item_count"]) == (total, count)
        assert (s["cart_gift_eligible"], s["cart_free_delivery"]) == (gift, free)
        [line] = [x for x in s["cart"] if not x.get("is_gift")]
        assert (line["sku"], line["qty"], line["line_total"]) == ("PR270300", count, total)
        gifts = [x for x in s["cart"] if x.get("is_gift")]
        if gift:
            [g] = gifts
            assert {k: g[k] for k in ("sku", "name", "price", "qty", "line_total")} == {
                "sku": "PR100999", "name": "Brilliant Gloss (gift)", "price": 0, "qty": 1,
                "line_total": 0}
            gift_added = gift_added or g["added_at"]
            assert g["added_at"] == gift_added  # kept, not re-added every turn
        else:
            assert gifts == []
    state = await h.state("s1")
    assert state["cart_total"] == 750 and not state["cart_gift_eligible"]
    assert [x["sku"] for x in state["cart"]] == ["PR270300"]

    with_gift = h.model.prompt("s1", 5)  # the cart is 1000 when turn 5 starts
    assert "- PR100999 Brilliant Gloss (gift) x1 = 0 UAH (gift)" in with_gift
    assert "The free gift is in the cart." in with_gift
    assert "Free delivery from 1500 UAH (500 to go)." in with_gift
    assert "Delivery is free." in h.model.prompt("s1", 6)


async def test_a_customer_who_changes_their_mind(make: Factory) -> None:
    swap = {"reply": "Swapped the shampoo for the lotion.", "actions": [
        {"type": "remove_from_cart", "sku": "PR251010"},
        {"type": "add_to_cart", "sku": "PR251020"}]}
    h = await make([GREET, PROFILE, SHOW, add("PR251010"), swap])
    *_, result = await h.say("s1", "Hi", "Sphynx", "Recommend?", "The shampoo",
                             "Actually, the lotion instead")
    assert [(o.type, o.accepted) for o in result.actions] == [("remove_from_cart", True),
                                                               ("add_to_cart", True)]
    state = await h.state("s1")
    assert [(x["sku"], x["name"], x["qty"], x["line_total"]) for x in state["cart"]] == \
        [("PR251020", "Exotic Spa moisturising lotion", 1, 420)]
    assert state["cart_total"] == 420 and state["cart_item_count"] == 1
    assert state["stage"] == "cart_building"


# -- objections -------------------------------------------------------------------------
async def test_the_manager_is_offered_after_three_rounds_of_objections(make: Factory) -> None:
    objection = {"reply": "I understand.", "actions": [
        {"type": "record_objection", "objection": "price"}]}
    doubt = {"reply": "It lasts three months."}
    agree = {"reply": "Connecting you.", "actions": [
        {"type": "request_handoff", "reason": "explicit_request"}]}
    h = await make([GREET, PROFILE, SHOW, objection, doubt, doubt, doubt, agree])
    results = await h.say("s1", "Hi", "Sphynx", "Recommend?", "Expensive!", "Still expensive",
                          "Hmm", "Really?", "OK, a person please")
    entered = results[3]
    assert (entered.stage_before, entered.stage_after) == ("presentation", "objection_handling")
    assert entered.state["stage_iteration"] == 0
    assert entered.state["objections_raised"] == [
        {"objection": "price", "stage": "presentation",
         "recorded_at": h.clock.calls[3].isoformat()}]

    offer = "gently offer to connect the customer with a real person"
    for turn, result in zip((5, 6, 7), results[4:7], strict=True):
        rounds = turn - 4
        prompt = h.model.prompt("s1", turn)
        assert "Stage: objection_handling." in prompt
        assert f"(round {rounds})" in prompt and offer not in prompt
        assert "Objections so far: price." in prompt
        assert result.stage_after == "objection_handling"
        assert result.state["stage_iteration"] == rounds
    fourth = h.model.prompt("s1", 8)
    assert offer in fourth and "(round 4)" in fourth
    final = results[7]
    assert final.stage_after == "handoff" and final.handoff
    assert final.state["handoff_reason"] == "explicit_request"


# -- handoff ------------------------------------------------------------------------------
@pytest.mark.parametrize("reason", ["explicit_request", "complaint"])
async def test_a_request_for_a_manager_hands_off_from_discovery(make: Factory, sql: Any,
                                                                reason: str) -> None:
    ask = {"reply": "Connecting you with a manager.",
           "actions": [{"type": "request_handoff", "reason": reason}]}
    h = await make([GREET, ask])
    await h.say("s1", "Hi")
    result = await h.engine.handle("s1", "I want a person", channel="telegram")
    await h.engine.drain()  # the alert goes out after the reply
    assert (result.stage_before, result.stage_after) == ("discovery", "handoff")
    assert result.handoff and result.transitions[0]["to"] == "handoff"
    assert result.transitions[0]["when"] == f"handoff_requested == '{reason}'"
    state = await h.state("s1")
    assert state["stage"] == "handoff" and state["handoff_reason"] == reason
    assert when(state["handoff_triggered_at"]) == h.clock.calls[-1]
    assert state["handoff_channel"] == "telegram"
    [payload] = h.notifier.calls
    assert payload["event"] == "handoff" and payload["session_id"] == "s1"
    assert payload["channel"] == "telegram" and payload["funnel"] == "puramur"
    assert payload["state"]["handoff_reason"] == reason
    assert payload["idempotency_key"] == "puramur:s1:handoff"
    assert sql("SELECT count(*) FROM funnel_outbox WHERE delivered_at IS NOT NULL") == [(1,)]


async def path_to_contact(make: Factory, *more: Any, **kw: Any) -> Harness:
    h = await make([GREET, PROFILE, add("PR251010"), CONFIRM, *more], **kw)
    results = await h.say("s1", "Hi", "Sphynx", "The shampoo", "That's all")
    assert results[-1].stage_after == "contact_collection"
    return h


async def test_contact_collection_checks_the_phone(make: Factory) -> None:
    too_short = {"reply": "Thanks!", "updates": {"customer": {"name": "Anna", "phone": "12"}}}
    invalid = {"reply": "Thanks!", "updates": {"customer": {"name": "Anna", "phone": "12 34"}}}
    h = await path_to_contact(make, {"output": too_short, "repair": too_short}, invalid,
                              CONTACT)
    [short] = await h.say("s1", "Anna, 12")
    assert short.fallback and short.stage_after == "contact_collection"
    [repair] = [r for r in h.model.requests if r.attempt == 1]
    assert "phone" in repair.messages[-1]["content"]  # the repair call says what was wrong
    state = await h.state("s1")
    assert state["customer"] == {}

    [bad] = await h.say("s1", "Anna, 12 34")
    assert bad.stage_after == "contact_collection" and bad.updated == ["customer"]
    notice = "'12 34' is not a valid phone number for customer.phone; it was not saved"
    # libphonenumber's verdict, with an example of the field's region (engine.format.phones).
    assert len(bad.notices) == 1 and bad.notices[0].startswith(notice)
    assert "a number of UA" in bad.notices[0]
    state = await h.state("s1")
    assert state["customer"] == {"name": "Anna"} and state["handoff_triggered_at"] is None
    assert h.notifier.calls == []

    [good] = await h.say("s1", "Anna, 066 123 45 67")
    prompt = h.model.prompt("s1", 7)
    assert notice in prompt and "a phone number;" in prompt and "customer's name;" not in prompt
    assert good.stage_after == "handoff" and good.handoff
    state = await h.state("s1")
    assert state["customer"] == {"name": "Anna", "phone": "+380661234567"}
    assert state["handoff_reason"] == "cart_confirmed"
    assert good.transitions == [{"from": "contact_collection", "to": "handoff",
                                 "trigger": "advance", "when": "customer.name and customer.phone"}]
    assert len(h.notifier.calls) == 1


async def test_a_five_digit_number_is_not_a_phone(make: Factory) -> None:
    five = {"reply": "Thanks!", "updates": {"customer": {"name": "Anna", "phone": "12345"}}}
    h = await path_to_contact(make, five)
    [result] = await h.say("s1", "Anna, 12345")
    state = await h.state("s1")
    assert state["customer"] == {"name": "Anna"}
    assert result.stage_after == "contact_collection" and h.notifier.calls == []


async def test_an_invalid_phone_that_passes_the_schema_is_not_stored(
        make: Factory, permissive: CompiledFunnel) -> None:
    short = {"reply": "Thanks!", "updates": {"customer": {"phone": "12"}}}
    h = await path_to_contact(make, short, OK, funnel=permissive)
    [result] = await h.say("s1", "12")
    assert result.updated == [] and result.stage_after == "contact_collection"
    assert (await h.state("s1"))["customer"] == {}
    await h.say("s1", "?")
    assert "'12' is not a valid phone number for customer.phone" in h.model.prompt("s1", 6)


async def test_the_manager_is_notified_once(make: Factory, sql: Any) -> None:
    update_address = {"reply": "Noted the address.",
                      "updates": {"customer": {"delivery_address": "Kyiv, Khreshchatyk 1"}}}
    h = await path_to_contact(make, CONTACT, OK, update_address, OK)
    [handoff] = await h.say("s1", "Anna, 066 123 45 67")
    assert handoff.handoff and handoff.stage_after == "handoff"
    triggered = (await h.state("s1"))["handoff_triggered_at"]
    assert when(triggered) == h.clock.calls[4]

    later = await h.say("s1", "Thanks!", "Deliver to Kyiv, Khreshchatyk 1", "When?",
                        step=timedelta(minutes=30))
    assert [r.handoff for r in later] == [False, False, False]
    assert all(r.stage_before == r.stage_after == "handoff" for r in later)
    assert len(h.notifier.calls) == 1
    assert h.notifier.calls[0]["state"]["customer"] == {"name": "Anna",
                                                        "phone": "+380661234567"}
    assert h.notifier.calls[0]["state"]["cart_total"] == 277
    state = await h.state("s1")
    assert state["handoff_triggered_at"] == triggered  # write-once
    assert state["handoff_reason"] == "cart_confirmed"
    assert state["customer"]["delivery_address"] == "Kyiv, Khreshchatyk 1"
    for turn in (6, 7, 8):
        prompt = h.model.prompt("s1", turn)
        assert "Stage: handoff." in prompt
        assert "A manager already has this conversation." in prompt
        assert "The manager (reason: cart_confirmed)" in prompt
        assert "will contact Anna at +380661234567" in prompt
    rows = sql("SELECT session_id, kind, attempts, delivered_at IS NOT NULL, last_error "
               "FROM funnel_outbox")
    assert rows == [("s1", "handoff", 1, True, None)]
    assert await h.engine.dispatch() == 0


async def test_a_failing_notifier_does_not_fail_the_turn(make: Factory, sql: Any) -> None:
    notifier = Notifier(fail=True)
    h = await path_to_contact(make, CONTACT, OK, notifier=notifier)
    [result] = await h.say("s1", "Anna, 066 123 45 67")
    assert result.handoff and result.stage_after == "handoff" and result.reply == CONTACT["reply"]
    assert len(notifier.calls) == 1
    [(delivered, error, attempts, due_later)] = sql(
        "SELECT delivered_at, last_error, attempts, next_attempt_at > now() FROM funnel_outbox")
    assert delivered is None and error == "RuntimeError: CRM is down"
    assert attempts == 1 and due_later is True
    assert (await h.state("s1"))["stage"] == "handoff"

    await h.say("s1", "Hello?")  # a later message neither re-enqueues nor re-sends
    assert await h.engine.dispatch() == 0  # not due yet
    assert len(notifier.calls) == 1

    notifier.fail = False
    sql("UPDATE funnel_outbox SET next_attempt_at = now()")
    assert await h.engine.dispatch() == 1
    assert await h.engine.dispatch() == 0
    assert len(notifier.calls) == 2 and notifier.calls[1]["session_id"] == "s1"
    assert sql("SELECT count(*), bool_and(delivered_at IS NOT NULL), max(attempts), "
               "max(last_error) FROM funnel_outbox") == [(1, True, 2, None)]


async def test_concurrent_messages_of_one_session_are_serialised(make: Factory,
                                                                   sql: Any) -> None:
    h = await make({"default": OK})
    results = await asyncio.gather(*(h.engine.handle("s1", f"message {i}") for i in range(4)),
                                   h.engine.handle("s2", "other"))
    assert all(r.reply == OK["reply"] for r in results)
    state = await h.state("s1")
    assert state["turns"] == 4
    assert sorted(r.state["turns"] for r in results[:4]) == [1, 2, 3, 4]
    assert sql("SELECT session_id, count(*) FROM funnel_turns GROUP BY 1 ORDER BY 1") == [
        ("s1", 4), ("s2", 1)]
    assert sql("SELECT count(*) FROM funnel_messages WHERE session_id = 's1'") == [(8,)]


# -- language and returning customers ------------------------------------------------------
async def test_the_customers_language_is_detected_in_code(make: Factory) -> None:
    # Puramur follows the customer among uk, ru, en, pl: the model's `language` is ignored.
    h = await make([{"reply": "Cześć! Jestem konsultantem Puramur. Kot czy pies?",
                     "language": "en"}, OK, {"reply": "Hi", "language": "en"}])
    [first, second, third] = await h.say("s1", "Cześć! Mam pytanie o kota", "Mam kota", "Hi")
    assert first.state["detected_language"] == "pl" and first.state["response_language"] == "pl"
    assert second.state["detected_language"] == "pl"
    assert 'language with ISO 639-1 code "pl"' in h.model.prompt("s1", 2)
    state = await h.state("s1")  # "Hi" tells nothing: the session keeps Polish
    assert state["detected_language"] == "pl" and state["response_language"] == "pl"
    assert third.reply == "Hi" and not third.fallback


async def test_a_customer_returning_after_the_idle_gap(make: Factory) -> None:
    h = await make({"default": OK})
    await h.say("s1", "Hi", step=timedelta(0))
    [soon] = await h.say("s1", "A cat", step=timedelta(hours=5))
    assert soon.returning is False and "is back after" not in h.model.prompt("s1", 2)
    # last_message_at is written with the engine's clock, so the gap is the step
    [back] = await h.say("s1", "I'm back", step=timedelta(hours=7))
    assert back.returning is True
    prompt = h.model.prompt("s1", 3)
    assert "The customer is back after 7 hour(s) away" in prompt
    assert back.stage_after == "discovery"


# -- records and analytics ---------------------------------------------------------------
async def test_stage_history_and_the_seed_funnel_query(make: Factory, sql: Any) -> None:
    demo = ScriptedModel.from_file(DEMO)
    lines = ["Hi!", "I have a Sphynx cat, her skin is very dry",
             "She is 3, her name is Murka. What would you recommend?",
             "Hmm, isn't that expensive?",
             "OK, I'll take the first one, and two bottles of the lotion",
             "Yes, that's everything", "Anna, 066 123 45 67", "Thank you!"]
    h = await make({"turns": [e.output for e in demo.turns]})
    await h.say("demo-1", *lines, step=timedelta(minutes=2))
    await h.say("other", "Hi")  # a second session that only got to discovery

    state = await h.state("demo-1")
    history = state["stage_history"]
    assert [e["stage"] for e in history] == STAGES
    for entry, following in zip(history, history[1:], strict=False):
        assert set(entry) == {"stage", "entered_at", "exited_at"}
        assert entry["exited_at"] == following["entered_at"]
        assert when(entry["entered_at"]) <= when(entry["exited_at"])
    assert set(history[-1]) == {"stage", "entered_at"}
    assert when(history[0]["entered_at"]) == h.clock.calls[0]
    assert state["cart_total"] == 1117 and state["cart_gift_eligible"] is True
    assert state["handoff_reason"] == "cart_confirmed"

    reached = sql(f"""
        WITH stages_reached AS (
            SELECT session_id, ARRAY_AGG(DISTINCT h->>'stage') AS stages,
                   stage AS current_stage, handoff_triggered_at
            FROM {TABLE}, jsonb_array_elements(stage_history) h
            WHERE created_at > NOW() - INTERVAL '7 days'
            GROUP BY session_id, stage, handoff_triggered_at)
        SELECT
            COUNT(*) FILTER (WHERE 'greeting' = ANY(stages)),
            COUNT(*) FILTER (WHERE 'discovery' = ANY(stages)),
            COUNT(*) FILTER (WHERE 'presentation' = ANY(stages)),
            COUNT(*) FILTER (WHERE 'cart_building' = ANY(stages)),
            COUNT(*) FILTER (WHERE handoff_triggered_at IS NOT NULL)
        FROM stages_reached WHERE session_id = 'demo-1'""")
    assert reached == [(1, 1, 1, 1, 1)]
    per_stage = dict(sql(f"""
        SELECT h->>'stage', COUNT(DISTINCT session_id)
        FROM {TABLE}, jsonb_array_elements(stage_history) h GROUP BY 1"""))
    assert per_stage == {"greeting": 2, "discovery": 2, "presentation": 1,
                         "objection_handling": 1, "cart_building": 1, "contact_collection": 1,
                         "handoff": 1}
    durations = sql(f"""
        SELECT h->>'stage', (h->>'exited_at')::timestamptz - (h->>'entered_at')::timestamptz
        FROM {TABLE}, jsonb_array_elements(stage_history) WITH ORDINALITY h(h, n)
        WHERE session_id = 'demo-1' AND h ? 'exited_at' ORDER BY n""")
    assert [d[0] for d in durations] == STAGES[:-1]
    assert all(d[1] >= timedelta(0) for d in durations)


async def test_every_turn_is_recorded(make: Factory, sql: Any) -> None:
    mixed = {"reply": "Here you go.", "actions": [
        {"type": "present_products", "skus": ["PR251010"]},
        {"type": "add_to_cart", "sku": "PR000000"}]}
    h = await make([GREET, PROFILE, "this is not JSON", mixed, add("PR251010")])
    results = await h.say("s1", "Hi", "Sphynx", "?", "Show me", "Buy it")
    rows = sql("SELECT session_id, stage_before, stage_after, transitions, actions, refused, "
               "validation_failures, repaired, fallback, prompt_tokens, completion_tokens, "
               "model, error, funnel_version FROM funnel_turns ORDER BY id")
    assert len(rows) == len(results) == 5
    for row, result in zip(rows, results, strict=True):
        assert row[0] == "s1" and (row[1], row[2]) == (result.stage_before, result.stage_after)
        assert row[3] == result.transitions
        assert row[9] > 0 and row[10] > 0
        assert (row[9], row[10]) == (result.prompt_tokens, result.completion_tokens)
        assert row[11] == "scripted" and row[13] == 1
    assert [(r[1], r[2]) for r in rows] == [
        ("greeting", "discovery"), ("discovery", "presentation"),
        ("presentation", "presentation"), ("presentation", "presentation"),
        ("presentation", "cart_building")]
    assert [r[4] for r in rows] == [[], [], [], ["present_products"], ["add_to_cart"]]
    assert rows[3][5] == [{"type": "add_to_cart", "reason": results[3].actions[1].reason}]
    assert [r[5] for r in rows[:3]] == [[], [], []]
    assert [(r[6], r[7], r[8]) for r in rows] == [
        (0, False, False), (0, False, False), (2, False, True), (0, False, False),
        (0, False, False)]
    assert rows[2][12] and "not valid JSON" in rows[2][12]
    assert [r[12] for r in rows if r is not rows[2]] == [None] * 4
    # the scripted model's token counts are the documented estimate of what it was sent
    first = h.model.first_calls("s1")[0]
    assert rows[0][9] == estimate_tokens(first.messages)
    fallback_calls = [r for r in h.model.requests if r.turn == 3]
    assert len(fallback_calls) == 2
    assert rows[2][9] == sum(estimate_tokens(r.messages) for r in fallback_calls)


async def test_every_message_is_logged_with_its_stage(make: Factory, sql: Any) -> None:
    h = await make([GREET, PROFILE, SHOW])
    texts = ["Hi", "A Sphynx cat with dry skin", "What do you have?"]
    await h.say("s1", *texts)
    rows = sql("SELECT role, content, stage FROM funnel_messages WHERE session_id = 's1' "
               "ORDER BY id")
    assert rows == [
        ("user", "Hi", "greeting"), ("assistant", GREET["reply"], "discovery"),
        ("user", texts[1], "discovery"), ("assistant", PROFILE["reply"], "presentation"),
        ("user", texts[2], "presentation"), ("assistant", SHOW["reply"], "presentation"),
    ]
    assert sql("SELECT DISTINCT funnel FROM funnel_messages") == [("puramur",)]


@pytest.mark.parametrize(("session_id", "text"), [
    ("x" * 201, "Hi"), ("s1", "x" * 8001), ("", "Hi"), ("s\x001", "Hi"), ("s1", "a\x00b")])
async def test_bad_input_raises_and_writes_nothing(make: Factory, sql: Any, session_id: str,
                                                   text: str) -> None:
    h = await make({"default": OK})
    with pytest.raises(FunnelError):
        await h.engine.handle(session_id, text)
    assert h.model.requests == []
    for table in ("funnel_messages", "funnel_turns", "funnel_outbox", TABLE):
        assert sql(f"SELECT count(*) FROM {table}") == [(0,)]


async def test_the_longest_allowed_session_id_is_accepted(make: Factory, sql: Any) -> None:
    h = await make({"default": OK})
    result = await h.engine.handle("x" * 200, "Hi")
    assert result.reply == OK["reply"]
    assert sql(f"SELECT length(session_id) FROM {TABLE}") == [(200,)]


async def test_a_message_over_the_prompt_budget_is_asked_to_be_shortened(make: Factory,
                                                                        sql: Any) -> None:
    # 8000 characters are allowed, but do not fit puramur's 1000-token prompt budget:
    # the customer is asked to shorten it (memory.too_long_reply), and the turn record
    # names the stage and sizes.
    h = await make({"default": OK})
    result = await h.engine.handle("s1", "y" * 8000)
    assert result.fallback and result.reply == said(h.engine.spec.memory.too_long_reply)
    assert "скоротити" in result.reply and h.model.requests == []  # uk: a new session
    assert "stage 'greeting'" in (result.error or "") and "budget of 1000" in (result.error or "")
    assert sql("SELECT length(content) FROM funnel_messages WHERE role = 'user'") == [(8000,)]
    assert sql("SELECT fallback, error LIKE '%budget%' FROM funnel_turns") == [(True, True)]


# -- the sync wrapper and the CLI -------------------------------------------------------
def test_the_sync_engine(db_url: str, puramur: CompiledFunnel) -> None:
    notifier = Notifier()
    model = ScriptedModel.from_data({"turns": [GREET, PROFILE]})
    with SyncEngine(puramur, db=db_url, model=model, notifier=notifier, clock=Clock()) as sync:
        first = sync.handle("s1", "Hi")
        second = sync.handle("s1", "Sphynx, dry skin", channel="telegram")
        state = sync.state("s1")
        assert sync.state("nobody") is None
    assert (first.stage_after, second.stage_after) == ("discovery", "presentation")
    assert state is not None and state["stage"] == "presentation" and state["turns"] == 2
    assert state["discovery_completeness"] == 75 and notifier.calls == []
    # On uvloop (the test extras install it with uvicorn[standard]): a cheaper turn.
    assert type(sync._loop).__module__.startswith("uvloop")


async def test_the_sync_engine_from_a_thread(db_url: str, puramur: CompiledFunnel) -> None:
    def run() -> dict[str, Any] | None:
        model = ScriptedModel.from_data({"default": OK})
        with SyncEngine(puramur, db=db_url, model=model) as sync:
            sync.handle("t1", "Hi")
            return sync.state("t1")

    state = await asyncio.to_thread(run)
    assert state is not None and state["stage"] == "discovery"


def test_cli_demo(db_url: str) -> None:
    done = run_cli("demo", db_url=db_url)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for source, dest in zip(STAGES, STAGES[1:], strict=False):
        assert f"[stage] {source} -> {dest}" in out
    assert "gift: True" in out and "handoff: cart_confirmed" in out
    assert "[handoff] the manager was notified" in out
    assert "final stage: handoff" in out and "Traceback" not in done.stderr


def test_cli_chat_then_state(db_url: str) -> None:
    script = ScriptedModel.from_file(DEMO)
    lines = ["Hi!", "I have a Sphynx cat, her skin is very dry", "",
             "She is 3, her name is Murka. What would you recommend?"]
    chat = run_cli("chat", "funnels/puramur.yaml", "--model",
                   "scripted:funnels/puramur/demo.yaml", "--db", db_url, "--session", "s1",
                   db_url=db_url, stdin="\n".join(lines) + "\n")
    assert chat.returncode == 0, chat.stderr
    replies = chat.stdout.splitlines()
    assert replies == [str(e.output["reply"]) for e in script.turns[:3]]  # blank lines skipped

    state = run_cli("state", "funnels/puramur.yaml", "s1", "--db", db_url, "--history",
                    db_url=db_url)
    assert state.returncode == 0, state.stderr
    row = json.loads(state.stdout)
    assert row["stage"] == "presentation" and row["session_id"] == "s1"
    assert row["handoff_channel"] is None and row["turns"] == 3
    assert [m["role"] for m in row["messages"]] == ["user", "assistant"] * 3
    assert [m["content"] for m in row["messages"][::2]] == [x for x in lines if x]
    assert row["messages"][1]["stage"] == "discovery"

    missing = run_cli("state", "funnels/puramur.yaml", "nobody", "--db", db_url, db_url=db_url)
    assert missing.returncode == 1 and missing.stdout == ""
    assert "no session 'nobody'" in missing.stderr and "Traceback" not in missing.stderr


# -- on_enter ----------------------------------------------------------------------------
async def test_on_enter_actions_run_for_the_initial_stage_and_on_transitions(
        make: Factory, sql: Any) -> None:
    # Puramur declares no on_enter; give greeting and discovery one each.
    funnel = load_funnel(PURAMUR)
    for name in ("greeting", "discovery"):
        stage = funnel.stages[name]
        spec = dataclasses.replace(stage.spec, on_enter=(
            {"type": "record_objection", "objection": f"entered {name}"},))
        funnel.stages[name] = dataclasses.replace(stage, spec=spec)
    h = await make({"default": OK}, funnel=funnel)
    [first] = await h.say("s1", "Hi")
    assert first.stage_after == "discovery"
    state = await h.state("s1")
    entered = [o["objection"] for o in state["objections_raised"]]
    assert entered == ["entered greeting", "entered discovery"]
    assert [o["stage"] for o in state["objections_raised"]] == ["greeting", "discovery"]
    await h.say("s1", "More")  # staying in discovery runs nothing again
    assert len((await h.state("s1"))["objections_raised"]) == 2


class SlowNotifier(Notifier):
    """A manager webhook that takes its time."""

    async def __call__(self, payload: Mapping[str, Any]) -> None:
        await asyncio.sleep(1.5)
        await super().__call__(payload)


async def test_a_slow_manager_alert_never_delays_the_reply(make: Factory, sql: Any) -> None:
    ask = {"reply": "Connecting you with a manager.",
           "actions": [{"type": "request_handoff", "reason": "explicit_request"}]}
    notifier = SlowNotifier()
    h = await make([GREET, ask], notifier=notifier)
    await h.say("s1", "Hi")
    started = time.perf_counter()
    result = await h.engine.handle("s1", "I want a person")
    assert result.handoff and time.perf_counter() - started < 1.0
    assert notifier.calls == []  # still on its way
    await h.engine.drain()
    assert len(notifier.calls) == 1
    assert sql("SELECT count(*) FROM funnel_outbox WHERE delivered_at IS NOT NULL") == [(1,)]


# -- explanations --------------------------------------------------------------------------
def test_chat_and_state_explain_why_a_session_moved_or_stayed(db_url: str, sql: Any) -> None:
    lines = ["Hi!", "I have a Sphynx cat, her skin is very dry"]
    chat = run_cli("chat", "funnels/puramur.yaml", "--model",
                   "scripted:funnels/puramur/demo.yaml", "--db", db_url, "--session", "why",
                   "--explain", db_url=db_url, stdin="\n".join(lines) + "\n")
    assert chat.returncode == 0, chat.stderr
    assert len(chat.stdout.splitlines()) == 2  # stdout stays one reply per line
    why = [x for x in chat.stderr.splitlines() if x.startswith("  [why] ")]
    # Turn 1: greeting -> discovery, where nothing is known yet. Turn 2: type, problems
    # and breed give 75 points, past the 60 that presentation needs; there nothing holds.
    assert why == [
        "  [why] greeting -> handoff (global): `handoff_requested == 'complaint'` was false: "
        "handoff_requested=null",
        "  [why] greeting -> handoff (global): `handoff_requested == 'explicit_request'` was "
        "false: handoff_requested=null",
        "  [why] greeting -> discovery: always",
        "  [why] discovery -> handoff (global): `handoff_requested == 'complaint'` was false: "
        "handoff_requested=null",
        "  [why] discovery -> handoff (global): `handoff_requested == 'explicit_request'` was "
        "false: handoff_requested=null",
        "  [why] discovery -> presentation: `discovery_completeness >= 60` was false: "
        "discovery_completeness=0 (no rule holds)",
        "  [why] discovery -> handoff (global): `handoff_requested == 'complaint'` was false: "
        "handoff_requested=null",
        "  [why] discovery -> handoff (global): `handoff_requested == 'explicit_request'` was "
        "false: handoff_requested=null",
        "  [why] discovery -> presentation: `discovery_completeness >= 60` was true: "
        "discovery_completeness=75 (pet.type 25 + pet.problems 25 + pet.breed 25)",
        "  [why] presentation -> handoff (global): `handoff_requested == 'complaint'` was "
        "false: handoff_requested=null",
        "  [why] presentation -> handoff (global): `handoff_requested == 'explicit_request'` "
        "was false: handoff_requested=null",
        "  [why] presentation -> cart_building: `cart_item_count > 0` was false: "
        "cart_item_count=0",
        "  [why] presentation -> objection_handling: `'record_objection' in actions` was "
        "false: actions=[]",
    ]

    state = run_cli("state", "funnels/puramur.yaml", "why", "--explain", "--db", db_url,
                    db_url=db_url)
    assert state.returncode == 0, state.stderr
    row = json.loads(state.stdout)
    assert [(s["stage"], s["fired"]) for s in row["explain"]] == [
        ("discovery", "presentation"), ("presentation", None)]
    moved = [t for t in row["explain"][0]["transitions"] if not t.get("global")]
    assert moved == [{"to": "presentation", "when": "discovery_completeness >= 60", "held": True,
                      "values": {"discovery_completeness": 75},
                      "derived": {"discovery_completeness":
                                  "pet.type 25 + pet.problems 25 + pet.breed 25"}}]
    assert "discovery_completeness=75" in state.stderr
    # The turn records keep every explanation and the outputs the model gave.
    records = sql("SELECT explain, raw_output FROM funnel_turns WHERE session_id = 'why' "
                  "ORDER BY id")
    assert [[s["fired"] for s in r[0]] for r in records] == [
        ["discovery", None], ["presentation", None]]
    assert json.loads(records[0][1][0])["reply"].startswith("Hello! I'm the Puramur")
