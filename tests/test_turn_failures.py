"""A turn that fails anywhere after the message is logged still ends well.

Render errors the sandbox raises only at run time, output schemas with a
dangling ``$ref``, a condition that fails, and a save PostgreSQL refuses: in
each case the customer gets the stage's fallback, a turn record names the
error, the assistant message is logged, the state is unchanged, and the next
turn works. Also: the state merge and the output parser under hypothesis.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import PURAMUR, ROOT, said
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Engine, ScriptedModel
from engine.boundary.sanitize import Rejected, loads_bounded, model_json
from engine.funnel.compiled import CompiledFunnel, load_funnel
from engine.turn.engine import TECHNICAL_REPLY
from engine.turn.invariants import check_funnel
from engine.turn.output import parse_output

pytestmark = pytest.mark.postgres

GREET = {"reply": "Hello! A dog, lovely.", "updates": {"pet": {"type": "dog"}}}
OK = {"reply": "All good."}


def funnel_copy(tmp: Path, *, funnel: Any = None, files: dict[str, str] | None = None
                ) -> Path:
    """Puramur with its prompts copied beside it, edited by ``files``
    (relative path -> new text) and ``funnel`` (a function of the YAML data)."""
    shutil.copytree(ROOT / "prompts" / "puramur", tmp / "prompts")
    data = yaml.safe_load(PURAMUR.read_text("utf-8"))
    data.update(prompts="prompts",
                catalog=str(ROOT / "funnels" / "puramur" / "catalog.yaml"))
    data["knowledge"]["folder"] = str(ROOT / "funnels" / "puramur" / "knowledge")
    if funnel is not None:
        funnel(data)
    for rel, text in (files or {}).items():
        (tmp / rel).write_text(text, "utf-8")
    path = tmp / "puramur.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    return path


def loose(funnel: CompiledFunnel) -> CompiledFunnel:
    validator = jsonschema.Draft202012Validator({"type": "object", "required": ["reply"]})
    for name, stage in list(funnel.stages.items()):
        funnel.stages[name] = dataclasses.replace(stage, validator=validator)
    return funnel


async def two_turns(funnel: Any, db_url: str, second: Any, sql: Any) -> tuple[Any, Any, Any]:
    """Greeting (good), then a turn in discovery answered by ``second``, then a good turn.
    Returns (the failed turn's result, the row before it, the row after it)."""
    model = ScriptedModel.from_data({"turns": [GREET, second, OK]})
    engine = await Engine.open(funnel, db=db_url, model=model)
    try:
        await engine.handle("s1", "Hi, a dog")
        before = await engine.state("s1")
        result = await engine.handle("s1", "Tell me more")
        after = await engine.state("s1")
        assert before is not None and after is not None
        spec = engine.spec
        assert {n: after[n] for n in spec.state} == {n: before[n] for n in spec.state}
        assert after["stage"] == before["stage"] and after["turns"] == before["turns"] + 1
        assert sql("SELECT role, content FROM funnel_messages ORDER BY id")[2:] == [
            ("user", "Tell me more"), ("assistant", result.reply)]
        [record] = sql("SELECT fallback, error FROM funnel_turns ORDER BY id")[1:]
        assert record[0] is True and record[1] == result.error
        violations = await check_funnel(engine.funnel, db_url)
        assert [v for v in violations if v.severity == "error"] == []
    finally:
        await engine.close()
    return result, before, after


@pytest.mark.parametrize("trap", [
    "{{ ''.__class__.__mro__ }}",
    "{{ stage|attr('__class__') }}",
    '{% include "/etc/passwd" %}',
    "{{ state.update({'stage': 'handoff'}) }}",
    "{{ catalog[0].__class__ }}",
])
async def test_a_template_the_sandbox_refuses_at_run_time_ends_in_the_fallback(
        trap: str, tmp_path: Path, db_url: str, sql: Any) -> None:
    # `funnel validate` refuses these (F205, F007): the template is swapped in after
    # loading, as a construct the static checks cannot see would be.
    source = (ROOT / "prompts" / "puramur" / "discovery.j2").read_text("utf-8")
    funnel = load_funnel(funnel_copy(tmp_path))
    stage = funnel.stages["discovery"]
    hostile = stage.template.environment.from_string(source + "\n" + trap)
    funnel.stages["discovery"] = dataclasses.replace(stage, template=hostile)
    result, _, after = await two_turns(funnel, db_url, OK, sql)
    assert result.fallback and result.reply == said(funnel.stage("discovery").spec.fallback,
                                                    result.state)
    assert "template" in (result.error or "") and after["stage"] == "discovery"


async def test_a_dangling_ref_in_an_output_schema_ends_in_the_fallback(
        tmp_path: Path, db_url: str, sql: Any) -> None:
    # `funnel validate` refuses it (F306): the validator is swapped in after loading.
    funnel = load_funnel(funnel_copy(tmp_path))
    stage = funnel.stages["discovery"]
    schema = copy.deepcopy(stage.schema)
    schema["properties"]["updates"]["properties"]["pet"] = {"$ref": "#/$defs/nowhere"}
    funnel.stages["discovery"] = dataclasses.replace(
        stage, validator=jsonschema.Draft202012Validator(schema))
    second = {"reply": "Noted.", "updates": {"pet": {"breed": "Yorkie"}}}
    result, _, _ = await two_turns(funnel, db_url, second, sql)
    assert result.fallback and "cannot be evaluated" in (result.error or "")
    assert "(derived)" in (result.error or "")


async def test_a_save_postgresql_refuses_ends_in_the_fallback(tmp_path: Path, db_url: str,
                                                              sql: Any) -> None:
    """A hook writes a NUL into a text value (its schema allows it; jsonb does not)."""

    def add_hook(data: dict[str, Any]) -> None:
        data["actions"]["tag_pet"] = {"hook": "pet_hooks:tag",
                                     "writes": ["objections_raised"]}

    hook = "def tag(call):\n    return {'objections_raised': [{'detail': 'Rex\\x00'}]}\n"
    path = funnel_copy(tmp_path, funnel=add_hook, files={"pet_hooks.py": hook})
    second = {"reply": "Tagged.", "actions": [{"type": "tag_pet"}]}
    result, _, _ = await two_turns(loose(load_funnel(path)), db_url, second, sql)
    assert result.fallback and result.error is not None
    assert result.error.startswith("bug: the turn failed: ")  # not a FunnelError


async def test_a_failing_condition_ends_in_the_fallback(tmp_path: Path, db_url: str,
                                                        sql: Any) -> None:
    def bad_condition(data: dict[str, Any]) -> None:
        data["stages"]["discovery"]["transitions"][0]["when"] = \
            "discovery_completeness >= 60 and pet.age_years > 'x'"

    path = funnel_copy(tmp_path, funnel=bad_condition)
    second = {"reply": "Noted.", "updates": {"pet": {"age_years": 3}}}
    model = ScriptedModel.from_data({"turns": [GREET, second, OK]})
    async with await Engine.open(load_funnel(path), db=db_url, model=model) as engine:
        await engine.handle("s1", "Hi, a dog")
        result = await engine.handle("s1", "He is 3")
        nxt = await engine.handle("s1", "ok")
    # Either the engine skips the broken condition or the turn falls back; never a crash.
    assert result.reply and nxt.reply == OK["reply"]
    assert len(sql("SELECT 1 FROM funnel_turns")) == 3


# -- property tests ------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(), json_values.map(lambda v: json.dumps(v, allow_nan=True)),
                 st.dictionaries(st.sampled_from(["reply", "updates", "actions", "language"]),
                                 json_values).map(lambda v: json.dumps(v, allow_nan=True))))
def test_the_output_parser_gives_an_envelope_or_a_problem_never_an_exception(
        text: str) -> None:
    funnel = _puramur()
    for stage in funnel.stages.values():
        envelope, problem = parse_output(stage, text)
        assert (envelope is None) == bool(problem)
        if envelope is not None:  # what passed can be stored and shown
            assert isinstance(envelope["reply"], str) and envelope["reply"].strip()
            json.dumps(envelope, allow_nan=False).encode("utf-8")
            assert "\x00" not in json.dumps(envelope)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_bounded_loading_refuses_with_rejected_only(raw: bytes) -> None:
    try:
        loads_bounded(raw, clean=False)
    except Rejected:
        pass
    try:
        model_json(raw.decode("utf-8", "replace"))
    except Rejected:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["pet", "customer", "objections_raised", "cart",
                                           "stage", "undeclared"]), json_values), max_size=6))
def test_after_any_merges_the_state_validates(updates: list[tuple[str, Any]]) -> None:
    funnel = _puramur()
    rules = funnel.rules
    from engine.funnel.state import defaults

    state = defaults(funnel.spec)
    allowed = frozenset({"pet", "customer", "objections_raised", "cart"})
    notices: list[str] = []
    for name, value in updates:
        rules.apply_updates(state, {name: value}, allowed, notices)
    for name in funnel.spec.state:
        assert rules.invalid(name, state[name]) is None, (name, state[name])


_CACHE: dict[str, CompiledFunnel] = {}


def _puramur() -> CompiledFunnel:
    if "f" not in _CACHE:
        _CACHE["f"] = load_funnel(PURAMUR)
    return _CACHE["f"]


async def test_64_concurrent_objections_to_one_session_are_all_answered_by_the_model(
        db_url: str) -> None:
    """Each turn appends a 200-character objection; the state grows past what the stage's
    prompt budget holds uncompacted, and every turn still reaches the model."""
    funnel = loose(load_funnel(PURAMUR))
    objection = {"reply": "I hear you.", "actions": [
        {"type": "record_objection", "objection": "too pricey " * 18}]}
    model = ScriptedModel.from_data({"turns": [GREET], "default": objection})
    async with await Engine.open(funnel, db=db_url, model=model) as engine:
        await engine.handle("busy", "Hi, a dog")
        results = await asyncio.gather(*(engine.handle("busy", f"It costs too much ({i})")
                                          for i in range(64)))
        assert [r.error for r in results if r.fallback] == []
        state = await engine.state("busy")
        assert state is not None and len(state["objections_raised"]) == 64
        found = await check_funnel(engine.funnel, db_url)
    assert [str(v) for v in found if v.severity == "error"] == []


async def test_a_session_in_an_unknown_stage_gets_the_technical_reply(db_url: str,
                                                                      sql: Any) -> None:
    funnel = load_funnel(PURAMUR)
    model = ScriptedModel.from_data({"turns": [GREET], "default": OK})
    async with await Engine.open(funnel, db=db_url, model=model) as engine:
        await engine.handle("lost", "Hi, a dog")
        sql("UPDATE puramur_sessions_state SET stage = 'ghost'")
        result = await engine.handle("lost", "Hello?")
        assert result.fallback and result.reply == said(TECHNICAL_REPLY, result.state)
        assert "has no stage 'ghost'" in (result.error or "")
        found = await check_funnel(engine.funnel, db_url)
    assert [(v.rule, v.detail) for v in found] == [("unknown stage", "'ghost'")]
    assert sql("SELECT count(*) FROM funnel_turns") == [(2,)]
