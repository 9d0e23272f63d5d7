"""`funnel record`: a scripted conversation becomes a scenario that replays green, and
turns red at the right turn, with the explanation, once the funnel changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from conftest import CliResult, run_funnel

from engine.authoring.scaffold import scaffold

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "funnels" / "puramur" / "demo.yaml"
LINES = ["Hi!", "I have a Sphynx cat, her skin is very dry",
         "She is 3, her name is Murka. What would you recommend?", "Hmm, isn't that expensive?"]


def cli(*args: str, cwd: Path, db: str, stdin: str = "") -> CliResult:
    return run_funnel(*args, cwd=cwd, env={"FUNNEL_DB": db}, stdin=stdin)


def test_record_then_replay(tmp_path: Path, db_url: str, sql: Any) -> None:
    scaffold("shop", tmp_path / "shop", "puramur")
    chat = cli("chat", "shop/funnel.yaml", "--model", f"scripted:{DEMO}", "--session", "r1",
               cwd=tmp_path, db=db_url, stdin="\n".join(LINES) + "\n")
    assert chat.returncode == 0, chat.stderr

    out = tmp_path / "shop" / "scenarios" / "recorded.yaml"
    rec = cli("record", "shop/funnel.yaml", "r1", "--out", str(out), cwd=tmp_path, db=db_url)
    assert rec.returncode == 0, rec.stderr
    scenario = yaml.safe_load(out.read_text("utf-8"))
    assert scenario["funnel"] == "../funnel.yaml"
    assert [t["customer"] for t in scenario["turns"]] == LINES
    assert [t["expect"]["stage"] for t in scenario["turns"]] == [
        "discovery", "presentation", "presentation", "objection_handling"]
    assert scenario["turns"][1]["llm"]["updates"]["pet"]["breed"] == "Sphynx"
    assert scenario["turns"][2]["expect"]["actions"] == ["present_products"]

    replay = cli("test", str(out), "--db", db_url, cwd=tmp_path, db=db_url)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert replay.stdout.strip().endswith("1 passed, 0 failed")

    # The funnel changes: presentation now needs 80 points, the recording's turn 2 has 75.
    funnel = tmp_path / "shop" / "funnel.yaml"
    text = funnel.read_text("utf-8")
    assert text.count("when: discovery_completeness >= 60") == 1
    funnel.write_text(text.replace("discovery_completeness >= 60", "discovery_completeness >= 80"))
    broken = cli("test", str(out), "--db", db_url, cwd=tmp_path, db=db_url)
    assert broken.returncode == 1
    first = broken.stdout.splitlines()[0]
    assert "turn 2: expected stage \"presentation\", got \"discovery\"" in first, first
    assert ("`discovery_completeness >= 80` was false: discovery_completeness=75 "
            "(pet.type 25 + pet.problems 25 + pet.breed 25)") in first, first


def test_record_refuses_what_it_cannot_replay(tmp_path: Path, db_url: str) -> None:
    scaffold("shop", tmp_path / "shop", "minimal")
    cli("migrate", "shop/funnel.yaml", cwd=tmp_path, db=db_url)
    nothing = cli("record", "shop/funnel.yaml", "nobody", cwd=tmp_path, db=db_url)
    assert nothing.returncode == 1 and "no turn record" in nothing.stderr
    assert "Traceback" not in nothing.stderr
