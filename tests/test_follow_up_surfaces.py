"""Follow-ups seen from outside the scheduler (docs/follow-ups.md): `funnel validate`'s
checks, a Telegram customer getting one in the chat through the service, the report's
win-back rate, and a silent customer in `funnel simulate`."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import puramur_data, run_funnel
from follow_up_support import DAY, outcomes, quiet_model, write_funnel
from service_support import FakeTelegram
from starlette.testclient import TestClient

from engine.evidence.personas import load_personas
from engine.evidence.simulate import simulate
from engine.experiments.stats import wilson
from engine.funnel.compiled import load_funnel
from engine.llm.models import ScriptedModel
from engine.report import build_report, render_html, render_table
from engine.service.app import create_app
from engine.service.config import ServiceConfig, TelegramBot
from engine.turn.engine import Engine
from engine.turn.follow_up import run_due


@pytest.fixture(scope="module")
def funnel_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_funnel(tmp_path_factory.mktemp("surfaces"))


def test_validate_names_each_bad_follow_up(tmp_path: Path) -> None:
    data = puramur_data()
    data["follow_up"] = {"quiet_hours": {"from": "25:00", "to": "09:00",
                                         "timezone": "Europe/Kiyv"},
                         "steps": [{"after": "-5h", "text": "Hi"},
                                   {"after": "400d", "text": "{{ no_such_field }}"},
                                   {"after": "24h", "text": "Hi", "max": 50}]}
    data["stages"]["handoff"]["follow_up"] = {"steps": [{"after": "24h", "text": "Hi"}]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), "utf-8")
    result = run_funnel("validate", str(path))
    assert result.returncode == 1
    codes = [line.split()[2] for line in result.stdout.splitlines() if " F95" in line]
    assert sorted(codes) == ["F951", "F951", "F952", "F953", "F954", "F955", "F956"]
    assert all(line.startswith(f"{path}:") and line.split(":")[1] != "0"
               for line in result.stdout.splitlines() if " F95" in line)


# -- over Telegram, end to end ---------------------------------------------------------
TOKEN = "123456:TEST-bot-token"
SECRET = "hook-secret-follow"


async def _scheduler_pass(funnel: Path, url: str, at: datetime) -> list[dict[str, Any]]:
    """Another process's scheduler (cron's `funnel follow-up`), at ``at``: quiet hours
    waited out."""
    engine = await Engine.open(funnel, db=url, model=quiet_model())
    try:
        done = await run_due(engine, now=at)
        while done and done[0]["outcome"] == "deferred":
            done = await run_due(engine, now=done[0]["until"])
        return done
    finally:
        await engine.close()


def test_a_telegram_customer_gets_the_follow_up_in_the_chat(db_url: str,
                                                            funnel_file: Path) -> None:
    telegram = FakeTelegram().start()
    config = ServiceConfig(
        funnels=[funnel_file], db=db_url, model="scripted:" + str(
            Path(__file__).resolve().parent.parent / "funnels" / "puramur" / "demo.yaml"),
        secret=b"test-secret-0123456789abcdef", rate_limit=(1000, 60.0),
        telegram_api=telegram.url, telegram={"PURAMUR": TelegramBot(TOKEN, SECRET)},
        dispatch_interval=0.2)
    update = {"update_id": 9001, "message": {
        "message_id": 9001, "date": 1700000000, "text": "Привіт, у мене кішка",
        "chat": {"id": 4242, "type": "private", "first_name": "Anna"},
        "from": {"id": 4242, "is_bot": False, "first_name": "Anna"}}}
    try:
        with TestClient(create_app(config)) as client:
            r = client.post("/v1/funnels/puramur/telegram", json=update,
                            headers={"X-Telegram-Bot-Api-Secret-Token": SECRET})
            assert r.status_code == 200
            assert len(telegram.wait_sent(1)) == 1  # the turn's reply
            done = asyncio.run(_scheduler_pass(funnel_file, db_url,
                                               datetime.now(UTC) + DAY + timedelta(hours=1)))
            assert [(d["outcome"], d["channel"]) for d in done] == [("sent", "telegram")]
            # The service's dispatch delivers it: once, to the chat, in Ukrainian.
            sent = telegram.wait_sent(2)
            assert sent[1] == {"chat_id": 4242, "text": done[0]["text"]}
            assert done[0]["text"].startswith("Привіт! Ми досі тут")
    finally:
        telegram.stop()


async def test_the_report_counts_sent_replied_and_won_back(db_url: str,
                                                           funnel_file: Path) -> None:
    model = ScriptedModel.from_data({"match": [{"pattern": "Sphynx", "output": {
        "reply": "Сфінкс! Спробуйте лосьйон Exotic Spa.",
        "updates": {"pet": {"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"],
                            "age_years": 3, "name": "Murka"}}}}],
        "default": {"reply": "Чим можу допомогти?"}})
    engine = await Engine.open(funnel_file, db=db_url, model=model)
    try:
        for session in ("r-won", "r-silent"):
            await engine.handle(session, "Привіт, у мене кішка")
        at = datetime.now(UTC) + DAY + timedelta(hours=1)
        done = await run_due(engine, now=at)
        while any(d["outcome"] == "deferred" for d in done):
            done = await run_due(engine, now=max(d["until"] for d in done))
        assert sorted(outcomes(done, "r-won") + outcomes(done, "r-silent")) == ["sent", "sent"]
        await engine.handle("r-won", "Це Sphynx, 3 роки, суха шкіра, звати Murka")
        report = await build_report(engine.funnel, db=db_url)
    finally:
        await engine.close()
    assert report["follow_ups"]["stages"] == [{
        "stage": "discovery", "sent": 2, "replied": 1, "moved_on": 1, "win_back_rate": 0.5,
        "interval": [round(x, 4) for x in wilson(1, 2)]}]
    assert "Follow-ups: customers who went quiet" in render_table(report)
    assert '<section id="follow_ups">' in render_html(report)


def test_a_silent_simulated_customer_gets_the_follow_up_and_comes_back(
        server_dsn: str, tmp_path: Path, funnel_file: Path) -> None:
    personas = tmp_path / "personas.yaml"
    personas.write_text(yaml.safe_dump({"personas": [{
        "name": "quiet_cart", "language": "uk", "patience": 10,
        "script": ["Привіт, у мене кішка", "Це Sphynx, 3 роки, суха шкіра, звати Murka",
                   "Додайте два лосьйони", None, "Так, оформлюємо"]}]},
        allow_unicode=True), "utf-8")
    model = ScriptedModel.from_data({"match": [
        {"pattern": "Sphynx", "output": {"reply": "Сфінкс! Раджу лосьйон Exotic Spa.", "updates": {
            "pet": {"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"],
                    "age_years": 3, "name": "Murka"}}}},
        {"pattern": "лосьйони", "output": {"reply": "Додала два лосьйони в кошик.", "actions": [
            {"type": "add_to_cart", "sku": "PR251020", "qty": 2}]}},
        {"pattern": "оформ", "output": {"reply": "Чудово! Ваше ім'я і телефон?",
                                        "actions": [{"type": "confirm_cart"}]}}],
        "default": {"reply": "Чим можу допомогти?"}})
    # Puramur's own cart reminder (its cart_building stage), without the knowledge base.
    run = simulate(load_funnel(funnel_file), load_personas(personas), model, n=1, seed=1,
                   db=server_dsn)
    [conv] = run.conversations
    assert conv.follow_ups == 1  # Puramur's cart reminder, fast-forwarded past its 24 h
    assert conv.stage == "contact_collection" and conv.turns == 4
