"""Mistakes product owners make, caught before they ship, each with where and what to do.

(The refused action that kept the reply is the scenario
funnels/puramur/scenarios/refused_action.yaml; the closed pipe, tests/test_contract.py;
doctor's "invalid", tests/test_providers.py.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import PURAMUR, ROOT

from engine.errors import ConfigError
from engine.llm.models import ScriptedModel, make_model
from engine.validation import check_file


def _copy(tmp_path: Path) -> Path:
    """Puramur with its prompts in ``tmp_path`` (a project of its own)."""
    (tmp_path / "pyproject.toml").write_text("")
    shutil.copytree(ROOT / "prompts" / "puramur", tmp_path / "prompts")
    text = PURAMUR.read_text("utf-8").replace("prompts: ../prompts/puramur", "prompts: prompts")
    text = text.replace("catalog: puramur/catalog.yaml",
                        f"catalog: {ROOT / 'funnels/puramur/catalog.yaml'}")
    text = text.replace("folder: puramur/knowledge",
                        f"folder: {ROOT / 'funnels/puramur/knowledge'}")
    path = tmp_path / "puramur.yaml"
    path.write_text(text, "utf-8")
    return path


def test_a_lone_equals_sign_in_a_condition_suggests_double_equals(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    text = path.read_text("utf-8")
    path.write_text(text.replace("when: discovery_completeness >= 60",
                                 "when: \"pet.type = 'cat' and discovery_completeness >= 60\""))
    _, diagnostics = check_file(path)
    (d,) = [d for d in diagnostics if d.severity == "error"]
    assert d.code == "F401" and d.line == text.splitlines().index(
        "        when: discovery_completeness >= 60") + 1
    assert "did you mean `==`?" in d.message
    assert "pet.type == 'cat' and discovery_completeness >= 60" in d.message  # `>=` kept


def test_a_loop_whose_lines_run_together_is_a_warning(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    template = tmp_path / "prompts" / "cart_building.j2"
    # The line as it shipped: `{% endif %}` ate the newline, the cart lines ran together.
    template.write_text(template.read_text("utf-8").replace(
        '{{ " (gift)" if line.get("is_gift") else "" }}',
        '{% if line.get("is_gift") %} (gift){% endif %}'), "utf-8")
    _, diagnostics = check_file(path)
    found = [d for d in diagnostics if d.code == "F208"]
    assert len(found) == 1 and Path(found[0].file).name == "cart_building.j2"
    assert found[0].severity == "warning" and "run together" in found[0].message
    assert "+%}" in found[0].message
    # A loop written on one line on purpose is not one.
    shipped = [d for d in check_file(PURAMUR)[1] if d.code == "F208"]
    assert shipped == []


def test_a_scenario_file_serves_as_the_scripted_model() -> None:
    model = ScriptedModel.from_file(ROOT / "funnels/puramur/scenarios/happy_path.yaml")
    first = model.turns[0].text(False)
    assert '"reply"' in first and '"customer"' not in first and '"expect"' not in first


def test_a_script_that_cannot_be_sent_says_what_a_script_is(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text("- reply: hi\n  at: 2025-01-01T00:00:00Z\n")
    with pytest.raises(ConfigError, match=r"a script is a list of model outputs .* or a "
                       "scenario file"):
        ScriptedModel.from_file(script)


def test_no_model_at_all_says_what_to_give() -> None:
    with pytest.raises(ConfigError) as caught:
        make_model("scripted")
    message = str(caught.value)
    assert "--model" in message and "scripted:PATH" in message and "I am the model" in message


def test_a_file_outside_the_project_names_funnel_root(tmp_path: Path) -> None:
    """A deploy directory without `.git` or `pyproject.toml` cannot read ../prompts."""
    (tmp_path / "deploy" / "funnels").mkdir(parents=True)
    shutil.copytree(ROOT / "prompts" / "puramur", tmp_path / "deploy" / "prompts" / "puramur")
    shutil.copy(PURAMUR, tmp_path / "deploy" / "funnels" / "puramur.yaml")
    shutil.copytree(ROOT / "funnels" / "puramur", tmp_path / "deploy" / "funnels" / "puramur")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FUNNEL_ROOT", "")
        _, diagnostics = check_file(tmp_path / "deploy" / "funnels" / "puramur.yaml")
        errors = [d for d in diagnostics if d.code == "F007"]
        assert errors and "FUNNEL_ROOT" in errors[0].message
        assert "docs/deploy.md#container-layout" in errors[0].message
        mp.setenv("FUNNEL_ROOT", str(tmp_path / "deploy"))
        _, diagnostics = check_file(tmp_path / "deploy" / "funnels" / "puramur.yaml")
        assert [d for d in diagnostics if d.severity == "error"] == []


@pytest.mark.parametrize(("budget", "code", "severity"), [
    (500000, "F209", "error"), (110000, "F210", "warning"), (100000, None, None)])
def test_the_prompt_budget_must_fit_the_models_context(
        tmp_path: Path, budget: int, code: str | None, severity: str | None) -> None:
    """gpt-4o-mini has 128k tokens of context (litellm's map, read without importing it):
    the budget plus max_tokens (500) must fit, and should stay within 80% of it."""
    path = _copy(tmp_path)
    text = path.read_text("utf-8")
    path.write_text(text.replace("prompt_budget: 1000 ", f"prompt_budget: {budget} "))
    _, diagnostics = check_file(path)
    found = [d for d in diagnostics if d.code in ("F209", "F210")]
    if code is None:
        assert found == []
        return
    (d,) = found  # once for the funnel's budget, not once per stage
    assert (d.code, d.severity) == (code, severity)
    assert d.line == next(i for i, line in enumerate(text.splitlines(), 1)
                          if "prompt_budget: 1000" in line)
    assert "128000" in d.message and "at most 101900" in d.message


def test_a_misspelt_confirm_reason_says_the_hand_off_would_run_unconfirmed(
        tmp_path: Path) -> None:
    """`confirm:` keyed by a reason the action does not have guards nothing: the hand-off it
    was written for would alert a manager on the model's word alone."""
    path = _copy(tmp_path)
    text = path.read_text("utf-8")
    assert "      explicit_request:\n        en: [manager" in text
    path.write_text(text.replace("      explicit_request:\n        en: [manager",
                                 "      explicit-request:\n        en: [manager"), "utf-8")
    _, diagnostics = check_file(path)
    [found] = [d for d in diagnostics if d.code == "F507"]
    assert found.severity == "error" and found.line == text.splitlines().index(
        "      explicit_request:") + 1
    assert "did you mean 'explicit_request'" in found.message
    assert "run unconfirmed" in found.message


def test_grounding_an_enum_is_refused_with_the_reason(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    text = path.read_text("utf-8")
    old = "      type: {type: string, enum: [cat, dog]}"
    assert old in text
    path.write_text(text.replace(old, "      type: {type: string, enum: [cat, dog], "
                                      "grounded: true}"), "utf-8")
    _, diagnostics = check_file(path)
    [found] = [d for d in diagnostics if d.code == "F310"]
    assert found.line == text.splitlines().index(old) + 1
    assert "pet.type" in found.message and "enum" in found.message
