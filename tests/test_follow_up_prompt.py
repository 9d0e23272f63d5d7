"""Follow-ups the model writes (a step's ``prompt:``, docs/follow-ups.md): the reply only,
no state change; its claims checked; the step's ``text`` sent when the model fails or
claims too much, nothing when it has none. With the scripted model, matched on the
engine's instruction (the prompt names the session)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import puramur_data, run_funnel, sql_runner
from follow_up_support import DAY, START, TEXTS, Clock, outcomes

from engine.llm.models import ScriptedModel
from engine.report import build_report, render_html, render_table
from engine.service.metrics import Metrics, follow_up_stages
from engine.turn.engine import Engine
from engine.turn.follow_up import preview, run_due

PROMPT = "Remind them gently that we can help. [{{ session_id }}]"


def _funnel(folder: Path) -> Path:
    data = puramur_data()
    del data["knowledge"]  # indexing it costs seconds; follow-ups do not read it
    for stage in data["stages"].values():
        stage.pop("knowledge", None)
    data["follow_up"] = {"steps": [
        {"after": "24h", "prompt": PROMPT, "text": TEXTS},  # the text: the fallback
        {"after": "48h", "prompt": PROMPT}]}                # no fallback: nothing is sent
    path = folder / "puramur.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), "utf-8")
    return path


MODEL = {
    "match": [
        # Writes a follow-up and proposes changes a follow-up must not make.
        {"pattern": r"\[pp-ok\]", "output": {
            "reply": "Ми досі тут! Підказати засіб для вашої кішки?",
            "updates": {"customer": {"name": "Olena"}},
            "actions": [{"type": "request_handoff", "reason": "explicit_request"}]}},
        # A promise nothing backs: refused, the declared text goes instead.
        {"pattern": r"\[pp-claim\]", "output": {"reply": "A manager will call you today."}},
        {"pattern": r"\[pp-fail\]", "output": {"error": "the provider is down"}},
    ],
    "default": {"reply": "Чим можу допомогти?"}}


@pytest.fixture(scope="module")
def schema(server_dsn: str) -> Any:
    from engine.store.connect import temporary_schema

    with temporary_schema(server_dsn, "p") as url:
        yield url


@pytest.fixture(scope="module")
async def engine(schema: str, tmp_path_factory: pytest.TempPathFactory
                 ) -> AsyncIterator[Engine]:
    clock = Clock()
    opened = await Engine.open(_funnel(tmp_path_factory.mktemp("prompt")), db=schema,
                               model=ScriptedModel.from_data(MODEL), clock=clock)
    for session, text in (("pp-ok", "Привіт, у мене кішка"),
                          ("pp-claim", "Hello, I have a cat with dry skin"),
                          ("pp-fail", "Привіт, у мене пес")):
        await opened.handle(session, text)
    yield opened
    await opened.close()


def _rows(schema: str, session: str) -> list[tuple[Any, ...]]:
    with sql_runner(schema) as run:
        return run("SELECT m.content, t.follow_up->>'written_by', t.prompt_tokens > 0, "
                   "t.claims <> '[]'::jsonb FROM funnel_messages m JOIN funnel_turns t ON "
                   "t.session_id = m.session_id AND t.follow_up->>'step' = "
                   "split_part(m.follow_up, ':', 2) WHERE m.session_id = %s AND "
                   "m.follow_up IS NOT NULL ORDER BY m.id", (session,))


async def test_the_model_writes_it_and_changes_nothing_else_the_text_or_nothing(
        engine: Engine, schema: str) -> None:
    before = {s: await engine.store.load(engine.spec, s) for s in ("pp-ok", "pp-claim")}
    done = await run_due(engine, now=START + DAY + timedelta(minutes=1))
    assert sorted((d["session_id"], d["outcome"], d.get("written_by")) for d in done) == [
        ("pp-claim", "sent", "text"), ("pp-fail", "sent", "text"), ("pp-ok", "sent", "model")]
    # The model's reply went out; the name and the hand-off it proposed did not apply.
    assert _rows(schema, "pp-ok") == [
        ("Ми досі тут! Підказати засіб для вашої кішки?", "model", True, False)]
    after = await engine.store.load(engine.spec, "pp-ok")
    assert after is not None and before["pp-ok"] is not None
    assert after["customer"] == before["pp-ok"]["customer"]
    assert not after.get("handoff_triggered_at")
    # A claim nothing backs: the declared text instead, in the customer's language, the
    # refused claim kept on the record with the tokens the model spent.
    assert _rows(schema, "pp-claim") == [(TEXTS["en"], "text", True, True)]
    # The model failed: the declared text, nothing of the failure sent.
    assert _rows(schema, "pp-fail") == [(
        "Привіт! Ми досі тут, якщо потрібна порада для улюбленця.", "text", False, False)]
    # The second step has no text: when the model fails, nothing is sent, and it is said.
    later = await run_due(engine, now=START + 2 * DAY + timedelta(minutes=1))
    failed = [d for d in later if d["session_id"] == "pp-fail"]
    assert [d["outcome"] for d in failed] == ["refused"]
    assert "the provider is down" in failed[0]["why"]
    assert len(_rows(schema, "pp-fail")) == 1
    assert outcomes(later, "pp-ok") == ["sent"]
    assert outcomes(later, "pp-claim") == ["refused"]  # a claim, and no text to send
    # `/metrics` counts each pass's outcomes by funnel and stage (the service's dispatch
    # loop hands it what run_due returns); every stage with follow-ups starts at zero.
    metrics = Metrics()
    metrics.declare("puramur", engine.spec.stages, telegram=False,
                    follow_ups=follow_up_stages(engine.spec))
    metrics.follow_ups("puramur", done + later)
    stage = done[0]["stage"]
    counted = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in metrics.render().splitlines()
               if line.startswith("funnel_follow_ups_total{")}
    assert counted[f'funnel_follow_ups_total{{funnel="puramur",outcome="sent",'
                   f'stage="{stage}"}}'] == 4.0
    assert counted[f'funnel_follow_ups_total{{funnel="puramur",outcome="refused",'
                   f'stage="{stage}"}}'] == 2.0
    assert 'funnel_follow_ups_total{funnel="puramur",outcome="cancelled",' \
           'stage="cart_building"}' in counted
    assert not any('stage="handoff"' in k for k in counted)


def test_validate_wants_text_or_prompt(tmp_path: Path) -> None:
    data = puramur_data()
    data["follow_up"] = {"steps": [{"after": "24h"},
                                   {"after": "48h", "prompt": "{{ no_such_field }}"}]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), "utf-8")
    result = run_funnel("validate", str(path))
    assert result.returncode == 1
    found = sorted(line.split()[2] for line in result.stdout.splitlines() if " F95" in line)
    assert found == ["F954", "F957"]
    assert all(line.startswith(f"{path}:") and line.split(":")[1] != "0"
               for line in result.stdout.splitlines() if " F95" in line)


async def test_the_report_counts_customer_turns_and_the_follow_ups_spend(
        engine: Engine, schema: str) -> None:
    """Runs after the sends above: 3 customers wrote once each; 4 follow-ups were sent."""
    with sql_runner(schema) as run:
        records, tokens = run("SELECT count(*), sum(prompt_tokens) FROM funnel_turns")[0]
        followed = run("SELECT count(*) FROM funnel_turns WHERE follow_up IS NOT NULL")[0][0]
    assert (records, followed) == (3 + 4, 4)
    report = await build_report(engine.funnel, db=schema)
    assert "discovery" in render_table(report) and "discovery" in render_html(report)
    costs = report["costs"]
    conv = costs["conversations"]
    assert (conv["conversations"], conv["turns"], conv["avg_turns"]) == (3, 3, 1)
    assert conv["turns_without_cost"] == 3  # the scripted model has no price: its turns
    assert conv["prompt_tokens"] == tokens  # the model-written follow-ups' spend counts
    # The customers wrote in greeting; their follow-ups went out in discovery: its
    # row has their spend and no customer turn.
    rows = {s["stage"]: s for s in costs["stages"]}
    assert {k: (r["turns"], r["sessions"]) for k, r in rows.items()} == {
        "greeting": (3, 3), "discovery": (0, 0)}
    assert rows["discovery"]["prompt_tokens"] > 0
    assert rows["discovery"]["avg_tokens_per_turn"] is None


async def test_fast_forward_shows_the_prompt_and_its_fallback(engine: Engine) -> None:
    state = await engine.store.load(engine.spec, "pp-ok")
    assert state is not None
    steps = preview(engine, state, "pp-ok", START)["steps"]
    assert [(s["prompt"], s["text"]) for s in steps] == [
        (PROMPT, "Привіт! Ми досі тут, якщо потрібна порада для улюбленця."), (PROMPT, "")]
