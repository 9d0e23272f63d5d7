"""The studio's Scenarios and Simulate tabs (docs/studio.md), in headless Chromium.

One browser and one studio for the module, on a copy of Puramur's project with its
scenarios (one expectation broken on purpose), a personas file and a scripted model
for the simulation. Real parts only: the studio's app on uvicorn, a PostgreSQL
schema, `funnel test` as the terminal runs it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from projects import copy_puramur
from service_support import running
from studio_support import headless_chromium, opener

from engine.cli import main
from engine.store.connect import temporary_schema
from engine.studio import create_studio_app
from engine.studio.server import LOOPBACK_HOSTS

pytestmark = [pytest.mark.postgres]
ROOT = Path(__file__).resolve().parent.parent
BROKEN = ("      stage: presentation              # 25", "      stage: discovery              # 25")
SHOTS = os.environ.get("FUNNEL_STUDIO_SHOTS")  # a folder: the docs' screenshots are saved there


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Puramur's project copied, with three of its scenarios (happy_path's turn 2 expecting
    the wrong stage), the demo script, and the simulation's personas and scripted model."""
    funnel = copy_puramur(tmp_path_factory.mktemp("project"))
    own = funnel.parent / "puramur"
    (own / "scenarios").mkdir()
    for name in ("happy_path.yaml", "objections.yaml", "manager_request.yaml"):
        shutil.copy(ROOT / "funnels" / "puramur" / "scenarios" / name, own / "scenarios")
    happy = own / "scenarios" / "happy_path.yaml"
    happy.write_text(happy.read_text("utf-8").replace(*BROKEN, 1), "utf-8")
    shutil.copy(ROOT / "funnels" / "puramur" / "demo.yaml", own)
    shutil.copy(ROOT / "tests" / "evidence" / "personas.yaml", own)
    shutil.copy(ROOT / "tests" / "evidence" / "funnel_model.yaml", own)
    return funnel


@pytest.fixture(scope="module")
def served(project: Path, server_dsn: str) -> Iterator[tuple[str, str]]:
    with temporary_schema(server_dsn, "t") as db, \
            running(create_studio_app(opener(project, db), hosts=LOOPBACK_HOSTS)) as url:
        yield url, db


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with headless_chromium(tmp_path_factory.mktemp("profile")) as d:
        yield d


class Page:
    def __init__(self, driver: Any, url: str) -> None:
        from selenium.webdriver.support.ui import WebDriverWait

        self.d, self.wait = driver, WebDriverWait(driver, 60)
        driver.get("about:blank")
        driver.get_log("browser")  # an earlier test's page is not this one's
        driver.get(url + "/")
        self.until(lambda: self.js("return document.getElementById('graph').dataset.current"))

    def js(self, script: str, *args: Any) -> Any:
        return self.d.execute_script(script, *args)

    def until(self, condition: Any) -> None:
        self.wait.until(lambda _: condition())

    def tid(self, name: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.d.find_element(By.CSS_SELECTOR, f'[data-testid="{name}"]')

    def text(self, name: str) -> str:
        return str(self.js("const e = document.querySelector(`[data-testid=\"${arguments[0]}\"]`);"
                           " return e ? e.textContent : ''", name))

    def no_console_errors(self, *expected: str) -> None:
        """No error in the console but the ``expected`` responses (Chromium logs every
        4xx answer, the 409 the page asks on too)."""
        errors = [e for e in self.d.get_log("browser") if e["level"] == "SEVERE"
                  and not any(x in e["message"] for x in expected)]
        assert not errors, errors


def test_run_all_shows_a_failure_and_accepting_it_passes_funnel_test(
        driver: Any, served: tuple[str, str], project: Path, capsys: Any) -> None:
    url, db = served
    page = Page(driver, url)
    page.tid("tab-scenarios").click()
    page.tid("run-all-scenarios").click()
    page.until(lambda: "passed" in page.text("scenario-status"))
    folder = project.parent / "puramur" / "scenarios"
    assert str(folder) in page.text("scenario-status")
    items = page.js("return [...document.querySelectorAll('[data-testid=scenario-item]')]"
                    ".map(e => [e.dataset.name, e.dataset.passed])")
    assert sorted(items) == [["happy-path-gift", "false"], ["manager-request-from-discovery", "true"],
                             ["objections-offer-manager", "true"]]
    # The failing one shows its expectation, as written, and the turn with its message.
    failure = page.tid("scenario-failure")
    assert failure.get_attribute("data-turn") == "2"
    assert page.text("scenario-expectation").startswith("stage: discovery")
    shown = failure.text
    assert "turn 2" in shown and "I have a Sphynx cat, her skin is very dry" in shown
    assert 'expected stage "discovery", got "presentation"' in shown

    # Accept: the diff first (nothing written yet), then the file re-recorded.
    happy = folder / "happy_path.yaml"
    before = happy.read_text("utf-8")
    page.tid("accept-scenario").click()
    page.until(lambda: page.text("scenario-diff"))
    diff = page.text("scenario-diff")
    assert "-      stage: discovery" in diff and "+      stage: presentation" in diff
    added = [ln for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert len(added) == 1 and added[0].startswith("+" + BROKEN[0])  # its comment kept
    assert happy.read_text("utf-8") == before
    if SHOTS:
        driver.save_screenshot(str(Path(SHOTS) / "scenarios.png"))
    page.tid("accept-confirm").click()
    page.until(lambda: "accepted happy-path-gift" in page.text("scenario-status"))
    assert happy.read_text("utf-8") == before.replace(BROKEN[1], BROKEN[0])
    assert not page.js("return document.querySelector('[data-testid=scenario-item]"
                       "[data-passed=false]')")

    # Only the funnel's own scenarios are accepted; a diff that is no longer the file's is not.
    outside = httpx.post(url + "/api/scenarios/accept", json={"funnel": "puramur",
                                                              "file": str(project)})
    assert outside.status_code == 400 and "not a scenario file" in outside.text
    stale = httpx.post(url + "/api/scenarios/accept", json={
        "funnel": "puramur", "file": str(happy), "confirm": "0" * 16})
    assert stale.status_code == 400 and "changed since its diff was shown" in stale.text

    # `funnel test` from the terminal passes the accepted scenario.
    capsys.readouterr()
    assert main(["test", str(happy), "--db", db]) == 0, capsys.readouterr()
    page.no_console_errors()


def test_save_as_scenario_names_the_file_and_asks_before_overwriting(
        driver: Any, served: tuple[str, str], project: Path) -> None:
    from selenium.webdriver.support.ui import Select

    url, _db = served
    page = Page(driver, url)
    Select(page.tid("model-picker")).select_by_value("other")
    page.tid("model-name").send_keys(f"scripted:{project.parent / 'puramur' / 'demo.yaml'}")
    for n, text in enumerate(("Hi!", "I have a Sphynx cat, her skin is very dry"), 1):
        page.tid("chat-input").send_keys(text)
        page.tid("chat-send").click()
        page.until(lambda n=n: page.js("return document.querySelectorAll('#log .turn').length") == n)

    page.tid("save-scenario").click()
    name = page.tid("scenario-name")
    assert name.get_attribute("value") == page.text("session-id")  # proposed: the session id
    name.clear()
    name.send_keys("sphynx-two-turns")
    page.tid("scenario-save-confirm").click()
    page.until(lambda: "saved 2 turn(s)" in page.text("scenario-result"))
    saved = project.parent / "puramur" / "scenarios" / "sphynx-two-turns.yaml"
    assert saved.is_file() and str(saved) in page.text("scenario-result")
    assert not (project.parent / "puramur" / "puramur").exists()  # never nested
    text = saved.read_text("utf-8")
    assert "scenario: sphynx-two-turns\n" in text and "funnel: ../../puramur.yaml\n" in text

    # The same name again: the page asks first (409), the file is left until it is told.
    saved.write_text(text + "# kept until overwritten\n", "utf-8")
    page.tid("save-scenario").click()
    page.tid("scenario-save-confirm").click()
    page.until(lambda: page.tid("scenario-overwrite-ask").is_displayed())
    assert "exists" in page.text("scenario-overwrite-ask")
    assert saved.read_text("utf-8").endswith("# kept until overwritten\n")
    page.tid("scenario-overwrite").click()
    page.until(lambda: "overwrote 2 turn(s)" in page.text("scenario-result"))
    assert saved.read_text("utf-8") == text
    page.no_console_errors("/api/scenario - Failed to load resource: the server responded "
                           "with a status of 409")


def test_simulate_shows_progress_and_the_table_and_writes_no_session(
        driver: Any, served: tuple[str, str], project: Path, tmp_path: Path) -> None:
    from selenium.webdriver.support.ui import Select

    url, db = served
    page = Page(driver, url)
    page.tid("tab-simulate").click()
    page.until(lambda: "personas.yaml" in page.text("simulate-personas"))
    scripts = page.js("return [...document.querySelectorAll('#simulate-model option')]"
                      ".map(o => o.value)")
    model = next(s for s in scripts if s.endswith("funnel_model.yaml"))
    assert any(s.endswith("demo.yaml") for s in scripts)  # the funnel's scripts, both
    Select(page.tid("simulate-model")).select_by_value(model)
    page.tid("simulate-run").click()
    page.until(lambda: page.tid("simulate-progress").get_attribute("data-state") == "done")
    assert "8 of 8 conversations" in page.text("simulate-progress")
    rows = page.js("return [...document.querySelectorAll('[data-testid=simulate-table] tr')]"
                   ".map(r => r.dataset.group).filter(Boolean)")
    assert rows[0] == "all" and {"sphynx_owner", "price_sensitive", "wants_manager"} <= set(rows)
    handoff = page.js("return document.querySelector('[data-testid=simulate-table] "
                      "tr[data-group=sphynx_owner] td:nth-child(4)').textContent")
    assert handoff.startswith("100%")  # the scripted Sphynx owner always reaches the hand-off
    if SHOTS:
        driver.save_screenshot(str(Path(SHOTS) / "simulate.png"))

    # The studio reads the funnel's own project only (tmp_path is outside it).
    for name in ("personas.yaml", "funnel_model.yaml"):
        shutil.copy(ROOT / "tests" / "evidence" / name, tmp_path)
    inside = {"personas": str(project.parent / "puramur" / "personas.yaml"), "model": model}
    for field, value in (("personas", str(tmp_path / "personas.yaml")),
                         ("model", f"scripted:{tmp_path / 'funnel_model.yaml'}")):
        body = {"funnel": "puramur", **inside, field: value}
        refused = httpx.post(url + "/api/simulate", json=body)
        assert refused.status_code == 400, (field, refused.text)
        assert "outside funnel 'puramur''s project" in refused.text

    # One at a time, and cancellable: a long run is stopped from the page.
    page.tid("simulate-n").clear()
    page.tid("simulate-n").send_keys("1000")
    page.tid("simulate-run").click()
    page.until(lambda: page.tid("simulate-progress").get_attribute("data-state") == "running")
    busy = httpx.post(url + "/api/simulate", json={"funnel": "puramur", "personas": "x"})
    assert busy.status_code == 409 and "running" in busy.json()["error"]["message"]
    page.tid("simulate-cancel").click()
    page.until(lambda: page.tid("simulate-progress").get_attribute("data-state") == "cancelled")
    assert "of 1000 conversations" in page.text("simulate-progress")

    # Nothing of it is in the studio's database: the runs played in temporary schemas.
    with psycopg.connect(db) as conn:
        sessions = conn.execute("SELECT count(*) FROM puramur_sessions_state "
                                "WHERE session_id LIKE 'sim-%'").fetchone()
    assert sessions == (0,)
    page.no_console_errors()


def test_re_recording_rewrites_only_the_expectations_that_changed() -> None:
    """Without a database: a flow ``state:`` is rewritten on its one line, an expectation
    dropped loses its line, a new one comes after the block, everything else stays (the
    turns are edited from the last up, so a line count changed below moves nothing)."""
    import difflib

    from engine.scenarios.load import load_scenario
    from engine.scenarios.rerecord import rewritten

    path = ROOT / "funnels" / "puramur" / "scenarios" / "objections.yaml"
    scenario, problems = load_scenario(path)
    assert scenario is not None, problems
    expects = [dict(t.expect) for t in scenario.turns]
    expects[0]["state"] = {**expects[0]["state"], "stage_iteration": 1}
    del expects[1]["prompt_contains"]
    expects[1]["reply"] = "It is free of parabens."
    old = path.read_text("utf-8")
    new = rewritten(old, scenario, expects)
    changed = [ln for ln in difflib.unified_diff(old.splitlines(), new.splitlines(), n=0)
               if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    assert changed == [
        "-      state: {objections_raised.0.objection: price, stage_iteration: 0}",
        "+      state: {objections_raised.0.objection: price, stage_iteration: 1}",
        '-      prompt_contains: "(round 1)"',
        "+      reply: It is free of parabens."]


def test_the_scenarios_folder_is_the_one_funnel_test_runs(tmp_path: Path) -> None:
    """`funnel new`'s layout (NAME/funnel.yaml, NAME/scenarios/) and the shipped one
    (funnels/puramur.yaml, funnels/puramur/scenarios/): never NAME/NAME/scenarios."""
    from engine.authoring.scaffold import scaffold
    from engine.funnel.compiled import load_funnel
    from engine.studio.scenarios import folder_of

    scaffold("shop", tmp_path / "shop")
    assert folder_of(load_funnel(tmp_path / "shop" / "funnel.yaml").spec) == \
        tmp_path / "shop" / "scenarios"
    shipped = ROOT / "funnels" / "puramur.yaml"
    assert folder_of(load_funnel(shipped).spec) == ROOT / "funnels" / "puramur" / "scenarios"
