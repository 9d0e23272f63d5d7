"""`funnel new`: every template gives a funnel that validates clean and passes its scenarios."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CliResult, run_funnel

from engine.authoring.scaffold import funnel_name, scaffold
from engine.errors import ConfigError
from engine.funnel.compiled import load_funnel
from engine.validation import validate_paths

ROOT = Path(__file__).resolve().parent.parent
CASES = [("minimal", False), ("minimal", True), ("puramur", False), ("b2b_demo", False)]


def cli(*args: str, cwd: Path) -> CliResult:
    return run_funnel(*args, cwd=cwd)


@pytest.mark.parametrize(("template", "catalog"), CASES,
                         ids=[f"{t}{'+catalog' if c else ''}" for t, c in CASES])
def test_new_funnel_validates_and_passes_its_scenarios(
        tmp_path: Path, db_url: str, template: str, catalog: bool) -> None:
    args = ["new", "shop", "--from", template] + (["--catalog"] if catalog else [])
    made = cli(*args, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    folder = tmp_path / "shop"
    assert (folder / "funnel.yaml").is_file() and (folder / "catalog.yaml").is_file() == (
        catalog or template == "puramur")
    assert len(list((folder / "scenarios").glob("*.yaml"))) == 2
    # Clean under --strict: no error and no warning.
    assert validate_paths([folder]) == []
    checked = cli("validate", "--strict", "shop/", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout
    # No schema files: every stage's contract is derived from the funnel, `updates` closed,
    # actions from the declarations.
    assert not (folder / "schemas").exists()
    for stage in load_funnel(folder / "funnel.yaml").stages.values():
        assert stage.spec.derived and "derived from the funnel" in stage.schema["title"]
        updates = stage.schema["properties"].get("updates")  # none when it may write nothing
        assert updates is None or updates["additionalProperties"] is False
    shown = cli("schema", "shop/funnel.yaml", "--stage", "greeting", cwd=tmp_path)
    assert shown.returncode == 0 and json.loads(shown.stdout)["required"] == ["reply"]
    # Every stage prompt is laid out for prompt caches: a static part, then a state or a
    # turn block.
    for stage in load_funnel(folder / "funnel.yaml").stages.values():
        assert {"state", "turn"} & set(stage.template.blocks), stage.spec.name
    played = cli("test", "shop/scenarios/", "--db", db_url, cwd=tmp_path)
    assert played.returncode == 0, played.stdout + played.stderr
    assert played.stdout.strip().endswith("2 passed, 0 failed")


def test_new_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConfigError, match="exists already"):
        scaffold("shop", tmp_path / "taken")
    with pytest.raises(ConfigError, match="lowercase"):
        scaffold("Bad-Name", tmp_path / "x")
    assert not (tmp_path / "x").exists()
    refused = cli("new", "shop", "--dir", "taken", cwd=tmp_path)
    assert refused.returncode == 1 and "exists already" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_new_takes_a_name_with_a_dash_as_the_studio_does(tmp_path: Path) -> None:
    """`funnel new pet-shop` makes the funnel `pet_shop`, as the studio's New funnel does:
    one rule (engine.authoring.scaffold.funnel_name) for both."""
    from engine.errors import InvalidInput
    from engine.studio.make import identifier

    made = cli("new", "Pet-Shop", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert load_funnel(tmp_path / "pet_shop" / "funnel.yaml").name == "pet_shop"
    assert "pet_shop/scenarios/" in made.stdout and not (tmp_path / "Pet-Shop").exists()
    for name in ("pet-shop", "Pet-Shop", " shop ", "a-b-c"):
        assert funnel_name(name) == identifier(name)
    for bad in ("9-lives", "pet shop", "магазин", "a" * 42, "_x"):
        refused = cli("new", bad, cwd=tmp_path)
        assert refused.returncode != 0 and "starting with a letter" in refused.stderr, bad
        assert "Traceback" not in refused.stderr and refused.stderr.count("\n") == 1, bad
        with pytest.raises(InvalidInput, match="starting with a letter"):
            identifier(bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pet_shop"]
