"""Rendering a stage prompt: an error the validator cannot see names the template file and line."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from engine.errors import ConfigError
from engine.funnel.compiled import load_funnel
from engine.turn.prompts import compact_state, render

BASE = Path(__file__).resolve().parent / "corpus" / "_base"
ROOT = Path(__file__).resolve().parent.parent


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


def test_the_compact_state_leaves_out_the_engines_stamps_and_detected_language() -> None:
    """The model reads what was shown and bought, not when: the items' stamps and the
    detected language (the template states the reply's language) stay in the row."""
    funnel = load_funnel(ROOT / "funnels" / "puramur.yaml")
    state: dict[str, Any] = {
        "pet": {"type": "cat"},
        "presented_products": [{"sku": "PR251010", "presented_at": "2026-01-01T00:00:00+00:00",
                                "stage_iteration": 0}],
        "objections_raised": [{"objection": "price", "stage": "presentation",
                               "recorded_at": "2026-01-01T00:00:00+00:00"}],
        "detected_language": "en", "response_language": "en",
    }
    shown = compact_state(funnel, state, funnel.stage("greeting"))
    assert shown == {"pet": {"type": "cat"}, "presented_products": [{"sku": "PR251010"}],
                     "objections_raised": [{"objection": "price", "stage": "presentation"}],
                     "response_language": "en"}
    assert state["presented_products"][0]["presented_at"]  # the row keeps them
