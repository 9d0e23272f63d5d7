"""`funnel report --advise`: on sessions generated with a known best discovery threshold
(tests/advise_population.py), the advice recovers it within its interval; on sessions
the engine recorded, the suggestion is replayed with `funnel replay`'s own entry point
and changes what a replay of the same edit changes."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from advise_population import synthetic
from replay_population import PURAMUR, record

from engine.cli import main
from engine.evidence.advise import thresholds
from engine.funnel.compiled import load_funnel
from engine.store.connect import temporary_schema


@pytest.fixture(scope="module")
def generated(server_dsn: str) -> Iterator[tuple[str, list[str]]]:
    """1,500 generated sessions (no turn records), and the most recent: a few the engine
    recorded (turn records kept: these replay)."""
    with temporary_schema(server_dsn, prefix="funnel_advise") as url:
        synthetic(url, 1500, then=40, best=50)
        yield url, asyncio.run(record(url, n=6, seed=11, turns=8))


def _advise(capsys: Any, url: str, *extra: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["report", str(PURAMUR), "--advise", "--db", url, "--since", "30d", *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def advice(generated: tuple[str, list[str]]) -> dict[str, Any]:
    """`funnel report --advise --format json` over the generated population, once."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", str(PURAMUR), "--advise", "--db", generated[0], "--since",
                     "30d", "--format", "json"]) == 0
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


def test_the_thresholds_are_read_from_the_exit_conditions() -> None:
    found = [(t.stage, t.to, t.text) for t in thresholds(load_funnel(PURAMUR))]
    assert found == [("discovery", "presentation", "discovery_completeness >= 60"),
                     ("presentation", "cart_building", "cart_item_count > 0"),
                     ("objection_handling", "cart_building", "cart_item_count > 0"),
                     ("cart_building", "contact_collection", "cart_item_count > 0")]


def _discovery(report: dict[str, Any]) -> dict[str, Any]:
    (a,) = [t for t in report["thresholds"] if t["field"] == "discovery_completeness"]
    return a


def test_the_advice_recovers_the_best_threshold(generated, advice, capsys) -> None:
    url, recorded = generated
    recent = advice["sessions"] - 1500  # the recorded sessions of the last 30 days
    assert 0 < recent <= len(recorded)
    a = _discovery(advice)
    assert a["passed"] + a["stayed"] <= a["entered"] <= advice["sessions"]
    low, high = a["interval"]
    assert low <= 50 <= high and high < 60, a  # the known best, and not the threshold now
    assert a["suggested"] == pytest.approx(50, abs=3)
    assert a["advice"].startswith("lower it to")
    assert a["step"]["below"]["rate"] < 0.2 < 0.45 < a["step"]["from"]["rate"]
    # The replay: over the 500 most recent, of which the generated kept no turn records.
    assert a["replay"]["condition"] == f"discovery_completeness >= {a['suggested']:g}"
    assert a["replay"]["sessions"] == recent and a["replay"]["capped"]
    assert a["replay"]["without_turns"] == 500 - recent
    code, text, _ = _advise(capsys, url, "--advise-sessions", "0")
    assert code == 0 and "lower it to" in text and "replay of" not in text
    assert "discovery -> presentation  `discovery_completeness >= 60`" in text


def test_the_suggestion_is_replayed_like_funnel_replay(generated, advice, capsys, tmp_path
                                                       ) -> None:
    url, recorded = generated
    a = _discovery(advice)
    # The recorded sessions of the last 30 days (the scenarios' clocks are older).
    recent = [sid for sid in recorded if sid.startswith("synthetic")]
    value = a["replay"]["condition"].split()[-1]
    for folder in ("funnels", "prompts", "schemas"):
        shutil.copytree(PURAMUR.parent.parent / folder, tmp_path / folder)
    (tmp_path / "pyproject.toml").write_text("", "utf-8")
    edited = tmp_path / "funnels" / "puramur.yaml"
    edited.write_text(PURAMUR.read_text("utf-8").replace(
        "discovery_completeness >= 60", f"discovery_completeness >= {value}"), "utf-8")
    capsys.readouterr()
    assert main(["replay", str(edited), "--db", url, "--sessions", *recent, "--format",
                 "json", "--jobs", "1"]) == 0
    direct = json.loads(capsys.readouterr().out)
    assert a["replay"]["changed"] == direct["counts"]["changed"] > 0
    assert a["replay"]["sessions"] == direct["counts"]["sessions"] == len(recent) \
        == advice["sessions"] - 1500


def test_advice_on_an_empty_database_is_a_one_line_error(server_dsn, capsys) -> None:
    with temporary_schema(server_dsn, prefix="funnel_advise_empty") as url:
        code, _, err = _advise(capsys, url)
    assert code == 2 and err.count("\n") == 1
    assert "no recorded session of funnel 'puramur'" in err
