"""A session whose copy changed between turns is replayed turn by turn on its own copies
(issue 44; docs/evidence.md#what-it-does).

Puramur's v1 deployed, two turns of a session on it; a patch of v1 deployed without a
`version:` bump (discovery's exit at 80, and presentation's exit to objection_handling on
another action); two more turns, on the patch. Neither copy alone reproduces the
recording (the patch keeps turn 2 in discovery, the first copy moves turn 4 on), the two
turn by turn do: replaying the first copy as the edit finds its difference at turn 4.
With the first copy purged, the session is skipped with the reason.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from projects import copy_puramur

from engine.cli import main
from engine.llm.models import ScriptedModel
from engine.turn.engine import Engine

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "funnels" / "puramur" / "demo.yaml"
CUSTOMER: list[str] = yaml.safe_load(DEMO.read_text("utf-8"))["customer"]
TO_OBJECTIONS = "- to: objection_handling\n        when: \"'record_objection' in actions\""
PATCH = {"when: discovery_completeness >= 60": "when: discovery_completeness >= 80",
         TO_OBJECTIONS: TO_OBJECTIONS.replace("record_objection", "request_handoff")}


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_session_whose_copy_changed_is_replayed_turn_by_turn(
        db_url: str, tmp_path: Path, sql: Any, capsys: pytest.CaptureFixture[str]) -> None:
    funnel = copy_puramur(tmp_path)
    first = funnel.read_text("utf-8")
    model = ScriptedModel.from_file(DEMO)

    async def say(lines: list[str]) -> list[str]:
        # As `funnel serve` runs: its copies are the ones pinned sessions load.
        async with await Engine.open(funnel, db=db_url, model=model, deploy=True) as engine:
            return [(await engine.handle("p", line, channel="telegram")).stage_after
                    for line in lines]

    assert asyncio.run(say(CUSTOMER[:2])) == ["discovery", "presentation"]
    patched = first
    for old, new in PATCH.items():
        assert patched.count(old) == 1
        patched = patched.replace(old, new)
    funnel.write_text(patched, "utf-8")
    assert cli(capsys, "deploy", str(funnel), "--db", db_url)[0] == 0  # a patch of v1
    # Turn 4's objection no longer moves it on the patch.
    assert asyncio.run(say(CUSTOMER[2:4])) == ["presentation", "presentation"]
    ran = [h for (h,) in sql("SELECT funnel_hash FROM funnel_turns WHERE session_id = 'p' "
                             "ORDER BY id")]
    a, b = ran[0], ran[2]
    assert ran == [a, a, b, b] and a != b

    funnel.write_text(first, "utf-8")  # the edit replayed: the first copy
    run = ("replay", str(funnel), "--db", db_url, "--jobs", "1")
    code, out, err = cli(capsys, *run, "--format", "json")
    assert code == 0 and "warning" not in err, err
    report = json.loads(out)
    (session,) = report["sessions"]
    assert session["status"] == "different", session
    assert session["copies"] == [{"hash": a, "turns": [1, 2]}, {"hash": b, "turns": [3, 4]}]
    diff = session["first_difference"]
    assert (diff["turn"], diff["stage"]) == (4, "presentation")
    assert diff["changes"] == ["moved presentation->objection_handling now, nowhere then"]
    assert report["counts"]["not_reproduced"] == 0 and report["counts"]["skipped"] == 0
    assert a[:12] in report["versions"]["1"] and b[:12] in report["versions"]["1"]
    code, out, _ = cli(capsys, *run)
    assert f"played on the 2 copies it ran on (turns 1-2 on {a[:12]}, turns 3-4 on " \
        f"{b[:12]})" in out

    # The patch as the edit: turn 2, which ran on the first copy, differs (discovery's exit
    # at 80 does not hold where 60 did), and turn 3 needs the model.
    funnel.write_text(patched, "utf-8")
    code, out, _ = cli(capsys, *run, "--format", "json")
    (session,) = json.loads(out)["sessions"]
    assert (session["status"], session["needs_model_from_turn"]) == ("needs_model", 3)
    assert (session["first_difference"]["turn"], session["first_difference"]["stage"]) == \
        (2, "discovery")

    # A copy it ran on purged: skipped, with both hashes and why.
    sql("DELETE FROM funnel_versions WHERE hash = %s", (a,))
    code, out, _ = cli(capsys, *run, "--format", "json")
    (session,) = json.loads(out)["sessions"]
    assert session["status"] == "skipped" and "copies" not in session
    assert session["reason"].startswith(
        f"its copy of v1 changed between turns (turn 2 ran on {a[:12]}, turn 3 on {b[:12]}")
    assert f"the copy of version 1 it ran on ({a[:12]}) is not in the version store any " \
        "more (purged)" in session["reason"]
