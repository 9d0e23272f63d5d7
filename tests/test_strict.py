"""The contract the provider enforces, and honest accounting (engine.llm.strict, the calls).

- OpenAI and Azure get each stage's contract in OpenAI's strict form (``strict: true``,
  every property required, optional ones nullable, every object closed, no keyword
  strict mode refuses); Anthropic's ``output_format`` and Gemini's
  ``response_json_schema`` get it closed, as litellm maps it (tests/test_providers.py
  checks every wire); self-hosted servers keep ``strict: false``.
- A null the strict form forced reads as an absent property; the engine still validates
  against the stage's own schema.
- A turn's ``llm_ms``, tokens and cost count every call, a timed-out one's too, and the
  turn record lists the calls; a provider that sends no usage has its tokens counted
  by the engine and marked so.

Against recording fake servers on the loopback (tests/fake_providers.py) and a real
PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PURAMUR, ROOT, puramur_data
from fake_providers import FakeProvider
from jsonschema import Draft202012Validator
from test_litellm_path import close_litellm_clients, loopback_only  # noqa: F401
from test_providers import assert_strict_form, envelope

from engine.funnel.compiled import load_funnel
from engine.llm import strict

SESSION = "strict-1"
KEYS = {"OPENAI_API_KEY": "sk-test", "AZURE_API_KEY": "az-test",
        "AZURE_API_VERSION": "2024-08-01-preview"}
FUNNEL = load_funnel(PURAMUR)


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    """No strategy stepped down, no strict form refused (both live per process)."""
    from engine.llm import strategy

    strategy.forget()
    strict.forget()
    yield
    strategy.forget()
    strict.forget()


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)


def _envelopes() -> list[dict[str, Any]]:
    """Every model output of the Puramur scenarios."""
    out = []
    for path in (ROOT / "funnels" / "puramur" / "scenarios").glob("*.yaml"):
        for turn in yaml.safe_load(path.read_text("utf-8")).get("turns") or []:
            if isinstance(turn.get("llm"), dict) and "reply" in turn["llm"]:
                out.append(turn["llm"])
    return out


def _forced(value: Any, schema: dict[str, Any]) -> Any:
    """``value`` as a model under the strict ``schema`` must write it: every property
    present, null for those it has nothing for."""
    if isinstance(value, dict):
        node = _branch_for(value, schema)
        props = node.get("properties", {})
        return {name: _forced(value[name], _plain(sub)) if name in value else None
                for name, sub in props.items()}
    if isinstance(value, list):
        items = _plain(schema)["items"]
        return [_forced(v, items) for v in value]
    return value


def _plain(schema: dict[str, Any]) -> dict[str, Any]:
    """A nullable wrapper's non-null branch."""
    branches = schema.get("anyOf")
    if isinstance(branches, list) and {"type": "null"} in branches and len(branches) == 2:
        return next(b for b in branches if b != {"type": "null"})
    return schema


def _branch_for(value: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    schema = _plain(schema)
    for branch in schema.get("anyOf") or [schema]:
        kind = branch.get("properties", {}).get("type", {}).get("enum")
        if "anyOf" not in schema or (kind and value.get("type") in kind):
            return dict(branch)
    raise AssertionError(f"no branch for {value}")


# -- the strict form -----------------------------------------------------------------------


@pytest.mark.parametrize("stage", list(FUNNEL.stages))
def test_every_stage_has_openais_strict_form(stage: str) -> None:
    schema = FUNNEL.stages[stage].schema
    forms = strict.forms(schema)
    assert forms.openai is not None and forms.why_not == {}
    Draft202012Validator.check_schema(forms.openai)
    assert_strict_form(forms.openai)
    assert forms is strict.forms(schema)  # built once per stage, then kept


@pytest.mark.parametrize("stage", list(FUNNEL.stages))
def test_a_forced_null_reads_as_the_absent_property(stage: str) -> None:
    """Every valid answer, as a strict model must write it (nulls for what it has nothing
    for), is accepted by the strict form, and reads back as the answer itself."""
    compiled = FUNNEL.stages[stage]
    openai = strict.forms(compiled.schema).openai
    assert openai is not None
    checked = 0
    for answer in _envelopes():
        if not compiled.validator.is_valid(answer):
            continue
        forced = _forced(json.loads(json.dumps(answer)), openai)
        Draft202012Validator(openai).validate(forced)
        if forced != answer:
            assert not compiled.validator.is_valid(forced)  # the nulls alone are invalid
        assert strict.drop_forced_nulls(forced, compiled.schema) == answer
        checked += 1
    assert checked > 0 or stage in ("handoff", "contact_collection", "objection_handling",
                                    "cart_building")


def test_a_null_the_schema_allows_or_requires_stays() -> None:
    schema = {"type": "object", "required": ["reply"], "properties": {
        "reply": {"type": "string"}, "note": {"type": ["string", "null"]},
        "mood": {"enum": ["calm", None]}, "tag": {"type": "string"}}}
    data = {"reply": None, "note": None, "mood": None, "tag": None}
    assert strict.drop_forced_nulls(data, schema) == {"reply": None, "note": None,
                                                      "mood": None}


def test_a_recursive_schema_is_walked_once_per_node() -> None:
    """A hand-written ``schema:`` may refer to itself: the plan of where nulls may be
    dropped is built once per node, however deep the answer."""
    schema = {"$defs": {"node": {"type": "object", "properties": {
        "left": {"$ref": "#/$defs/node"}, "right": {"$ref": "#/$defs/node"},
        "tag": {"type": "string"}}}}, "$ref": "#/$defs/node"}
    deep: dict[str, Any] = {"tag": None}
    for _ in range(200):
        deep = {"left": deep, "right": None, "tag": "x"}
    strict.drop_forced_nulls(deep, schema)
    node = deep
    while "left" in node:
        assert "right" not in node and node["tag"] == "x"
        node = node["left"]
    assert node == {}


def test_a_contract_without_a_strict_form_says_why() -> None:
    """An object that takes keys it does not name (a hook action without ``arguments``)
    cannot be strict: the stage keeps the portable form."""
    schema = {"type": "object", "required": ["reply"], "additionalProperties": False,
              "properties": {"reply": {"type": "string"}, "extra": {
                  "type": "object", "additionalProperties": {"type": "string"}}}}
    forms = strict.forms(schema)
    assert forms.openai is None and forms.closed is None
    why = "$.extra is an object that takes keys it does not name"
    assert forms.why_not == {"openai": why, "closed": why}
    assert forms.get("portable") == forms.portable


def test_an_optional_field_that_takes_null_has_no_openai_form() -> None:
    """Under OpenAI's form every property is written: a null would clear a nullable field
    the model meant to leave alone. Such a contract keeps the portable form there (the
    closed form, where optional stays optional, is fine)."""
    schema = {"type": "object", "required": ["reply"], "additionalProperties": False,
              "properties": {"reply": {"type": "string"}, "updates": {
                  "type": "object", "additionalProperties": False, "properties": {
                      "note": {"type": ["string", "null"]}}}}}
    forms = strict.forms(schema)
    assert forms.openai is None and forms.closed is not None
    assert forms.why_not == {"openai": "$.updates.note is optional and takes null: under a "
                             "strict form, null (clear it) and absent (leave it) look the "
                             "same"}


def test_which_model_gets_which_form() -> None:
    from engine.llm.models import LiteLLMModel

    litellm = LiteLLMModel("openai/gpt-4o-mini")._litellm
    cases = {("openai/gpt-4o-mini", None, "json_schema"): "openai",
             ("gpt-4o", None, "tool"): "openai",
             ("azure/gpt-4o", None, "json_schema"): "openai",
             ("openai/qwen2.5-7b", "http://127.0.0.1:9/v1", "json_schema"): "portable",
             ("openai/gpt-4o-mini", None, "json_object"): "portable",
             ("anthropic/claude-sonnet-4-5", None, "json_schema"): "closed",
             ("anthropic/claude-3-5-sonnet-20241022", None, "tool"): "portable",
             ("gemini/gemini-2.0-flash", None, "json_schema"): "closed",
             ("gemini/gemini-1.5-flash", None, "json_schema"): "portable",
             ("ollama_chat/llama3.2", None, "json_schema"): "portable"}
    for (model, base, strategy), form in cases.items():
        mode = strict.mode(model, base, strategy, litellm)
        assert mode.form == form, (model, strategy, mode)
        assert mode.why


# -- on the wire ---------------------------------------------------------------------------


def make_funnel(tmp_path: Path, **model: Any) -> Path:
    data = puramur_data()
    data["model"].update(model)
    path = tmp_path / "puramur_strict.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    return path


async def open_engine(funnel: Path, db_url: str, model: str, api_base: str,
                      structured_output: str | None = None) -> Any:
    from engine.llm.models import LiteLLMModel
    from engine.turn.engine import Engine

    return await Engine.open(funnel, db=db_url, model=LiteLLMModel(
        model, api_base=api_base, structured_output=structured_output))


def record(sql: Any) -> dict[str, Any]:
    cols = ("llm_ms", "prompt_tokens", "completion_tokens", "cost", "attempts", "calls",
            "tokens_counted", "fallback", "validation_failures", "error")
    [row] = sql(f"SELECT {', '.join(cols)} FROM funnel_turns WHERE session_id = %s",
                (SESSION,))
    return dict(zip(cols, row, strict=True))


async def test_openai_gets_strict_true_and_a_forced_null_answer_is_applied(
        db_url: str, sql: Any, keys: None) -> None:
    """The request carries ``strict: true`` and the strict form; the answer a strict model
    gives (every property, nulls for the rest) is applied as if they were absent."""
    text = "Hi, I have a cat"
    output: dict[str, Any] = {"reply": "Hello! A cat, lovely. What breed?", "language": "en",
                              "updates": {"pet": {"type": "cat"}}}
    openai = strict.forms(FUNNEL.stages["greeting"].schema).openai
    assert openai is not None
    forced = _forced(output, openai)
    assert None in forced.values()  # the model had to write nulls
    with FakeProvider("openai") as fake:
        engine = await open_engine(PURAMUR, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            fake.reply(json.dumps(forced))
            result = await engine.handle(SESSION, text)
            row = await engine.state(SESSION)
        finally:
            await engine.close()
    assert not result.fallback and result.validation_failures == 0, result.error
    assert result.reply == output["reply"]
    assert row is not None and row["pet"] == output["updates"]["pet"]
    [body] = fake.requests
    fmt = body["response_format"]["json_schema"]
    assert fmt["strict"] is True and fmt["schema"] == openai
    assert_strict_form(fmt["schema"])


async def test_openais_tool_is_strict_too(db_url: str, keys: None) -> None:
    with FakeProvider("openai") as fake:
        engine = await open_engine(PURAMUR, db_url, "openai/gpt-4o-mini", fake.api_base,
                                   structured_output="tool")
        try:
            fake.reply(envelope())
            result = await engine.handle(SESSION, "Hi!")
        finally:
            await engine.close()
    assert not result.fallback, result.error
    [tool] = fake.requests[0]["tools"]
    assert tool["function"]["strict"] is True
    assert_strict_form(tool["function"]["parameters"])


async def test_a_server_that_refuses_the_strict_form_gets_the_portable_one(
        db_url: str, sql: Any, keys: None, caplog: pytest.LogCaptureFixture) -> None:
    """An Azure API version before strict mode, or a schema the provider's compiler
    rejects: a 400 naming response_format. The same strategy goes again at once with the
    portable form and ``strict: false`` (not a step down to JSON without a schema), and
    stays so for the process; the refused call is listed."""
    with FakeProvider("openai") as fake:
        engine = await open_engine(PURAMUR, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            fake.fail(400, "Invalid schema for response_format 'greeting_output': In "
                           "context=(), 'additionalProperties' is required")
            fake.reply(envelope())
            result = await engine.handle(SESSION, "Hi!")
            fake.reply(envelope())
            assert not (await engine.handle("strict-2", "Hi!")).fallback
        finally:
            await engine.close()
    assert not result.fallback, result.error
    sent = [b["response_format"]["json_schema"] for b in fake.requests]
    assert [s["strict"] for s in sent] == [True, False, False]
    assert sent[1]["schema"] == strict.forms(FUNNEL.stages["greeting"].schema).portable
    rec = record(sql)
    assert [c["outcome"] for c in rec["calls"]] == ["refused", "ok"]
    assert rec["attempts"] == 2 and rec["error"] is None
    [warning] = [r.getMessage() for r in caplog.records if "strict form" in r.getMessage()]
    assert "openai/gpt-4o-mini" in warning and "additionalProperties" in warning


async def test_a_self_hosted_server_keeps_strict_false(db_url: str, keys: None) -> None:
    with FakeProvider("openai") as fake:
        engine = await open_engine(PURAMUR, db_url, "openai/qwen2.5-7b", fake.api_base)
        try:
            fake.reply(envelope())
            assert not (await engine.handle(SESSION, "Hi!")).fallback
        finally:
            await engine.close()
    fmt = fake.requests[0]["response_format"]["json_schema"]
    assert fmt["strict"] is False and fmt["schema"]["required"] == ["reply"]


# -- accounting ----------------------------------------------------------------------------


async def test_a_call_that_timed_out_before_a_retry_answered_is_counted(
        db_url: str, sql: Any, keys: None, tmp_path: Path) -> None:
    funnel = make_funnel(tmp_path, timeout=1, retries=1, deadline=20)
    with FakeProvider("openai") as fake:
        engine = await open_engine(funnel, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            fake.sleep(5)
            fake.reply(envelope(), prompt_tokens=400, completion_tokens=40)
            result = await engine.handle(SESSION, "Hi!")
        finally:
            await engine.close()
    assert not result.fallback, result.error
    assert fake.calls == 2
    rec = record(sql)
    timed_out, answered = rec["calls"]
    assert timed_out["outcome"] == "timeout" and answered["outcome"] == "ok"
    assert [c["attempt"] for c in rec["calls"]] == [1, 2]
    assert {c["model"] for c in rec["calls"]} == {"openai/gpt-4o-mini"}
    assert not timed_out["repair"] and not answered["repair"]
    # The timed-out call was sent and read: its prompt counted by the tokenizer.
    assert timed_out["ms"] >= 900 and timed_out["tokens_counted"] is True
    assert timed_out["prompt_tokens"] > 0 and timed_out["completion_tokens"] == 0
    assert timed_out["cost"] > 0
    assert (answered["prompt_tokens"], answered["completion_tokens"]) == (400, 40)
    assert answered["tokens_counted"] is False
    assert rec["llm_ms"] >= timed_out["ms"] + answered["ms"] - 1
    assert rec["prompt_tokens"] == timed_out["prompt_tokens"] + 400
    assert rec["completion_tokens"] == 40
    # The column keeps 6 decimals.
    assert float(rec["cost"]) == pytest.approx(timed_out["cost"] + answered["cost"],
                                               abs=1e-6)
    assert rec["attempts"] == 2 and rec["tokens_counted"] is True
    assert result.prompt_tokens == rec["prompt_tokens"]
    assert result.model_seconds >= 0.9


async def test_a_provider_without_usage_has_its_tokens_counted(db_url: str, sql: Any,
                                                               keys: None) -> None:
    """litellm reports zeros (and a cost of 0) for a response without ``usage``: the engine
    counts both sides with the model's tokenizer, prices them, and says it counted."""
    with FakeProvider("openai") as fake:
        engine = await open_engine(PURAMUR, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            fake.reply(envelope(), usage=False)
            result = await engine.handle(SESSION, "Hi!")
        finally:
            await engine.close()
    assert not result.fallback, result.error
    rec = record(sql)
    [call] = rec["calls"]
    assert call["tokens_counted"] is True and rec["tokens_counted"] is True
    assert call["prompt_tokens"] > 100 and call["completion_tokens"] > 5
    assert (rec["prompt_tokens"], rec["completion_tokens"]) == (call["prompt_tokens"],
                                                                call["completion_tokens"])
    assert rec["cost"] is not None and rec["cost"] > 0
    assert result.prompt_tokens == call["prompt_tokens"]


async def test_the_repair_and_its_failed_calls_are_listed(db_url: str, sql: Any,
                                                          keys: None, tmp_path: Path) -> None:
    """An answer rejected, then a repair call that fails after its retry: four calls, the
    last three the repair's, all counted; the turn's cost is their sum."""
    funnel = make_funnel(tmp_path, retries=1)
    with FakeProvider("openai") as fake:
        engine = await open_engine(funnel, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            fake.reply('{"reply": ""}', prompt_tokens=300, completion_tokens=5)
            fake.fail(500, retry_after="0").fail(503, retry_after="0")
            result = await engine.handle(SESSION, "Hi!")
        finally:
            await engine.close()
    assert result.fallback
    rec = record(sql)
    assert [(c["attempt"], c["outcome"], c["repair"]) for c in rec["calls"]] == [
        (1, "ok", False), (2, "error", True), (3, "error", True)]
    assert rec["attempts"] == 3
    assert (rec["prompt_tokens"], rec["completion_tokens"]) == (300, 5)
    assert rec["llm_ms"] >= sum(c["ms"] for c in rec["calls"]) - 3
    # The errors billed nothing.
    assert float(rec["cost"]) == pytest.approx(rec["calls"][0]["cost"], abs=1e-6)
    assert rec["tokens_counted"] is False


# -- funnel doctor -------------------------------------------------------------------------


def test_doctor_says_which_model_gets_the_strict_form(keys: None,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    from engine.cli import main

    stages = len(FUNNEL.stages)
    with FakeProvider("openai") as fake:
        for _ in range(4):
            fake.reply('{"ok": true}')
        fake.reply("ok")
        for _ in range(stages):
            fake.reply('{"reply": "hi"}')
        code = main(["doctor", str(PURAMUR), "--model", "openai/gpt-4o-mini",
                     "--api-base", fake.api_base])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "strict: yes (openai structured outputs: strict: true on response_format" in out
    assert "stage schemas (openai form, sent with json_schema):" in out
    for body in fake.requests[-stages:]:
        assert body["response_format"]["json_schema"]["strict"] is True
        assert_strict_form(body["response_format"]["json_schema"]["schema"])

    with FakeProvider("openai") as fake:
        for _ in range(4):
            fake.reply('{"ok": true}')
        fake.reply("ok")
        for _ in range(stages):
            fake.reply('{"reply": "hi"}')
        code = main(["doctor", str(PURAMUR), "--model", "openai/qwen2.5-7b",
                     "--api-base", fake.api_base])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "strict: no (a model litellm does not know (a self-hosted server?)" in out
    assert "stage schemas (portable form, sent with json_schema):" in out


# -- the prompt says what the contract allows ----------------------------------------------


@pytest.mark.parametrize("name", list(FUNNEL.stages))
def test_the_puramur_prompt_allows_only_what_the_contract_does(name: str) -> None:
    """A prompt that shows the model an answer with ``updates`` where the stage's contract
    has none (cart_building), or with actions where it takes none (handoff), has a strict
    model fight its instructions: each stage's prompt shows the shape its contract allows,
    and names only fields it may update and actions it may take."""
    import re

    from engine.turn.prompts import build_context, render_parts

    stage = FUNNEL.stages[name]
    context = build_context(FUNNEL, stage, {}, {}, customer_message="", messages=[],
                            returning=False, idle_seconds=None,
                            now="2026-01-01T00:00:00+00:00")
    static = render_parts(stage, context)[0]
    [shape] = [line.split("of this shape: ", 1)[1] for line in static.splitlines()
               if "of this shape: " in line]
    updates = stage.schema["properties"].get("updates", {}).get("properties", {})
    assert ('"updates": {' in shape) == bool(updates), shape
    assert ('"actions": [' in shape) == bool(stage.allowed_actions), shape
    inside = shape.split('"updates": {', 1)[-1] if updates else ""
    shown = set(re.findall(r'"([a-z_]+)": \{', inside))
    assert shown == set(updates), (shown, set(updates))
    for field, narrowed in re.findall(r'"([a-z_]+)": \{"([a-z_]+)"', inside):
        assert narrowed in updates[field]["properties"], (field, narrowed)
    for path in re.findall(r'"updates\.([a-z_.]+)"', static):
        head, *rest = path.split(".")
        assert head in updates, (name, path)
        for part in rest:
            assert part in updates[head].get("properties", {}), (name, path)
    named = set(re.findall(r'\{"type": "([a-z_]+)"', static))
    assert named <= stage.allowed_actions, (name, named - stage.allowed_actions)
