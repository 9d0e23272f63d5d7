"""Whatever passes `funnel validate --strict` runs: every clean corpus funnel plays a turn in
each of its stages, with the real engine and the scripted model, and none fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from engine.validation import validate_paths

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "corpus"


def test_every_strictly_clean_corpus_funnel_runs_a_turn_in_every_stage(
        tmp_path: Path, db_url: str) -> None:
    clean = [f for f in sorted(CORPUS.glob("*/*.yaml"))
             if f.name != "expected.txt" and "funnel:" in f.read_text("utf-8")
             and not validate_paths([f])]
    assert CORPUS / "_base" / "funnel.yaml" in clean
    scenarios = []
    for funnel in clean:
        stages = yaml.safe_load(funnel.read_text("utf-8"))["stages"]
        for stage in stages:
            path = tmp_path / f"{funnel.parent.name}_{funnel.stem}_{stage}.yaml"
            path.write_text(yaml.safe_dump({
                "scenario": f"{funnel.parent.name}-{funnel.stem}-{stage}", "funnel": str(funnel),
                "start": {"stage": stage},
                "turns": [{"customer": "hello", "llm": {"reply": "Hello!"},
                           "expect": {"fallback": False}}]}), "utf-8")
            scenarios.append(path)
    played = subprocess.run([sys.executable, "-m", "engine.cli", "test", str(tmp_path),
                             "--db", db_url], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert played.returncode == 0, played.stdout + played.stderr
    assert played.stdout.strip().endswith(f"{len(scenarios)} passed, 0 failed")
    assert "Traceback" not in played.stderr
