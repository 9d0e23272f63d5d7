"""Rendering a stage prompt: an error the validator cannot see names the template file and line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.errors import ConfigError
from engine.funnel.compiled import load_funnel
from engine.turn.prompts import render

BASE = Path(__file__).resolve().parent / "corpus" / "_base"


def test_a_render_error_names_the_template_and_its_line(tmp_path: Path) -> None:
    for name in ("prompts", "schemas"):
        shutil.copytree(BASE / name, tmp_path / name)
    text = (BASE / "funnel.yaml").read_text("utf-8")
    (tmp_path / "funnel.yaml").write_text(
        text.replace("prompts: ../_base/prompts", "prompts: prompts")
        .replace("schemas: ../_base/schemas", "schemas: schemas"), "utf-8")
    # Line 3 reads a message that a new session does not have: only rendering can tell.
    (tmp_path / "prompts" / "greeting.j2").write_text(
        'Greet the customer.\nStage: {{ stage }}.\nLast: {{ messages[5].content }}\n'
        'Answer with JSON: {"reply": "..."}\n', "utf-8")
    stage = load_funnel(tmp_path / "funnel.yaml").stage("greeting")

    with pytest.raises(ConfigError) as caught:
        render(stage, {"stage": "greeting", "customer": {}, "messages": []})
    assert caught.value.file == str(tmp_path / "prompts" / "greeting.j2")
    assert caught.value.line == 3
    assert str(caught.value).startswith(f"{tmp_path / 'prompts' / 'greeting.j2'}:3: ")
