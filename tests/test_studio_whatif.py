"""The studio's what-if (docs/studio.md#what-if, issue 39 §3): after each clean save, the
customers' sessions of the last days replayed on the edit, in the background.

A recorded population of real sessions (tests/replay_population.py: the engine's own
turns with the scripted model) and the studio on a copy of the funnel; an exit threshold
is changed in the file and the save taken. The page's count, its needs-the-model share
and its changed sessions are those of `funnel replay --format json` on the same
database; a changed session's link opens it at its first differing turn; a second save
while a what-if runs cancels it (``cancelled`` in ``/api/whatif`` and on the page), and
stops a replay in progress after the chunk in hand; the cap takes the most recent
sessions; bad ``--what-if-*`` values are one line and rc 2.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import run_funnel
from projects import copy_puramur
from replay_population import record
from service_support import running
from studio_support import headless_chromium

from engine.cli import main
from engine.evidence.replay import replay
from engine.funnel.compiled import load_funnel
from engine.store import open_store
from engine.store.connect import temporary_schema
from engine.studio import Studio, create_studio_app
from engine.studio.server import LOOPBACK_HOSTS
from engine.studio.whatif import WhatIf, WhatIfSettings

pytestmark = [pytest.mark.postgres]

THRESHOLD = "when: discovery_completeness >= 60"
SETTLE = 1.5  # seconds a save's what-if waits: time enough for the second save to cancel it


@pytest.fixture(scope="module")
def studio(server_dsn: str, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, str, Path]]:
    """(the studio's address, its database, the funnel file it watches)."""
    with temporary_schema(server_dsn, prefix="funnel_whatif") as db:
        asyncio.run(record(db, n=10, seed=11))
        funnel = copy_puramur(tmp_path_factory.mktemp("whatif"))
        assert THRESHOLD in funnel.read_text("utf-8")

        async def opened() -> Studio:
            return await Studio.open([funnel], db=db, what_if=WhatIfSettings(settle=SETTLE))

        with running(create_studio_app(opened, hosts=LOOPBACK_HOSTS)) as url:
            yield url, db, funnel


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with headless_chromium(tmp_path_factory.mktemp("profile")) as d:
        yield d


def save(url: str, funnel: Path, threshold: int) -> int:
    """Edit the exit's threshold (``version:`` kept, as a product owner trying an edit
    does) and wait until the studio took the save; its generation."""
    source = funnel.read_text("utf-8")
    before = httpx.get(f"{url}/api/status").json()["puramur"]["generation"]
    text = source
    for n in (60, 55, 50, 45):
        text = text.replace(f"when: discovery_completeness >= {n}",
                            f"when: discovery_completeness >= {threshold}")
    assert text != source
    funnel.write_text(text, "utf-8")
    return wait(lambda: (s := httpx.get(f"{url}/api/status").json()["puramur"])["generation"]
                > before and s["ok"] and s["generation"])


def wait(check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("timed out")


def what_if(url: str) -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(f"{url}/api/whatif", params={"funnel": "puramur"}).json()
    return found


def replayed(capsys: pytest.CaptureFixture[str], db: str, funnel: Path) -> dict[str, Any]:
    capsys.readouterr()
    code = main(["replay", str(funnel), "--db", db, "--since", "7d", "--jobs", "1",
                 "--format", "json"])
    out = capsys.readouterr().out
    assert code == 0, out
    report: dict[str, Any] = json.loads(out)
    return report


def test_the_pages_count_is_funnel_replays_on_the_same_database(studio, page, capsys) -> None:
    url, db, funnel = studio
    page.get(f"{url}/?funnel=puramur")
    wait(lambda: page.find_elements("css selector", '[data-testid="what-if-status"]'))
    save(url, funnel, 50)
    run = wait(lambda: (r := what_if(url)["run"]) and r["status"] == "done" and r)
    report = replayed(capsys, db, funnel)
    counts = report["counts"]
    assert counts["changed"] > 0 and counts["not_reproduced"] == 0  # a population worth it
    assert run["counts"] == counts
    changed = {s["session_id"]: s for s in report["sessions"]
               if s["status"] in ("different", "needs_model")}
    assert {s["session_id"]: s["turn"] for s in run["changed"]} == \
        {sid: s["first_difference"]["turn"] for sid, s in changed.items()}

    sentence = wait(lambda: page.find_elements(
        "css selector", '[data-testid="what-if-sentence"]'))[0]
    assert sentence.get_attribute("data-changed") == str(counts["changed"])
    assert sentence.get_attribute("data-sessions") == str(counts["sessions"])
    assert f"changes {counts['changed']} of {counts['sessions']} sessions" in sentence.text
    earlier = len(report["earlier"].get("presentation", []))
    assert earlier and f"{earlier} reach presentation earlier" in sentence.text
    needs = page.find_element("css selector", '[data-testid="what-if-needs-model"]')
    assert float(needs.get_attribute("data-share")) == \
        pytest.approx(counts["needs_model"] / counts["changed"], abs=1e-4)
    links = page.find_elements("css selector", '[data-testid="what-if-session"]')
    assert {a.text for a in links} == set(changed)

    # A changed session's link opens it at its first difference.
    first = links[0]
    sid, turn = first.text, changed[first.text]["first_difference"]["turn"]
    first.click()
    marked = wait(lambda: page.find_elements(
        "css selector", '[data-testid="what-if-first-difference"]'))[0]
    assert page.find_element("css selector", '[data-testid="session-id"]').text == sid
    assert marked.get_attribute("data-turn") == str(turn)
    errors = [e for e in page.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_a_second_save_cancels_the_running_what_if(studio, page) -> None:
    url, _db, funnel = studio
    page.get(f"{url}/?funnel=puramur")
    save(url, funnel, 55)
    first = what_if(url)["run"]
    assert first["status"] == "running"
    save(url, funnel, 45)
    now = what_if(url)
    assert now["run"]["id"] != first["id"] and now["run"]["status"] == "running"
    assert now["earlier"][0] == {**now["earlier"][0], "id": first["id"], "status": "cancelled"}
    note = wait(lambda: page.find_elements("css selector", '[data-testid="what-if-cancelled"]'))
    assert "cancelled" in note[0].text


def test_the_what_if_replays_the_most_recent_sessions_up_to_its_cap(studio) -> None:
    _url, db, funnel = studio

    async def capped() -> dict[str, Any]:
        store = await open_store(db)
        try:
            what = WhatIf(store, WhatIfSettings(max_sessions=4, settle=0.0))
            what.start(load_funnel(funnel))
            while (run := what.status("puramur")["run"])["status"] == "running":
                await asyncio.sleep(0.02)
            await what.close()
            return run
        finally:
            await store.close()

    run = asyncio.run(capped())
    assert run["status"] == "done" and run["counts"]["sessions"] == 4
    assert run["scope"] == "the 4 most recent of the 13 sessions with a turn in the last 7 day(s)"


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--what-if-max", "-1", "0 or more sessions"), ("--what-if-days", "0", "more than 0"),
    ("--what-if-days", "week", "a number of days")])
def test_a_bad_what_if_setting_is_one_line_and_rc_2(option, value, says) -> None:
    result = run_funnel("studio", "funnels/puramur.yaml", option, value)
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_save_stops_a_replay_in_progress_after_its_chunk(studio, monkeypatch) -> None:
    _url, db, funnel = studio
    entered, release = threading.Event(), threading.Event()

    def held(*args: Any, **kwargs: Any) -> Any:  # the first chunk waits for the second save
        entered.set()
        release.wait(30)
        return replay(*args, **kwargs)

    monkeypatch.setattr("engine.studio.whatif.replay", held)

    async def two_saves() -> tuple[Any, dict[str, Any]]:
        store = await open_store(db)
        try:
            what = WhatIf(store, WhatIfSettings(settle=0.0, chunk=2))
            compiled = load_funnel(funnel)
            what.start(compiled)
            first = what.runs["puramur"][0]
            # (another what-if of the module's studio may call the patched replay too)
            while not (entered.is_set() and first.phase == "replaying"):
                await asyncio.sleep(0.01)
            assert (first.status, first.phase) == ("running", "replaying")
            what.start(compiled)
            release.set()
            while what.status("puramur")["run"]["status"] == "running":
                await asyncio.sleep(0.02)
            await what.close()
            assert first.worker is not None and first.worker.done()
            return first, what.status("puramur")["run"]
        finally:
            await store.close()

    first, second = asyncio.run(two_saves())
    assert first.status == "cancelled" and first.result is None
    assert first.done == 2  # the chunk in hand, no other
    assert second["status"] == "done" and second["counts"]["sessions"] == 13
