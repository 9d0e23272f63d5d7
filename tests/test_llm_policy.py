"""engine.llm without a server: the portable schema, the retry policy, strategy choice."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
import yaml
from conftest import PURAMUR, ROOT
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from engine.funnel.compiled import load_funnel
from engine.llm import portable_schema
from engine.llm import retry as policy

# Puramur's stage contracts, derived from the funnel (engine.format.contract).
SCHEMAS = {name: stage.schema for name, stage in load_funnel(PURAMUR).stages.items()}
BOUNDS = ("minLength", "maxLength", "maxItems", "minItems", "pattern", "minimum", "maximum",
          "$ref", "$defs", "oneOf", "$schema")


def _envelopes() -> list[dict[str, Any]]:
    """Every model output of the Puramur scenarios: a corpus of valid envelopes."""
    out = []
    for path in (ROOT / "funnels" / "puramur" / "scenarios").glob("*.yaml"):
        for turn in yaml.safe_load(path.read_text("utf-8")).get("turns") or []:
            if isinstance(turn.get("llm"), dict) and "reply" in turn["llm"]:
                out.append(turn["llm"])
    return out


@pytest.mark.parametrize("stage", SCHEMAS)
def test_the_portable_form_is_a_valid_schema_without_hard_keywords(stage: str) -> None:
    full = SCHEMAS[stage]
    before = json.dumps(full)
    portable = portable_schema(full)
    assert json.dumps(full) == before  # the stage's own schema is not touched
    Draft202012Validator.check_schema(portable)
    text = json.dumps(portable)
    for keyword in BOUNDS:
        assert f'"{keyword}"' not in text, keyword
    assert portable["additionalProperties"] is False and portable["required"] == ["reply"]
    assert "at most 1500 characters" in portable["properties"]["reply"]["description"]


@pytest.mark.parametrize("stage", SCHEMAS)
def test_every_valid_answer_stays_valid_under_the_portable_form(stage: str) -> None:
    """The portable form only relaxes: it never makes the model's valid answer impossible."""
    full = Draft202012Validator(SCHEMAS[stage])
    portable = Draft202012Validator(portable_schema(full.schema))  # type: ignore[arg-type]
    checked = 0
    for envelope in _envelopes():
        if full.is_valid(envelope):
            assert portable.is_valid(envelope), envelope
            checked += 1
    assert checked > 0 or stage in ("handoff", "contact_collection", "objection_handling",
                                        "cart_building")


def test_refs_are_inlined_and_a_recursive_ref_stops() -> None:
    schema = {"$defs": {"node": {"type": "object", "properties": {
        "next": {"$ref": "#/$defs/node"}, "tag": {"oneOf": [{"const": "a"}, {"const": "b"}]}}}},
        "$ref": "#/$defs/node", "description": "a list"}
    out = portable_schema(schema)
    assert out["description"] == "a list" and out["type"] == "object"
    assert out["properties"]["tag"] == {"anyOf": [{"const": "a"}, {"const": "b"}]}
    depth, node = 0, out
    while "properties" in node:
        node, depth = node["properties"]["next"], depth + 1
    assert 5 < depth <= 32  # bounded, however deep the recursion
    assert portable_schema({"$ref": "#/$defs/missing"}) == {}


@given(st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5)),
    lambda kids: st.one_of(st.lists(kids, max_size=3),
                           st.dictionaries(st.sampled_from(
                               ["type", "properties", "items", "$ref", "oneOf", "anyOf",
                                "maxLength", "description", "enum", "x"]), kids, max_size=4)),
    max_leaves=20))
@settings(max_examples=300, deadline=None)
def test_any_input_gives_a_mapping_without_crashing(schema: Any) -> None:
    out = portable_schema(schema if isinstance(schema, dict) else {"items": schema})
    assert isinstance(out, dict)
    json.dumps(out)


# -- the retry policy ---------------------------------------------------------------------


class _Err(Exception):
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"status {status}")
        self.status_code = status
        self.response = httpx.Response(status, headers=headers or {})


def test_which_failures_are_retried() -> None:
    for status in (408, 429, 500, 502, 503, 504, 529):
        assert policy.is_retryable(_Err(status)), status
    for status in (400, 401, 403, 404, 422):
        assert not policy.is_retryable(_Err(status)), status
    assert policy.is_retryable(TimeoutError())
    missing = _Err(500)
    missing.args = ("Missing Gemini API key. Set the GEMINI_API_KEY environment variable.",)
    assert not policy.is_retryable(missing)


def test_retry_after_in_every_form() -> None:
    assert policy.retry_after(_Err(429, {"retry-after": "3"})) == 3
    assert policy.retry_after(_Err(429, {"retry-after-ms": "250"})) == 0.25
    when = datetime.now(UTC) + timedelta(seconds=30)
    assert 25 < (policy.retry_after(_Err(503, {"retry-after": format_datetime(when)})) or 0) <= 30
    assert policy.retry_after(_Err(503, {"retry-after": "soon"})) is None
    assert policy.retry_after(_Err(503)) is None
    assert policy.backoff(1, _Err(429, {"retry-after": "3"})) == 3
    assert policy.backoff(1, _Err(429, {"retry-after": "9999"})) == 60


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    rng = random.Random(7)
    waits = [policy.backoff(n, _Err(500), rng) for n in range(1, 10)]
    assert 0.125 <= waits[0] <= 0.25
    assert 0.25 <= waits[1] <= 0.5
    assert all(w <= policy.MAX_DELAY for w in waits)
    assert waits[-1] >= policy.MAX_DELAY / 2


def test_a_deadline_is_shared_equally() -> None:
    now = [100.0]
    deadline = policy.Deadline(110.0, clock=lambda: now[0])
    half = deadline.share(2)
    assert half.remaining() == 5
    now[0] = 108
    assert deadline.remaining() == 2 and half.remaining() == 0
