"""Claude's prompt cache on every route litellm serves it by, and the cached tokens a user sees.

Claude caches only up to a marked block. On Anthropic's API the mark is the
block's ``cache_control`` (tests/test_prompt_cache.py); through litellm the same
mark reaches Bedrock Converse as a ``cachePoint`` block, Bedrock InvokeModel and
OpenRouter as ``cache_control``. Each is checked on the wire, against the
recording fakes of tests/fake_providers.py: the marks are the static prefix and,
from the second turn, the last window message (the previous reply: the second
breakpoint, tests/test_prompt_cache_breakpoints.py), and a route that does not
cache what is marked (OpenAI, a Bedrock model without prompt caching, a model
OpenRouter serves from OpenAI) gets the request it got before, unmarked. The
cached and cache-write tokens each wire reports reach the turn record,
:class:`engine.TurnResult` and the service's metrics.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import PURAMUR
from fake_providers import FakeProvider
from test_litellm_path import close_litellm_clients, loopback_only  # noqa: F401
from test_providers import SESSION, fresh_strategies, happy_turns, keys, open_engine  # noqa: F401

from engine.llm import cache

pytestmark = pytest.mark.postgres

BEDROCK_CLAUDE = "bedrock/us.anthropic.claude-sonnet-4-5-20250929-v1:0"
# No prompt caching on Bedrock (litellm's map): a cachePoint would be refused.
BEDROCK_NO_CACHE = "bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0"
# The presentation turn's state, which belongs after the cached prefix.
STATE = '"breed":"Sphynx"'


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Dummy AWS credentials: litellm signs with them, the fake checks only the scheme."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_BEARER_TOKEN_BEDROCK",
                 "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKEFAKEFAKEFAKE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret-key")
    monkeypatch.setenv("AWS_REGION_NAME", "us-east-1")
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    # litellm fetches its Anthropic beta-header table from GitHub for some models
    # (Opus 4.8) unless told to use its bundled copy.
    monkeypatch.setenv("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True")
    cache.forget()
    yield
    cache.forget()


def _found(value: Any, key: str) -> list[Any]:
    """Every value under ``key`` anywhere in ``value``."""
    if isinstance(value, dict):
        here = [value[key]] if key in value else []
        return here + [m for v in value.values() for m in _found(v, key)]
    if isinstance(value, list):
        return [m for v in value for m in _found(v, key)]
    return []


def _sequence(body: dict[str, Any]) -> list[list[Any]]:
    """Every text block of a request in wire order, as ``[text, marked]``: marked by
    ``cache_control`` or a ``cachePoint`` key (Anthropic's, InvokeModel Nova's), or by a
    ``cachePoint`` block right after it (Converse's)."""
    out: list[list[Any]] = []

    def blocks(content: Any) -> None:
        if isinstance(content, str):
            out.append([content, False])
            return
        for block in content or []:
            if "text" in block:
                out.append([block["text"], "cache_control" in block or "cachePoint" in block])
            elif "cachePoint" in block:
                out[-1][1] = True

    system = body.get("system")
    blocks([{"text": system}] if isinstance(system, str) else system)
    for message in body.get("messages", []):
        blocks(message["content"])
    return out


REPLIES = [output["reply"] for _, output in happy_turns(3)] + ["About two months."]


def _turns(bodies: list[Any]) -> list[Any]:
    """The turns' requests, without the observer's (the summarizer defaults to the
    funnel's model; with no reply queued for it, it fails and catches up later)."""
    out = [b for b in bodies if _sequence(b)[0][0].startswith("You are the Puramur consultant")]
    assert len(out) == len(REPLIES)
    return out


def _breakpoints_are_the_static_prefix_and_the_last_reply(bodies: list[Any]) -> None:
    """Turn by turn: the static prefix is marked, and from the second turn the previous
    reply (the last window message) too; nothing else."""
    for i, body in enumerate(_turns(bodies)):
        marked = [text for text, flag in _sequence(body) if flag]
        assert marked[0].startswith("You are the Puramur consultant"), marked
        assert marked[1:] == ([REPLIES[i - 1]] if i else []), marked


def _after(body: dict[str, Any], static: str, needle: str) -> bool:
    """Whether ``needle`` is in a text block of ``body`` other than the static prefix."""
    return any(needle in text for text in _found(body, "text") if text != static)


async def _conversation(fake: FakeProvider, db_url: str, model: str, *,
                        cached: tuple[int, ...] = (0, 1200, 1200, 1200),
                        written: tuple[int, ...] = (0, 0, 0, 0),
                        session: str = SESSION) -> list[Any]:
    """The happy path's three turns and a question that stays in presentation, each
    answered with 1,500 prompt tokens of which ``cached[i]`` came from the cache and
    ``written[i]`` were written to it."""
    engine = await open_engine(PURAMUR, db_url, model, fake.api_base)
    turns = [*happy_turns(3), ("How long does a bottle last?",
                               {"reply": "About two months."})]
    results = []
    try:
        for (text, output), read, write in zip(turns, cached, written, strict=True):
            fake.reply(json.dumps(output), prompt_tokens=1500, completion_tokens=40,
                       cached_tokens=read, written_tokens=write)
            result = await engine.handle(session, text)
            assert not result.fallback, result.error
            results.append(result)
    finally:
        await engine.close()
    assert results[-1].stage_before == results[-1].stage_after == "presentation"
    return results


# -- Bedrock Converse: cachePoints after the static prefix and the last reply ------------


async def test_bedrock_converse_gets_cache_points_after_the_static_prefix_and_last_reply(
        db_url: str, sql: Any, aws: None) -> None:
    with FakeProvider("bedrock") as fake:
        results = await _conversation(fake, db_url, BEDROCK_CLAUDE,
                                      written=(1200, 150, 150, 150))
        bodies, paths = fake.requests, fake.paths
    assert all(p.endswith("/converse") for p in paths)
    _breakpoints_are_the_static_prefix_and_the_last_reply(bodies)
    statics = []
    for i, body in enumerate(_turns(bodies)):
        system = body["system"]
        # One cache point after the first block, one after the last reply from turn 2.
        assert _found(body, "cachePoint") == [{"type": "default"}] * (2 if i else 1), system
        assert "cachePoint" in system[1] and set(system[0]) == {"text"}
        if i:
            assert body["messages"][-2]["role"] == "assistant"
            assert body["messages"][-2]["content"][-1] == {"cachePoint": {"type": "default"}}
        assert _found(body, "cache_control") == []  # Converse has no such field
        statics.append(system[0]["text"])
    # The presentation turns: the same prefix word for word, the state after the point.
    assert statics[2] == statics[3]
    assert STATE not in statics[3] and _after(_turns(bodies)[3], statics[3], STATE)

    # Bedrock's cacheReadInputTokens, through litellm, to the record and the result.
    assert [r.cached_prompt_tokens for r in results] == [0, 1200, 1200, 1200]
    assert [r.prompt_tokens for r in results] == [1500] * 4
    # ... and cacheWriteInputTokens.
    assert [r.cache_write_tokens for r in results] == [1200, 150, 150, 150]
    rows = sql("SELECT prompt_tokens, cached_prompt_tokens, cache_write_tokens, cost "
               "FROM funnel_turns WHERE session_id = %s ORDER BY id", (SESSION,))
    assert [(p, c, w) for p, c, w, _ in rows] == [(1500, 0, 1200)] + [(1500, 1200, 150)] * 3
    # litellm bills writes at 1.25 times the input price and reads at a tenth of it.
    import litellm

    info = litellm.get_model_info(model=BEDROCK_CLAUDE)
    prices = [info["input_cost_per_token"], info["output_cost_per_token"],
              info["cache_creation_input_token_cost"], info["cache_read_input_token_cost"]]
    assert all(isinstance(p, float) for p in prices), prices  # the map prices them all
    price_in, price_out, price_write, price_read = (float(p or 0) for p in prices)
    assert price_write == pytest.approx(1.25 * price_in)
    assert price_read == pytest.approx(0.1 * price_in)
    # (the record keeps the cost to six decimals)
    assert float(rows[0][3]) == pytest.approx(300 * price_in + 1200 * price_write
                                              + 40 * price_out, abs=1e-5)
    assert float(rows[3][3]) == pytest.approx(150 * price_in + 150 * price_write
                                              + 1200 * price_read + 40 * price_out, abs=1e-5)


async def test_a_bedrock_model_without_prompt_caching_is_sent_no_cache_point(
        db_url: str, aws: None) -> None:
    with FakeProvider("bedrock") as fake:
        await _conversation(fake, db_url, BEDROCK_NO_CACHE, cached=(0, 0, 0, 0))
        bodies = fake.requests
    for body in bodies:
        assert _found(body, "cachePoint") == [] and _found(body, "cache_control") == []
        assert all(set(block) == {"text"} for block in body["system"])


# -- Bedrock InvokeModel and OpenRouter: cache_control on the static prefix and last reply


async def test_bedrock_invoke_keeps_cache_control_on_the_static_prefix(
        db_url: str, aws: None) -> None:
    model = "bedrock/invoke/anthropic.claude-sonnet-4-5-20250929-v1:0"
    with FakeProvider("bedrock") as fake:
        results = await _conversation(fake, db_url, model, written=(1200, 150, 150, 150))
        bodies, paths = fake.requests, fake.paths
    assert all(p.endswith("/invoke") for p in paths)
    _breakpoints_are_the_static_prefix_and_the_last_reply(bodies)
    for i, body in enumerate(_turns(bodies)):
        assert _found(body, "cache_control") == [{"type": "ephemeral"}] * (2 if i else 1)
        assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert STATE not in _turns(bodies)[3]["system"][0]["text"]
    assert [r.cached_prompt_tokens for r in results] == [0, 1200, 1200, 1200]
    # Claude on InvokeModel reports Anthropic's cache_creation_input_tokens.
    assert [r.cache_write_tokens for r in results] == [1200, 150, 150, 150]


async def test_nova_on_invoke_model_gets_the_cache_point_in_the_static_block(
        db_url: str, aws: None) -> None:
    with FakeProvider("bedrock") as fake:
        results = await _conversation(fake, db_url, "bedrock/invoke/amazon.nova-pro-v1:0",
                                      written=(1200, 150, 150, 150))
        bodies = fake.requests
    _breakpoints_are_the_static_prefix_and_the_last_reply(bodies)
    for i, body in enumerate(_turns(bodies)):
        assert _found(body, "cachePoint") == [{"type": "default"}] * (2 if i else 1)
        assert body["system"][0]["cachePoint"] == {"type": "default"}  # the block's own key
        assert _found(body, "cache_control") == []
    assert STATE not in _turns(bodies)[3]["system"][0]["text"]
    # InvokeModel's cacheReadInputTokenCount and cacheWriteInputTokenCount, through litellm.
    assert [r.cached_prompt_tokens for r in results] == [0, 1200, 1200, 1200]
    assert [r.cache_write_tokens for r in results] == [1200, 150, 150, 150]


async def test_openrouter_marks_claude_only(db_url: str, aws: None) -> None:
    with FakeProvider("openai") as fake:
        results = await _conversation(fake, db_url, "openrouter/anthropic/claude-sonnet-4.5",
                                      written=(1200, 150, 150, 150))
        claude = fake.requests
    _breakpoints_are_the_static_prefix_and_the_last_reply(claude)
    for i, body in enumerate(_turns(claude)):
        first = body["messages"][0]
        assert first["role"] == "system"
        assert first["content"][0]["cache_control"] == {"type": "ephemeral"}
        assert _found(body, "cache_control") == [{"type": "ephemeral"}] * (2 if i else 1)
    assert STATE not in _turns(claude)[3]["messages"][0]["content"][0]["text"]
    # OpenRouter reports the OpenAI shape: prompt_tokens_details.cached_tokens and
    # .cache_write_tokens.
    assert [r.cached_prompt_tokens for r in results] == [0, 1200, 1200, 1200]
    assert [r.cache_write_tokens for r in results] == [1200, 150, 150, 150]

    with FakeProvider("openai") as fake:
        await _conversation(fake, db_url, "openrouter/openai/gpt-4o", session="p-2")
        other = fake.requests
    for body in other:  # OpenAI's models behind OpenRouter cache by themselves
        assert _found(body, "cache_control") == []
        assert isinstance(body["messages"][0]["content"], str)


async def test_the_openai_route_is_sent_no_mark(db_url: str, aws: None,
                                                keys: None) -> None:  # noqa: F811
    with FakeProvider("openai") as fake:
        results = await _conversation(fake, db_url, "openai/gpt-4o-mini",
                                      cached=(0, 1024, 1024, 1024))
        bodies = fake.requests
    for body in bodies:
        assert _found(body, "cache_control") == [] and _found(body, "cachePoint") == []
        assert all(isinstance(m["content"], str) for m in body["messages"])
    assert [r.cached_prompt_tokens for r in results] == [0, 1024, 1024, 1024]
    assert [r.cache_write_tokens for r in results] == [0, 0, 0, 0]


def test_vertex_claude_keeps_the_mark_on_the_static_prefix(aws: None) -> None:
    """Vertex AI's HTTP path needs google-auth for a token (not installed here), so this
    route is checked one step short of the wire: litellm's own Vertex Claude request
    transformation, on the messages the engine sends."""
    import litellm
    from litellm.llms.vertex_ai.vertex_ai_partner_models.anthropic.transformation import (
        VertexAIAnthropicConfig,
    )

    from engine.format.settings import ModelSettings
    from engine.llm.client import Caller
    from engine.llm.request import ModelRequest

    model = "vertex_ai/claude-sonnet-4-5@20250929"
    chat = [{"role": "system", "content": "STATIC"}, {"role": "system", "content": "TURN"},
            {"role": "user", "content": "Hi"}]
    request = ModelRequest(messages=chat, schema={"type": "object"}, stage="greeting",
                           settings=ModelSettings(name=model), session_id="s", turn=1,
                           user_text="Hi")
    sent = Caller(litellm, model).request_kwargs(model, None, request, "prompt", 5.0)
    body = VertexAIAnthropicConfig().transform_request(
        model="claude-sonnet-4-5@20250929", messages=sent["messages"], optional_params={},
        litellm_params={}, headers={})
    assert body["system"][0] == {"type": "text", "text": "STATIC",
                                 "cache_control": {"type": "ephemeral"}}
    assert _found(body, "cache_control") == [{"type": "ephemeral"}]


# -- the decision, route by route (litellm's map and routing; no request sent) ----------


@pytest.mark.parametrize(("model", "marker"), [
    ("anthropic/claude-sonnet-4-5", "cache_control"),
    ("anthropic/claude-3-5-sonnet-20241022", "cache_control"),  # Anthropic takes it always
    (BEDROCK_CLAUDE, "cachePoint"),
    ("bedrock/converse/us.anthropic.claude-3-7-sonnet-20250219-v1:0", "cachePoint"),
    ("bedrock/anthropic.claude-3-5-haiku-20241022-v1:0", "cachePoint"),
    ("bedrock/amazon.nova-pro-v1:0", "cachePoint"),  # explicit cache points pay on Nova too
    ("bedrock/invoke/anthropic.claude-sonnet-4-5-20250929-v1:0", "cache_control"),
    ("bedrock/invoke/amazon.nova-pro-v1:0", "cachePoint"),  # a key of the text block
    ("bedrock/claude_platform/claude-sonnet-4-5", "cache_control"),
    ("bedrock/arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/x",
     None),  # not in litellm's map: unknown, so unmarked
    (BEDROCK_NO_CACHE, None),
    ("bedrock/invoke/anthropic.claude-3-5-sonnet-20240620-v1:0", None),
    ("bedrock/meta.llama3-70b-instruct-v1:0", None),
    ("vertex_ai/claude-sonnet-4-5@20250929", "cache_control"),
    ("vertex_ai/gemini-2.5-flash", None),  # a mark would be a context-cache request
    ("openrouter/anthropic/claude-sonnet-4.5", "cache_control"),
    ("openrouter/google/gemini-2.5-flash", None),
    ("openrouter/openai/gpt-4o", None),
    ("openai/gpt-4o-mini", None), ("azure/gpt-4o", None), ("gemini/gemini-2.5-flash", None),
    ("deepseek/deepseek-chat", None), ("openai/fake-model", None),
])
def test_which_routes_are_marked(model: str, marker: str | None, aws: None) -> None:
    import litellm

    assert cache.cache_marker(litellm, model) == marker
    assert cache.marks_prefix(litellm, model) is (marker is not None)


# -- reading the cached tokens --------------------------------------------------------


def test_cached_tokens_are_read_from_every_usage_shape() -> None:
    from litellm.types.utils import Usage

    # As litellm normalises each provider's usage (its own Usage object) ...
    assert cache.cached_tokens(Usage(prompt_tokens=1500, completion_tokens=4,
                                     prompt_tokens_details={"cached_tokens": 1024})) == 1024
    assert cache.cached_tokens(Usage(prompt_tokens=1500, completion_tokens=4,
                                     cache_read_input_tokens=1200)) == 1200
    assert cache.cached_tokens(Usage(prompt_tokens=1500, completion_tokens=4,
                                     prompt_cache_hit_tokens=900)) == 900  # DeepSeek's
    # ... and as the providers word it, should a usage reach the engine unconverted.
    assert cache.cached_tokens({"cacheReadInputTokens": 800}) == 800  # Bedrock Converse
    assert cache.cached_tokens({"cacheReadInputTokenCount": 700}) == 700  # InvokeModel
    assert cache.cached_tokens({"prompt_tokens_details": {"cached_tokens": 0},
                                "cache_read_input_tokens": 600}) == 600
    for nothing in (None, {}, Usage(prompt_tokens=10, completion_tokens=1),
                    {"prompt_tokens_details": None}, {"cache_read_input_tokens": True}):
        assert cache.cached_tokens(nothing) == 0


# -- the service's metrics ------------------------------------------------------------


async def test_cached_and_written_tokens_reach_the_service_metrics(
        db_url: str, aws: None) -> None:
    from engine.service.metrics import Metrics

    metrics = Metrics()
    metrics.declare("puramur", ["greeting"], telegram=False)
    assert 'funnel_cached_prompt_tokens_total{funnel="puramur"} 0' in metrics.render()
    assert 'funnel_cache_write_tokens_total{funnel="puramur"} 0' in metrics.render()
    with FakeProvider("bedrock") as fake:
        for result in await _conversation(fake, db_url, BEDROCK_CLAUDE,
                                          written=(1200, 150, 150, 150)):
            metrics.turn("puramur", result, 0.1)
    text = metrics.render()
    assert 'funnel_tokens_total{funnel="puramur",kind="prompt"} 6000' in text
    assert 'funnel_cached_prompt_tokens_total{funnel="puramur"} 3600' in text
    assert 'funnel_cache_write_tokens_total{funnel="puramur"} 1650' in text
    assert "# TYPE funnel_cached_prompt_tokens_total counter" in text
    assert "# TYPE funnel_cache_write_tokens_total counter" in text


def test_doctor_says_how_the_prefix_is_marked() -> None:
    from engine.llm.doctor import Diagnosis, render

    def said(marker: str | None) -> str:
        report = Diagnosis(model="m", api_base=None, setting="auto", chain=("json_schema",),
                           cache_marker=marker)
        [line] = [x for x in render(report).splitlines() if x.startswith("prompt cache:")]
        return line

    assert said("cachePoint") == ("prompt cache: the static prefix and the conversation's end "
                                  "are followed by a Bedrock cachePoint")
    assert said("cache_control") == ("prompt cache: the static prefix and the conversation's "
                                     "end are marked cache_control")
    assert said(None).startswith("prompt cache: not marked")
