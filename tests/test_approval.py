"""Approval gates (a stage's `approval:`): the move held, the customer answered with the
holding reply, then approved, rejected or timed out; on the real engine, a real
PostgreSQL, the scripted model, the HTTP API and the fake Telegram Bot API."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from projects import copy_puramur
from service_support import FakeTelegram
from starlette.testclient import TestClient

from engine import Engine
from engine.errors import ApprovalRefused, NotAwaitingApproval
from engine.funnel.compiled import load_funnel
from engine.llm.models import Completion, ModelRequest, ScriptedModel
from engine.report import build_report, render_html, render_table
from engine.service.app import create_app
from engine.service.config import ServiceConfig, TelegramBot
from engine.turn import manager
from engine.turn.invariants import check_funnel

HOLD = "A manager checks this and confirms in a few minutes."
SCRIPT = {"match": [
    {"pattern": "cat", "output": {"reply": "A cat! Let us look closer.",
                                  "updates": {"pet": {"type": "cat"}}}}],
    "default": {"reply": "ok"}}
CONVERSE = "converse-key-3f9a1c77e2b4"
MANAGE = "manage-key-71c0e9a4d25b"
BOT_TOKEN = "123456:TEST-bot-token"
HOOK_SECRET = "hook-secret-4c8e1b"
MANAGERS = -100555
BASE = "/v1/funnels/puramur"

pytestmark = pytest.mark.postgres


def gated(root: Path, on_timeout: str = "reject", **extra: Any) -> Path:
    """Puramur, where moving on to discovery with a cat waits for a manager."""
    path = copy_puramur(root / "project")
    data = yaml.safe_load(path.read_text())
    data["stages"]["discovery"]["approval"] = {
        "when": "pet.type == 'cat'", "timeout": "15m", "on_timeout": on_timeout,
        "holding_reply": HOLD, "reason": "cats need the vet's word", **extra}
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


class Counting:
    """The script, counting its calls and keeping the prompts it was sent."""

    name = "counting"

    def __init__(self) -> None:
        self.inner = ScriptedModel.from_data(SCRIPT)
        self.prompts: list[str] = []

    async def complete(self, request: ModelRequest) -> Completion:
        self.prompts.append("\n".join(m["content"] for m in request.messages))
        return await self.inner.complete(request)


async def _engine(path: Path, store: Any, model: Counting, clock: Clock) -> Engine:
    return await Engine.open(path, store=store, model=model, clock=clock)


def _events(sql: Any, session: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in sql(
        "SELECT event, manager, detail->>'entered' FROM funnel_control_events "
        "WHERE session_id = %s ORDER BY id", (session,))]


async def test_the_move_waits_and_approval_makes_exactly_it(
        store: Any, tmp_path: Path, sql: Any, db_url: str) -> None:
    path, model, clock = gated(tmp_path), Counting(), Clock()
    engine = await _engine(path, store, model, clock)
    try:
        first = await engine.handle("a1", "I have a cat")
        # The turn's updates stand; the move into discovery waits, the customer is told so.
        assert first.approval == "discovery" and first.stage_after == "greeting"
        assert first.reply == HOLD and first.state["pet"]["type"] == "cat"
        assert sql("SELECT mode, held->>'from', held->>'to', deadline - since FROM "
                   "funnel_control") == [("approval", "greeting", "discovery",
                                          timedelta(minutes=15))]
        alerts = sql("SELECT kind, payload->>'event', payload->>'to', payload->>'reason' "
                     "FROM funnel_outbox WHERE session_id = 'a1'")
        assert ("handoff", "approval", "discovery", "cats need the vet's word") in alerts
        status = await manager.status(engine, "a1")
        assert status["control"] == "approval" and status["approval"]["to"] == "discovery"

        calls = len(model.prompts)
        clock.now += timedelta(minutes=3)
        waiting = await engine.handle("a1", "Hello? Still a cat")
        assert waiting.held and waiting.reply == HOLD and waiting.stage_after == "greeting"
        assert len(model.prompts) == calls  # no model while it waits; the stage never moves

        clock.now += timedelta(minutes=2)
        done = await manager.approve(engine, "a1", "Olena")
        assert done["stage"] == "discovery" and done["entered"] == "discovery"
        assert done["waited_seconds"] == 300.0
        with pytest.raises(NotAwaitingApproval):  # decided once: the second finds nothing
            await manager.approve(engine, "a1", "Taras")
        after = await engine.handle("a1", "So what now?")
        assert not after.held and after.stage_before == "discovery"
        assert "a manager approved moving to stage 'discovery'" in model.prompts[-1]
        assert _events(sql, "a1") == [("approval", None, None),
                                      ("approved", "Olena", "discovery")]
        assert sql("SELECT count(*) FROM funnel_control") == [(0,)]
        assert [str(v) for v in await check_funnel(load_funnel(path), db_url)] == []
    finally:
        await engine.close()


async def test_a_rejection_keeps_the_stage_and_the_next_prompt_sees_why(
        store: Any, tmp_path: Path, sql: Any) -> None:
    path, model, clock = gated(tmp_path), Counting(), Clock()
    engine = await _engine(path, store, model, clock)
    try:
        await engine.handle("r1", "I have a cat")
        done = await manager.reject(engine, "r1", "Olena", "no vet record yet")
        assert done["stage"] == "greeting" and done["entered"] is None
        with pytest.raises(NotAwaitingApproval):
            await manager.reject(engine, "r1", "Olena")
        again = await engine.handle("r1", "ok, and now?")
        assert "rejected moving to stage 'discovery': no vet record yet" in model.prompts[-1]
        # The exit still holds, so the move is asked for again: a new approval, not a loop.
        assert again.approval == "discovery" and again.stage_after == "greeting"
        assert _events(sql, "r1") == [("approval", None, None), ("rejected", "Olena", None),
                                      ("approval", None, None)]
    finally:
        await engine.close()


async def test_a_timeout_applies_on_timeout_at_the_next_message(
        store: Any, tmp_path: Path, sql: Any) -> None:
    path, model, clock = gated(tmp_path, on_timeout="proceed"), Counting(), Clock()
    engine = await _engine(path, store, model, clock)
    try:
        await engine.handle("t1", "I have a cat")
        clock.now += timedelta(minutes=10)
        assert (await engine.handle("t1", "hello?")).held  # not yet due
        clock.now += timedelta(minutes=6)
        late = await engine.handle("t1", "anyone?")
        # The deadline passed: the move was made (proceed), then the bot answered.
        assert not late.held and late.stage_before == "discovery" and late.reply == "ok"
        assert sql("SELECT event, (detail->>'waited')::float FROM funnel_control_events "
                   "WHERE session_id = 't1' ORDER BY id") == [("approval", None),
                                                              ("timeout", 960.0)]
        with pytest.raises(NotAwaitingApproval):  # too late for a manager now
            await manager.approve(engine, "t1", "Olena")
    finally:
        await engine.close()


async def test_the_sweep_times_out_without_a_customer_message(
        store: Any, tmp_path: Path, sql: Any) -> None:
    path, model, clock = gated(tmp_path, on_timeout="handoff"), Counting(), Clock()
    engine = await _engine(path, store, model, clock)
    try:
        await engine.handle("w1", "I have a cat")
        await engine.handle("w2", "I have a cat")
        assert await manager.sweep(engine) == 0  # none due
        clock.now += timedelta(minutes=15)
        assert await manager.sweep(engine) == 2
        assert await manager.sweep(engine) == 0  # decided once
        rows = sql("SELECT session_id, stage, handoff_triggered_at IS NOT NULL FROM "
                   "puramur_sessions_state ORDER BY 1")
        assert rows == [("w1", "handoff", True), ("w2", "handoff", True)]
        handoffs = sql("SELECT session_id FROM funnel_outbox WHERE payload->>'event' = "
                       "'handoff' ORDER BY 1")
        assert handoffs == [("w1",), ("w2",)]  # the hand-off alert, as entering it sends
    finally:
        await engine.close()


async def test_an_approval_that_no_longer_applies_is_refused(
        store: Any, tmp_path: Path, sql: Any, db_url: str) -> None:
    path, model, clock = gated(tmp_path), Counting(), Clock()
    engine = await _engine(path, store, model, clock)
    try:
        await engine.handle("x1", "I have a cat")
        sql("UPDATE puramur_sessions_state SET stage = 'presentation' WHERE session_id = 'x1'")
        problems = [str(v) for v in await check_funnel(load_funnel(path), db_url)]
        assert any("holds a move from stage 'greeting'" in p for p in problems)
        with pytest.raises(ApprovalRefused, match="not in 'greeting'"):
            await manager.approve(engine, "x1", "Olena")
        assert sql("SELECT mode FROM funnel_control") == [("approval",)]  # nothing written
        assert (await manager.reject(engine, "x1", "Olena"))["stage"] == "presentation"
    finally:
        await engine.close()


async def test_the_report_counts_waits_approvals_rejections_and_timeouts(
        store: Any, tmp_path: Path, db_url: str) -> None:
    path, model, clock = gated(tmp_path), Counting(), Clock()
    engine = await _engine(path, store, model, clock)
    try:
        for n in range(5):
            await engine.handle(f"p{n}", "I have a cat")
        clock.now += timedelta(seconds=60)
        await manager.approve(engine, "p0", "Olena")
        clock.now += timedelta(seconds=60)
        await manager.reject(engine, "p1", "Olena")
        await manager.take_over(engine, "p4", "Olena")  # ends p4's approval, decided by her
        clock.now += timedelta(minutes=15)
        assert await manager.sweep(engine) == 2  # p2, p3 time out (rejected)
    finally:
        await engine.close()
    report = await build_report(path, db=db_url, since=86400)
    assert report["approvals"] == [{
        "stage": "discovery", "asked": 5, "approved": 1, "rejected": 1, "timeouts": 2,
        "timeouts_entered": 0, "taken_over": 1, "median_wait_seconds": 120.0,
        "p90_wait_seconds": 1020.0, "waiting": 0}]
    assert "Approvals: moves that waited for a manager" in render_table(report)
    page = render_html(report)
    section = page[page.index('<section id="approvals">'):]
    section = section[:section.index("</section>")]
    cells = re.findall(r'<td class="n">([^<]*)</td>', section)
    # asked, approved, rejected, timed out, taken over, waiting
    assert cells[:6] == ["5", "1", "1", "2", "1", "0"]


def _config(db_url: str, funnel: Path, model: Any, **overrides: Any) -> ServiceConfig:
    options: dict[str, Any] = {
        "funnels": [funnel], "db": db_url, "model": model,
        "api_keys": {CONVERSE: frozenset({"converse"}), MANAGE: frozenset({"manage"})},
        "secret": b"test-secret-0123456789abcdef", "rate_limit": (1000, 60.0),
        "telegram_api": "http://127.0.0.1:9",
        "telegram": {"PURAMUR": TelegramBot(BOT_TOKEN, HOOK_SECRET)}}
    options.update(overrides)
    return ServiceConfig(**options)


def test_the_api_approves_and_rejects(db_url: str, tmp_path: Path, sql: Any) -> None:
    path = gated(tmp_path)
    with TestClient(create_app(_config(db_url, path, ScriptedModel.from_data(SCRIPT)))) as c:
        def say(session: str, text: str) -> dict[str, Any]:
            r = c.post(f"{BASE}/sessions/{session}/messages", json={"text": text},
                       headers={"X-API-Key": CONVERSE})
            assert r.status_code == 200, r.text
            out: dict[str, Any] = r.json()
            return out

        def manage(session: str, action: str, **body: Any) -> Any:
            return c.post(f"{BASE}/sessions/{session}/{action}", json=body,
                          headers={"X-API-Key": MANAGE})

        assert say("h1", "I have a cat")["reply"] == HOLD
        held = say("h1", "hi?")
        assert held["held"] is True and held["reply"] == HOLD and held["stage"] == "greeting"
        status = c.get(f"{BASE}/sessions/h1/control", headers={"X-API-Key": MANAGE}).json()
        assert status["control"] == "approval" and status["approval"]["stage"] == "greeting"
        assert c.post(f"{BASE}/sessions/h1/approve", json={},
                      headers={"X-API-Key": CONVERSE}).status_code == 403
        r = manage("h1", "approve", manager="Olena")
        assert r.status_code == 200, r.text
        assert r.json()["decision"] == "approved" and r.json()["stage"] == "discovery"
        r = manage("h1", "reject")
        assert r.status_code == 409 and r.json()["error"] == "not_awaiting_approval"
        assert say("h1", "thanks")["stage"] == "discovery"

        say("h2", "I have a cat")
        assert manage("h2", "reject", note="  ").status_code == 400
        assert manage("h2", "reject", note="no\x00record").status_code == 400
        assert manage("h2", "reject", note="x" * 501).status_code == 400  # names `note`
        assert c.get(f"{BASE}/sessions/h2/control",  # refused notes decided nothing
                     headers={"X-API-Key": MANAGE}).json()["control"] == "approval"
        r = manage("h2", "reject", manager="Olena", note="no vet record")
        assert r.status_code == 200 and r.json()["entered"] is None
        assert manage("nobody", "approve").status_code == 404
        paths = c.get("/openapi.json").json()["paths"]
        assert "/v1/funnels/{funnel}/sessions/{session}/approve" in paths
        assert "/v1/funnels/{funnel}/sessions/{session}/reject" in paths


def test_the_managers_chat_approves_with_the_alerts_button(
        db_url: str, tmp_path: Path, sql: Any) -> None:
    path = gated(tmp_path)
    fake = FakeTelegram().start()
    try:
        bot = TelegramBot(BOT_TOKEN, HOOK_SECRET, manager_chat=MANAGERS)
        app = create_app(_config(db_url, path, ScriptedModel.from_data(SCRIPT),
                                 telegram_api=fake.url, telegram={"PURAMUR": bot},
                                 dispatch_interval=0.2))
        hook, secret = f"{BASE}/telegram", {"X-Telegram-Bot-Api-Secret-Token": HOOK_SECRET}
        with TestClient(app) as tg:
            tg.post(hook, headers=secret, json={"update_id": 1, "message": {
                "message_id": 1, "date": 1700000000, "chat": {"id": 777, "type": "private"},
                "from": {"id": 777, "is_bot": False, "first_name": "Anna"},
                "text": "I have a cat"}})
            sent = fake.wait_sent(2)
            assert any(m["chat_id"] == 777 and m["text"] == HOLD for m in sent)
            alert = next(m for m in sent if m["chat_id"] == MANAGERS)
            assert "Approval needed" in alert["text"] and "discovery" in alert["text"]
            keyboard = alert["reply_markup"]["inline_keyboard"][0]
            assert [b["callback_data"] for b in keyboard] == ["approve:tg-777",
                                                              "reject:tg-777"]
            tg.post(hook, headers=secret, json={"update_id": 2, "callback_query": {
                "id": "cb2", "from": {"id": 9, "is_bot": False, "first_name": "Olena"},
                "data": "approve:tg-777", "message": {
                    "message_id": 1, "date": 1700000000,
                    "chat": {"id": MANAGERS, "type": "supergroup"}}}})
            answer = fake.wait_sent(1, method="answerCallbackQuery")[0]
            assert "Olena approved tg-777" in answer["text"]
            assert sql("SELECT stage FROM puramur_sessions_state") == [("discovery",)]
        assert fake.violations == []
    finally:
        fake.stop()
