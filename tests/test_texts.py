"""The texts the engine sends instead of the model, in the customer's language (issue 38).

Measured before: a Ukrainian customer of Puramur got English in 24 of 40 turns, because a
reply that failed the language check (and its repair) was replaced by the stage's
English-only fallback. Each text a customer can get from the engine (a stage's fallback,
the too-long reply, the technical reply, the hand-off and approval holding replies, the
Telegram notes) is now picked for the session's response language, else the funnel's
default; `funnel validate` names every missing translation (F704) and every language a
text gives that the funnel does not declare (F705). On the real engine, a real PostgreSQL
and the scripted model.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import B2B, PURAMUR, run_funnel
from projects import copy_puramur
from service_support import FakeTelegram
from starlette.testclient import TestClient

from engine import Engine
from engine.errors import Diagnostic
from engine.format.texts import FALLBACK, TECHNICAL, TOO_LONG, Localized
from engine.funnel.compiled import load_funnel
from engine.llm.models import ScriptedModel
from engine.service.app import create_app
from engine.service.config import ServiceConfig, TelegramBot
from engine.service.telegram import POLITE
from engine.turn import manager
from engine.turn.language import detect
from engine.validation.runner import check_file

pytestmark = pytest.mark.postgres

LANGS = ("uk", "ru", "en", "pl")
# A Russian reply, decidedly so (its letters and words): never right for a Ukrainian
# customer, whatever the repair says.
RU_REPLY = "Здравствуйте! Для кошки с сухой кожей подойдёт этот шампунь, вы будете довольны."
UK_REPLY = "Вітаю! Для кішки із сухою шкірою підійде цей шампунь, ви будете задоволені."
EN_REPLY = "Hello! For a cat with dry skin this shampoo is a good choice, you will like it."
PL_REPLY = "Dzień dobry! Dla kota z suchą skórą polecam ten szampon, będziesz zadowolona."
# The customer's messages, each decidedly in its language (the session follows them).
UK_MESSAGES = [
    "Привіт! У мене кішка, їй три роки, і в неї суха шкіра",
    "Що порадите для сухої шкіри?",
    "Вона британська, дуже линяє взимку",
    "А скільки коштує цей шампунь?",
    "Дякую, я ще подумаю і напишу вам",
    "Чи є у вас щось дешевше?",
]
CUSTOMER = {
    "uk": "Привіт! У мене кішка, їй три роки, і в неї суха шкіра",
    "ru": "Здравствуйте! У меня кошка, ей три года, и у неё сухая кожа",
    "en": "Hello, I have a question about my cat, her skin is very dry",
    "pl": "Dzień dobry, mam kotkę brytyjską, bardzo linieje i ma suchą skórę",
}
# A reply each customer must not get: in another of Puramur's languages.
WRONG = {"uk": RU_REPLY, "ru": UK_REPLY, "en": PL_REPLY, "pl": EN_REPLY}
RIGHT = {"uk": UK_REPLY, "ru": RU_REPLY, "en": EN_REPLY, "pl": PL_REPLY}


def text_in(text: Localized, language: str) -> str:
    """The text a map gives for ``language`` (it must give one)."""
    return dict(text.texts)[language]


def edited(tmp_path: Path, edit: Any) -> Path:
    """A copy of Puramur (its prompts and catalog beside it), changed by ``edit(data)``."""
    path = copy_puramur(tmp_path / "project")
    data = yaml.safe_load(path.read_text("utf-8"))
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    return path


# -- the type --------------------------------------------------------------------------
def test_a_text_is_picked_for_the_language_else_the_default() -> None:
    text = Localized.of({"uk": "Вітаю", "en": "Hello"})
    assert text.pick("en", "uk") == "Hello"
    assert text.pick("pl", "uk") == "Вітаю"  # no Polish: the default language's
    assert text.pick(None, "uk") == "Вітаю"
    assert text.pick("pl", "de") == "Вітаю"  # neither: the first it gives (validate warns)
    assert text.languages == ("uk", "en")
    # A plain string is the funnel's default language's: sent for every language.
    plain = Localized.of("Hello")
    assert plain.pick("pl", "uk") == plain.pick(None, None) == "Hello"
    assert plain.languages == ()
    assert Localized.of(text) is text and Localized.optional(None) is None
    assert text == Localized.of({"uk": "Вітаю", "en": "Hello"}) and hash(text) == hash(
        Localized.of({"uk": "Вітаю", "en": "Hello"}))
    with pytest.raises(ValueError, match="needs a string"):
        Localized()


@pytest.mark.parametrize("builtin", [FALLBACK, TOO_LONG, TECHNICAL, *POLITE.values()],
                         ids=["fallback", "too_long", "technical", *POLITE])
def test_the_engines_own_texts_ship_in_four_languages(builtin: Localized) -> None:
    assert set(builtin.languages) == set(LANGS)
    for language, text in builtin.texts:
        assert detect(text, LANGS).language == language, text


def test_puramurs_texts_are_in_each_of_its_languages() -> None:
    spec = load_funnel(PURAMUR).spec
    assert spec.language_policy.languages == LANGS
    for stage in spec.stages.values():
        assert set(stage.fallback.languages) == set(LANGS), stage.name
        for language, text in stage.fallback.texts:
            assert detect(text, LANGS).language == language, (stage.name, text)


# -- through the engine ----------------------------------------------------------------
async def test_a_ukrainian_customer_answered_in_russian_gets_ukrainian_fallbacks(
        db_url: str) -> None:
    # The model answers in Russian on every turn, and again in Russian when asked to
    # repair: each reply fails the language check, and the customer gets the stage's
    # fallback, in Ukrainian, every time (before: in English).
    model = ScriptedModel.from_data({"default": {"output": {"reply": RU_REPLY},
                                                 "repair": {"reply": RU_REPLY}}})
    spec = load_funnel(PURAMUR).spec
    async with await Engine.open(PURAMUR, db=db_url, model=model) as engine:
        for text in UK_MESSAGES:
            result = await engine.handle("uk-1", text)
            assert result.fallback and result.validation_failures == 2, text
            assert "must be in Ukrainian (uk)" in (result.error or "")
            assert result.reply == text_in(spec.stages[result.stage_before].fallback, "uk")
            assert detect(result.reply, LANGS).language == "uk"
            assert result.state["response_language"] == "uk"


@pytest.mark.parametrize("language", LANGS)
async def test_each_customer_gets_the_fallback_in_their_language(db_url: str,
                                                                 language: str) -> None:
    wrong = WRONG[language]
    model = ScriptedModel.from_data({"default": {"output": {"reply": wrong},
                                                 "repair": {"reply": wrong}}})
    greeting = load_funnel(PURAMUR).spec.stages["greeting"].fallback
    async with await Engine.open(PURAMUR, db=db_url, model=model) as engine:
        result = await engine.handle("s1", CUSTOMER[language])
    assert result.fallback and result.reply == text_in(greeting, language)
    assert result.state["response_language"] == language


async def test_a_failed_model_call_gets_the_fallback_in_the_sessions_language(
        db_url: str) -> None:
    # A call that fails (an error, or the turn's deadline run out: the same path) never
    # reaches the language check: the fallback still follows the session.
    model = ScriptedModel.from_data({"turns": [
        {"reply": PL_REPLY}, {"error": "the turn's deadline of 20 s ran out"}]})
    discovery = load_funnel(PURAMUR).spec.stages["discovery"].fallback
    async with await Engine.open(PURAMUR, db=db_url, model=model) as engine:
        first = await engine.handle("pl-1", CUSTOMER["pl"])
        assert first.reply == PL_REPLY and first.stage_after == "discovery"
        failed = await engine.handle("pl-1", "OK")  # undecided: the session's language
    assert failed.fallback and "deadline" in (failed.error or "")
    assert failed.reply == text_in(discovery, "pl")


async def test_a_message_too_long_is_answered_in_the_sessions_language(db_url: str) -> None:
    # Puramur leaves `memory.too_long_reply` to the engine: its own Russian text.
    model = ScriptedModel.from_data({"default": {"reply": RU_REPLY}})
    async with await Engine.open(PURAMUR, db=db_url, model=model) as engine:
        await engine.handle("ru-1", CUSTOMER["ru"])
        # SKUs only: no language of its own, and far over the 1000-token prompt budget.
        result = await engine.handle("ru-1", "PR251010 " * 800)
    assert result.fallback and "too long" in (result.error or "")
    assert result.reply == text_in(TOO_LONG, "ru")


async def test_a_funnels_own_too_long_reply_is_picked_by_language(tmp_path: Path,
                                                                  db_url: str) -> None:
    own = {"uk": "Задовго, скоротіть, будь ласка.", "ru": "Слишком длинно, сократите.",
           "en": "Too long, please shorten it.", "pl": "Za długie, skróć, proszę."}

    def edit(data: dict[str, Any]) -> None:
        data["memory"]["too_long_reply"] = own

    path = edited(tmp_path, edit)
    model = ScriptedModel.from_data({"default": {"reply": EN_REPLY}})
    async with await Engine.open(path, db=db_url, model=model) as engine:
        await engine.handle("en-1", CUSTOMER["en"])
        result = await engine.handle("en-1", "PR251010 " * 800)
        fresh = await engine.handle("new-1", "PR251010 " * 800)  # a new session: uk
    assert result.reply == own["en"] and fresh.reply == own["uk"]


async def test_a_session_in_an_unknown_stage_gets_the_technical_reply_in_its_language(
        db_url: str, sql: Any) -> None:
    model = ScriptedModel.from_data({"default": {"reply": PL_REPLY}})
    async with await Engine.open(PURAMUR, db=db_url, model=model) as engine:
        await engine.handle("lost", CUSTOMER["pl"])
        sql("UPDATE puramur_sessions_state SET stage = 'ghost'")
        result = await engine.handle("lost", "Halo?")
    assert result.fallback and "has no stage 'ghost'" in (result.error or "")
    assert result.reply == text_in(TECHNICAL, "pl")


async def test_a_turn_that_fails_after_deciding_answers_in_the_decided_language(
        db_url: str) -> None:
    # A render the sandbox refuses fails the turn after its language was decided (a
    # switch to English on this very message): the fallback the failed turn ends in
    # (engine.turn.save.fail, begun afresh from the row as read) is in English, not in
    # the Ukrainian the row still holds.
    funnel = load_funnel(PURAMUR)
    stage = funnel.stages["discovery"]
    source = (PURAMUR.parent.parent / "prompts" / "puramur" / "discovery.j2").read_text("utf-8")
    trap = stage.template.environment.from_string(source + "\n{{ ''.__class__.__mro__ }}")
    funnel.stages["discovery"] = dataclasses.replace(stage, template=trap)
    model = ScriptedModel.from_data({"default": {"reply": UK_REPLY}})
    async with await Engine.open(funnel, db=db_url, model=model) as engine:
        first = await engine.handle("s1", CUSTOMER["uk"])
        assert first.stage_after == "discovery" and first.state["response_language"] == "uk"
        failed = await engine.handle("s1", CUSTOMER["en"])
    assert failed.fallback and "template failed" in (failed.error or "")
    assert failed.reply == text_in(stage.spec.fallback, "en")


async def test_a_reply_whose_claims_are_refused_twice_gets_the_fallback_in_its_language(
        db_url: str) -> None:
    # The claims check (engine.turn.truth) replaces a reply that claims a false price
    # twice with the stage's fallback: in the customer's language too.
    profile = {"reply": "Sfinks z suchą skórą potrzebuje delikatnej pielęgnacji. Ile ma lat?",
               "updates": {"pet": {"type": "cat", "breed": "Sphynx",
                                   "problems": ["dry_skin"]}}}
    lie = {"output": {"reply": "Szampon Exotic Spa kosztuje dziś tylko 99 UAH, polecam!"},
           "repair": {"reply": "Szampon Exotic Spa kosztuje dla ciebie tylko 150 UAH!"}}
    model = ScriptedModel.from_data({"turns": [{"reply": PL_REPLY}, profile, lie]})
    async with await Engine.open(PURAMUR, db=db_url, model=model) as engine:
        for text in (CUSTOMER["pl"], "To sfinks, ma bardzo suchą skórę"):
            await engine.handle("pl-1", text)
        result = await engine.handle("pl-1", "Co polecasz dla mojej kotki?")
    assert result.fallback and [c["text"] for c in result.reply_claims] == ["99 UAH", "150 UAH"]
    presentation = load_funnel(PURAMUR).spec.stages[result.stage_before].fallback
    assert result.reply == text_in(presentation, "pl")


HOLDING = {"uk": "Менеджер уже тут і скоро вам відповість.",
           "ru": "Менеджер уже здесь и скоро вам ответит.",
           "en": "A manager is on it and will answer you here shortly.",
           "pl": "Menedżer już się tym zajmuje i wkrótce odpowie."}


async def test_the_take_over_holding_reply_is_in_the_sessions_language(
        tmp_path: Path, db_url: str) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["handoff"]["holding_reply"] = HOLDING

    path = edited(tmp_path, edit)
    model = ScriptedModel.from_data({"default": {"reply": RU_REPLY}})
    async with await Engine.open(path, db=db_url, model=model) as engine:
        await engine.handle("ru-1", CUSTOMER["ru"])
        await manager.take_over(engine, "ru-1", "Olena")
        held = await engine.handle("ru-1", "Алло?")
    assert held.held and held.reply == HOLDING["ru"]


async def test_the_approval_holding_reply_is_in_the_customers_language(
        tmp_path: Path, db_url: str) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["stages"]["discovery"]["approval"] = {
            "when": "pet.type == 'cat'", "timeout": "15m", "on_timeout": "reject",
            "holding_reply": HOLDING}

    path = edited(tmp_path, edit)
    cat = {"reply": PL_REPLY, "updates": {"pet": {"type": "cat"}}}
    model = ScriptedModel.from_data({"default": cat})
    async with await Engine.open(path, db=db_url, model=model) as engine:
        asked = await engine.handle("pl-1", CUSTOMER["pl"])
        waiting = await engine.handle("pl-1", "Halo?")
    # The turn that asked, and each message while the approval waits.
    assert asked.approval == "discovery" and asked.reply == HOLDING["pl"]
    assert waiting.held and waiting.reply == HOLDING["pl"]


# -- funnel validate -------------------------------------------------------------------
def diagnostics(path: Path) -> list[Diagnostic]:
    return check_file(path)[1]


def line_of(path: Path, needle: str) -> int:
    """The 1-based line of ``path`` where ``needle`` first occurs."""
    lines = path.read_text("utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line)


def test_the_shipped_funnels_have_every_translation() -> None:
    for path in (PURAMUR, B2B):
        assert [d.format() for d in diagnostics(path)] == []


def test_a_plain_string_in_a_funnel_of_four_languages_misses_three(tmp_path: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["stages"]["discovery"]["fallback"] = "Розкажіть трохи більше."

    path = edited(tmp_path, edit)
    found = [d for d in diagnostics(path) if d.code == "F704"]
    line = line_of(path, "Розкажіть трохи більше.")
    assert {(d.severity, d.line) for d in found} == {("warning", line)}
    assert all(d.col > 1 for d in found)
    missing = sorted(code for d in found
                     for code in re.findall(r"answered in \w+ \((\w+)\)", d.message))
    assert missing == ["en", "pl", "ru"]
    assert "stage 'discovery': `fallback` is a plain string" in found[0].message
    assert "{uk: " in found[0].message  # how to fix it


def test_a_missing_translation_is_a_warning_and_strict_fails(tmp_path: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        del data["stages"]["handoff"]["fallback"]["pl"]
        data["handoff"]["holding_reply"] = {k: v for k, v in HOLDING.items() if k != "ru"}

    path = edited(tmp_path, edit)
    found = sorted((d.code, d.severity, d.line, d.message) for d in diagnostics(path))
    assert [(c, s) for c, s, _, _ in found] == [("F704", "warning")] * 2
    messages = " | ".join(m for *_, m in found)
    assert "stage 'handoff': `fallback` has no Polish (pl) text" in messages
    assert "gets the Ukrainian (uk) one. Add `pl: \"...\"`" in messages
    assert "`handoff.holding_reply` has no Russian (ru) text" in messages
    lines = {line for _, _, line, _ in found}
    text = path.read_text("utf-8").splitlines()
    assert {text[n - 1].strip() for n in lines} == {"fallback:", "holding_reply:"}
    assert run_funnel("validate", str(path)).returncode == 0
    strict = run_funnel("validate", str(path), "--strict")
    assert strict.returncode == 1 and "F704" in strict.stdout


def test_a_language_the_funnel_does_not_declare_is_an_error(tmp_path: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["stages"]["greeting"]["fallback"]["de"] = "Hallo! Katze oder Hund?"
        data["stages"]["greeting"]["approval"] = {
            "timeout": "5m", "on_timeout": "proceed", "holding_reply": {**HOLDING, "ua": "?"}}

    path = edited(tmp_path, edit)
    found = [d for d in diagnostics(path) if d.code == "F705"]
    assert len(found) == 2 and {d.severity for d in found} == {"error"}
    de = next(d for d in found if "German" in d.message)
    assert de.line == line_of(path, "de: Hallo!") and de.col > 1
    assert "'de' is not one of the funnel's languages (uk, ru, en, pl)" in de.message
    assert "Remove it, or add de to `language:`" in de.message
    ua = next(d for d in found if d is not de)
    assert "stage 'greeting': `approval.holding_reply` gives a text under 'ua', which is not " \
        "an ISO 639-1 language code" in ua.message
    assert run_funnel("validate", str(path)).returncode == 1


def test_a_map_in_a_funnel_without_languages_is_an_error(tmp_path: Path) -> None:
    data = yaml.safe_load(B2B.read_text("utf-8"))
    data["stages"]["greeting"]["fallback"] = {"en": "Hi!", "de": "Hallo!"}
    (tmp_path / "pyproject.toml").write_text("")
    path = tmp_path / "b2b.yaml"
    data["prompts"] = str(B2B.parent.parent / "prompts" / "b2b_demo")
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    found = [d for d in diagnostics(path) if d.code in ("F704", "F705")]
    assert sorted(d.code for d in found) == ["F705", "F705"]
    assert all("declares no languages" in d.message for d in found)


def test_a_language_the_engines_texts_lack_is_named(tmp_path: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["language"]["follow_customer"] = [*LANGS, "de"]
        for stage in data["stages"].values():
            stage["fallback"]["de"] = "Entschuldigung, ich habe das nicht ganz verstanden."
            for step in (stage.get("follow_up") or {}).get("steps", ()):
                step["text"]["de"] = "Ihr Warenkorb wartet."

    path = edited(tmp_path, edit)
    [found] = [d for d in diagnostics(path) if d.code == "F704"]
    assert found.line == line_of(path, "- de")
    assert "German (de) is not among the languages of the engine's own texts" in found.message
    assert "`memory.too_long_reply`" in found.message and "stage '" not in found.message


@pytest.mark.parametrize("bad", [{"uk": 5}, {"UKR": "Вітаю"}, {}, ""], ids=[
    "not-a-string", "not-a-code", "empty-map", "empty-string"])
def test_a_text_of_the_wrong_shape_is_a_format_error(tmp_path: Path, bad: Any) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["stages"]["greeting"]["fallback"] = bad

    found = [d for d in diagnostics(edited(tmp_path, edit)) if d.code == "F004"]
    assert len(found) == 1 and "`stages.greeting.fallback`: a customer text is a non-empty" \
        in found[0].message


# -- the Telegram notes ----------------------------------------------------------------
def test_telegram_notes_are_in_the_sessions_language(db_url: str) -> None:
    def update(update_id: int, chat: int, **content: Any) -> dict[str, Any]:
        return {"update_id": update_id, "message": {
            "message_id": update_id, "date": 1700000000, **content,
            "chat": {"id": chat, "type": "private", "first_name": "Anna"},
            "from": {"id": chat, "is_bot": False, "first_name": "Anna"}}}

    sticker = {"sticker": {"file_id": "CAACAgIAAxkBAAID", "file_unique_id": "AgADcQ",
                           "type": "regular", "width": 512, "height": 512,
                           "is_animated": False, "is_video": False}}
    fake = FakeTelegram().start()
    secret = "hook-secret-4c8e1b"
    headers = {"X-Telegram-Bot-Api-Secret-Token": secret}
    config = ServiceConfig(
        funnels=[PURAMUR], db=db_url, model=ScriptedModel.from_data({"default": {
            "reply": RU_REPLY}}), secret=b"test-secret-0123456789abcdef",
        rate_limit=(1000, 60.0), telegram_api=fake.url,
        telegram={"PURAMUR": TelegramBot("123456:TEST-bot-token", secret)},
        dispatch_interval=0.2)
    try:
        with TestClient(create_app(config)) as client:
            hook = "/v1/funnels/puramur/telegram"
            client.post(hook, json=update(1, 4242, text=CUSTOMER["ru"]), headers=headers)
            assert fake.wait_sent(1)[0]["text"] == RU_REPLY
            client.post(hook, json=update(2, 4242, **sticker), headers=headers)
            client.post(hook, json=update(3, 5353, **sticker), headers=headers)  # new: uk
            sent = fake.wait_sent(3)
    finally:
        fake.stop()
    notes = {body["chat_id"]: body["text"] for body in sent[1:]}
    assert notes == {4242: text_in(POLITE["sticker"], "ru"),
                     5353: text_in(POLITE["sticker"], "uk")}
