"""Every provider's wire format, through the real litellm HTTP path (engine.llm).

Each case points a model string at a recording fake server that speaks that
provider's protocol (tests/fake_providers.py) and checks two things: what the
engine sent for structured output, and that the Puramur conversation's first
three turns (greeting -> discovery -> presentation, from the happy-path
scenario) work. Then the engine's own retries (429 and 500, then 200: exactly
two calls), the turn deadline (a hanging server ends in the fallback), a
missing key (one call, an error naming the variable), fallback models, and
the strategy overrides.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PURAMUR, ROOT, puramur_data
from fake_providers import FakeProvider
from test_litellm_path import close_litellm_clients, loopback_only  # noqa: F401

pytestmark = pytest.mark.postgres

SESSION = "p-1"
HAPPY = ROOT / "funnels" / "puramur" / "scenarios" / "happy_path.yaml"
KEYS = {"OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "sk-ant-test",
        "GEMINI_API_KEY": "gm-test", "AZURE_API_KEY": "az-test",
        "AZURE_API_VERSION": "2024-08-01-preview"}


def _schema_of(body: dict[str, Any]) -> dict[str, Any]:
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema", fmt
    assert fmt["json_schema"]["name"].endswith("_output")
    return dict(fmt["json_schema"]["schema"])


# What OpenAI's strict mode refuses, or what the portable form turns into words.
REFUSED = ("minLength", "maxLength", "pattern", "format", "minimum", "maximum", "maxItems",
           "minItems", "default", "const", "$ref", "$defs", "oneOf", "allOf", "$schema")


def objects(schema: Any) -> Iterator[dict[str, Any]]:
    """Every object schema in ``schema``, at any depth."""
    if isinstance(schema, dict):
        if schema.get("type") == "object" or "properties" in schema:
            yield schema
        for value in schema.values():
            yield from objects(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from objects(value)


def assert_strict_form(schema: dict[str, Any]) -> None:
    """OpenAI's strict form: every object lists all its properties as required and takes no
    others; no keyword strict mode refuses."""
    found = list(objects(schema))
    assert found
    for node in found:
        assert node["additionalProperties"] is False, node
        assert node["required"] == list(node["properties"]), node
    text = json.dumps(schema)
    for keyword in REFUSED:
        assert f'"{keyword}"' not in text, keyword


def assert_closed_form(schema: dict[str, Any]) -> None:
    """The closed form (Anthropic's output_format, Gemini's response_json_schema): every
    object takes no keys it does not name; optional properties stay optional."""
    for node in objects(schema):
        assert node["additionalProperties"] is False, node
    assert schema["required"] == ["reply"]


def _tool_schema(body: dict[str, Any]) -> dict[str, Any]:
    [tool] = body["tools"]
    if "function" in tool:  # OpenAI's shape
        assert body["tool_choice"] == {"type": "function", "function": {"name": "answer"}}
        return dict(tool["function"]["parameters"])
    assert tool["name"] == "answer"  # Anthropic's shape
    assert body["tool_choice"]["type"] == "tool" and body["tool_choice"]["name"] == "answer"
    return dict(tool["input_schema"])


@dataclass
class Case:
    wire: str
    model: str
    sent: Callable[[dict[str, Any]], dict[str, Any]]  # the schema the request carried
    path: str
    known_cost: bool | None = False  # None: litellm may or may not know (Ollama's are 0)
    extra_calls: int = 0  # refused strategies before the first answer
    form: str = "portable"  # what engine.llm.strict sends: openai, closed or portable
    env: dict[str, str] = field(default_factory=lambda: dict(KEYS))


CASES = {
    "openai": Case("openai", "openai/gpt-4o-mini", _schema_of, "/v1/chat/completions",
                   known_cost=True, form="openai"),
    "azure": Case("azure", "azure/gpt-4o", _schema_of,
                  "/openai/deployments/gpt-4o/chat/completions", known_cost=True,
                  form="openai"),
    "anthropic-output-format": Case(
        "anthropic", "anthropic/claude-sonnet-4-5",
        lambda b: dict(b["output_format"]["schema"]), "/v1/messages", known_cost=True,
        form="closed"),
    # Claude 3.x has left this litellm's price map: its cost is unknown.
    "anthropic-tool": Case("anthropic", "anthropic/claude-3-5-sonnet-20241022", _tool_schema,
                           "/v1/messages"),
    "ollama-chat": Case("ollama", "ollama_chat/llama3.2", lambda b: dict(b["format"]),
                        "/api/chat", known_cost=None),
    "ollama-generate": Case("ollama", "ollama/llama3", lambda b: dict(b["format"]),
                            "/api/generate", known_cost=True),
    "gemini": Case("gemini", "gemini/gemini-2.0-flash",
                   lambda b: dict(b["generationConfig"]["response_json_schema"]),
                   "/models/gemini-2.0-flash:generateContent", form="closed"),
    "vllm": Case("openai", "openai/Qwen2.5-7B-Instruct", _schema_of, "/v1/chat/completions"),
    "lmstudio": Case("lmstudio", "openai/qwen2.5-7b-instruct", _schema_of,
                     "/v1/chat/completions"),
    "llamacpp": Case("llamacpp", "openai/smollm2",
                     lambda b: dict(b["response_format"]["schema"]), "/v1/chat/completions",
                     extra_calls=1),
}


def happy_turns(n: int = 3) -> list[tuple[str, dict[str, Any]]]:
    data = yaml.safe_load(HAPPY.read_text("utf-8"))
    return [(t["customer"], t["llm"]) for t in data["turns"][:n]]


@pytest.fixture(autouse=True)
def fresh_strategies() -> Iterator[None]:
    """Each test starts with no strategy stepped down (the choice lives per process)."""
    from engine.llm import strategy

    strategy.forget()
    yield
    strategy.forget()


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)


def make_funnel(tmp_path: Path, **model: Any) -> Path:
    """A copy of the puramur funnel with ``model`` settings changed."""
    data = puramur_data()
    data["model"].update(model)
    path = tmp_path / "puramur_models.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    return path


async def open_engine(funnel: Path, db_url: str, model: str, api_base: str | None,
                      structured_output: str | None = None) -> Any:
    from engine.llm.models import LiteLLMModel
    from engine.turn.engine import Engine

    return await Engine.open(funnel, db=db_url, model=LiteLLMModel(
        model, api_base=api_base, structured_output=structured_output))


def turn_rows(sql: Any) -> list[dict[str, Any]]:
    cols = ("stage_before", "stage_after", "fallback", "cost", "model", "attempts", "error")
    rows = sql(f"SELECT {', '.join(cols)} FROM funnel_turns WHERE session_id = %s ORDER BY id",
               (SESSION,))
    return [dict(zip(cols, r, strict=True)) for r in rows]


def envelope(n: int = 0) -> str:
    return json.dumps(happy_turns(n + 1)[n][1])


# -- every provider: what is sent, and a whole conversation ------------------------------


@pytest.mark.parametrize("name", list(CASES))
async def test_conversation_on_every_wire(name: str, db_url: str, sql: Any, keys: None) -> None:
    case = CASES[name]
    from jsonschema import Draft202012Validator

    with FakeProvider(case.wire) as fake:
        engine = await open_engine(PURAMUR, db_url, case.model, fake.api_base)
        try:
            stages = []
            for text, output in happy_turns():
                fake.reply(json.dumps(output), prompt_tokens=400, completion_tokens=40)
                result = await engine.handle(SESSION, text)
                assert not result.fallback, result.error
                assert result.reply == output["reply"]
                stages.append((result.stage_before, result.stage_after))
            assert stages == [("greeting", "discovery"), ("discovery", "presentation"),
                              ("presentation", "presentation")]
            row = await engine.state(SESSION)
            assert row is not None
            assert [p["sku"] for p in row["presented_products"]] == ["PR251010", "PR251020"]
            assert row["pet"]["breed"] == "Sphynx"
        finally:
            await engine.close()

        assert fake.calls == 3 + case.extra_calls and fake.pending == 0
        assert set(fake.paths) == {case.path}
        # every answered request carried the stage's schema, in the form its provider
        # enforces (engine.llm.strict), else the portable one
        for body, stage in zip(fake.requests[case.extra_calls:],
                               ("greeting", "discovery", "presentation"), strict=True):
            sent = case.sent(body)
            Draft202012Validator.check_schema(sent)
            assert set(sent["properties"]) == {"reply", "language", "updates", "actions"}
            text = json.dumps(sent)
            for keyword in ("$ref", "$defs", "maxLength", "minLength", "maxItems", "oneOf"):
                assert keyword not in text, (stage, keyword)
            if case.form == "openai":
                assert body["response_format"]["json_schema"]["strict"] is True
                assert_strict_form(sent)
            else:
                assert sent["required"] == ["reply"]
                assert '"strict"' not in json.dumps(body) or \
                    body["response_format"]["json_schema"]["strict"] is False
            if case.form == "closed":
                assert_closed_form(sent)
        presentation = json.dumps(case.sent(fake.requests[-1]))
        assert "present_products" in presentation  # the $ref'd action schemas, inlined

    rows = turn_rows(sql)
    assert [r["model"] for r in rows] == [case.model] * 3
    assert [r["attempts"] for r in rows] == [1 + case.extra_calls, 1, 1]
    assert all(r["error"] is None for r in rows)
    if case.known_cost:
        assert all(r["cost"] is not None for r in rows)
    elif case.known_cost is False:  # litellm has no price: unknown, not 0
        assert all(r["cost"] is None for r in rows)


async def test_the_step_down_is_logged_once_per_process(db_url: str, keys: None,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    """llama-cpp-python's server refuses ``json_schema`` (a 500 naming response_format): one
    refused call, a warning
    naming the reason, then ``json_object`` with the schema for the rest of the process."""
    with FakeProvider("llamacpp") as fake:
        engine = await open_engine(PURAMUR, db_url, "openai/smollm2", fake.api_base)
        try:
            for text, output in happy_turns(2):
                fake.reply(json.dumps(output))
                assert not (await engine.handle(SESSION, text)).fallback
        finally:
            await engine.close()
    kinds = [b["response_format"]["type"] for b in fake.requests]
    assert kinds == ["json_schema", "json_object", "json_object"]
    [warning] = [r for r in caplog.records if r.name == "funnel.models"]
    assert "'json_schema'" in warning.getMessage() and "json_object_schema" in \
        warning.getMessage()
    assert "response_format" in warning.getMessage()


async def test_lmstudio_is_never_sent_json_object(db_url: str, keys: None,
                                                  tmp_path: Path) -> None:
    """Forcing ``json_object`` on a server that refuses it is a clear error, not a 200."""
    funnel = make_funnel(tmp_path, structured_output="json_object")
    with FakeProvider("lmstudio") as fake:
        engine = await open_engine(funnel, db_url, "openai/local", fake.api_base)
        try:
            fake.reply(envelope())
            result = await engine.handle(SESSION, "Hi!")
        finally:
            await engine.close()
    assert result.fallback
    assert fake.calls == 1  # a forced strategy has nothing to step down to; 400 is final
    assert "BadRequestError" in (result.error or "")
    assert "json_schema" in (result.error or "")


@pytest.mark.parametrize("strategy", ["json_schema", "json_object_schema", "tool",
                                      "json_object", "prompt"])
async def test_strategy_set_on_the_command_line(strategy: str, db_url: str, keys: None
                                                ) -> None:
    with FakeProvider("openai") as fake:
        engine = await open_engine(PURAMUR, db_url, "openai/gpt-4o-mini", fake.api_base,
                                   structured_output=strategy)
        try:
            fake.reply(envelope())
            result = await engine.handle(SESSION, "Hi!")
        finally:
            await engine.close()
    assert not result.fallback, result.error
    [body] = fake.requests
    fmt = body.get("response_format")
    expected = {"json_schema": "json_schema", "json_object_schema": "json_object",
                "json_object": "json_object", "tool": None, "prompt": None}[strategy]
    assert (fmt or {}).get("type") == expected
    assert ("schema" in (fmt or {})) == (strategy == "json_object_schema")
    assert ("tools" in body) == (strategy == "tool")


async def test_strategy_set_in_the_funnel(db_url: str, keys: None, tmp_path: Path) -> None:
    funnel = make_funnel(tmp_path, structured_output="tool")
    with FakeProvider("ollama") as fake:
        engine = await open_engine(funnel, db_url, "ollama_chat/llama3.2", fake.api_base)
        try:
            fake.reply(envelope())
            result = await engine.handle(SESSION, "Hi!")
        finally:
            await engine.close()
    assert not result.fallback, result.error
    [body] = fake.requests
    assert "format" not in body
    assert body["tools"][0]["function"]["name"] == "answer"


# -- retries, deadline, missing key --------------------------------------------------------


@pytest.mark.parametrize("status", [429, 500])
@pytest.mark.parametrize("name", list(CASES))
async def test_a_transient_error_is_retried_once(name: str, status: int, db_url: str,
                                                 sql: Any, keys: None) -> None:
    case = CASES[name]
    with FakeProvider(case.wire) as fake:
        engine = await open_engine(PURAMUR, db_url, case.model, fake.api_base)
        try:
            fake.fail(status, "slow down" if status == 429 else "upstream error",
                      retry_after="0")
            fake.reply(envelope())
            result = await engine.handle(SESSION, "Hi!")
        finally:
            await engine.close()
    assert not result.fallback, result.error
    assert result.reply == happy_turns(1)[0][1]["reply"]
    # llama-cpp-python's refusal of json_schema comes first (and is not a retry)
    assert fake.calls == 2 + case.extra_calls and fake.pending == 0
    [row] = turn_rows(sql)
    assert row["attempts"] == 2 + case.extra_calls and row["error"] is None


async def test_retry_after_is_honoured(db_url: str, keys: None) -> None:
    with FakeProvider("anthropic") as fake:
        engine = await open_engine(PURAMUR, db_url, "anthropic/claude-sonnet-4-5",
                                   fake.api_base)
        try:
            fake.fail(429, "rate limited", retry_after="1")
            fake.reply(envelope())
            started = time.monotonic()
            result = await engine.handle(SESSION, "Hi!")
            waited = time.monotonic() - started
        finally:
            await engine.close()
    assert not result.fallback and fake.calls == 2
    assert waited >= 1.0  # the server asked for a second; the default backoff is 0.25 s


@pytest.mark.parametrize("name", ["openai", "anthropic-tool", "ollama-chat", "gemini",
                                  "azure"])
async def test_a_hanging_provider_ends_in_the_fallback_by_the_deadline(
        name: str, db_url: str, sql: Any, keys: None, tmp_path: Path) -> None:
    case = CASES[name]
    funnel = make_funnel(tmp_path, deadline=2, timeout=30, retries=2)
    with FakeProvider(case.wire) as fake:
        engine = await open_engine(funnel, db_url, case.model, fake.api_base)
        try:
            fake.sleep(60)
            started = time.monotonic()
            result = await engine.handle(SESSION, "Hi!")
            elapsed = time.monotonic() - started
        finally:
            await engine.close()
    assert result.fallback
    assert 1.0 <= elapsed <= 3.0, f"a 2 s deadline took {elapsed:.1f} s"
    assert fake.calls == 1  # no time was left for a retry
    [row] = turn_rows(sql)
    assert row["attempts"] == 1 and "deadline" in (row["error"] or "")
    assert "retr" not in (row["error"] or "")  # no retry was made, and none is claimed


async def test_a_500_is_retried_until_the_deadline_not_past_it(db_url: str, keys: None,
                                                               tmp_path: Path) -> None:
    """Retry-After longer than the deadline: the retry is not made at all."""
    funnel = make_funnel(tmp_path, deadline=2, retries=5)
    with FakeProvider("openai") as fake:
        engine = await open_engine(funnel, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            fake.fail(503, "overloaded", retry_after="30")
            started = time.monotonic()
            result = await engine.handle(SESSION, "Hi!")
            elapsed = time.monotonic() - started
        finally:
            await engine.close()
    assert result.fallback and fake.calls == 1
    assert elapsed < 2
    assert "overloaded" in (result.error or "") and "retr" not in (result.error or "")


@pytest.mark.parametrize(("name", "variable", "http_calls"), [
    ("openai", "OPENAI_API_KEY", 1),  # a placeholder key goes out; the server says 401
    ("anthropic-output-format", "ANTHROPIC_API_KEY", 0),  # litellm refuses before sending
    ("gemini", "GEMINI_API_KEY", 0),
])
async def test_a_missing_key_makes_one_call_and_names_the_variable(
        name: str, variable: str, http_calls: int, db_url: str, sql: Any, keys: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    case = CASES[name]
    monkeypatch.delenv(variable)
    with FakeProvider(case.wire, key=KEYS[variable]) as fake:
        engine = await open_engine(PURAMUR, db_url, case.model, fake.api_base)
        try:
            fake.reply(envelope())
            result = await engine.handle(SESSION, "Hi!")
        finally:
            await engine.close()
    assert result.fallback
    assert fake.calls == http_calls  # one attempt, never retried
    [row] = turn_rows(sql)
    assert row["attempts"] == 1
    error = row["error"] or ""
    assert "in the environment" in error and variable in error.split("; set ")[-1], error


# -- fallback models ----------------------------------------------------------------------


async def test_a_fallback_model_answers_when_the_primary_is_down(
        db_url: str, sql: Any, keys: None, tmp_path: Path) -> None:
    with FakeProvider("openai") as primary, FakeProvider("anthropic") as backup:
        funnel = make_funnel(tmp_path, retries=1, fallbacks=[
            {"name": "anthropic/claude-3-5-haiku-20241022", "api_base": backup.api_base}])
        engine = await open_engine(funnel, db_url, "openai/gpt-4o-mini", primary.api_base)
        try:
            primary.fail(500).fail(502)
            backup.reply(envelope())
            result = await engine.handle(SESSION, "Hi!")
        finally:
            await engine.close()
    assert not result.fallback, result.error
    assert primary.calls == 2 and backup.calls == 1
    [row] = turn_rows(sql)
    assert row["model"] == "anthropic/claude-3-5-haiku-20241022"
    assert row["attempts"] == 3


async def test_a_hanging_primary_leaves_time_for_the_fallback(
        db_url: str, sql: Any, keys: None, tmp_path: Path) -> None:
    """Two models share a 4 s deadline: the primary is cut at its 2 s share."""
    with FakeProvider("openai") as fake:
        funnel = make_funnel(tmp_path, deadline=4, timeout=30,
                             fallbacks=["openai/gpt-4o"])
        engine = await open_engine(funnel, db_url, "openai/gpt-4o-mini", fake.api_base)
        try:
            fake.sleep(60).reply(envelope())
            started = time.monotonic()
            result = await engine.handle(SESSION, "Hi!")
            elapsed = time.monotonic() - started
        finally:
            await engine.close()
    assert not result.fallback, result.error
    assert elapsed < 4
    assert [b["model"] for b in fake.requests] == ["gpt-4o-mini", "gpt-4o"]
    [row] = turn_rows(sql)
    assert row["model"] == "openai/gpt-4o" and row["attempts"] == 2


# -- cost ---------------------------------------------------------------------------------


async def test_report_counts_the_turns_without_cost(db_url: str, keys: None) -> None:
    """One priced turn (gpt-4o-mini) and two of a self-hosted model litellm has no price for:
    the report sums the one and says two had none, rather than costing them at 0."""
    from engine.report import build_report, render_table

    with FakeProvider("openai") as fake:
        for model, session, turns in (("openai/gpt-4o-mini", "priced", 1),
                                      ("openai/local-model", "free", 2)):
            engine = await open_engine(PURAMUR, db_url, model, fake.api_base)
            try:
                for text, output in happy_turns(turns):
                    fake.reply(json.dumps(output), prompt_tokens=1000, completion_tokens=100)
                    assert not (await engine.handle(session, text)).fallback
            finally:
                await engine.close()
    report = await build_report(PURAMUR, db=db_url)
    costs = report["costs"]["conversations"]
    assert costs["turns"] == 3 and costs["turns_without_cost"] == 2
    assert costs["cost"] is not None and float(costs["cost"]) > 0
    assert "2 of 3 turns had no cost" in render_table(report)


# -- funnel doctor, summarizer endpoint ---------------------------------------------------


def test_doctor_reports_what_the_endpoint_accepts(keys: None,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A llama-cpp-python-like server: json_schema refused (a 500), the rest accepted; every
    stage's portable schema is sent once with the chosen json_object_schema."""
    from engine.cli import main

    with FakeProvider("llamacpp") as fake:
        fake.reply('{"ok": true}')  # json_object_schema
        fake.reply('{"ok": true}')  # tool
        fake.reply('{"ok": true}')  # json_object
        fake.reply("Sure! ok")  # prompt: not JSON
        stages = len(yaml.safe_load(PURAMUR.read_text("utf-8"))["stages"])
        for _ in range(stages):
            fake.reply('{"reply": "hi"}')
        code = main(["doctor", str(PURAMUR), "--model", "openai/smollm2",
                     "--api-base", fake.api_base])
    out = capsys.readouterr().out
    assert code == 0, out
    assert fake.pending == 0 and fake.calls == 5 + stages
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert lines["json_schema"].split()[1] == "no" and "response_format" in lines["json_schema"]
    assert lines["json_object_schema"].split()[1:3] == ["yes", "valid"]
    assert lines["prompt"].split()[1:3] == ["yes", "invalid"]
    # "invalid" says what it expected and what came back.
    assert 'expected the JSON object {"ok": true}' in lines["prompt"]
    assert "'Sure! ok'" in lines["prompt"]
    assert "chosen strategy: json_object_schema" in out
    assert "cost: unknown" in out
    assert "prompt cache: not marked" in out  # an OpenAI-compatible server
    assert lines["presentation"].split()[1] == "compiles"
    stage_bodies = fake.requests[-stages:]
    assert all(b["response_format"]["type"] == "json_object" for b in stage_bodies)
    assert all("maxLength" not in json.dumps(b) for b in stage_bodies)


async def test_the_summarizer_uses_the_funnels_endpoint(db_url: str, keys: None,
                                                        tmp_path: Path) -> None:
    data = puramur_data()
    data["memory"]["summarizer_model"] = "openai/summarizer"
    data["model"]["api_base"] = "http://127.0.0.1:9/v1"
    funnel = tmp_path / "summarized.yaml"
    funnel.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    from engine.turn.engine import Engine

    for given, expected in ((None, "http://127.0.0.1:9/v1"),
                            ("http://127.0.0.1:8/v1", "http://127.0.0.1:8/v1")):
        engine = await Engine.open(funnel, db=db_url, model="openai/main", api_base=given)
        try:
            summarizer: Any = engine.summary.summarizer
            assert summarizer.model.name == "openai/summarizer"
            assert summarizer.model.api_base == expected
        finally:
            await engine.close()


def test_the_command_line_takes_a_strategy() -> None:
    """``--structured-output`` on chat and doctor reaches the model (the requests themselves
    are checked by test_strategy_set_on_the_command_line)."""
    from engine.cli import _parser
    from engine.llm.models import make_model

    for command in ("chat", "doctor", "serve"):
        args = _parser().parse_args([command, "f.yaml", "--structured-output", "tool"])
        assert args.structured_output == "tool"
    with pytest.raises(SystemExit):
        _parser().parse_args(["chat", "f.yaml", "--structured-output", "grammar"])
    model: Any = make_model("openai/x", api_base="http://127.0.0.1:9/v1",
                            structured_output="json_object_schema")
    assert model.caller.structured_output == "json_object_schema"
    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match="'grammar' is not one of auto, json_schema"):
        make_model("openai/x", structured_output="grammar")


def test_the_service_takes_a_strategy_from_its_environment() -> None:
    from engine.errors import ConfigError
    from engine.service.config import ServiceConfig

    env = {"FUNNEL_SERVE_FUNNELS": str(PURAMUR), "FUNNEL_STRUCTURED_OUTPUT": "tool"}
    assert ServiceConfig.from_env(env).structured_output == "tool"
    del env["FUNNEL_STRUCTURED_OUTPUT"]
    assert ServiceConfig.from_env(env).structured_output is None
    with pytest.raises(ConfigError, match="FUNNEL_STRUCTURED_OUTPUT must be one of auto"):
        ServiceConfig.from_env({**env, "FUNNEL_STRUCTURED_OUTPUT": "grammar"})
