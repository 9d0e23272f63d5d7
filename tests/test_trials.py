"""Trying an edit is not deploying it (issue 44; docs/versions.md#deploying-and-trying).

Issue 44's steps with Puramur's scripted model: deploy, four sessions through `funnel chat`,
discovery's exit edited from 60 to 80 without a `version:` bump, a clean save taken by the
studio (over HTTP) and one `funnel chat` line on the edit: `funnel replay` of the edit says
per session what it said before either trial, nothing "not reproduced"; the trials are
listed apart by `funnel versions`; a deploy of the edit is still a patch. A session pinned
to v1, continued by an engine whose newest is v2 after a studio trial of an edited v1,
runs the deployed copy of v1. A gate over no comparable session fails; the share of the
sessions that need the model has a threshold; `--base` outside the project works.
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import sql_runner
from projects import copy_puramur
from service_support import running
from studio_support import opener

from engine.cli import main
from engine.funnel.compiled import load_funnel
from engine.llm.models import ScriptedModel
from engine.store import open_store
from engine.store.connect import temporary_schema
from engine.studio import Studio, create_studio_app
from engine.studio.server import LOOPBACK_HOSTS
from engine.turn.engine import Engine

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "funnels" / "puramur" / "demo.yaml"
SRC = (ROOT / "funnels" / "puramur.yaml").read_text("utf-8")
CUSTOMER: list[str] = yaml.safe_load(DEMO.read_text("utf-8"))["customer"]
SCRIPTED = f"scripted:{DEMO}"
EXIT_60 = "when: discovery_completeness >= 60"
EXIT_80 = "when: discovery_completeness >= 80"
# Four sessions of 1 to 4 customer messages (discovery's exit holds at the 2nd at 60).
SESSIONS = {f"s{n}": CUSTOMER[:n] for n in (1, 2, 3, 4)}


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def chat(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], funnel: Path,
         url: str, session: str, lines: list[str]) -> None:
    """`funnel chat` with the lines on stdin (not a terminal: one reply a line)."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(
        "".join(f"{line}\n" for line in lines).encode())))
    code, out, err = cli(capsys, "chat", str(funnel), "--db", url, "--session", session,
                         "--model", SCRIPTED)
    assert code == 0 and len(out.splitlines()) == len(lines), err


def per_session(report: dict[str, Any]) -> dict[str, Any]:
    return {s["session_id"]: {k: v for k, v in s.items() if k != "revenue"}
            for s in report["sessions"]}


def versions_of(funnel: Path) -> tuple[Path, Path]:
    """Puramur as shipped and with the 80 edit, beside ``funnel`` (its templates')."""
    original, edited = funnel.with_name("puramur_60.yaml"), funnel.with_name("puramur_80.yaml")
    original.write_text(SRC, "utf-8")
    edited.write_text(SRC.replace(EXIT_60, EXIT_80), "utf-8")
    return original, edited


@pytest.fixture(scope="module")
def world(server_dsn: str, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[str, Path]]:
    """Puramur deployed, and four sessions on it (typed as `funnel chat` types them: an
    engine that deploys nothing)."""
    funnel = copy_puramur(tmp_path_factory.mktemp("project"))

    async def talk(url: str) -> None:
        model = ScriptedModel.from_file(DEMO)
        async with await Engine.open(funnel, db=url, model=model) as engine:
            for session, lines in SESSIONS.items():
                for line in lines:
                    await engine.handle(session, line, channel="cli")

    with temporary_schema(server_dsn, prefix="funnel_trials") as url:
        assert main(["deploy", str(funnel), "--db", url]) == 0
        asyncio.run(talk(url))
        yield url, funnel


def test_a_trial_of_an_edit_leaves_replay_and_production_as_they_were(
        world: tuple[str, Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    url, funnel = world
    text = funnel.read_text("utf-8")
    assert text.count(EXIT_60) == 1
    funnel.write_text(text.replace(EXIT_60, EXIT_80), "utf-8")  # version: unchanged

    def replay(*extra: str) -> tuple[int, dict[str, Any], str]:
        code, out, err = cli(capsys, "replay", str(funnel), "--db", url, "--jobs", "1",
                             "--format", "json", *extra)
        return code, json.loads(out), err

    code, before, _ = replay()
    assert code == 0 and before["counts"]["not_reproduced"] == 0
    assert before["counts"]["changed"] == 3  # all but s1, which never leaves discovery
    with sql_runner(url) as sql:
        (deployed,) = sql("SELECT hash FROM funnel_versions WHERE NOT trial")
    assert deployed[0][:12] in before["versions"]["1"]

    # A trial in the studio: it opens on the edit, and takes a clean save of it.
    with running(create_studio_app(opener(funnel, url), hosts=LOOPBACK_HOSTS)) as base, \
            httpx.Client(base_url=base, timeout=60) as c:
        generation = c.get("/api/status").json()["puramur"]["generation"]
        funnel.write_text(funnel.read_text("utf-8") + "# saved in the studio\n", "utf-8")
        for _ in range(600):
            status = c.get("/api/status").json()["puramur"]
            if status["generation"] > generation:
                break
            asyncio.run(asyncio.sleep(0.05))
        assert status["ok"] and status["generation"] > generation
    # ... and one line of `funnel chat` on the edited file.
    chat(monkeypatch, capsys, funnel, url, "tried", CUSTOMER[:1])

    code, after, err = replay()
    assert code == 0 and "warning" not in err
    assert after["counts"]["not_reproduced"] == 0
    now = per_session(after)
    assert {k: now[k] for k in SESSIONS} == per_session(before)
    assert now["tried"]["status"] == "same"  # played on the trial it ran on
    with sql_runner(url) as sql:
        assert sql("SELECT hash FROM funnel_versions WHERE NOT trial") == [deployed]
        trials = sql("SELECT hash FROM funnel_versions WHERE trial")
        ran = sql("SELECT DISTINCT funnel_hash FROM funnel_turns WHERE session_id = 'tried'")
    assert len(trials) == 2 and ran[0] in trials  # the studio's open and its save

    code, out, _ = cli(capsys, "versions", str(funnel), "--db", url)
    lines = out.splitlines()
    assert lines[0].startswith("v1    " + deployed[0][:12]) and "(replaced)" not in out
    tried = [line for line in lines if line.endswith("  trial")]
    assert len(tried) == 2 and any("  1 session(s)  trial" in line for line in tried)

    # Records from before turn records kept their copy: one warning line counts them.
    with sql_runner(url) as sql:
        sql("UPDATE funnel_turns SET funnel_hash = NULL WHERE session_id IN ('s1', 's2')")
        # s4's last turn on the trial: a copy that changed between turns is played turn by
        # turn on its copies (tests/test_copies.py).
        sql("UPDATE funnel_turns SET funnel_hash = %s WHERE id = (SELECT max(id) FROM "
            "funnel_turns WHERE session_id = 's4')", (ran[0][0],))
    code, legacy, err = replay()
    s4 = per_session(legacy)["s4"]
    assert s4.pop("copies") == [{"hash": deployed[0], "turns": [1, 3]},
                                {"hash": ran[0][0], "turns": [4, 4]}]
    assert s4 == now["s4"]
    assert [line for line in err.splitlines() if "warning" in line] == [
        "funnel replay: warning: 2 session(s) were recorded before turn records kept the copy "
        "of the funnel they ran on: replayed on the copy of their version deployed last, "
        "which may not be the one they ran on"]
    assert legacy["measured"]["legacy"] == 2 and per_session(legacy)["s2"] == now["s2"]

    # A deploy of the edit without a bump is a patch, and says so (a trial never does).
    code, out, _ = cli(capsys, "deploy", str(funnel), "--db", url)
    assert code == 0 and "replaced v1 in the version store" in out


def test_a_gate_measured_over_nothing_fails(world: tuple[str, Path],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    url, funnel = world
    # On the 80 edit as the base, the sessions that reached presentation do not reproduce.
    original, edited = versions_of(funnel)
    gate = ("replay", str(original), "--db", url, "--jobs", "1", "--sessions", "s3", "s4",
            "--base", str(edited), "--fail-if", "handoff_rate < -5%")
    code, out, _ = cli(capsys, *gate, "--format", "github")
    assert code == 1
    (line,) = [x for x in out.splitlines() if "handoff_rate" in x]
    assert line == ("::error title=funnel replay gate::FAIL: handoff_rate < -5%25: not measured: "
                    "0 of 2 sessions comparable (2 not reproduced: turn 3: the model was asked "
                    "in presentation then, in discovery now)"), line
    assert cli(capsys, *gate, "--allow-unmeasured")[0] == 0
    code, out, _ = cli(capsys, *gate, "--format", "json")
    verdict = json.loads(out)["gates"][0]
    assert verdict["failed"] and verdict["not_measured"]
    assert json.loads(out)["measured"]["first_reason"].startswith("turn 3: ")


def test_the_share_that_needs_the_model_has_a_threshold(world: tuple[str, Path],
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    url, funnel = world
    original, edited = versions_of(funnel)
    run = ("replay", str(edited), "--db", url, "--jobs", "1", "--base", str(original),
           "--sessions", "s1", "s2", "s3", "s4")
    code, out, _ = cli(capsys, *run, "--format", "json", "--max-needs-model", "20%")
    report = json.loads(out)
    assert code == 1 and report["measured"]["needs_model"] == 2  # s3 and s4, from turn 3
    assert report["measured"]["needs_model_share"] == 0.5
    assert report["gates"][0]["line"].startswith("FAIL: --max-needs-model 20% (measured "
                                                 "50.0%)")
    code, out, _ = cli(capsys, *run, "--format", "github", "--max-needs-model", "20%",
                       "--warn-needs-model")
    assert code == 0 and "::warning title=funnel replay gate::warning: --max-needs-model" in out
    code, out, _ = cli(capsys, *run, "--max-needs-model", "60%")
    assert code == 0 and "needs the model 2 (50.0% of the sessions)" in out
    assert cli(capsys, *run, "--max-needs-model", "lots")[0] == 2


def test_a_base_outside_the_project_resolves_its_files_beside_it(
        world: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, funnel = world
    _, edited = versions_of(funnel)
    checkout = tmp_path / "base"  # no project marker: a copy of the base commit's files
    shutil.copytree(funnel.parent.parent, checkout)
    (checkout / "pyproject.toml").unlink()
    (checkout / "funnels" / "puramur.yaml").write_text(SRC, "utf-8")
    run = ("replay", str(edited), "--db", url, "--jobs", "1", "--format", "json",
           "--sessions", "s1", "s2")
    code, out, _ = cli(capsys, *run, "--base", str(checkout / "funnels" / "puramur.yaml"))
    counts = json.loads(out)["counts"]
    assert code == 0 and (counts["same"], counts["different"]) == (1, 1), out
    alone = tmp_path / "alone.yaml"  # the funnel file without its templates
    shutil.copy(funnel, alone)
    code, out, err = cli(capsys, *run, "--base", str(alone))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "must keep its files where the project keeps them" in err


def test_a_pinned_session_runs_the_deployed_copy_not_a_trial(
        db_url: str, tmp_path: Path, sql: Any) -> None:
    v1 = copy_puramur(tmp_path)
    assert main(["deploy", str(v1), "--db", db_url]) == 0
    model = ScriptedModel.from_file(DEMO)

    async def say(funnel: Path, text: str) -> tuple[Any, dict[int, str]]:
        async with await Engine.open(funnel, db=db_url, model=model, deploy=True) as engine:
            return await engine.handle("p", text, channel="telegram"), engine.loaded_versions()

    async def try_in_the_studio() -> None:
        studio = await Studio.open([v1], db=db_url)
        await studio.close()

    first, _ = asyncio.run(say(v1, CUSTOMER[0]))
    assert first.stage_after == "discovery"
    (deployed,) = sql("SELECT hash FROM funnel_versions WHERE NOT trial")
    # A studio trial of an edited v1, then v2 (the same edit) deployed and served.
    v1.write_text(SRC.replace(EXIT_60, EXIT_80), "utf-8")
    asyncio.run(try_in_the_studio())
    (trial,) = sql("SELECT hash FROM funnel_versions WHERE trial")
    v2 = v1.with_name("puramur_v2.yaml")
    v2.write_text(v1.read_text("utf-8").replace("version: 1", "version: 2", 1), "utf-8")
    assert main(["deploy", str(v2), "--db", db_url]) == 0
    turn, loaded = asyncio.run(say(v2, CUSTOMER[1]))
    assert loaded[1] == deployed[0]
    # The deployed v1's exit (>= 60) holds at 75; the trial's and v2's (>= 80) would not.
    assert turn.state["funnel_version"] == 1 and turn.stage_after == "presentation"
    hashes = sql("SELECT funnel_hash FROM funnel_turns WHERE session_id = 'p' ORDER BY id")
    assert hashes == [deployed, deployed] and trial != deployed

    # Retention: a trial last tried before the period that no turn record names is
    # purged; the deployed copies and the session (active) stay.
    async def purge() -> dict[str, int]:
        store = await open_store(db_url)
        try:
            return await store.purge(load_funnel(v2).spec, 86400.0)
        finally:
            await store.close()

    sql("UPDATE funnel_versions SET deployed_at = NOW() - INTERVAL '2 days' WHERE trial")

    deployed_rows = sql("SELECT hash FROM funnel_versions WHERE NOT trial ORDER BY 1")
    assert asyncio.run(purge())["trials"] == 1
    assert sql("SELECT hash FROM funnel_versions ORDER BY 1") == deployed_rows

    # A database from before trials: `funnel migrate` adds both columns, nothing lost.
    count = sql("SELECT (SELECT count(*) FROM funnel_turns), (SELECT count(*) FROM "
                "funnel_versions)")
    sql("ALTER TABLE funnel_turns DROP COLUMN funnel_hash")
    sql("ALTER TABLE funnel_versions DROP COLUMN trial")
    sql("DELETE FROM funnel_migrations WHERE funnel = '' AND (description LIKE "
        "'%trial BOOLEAN%' OR description LIKE '%funnel_hash TEXT%')")
    assert main(["migrate", str(v2), "--db", db_url]) == 0
    assert sql("SELECT (SELECT count(*) FROM funnel_turns), (SELECT count(*) FROM "
               "funnel_versions)") == count
    assert sql("SELECT count(*) FROM funnel_versions WHERE trial") == [(0,)]  # as deployed
    assert sql("SELECT count(*) FROM funnel_turns WHERE funnel_hash IS NULL") == [(2,)]
