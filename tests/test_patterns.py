"""Every regex a funnel declares runs in linear time (RE2), or `funnel validate` refuses it.

The common "letters and spaces" pattern ``^([a-zA-Z]+\\s?)+$`` backtracks
exponentially under Python's ``re`` on a name it rejects: a 28-character name
took a 40 s turn. Here it is declared in a state field and in every stage
schema, and names it rejects (one of 28 characters, one of 59: under ``re`` the
latter would not finish in the age of the universe) go through the fast
validator, the explanation path (jsonschema's ``best_match``), the state guard
and whole turns. The test finishing at all is the proof.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from projects import copy_puramur

from engine import Engine, ScriptedModel
from engine.funnel.compiled import load_funnel
from engine.sandbox.patterns import PatternRefused, compile_linear, linear_validator, problem
from engine.turn.output import parse_output
from engine.validation import validate_paths

LETTERS_AND_SPACES = r"^([a-zA-Z]+\s?)+$"
NAME_28 = "Sir Fluffington Whiskers 3rd"  # the digit makes the pattern fail, at the end
NAME_59 = "a" * 58 + "!"
assert len(NAME_28) == 28


def _with_pattern(node: Any) -> None:
    """Give every ``pet.name`` of an output schema the backtracking pattern."""
    if isinstance(node, dict):
        pet = node.get("pet")
        if isinstance(pet, dict) and isinstance(pet.get("properties"), dict) \
                and "name" in pet["properties"]:
            pet["properties"]["name"]["pattern"] = LETTERS_AND_SPACES
        for value in node.values():
            _with_pattern(value)
    elif isinstance(node, list):
        for value in node:
            _with_pattern(value)


@pytest.fixture
def funnel_path(tmp_path: Path) -> Path:
    path = copy_puramur(tmp_path)
    data = yaml.safe_load(path.read_text("utf-8"))
    data["state"]["pet"]["properties"]["name"]["pattern"] = LETTERS_AND_SPACES
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    for schema in (tmp_path / "schemas" / "puramur").glob("*.json"):
        doc = json.loads(schema.read_text("utf-8"))
        _with_pattern(doc)
        schema.write_text(json.dumps(doc, indent=2), "utf-8")
    return path


def test_a_backtracking_pattern_is_linear_on_every_path(funnel_path: Path) -> None:
    assert [d for d in validate_paths([funnel_path]) if d.severity == "error"] == []
    funnel = load_funnel(funnel_path)
    for name in (NAME_28, NAME_59):
        # the state field: the fast validator rejects, jsonschema explains
        why = funnel.rules.invalid("pet", {"name": name})
        assert why is not None and "does not match" in why
        # every stage schema that lets the model write the name
        output = json.dumps({"reply": "ok", "updates": {"pet": {"name": name}}})
        written = json.dumps(LETTERS_AND_SPACES)[1:-1]
        stages = [s for s in funnel.stages.values() if written in json.dumps(s.schema)]
        assert stages
        for stage in stages:
            envelope, problem_text = parse_output(stage, output)
            assert envelope is None and "does not match" in problem_text
    assert funnel.rules.invalid("pet", {"name": "Bella Rose"}) is None


@pytest.mark.postgres
async def test_a_turn_with_a_name_the_pattern_refuses_ends_in_a_reply(
        funnel_path: Path, db_url: str) -> None:
    bad = {"reply": "What a name!", "updates": {"pet": {"type": "dog", "name": NAME_59}}}
    script = {"turns": [bad, bad, {"reply": "And her breed?",
                                   "updates": {"pet": {"name": "Bella"}}}]}
    async with await Engine.open(funnel_path, db=db_url,
                                 model=ScriptedModel.from_data(script)) as engine:
        first = await engine.handle("redos-1", f"My dog is {NAME_59}")
        assert first.reply and first.fallback or first.validation_failures
        later = await engine.handle("redos-1", "Sorry, Bella")
        assert later.reply


def test_jsonschema_path_matches_with_re2() -> None:
    validator = linear_validator({
        "type": "object", "additionalProperties": False,
        "patternProperties": {LETTERS_AND_SPACES: {"type": "string"}}})
    assert validator.is_valid({"Bella Rose": "x"})
    errors = list(validator.iter_errors({NAME_59: "x"}))
    assert errors and "does not match any of the regexes" in errors[0].message
    # ECMA-262's \uXXXX escapes read as RE2's \x{XXXX}
    assert compile_linear(r"^[\u0400-\u04FF]+$").search("Привіт")


@pytest.mark.parametrize("pattern", [r"^(\w)\1$", r"^(?=\+)[0-9+]+$", r"(?<!a)b", r"\Z"])
def test_what_re2_cannot_run_is_refused_with_the_reason(pattern: str) -> None:
    why = problem(pattern)
    assert why is not None and "linear time" in why and "rewrite it" in why
    with pytest.raises(PatternRefused):
        compile_linear(pattern)


def test_a_scripted_models_match_runs_on_re2() -> None:
    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match="linear time"):
        ScriptedModel.from_data({"match": [{"pattern": r"(a)\1", "output": {"reply": "x"}}]})
    model = ScriptedModel.from_data({"match": [{"pattern": LETTERS_AND_SPACES,
                                                "output": {"reply": "x"}}]})
    assert model.match[0][0].search(NAME_59) is None
