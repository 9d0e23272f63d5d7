"""From nothing to a funnel that passes its scenarios, in the page only (issue 39's proof;
docs/studio.md, "From nothing to a funnel that passes its scenarios"): a real `funnel
studio` started on an empty folder, then each documented step in headless Chromium: New
funnel, an edit with a mistake seen inline and fixed, the save and its migration, a
conversation played as the model, saved as a scenario, all scenarios run, the one the
edit broke accepted, and `funnel test` from outside passing them all. No console errors.
Screenshots for the docs go to $FUNNEL_STUDIO_SHOTS when it is set."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import run_funnel, temporary_schema
from studio_support import ROOT, headless_chromium

from engine.errors import ConfigError
from engine.studio.home import resolve

pytestmark = [pytest.mark.postgres]
WAIT = 30
CM = "document.querySelector('#ed-cm .CodeMirror').CodeMirror"  # the editor's CodeMirror


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def studio(server_dsn: str, tmp_path: Path) -> Iterator[tuple[str, Path, str]]:
    """`funnel studio` (the command, in a process of its own) in an empty folder."""
    project = tmp_path / "my-funnels"
    project.mkdir()
    port = _free_port()
    with temporary_schema(server_dsn, "t") as db:
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "studio", "--db", db,
                                 "--port", str(port)], cwd=project,
                                env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + WAIT
            while True:
                try:
                    if httpx.get(f"{url}/api/status", timeout=5).is_success:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline, "the studio did not start"
                time.sleep(0.1)
            yield url, project, db
        finally:
            proc.terminate()
            out = proc.communicate(timeout=WAIT)[0]
            assert "Traceback" not in out, out
            assert "no funnel in" in out and "New funnel makes one there" in out, out


class Page:
    """The studio in the browser, found by data-testid."""

    def __init__(self, d: Any) -> None:
        from selenium.webdriver.support.ui import WebDriverWait

        self.d, self.wait = d, WebDriverWait(d, WAIT)

    def tid(self, name: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.d.find_element(By.CSS_SELECTOR, f'[data-testid="{name}"]')

    def js(self, script: str, *args: Any) -> Any:
        return self.d.execute_script(script, *args)

    def until(self, script: str, *args: Any) -> Any:
        return self.wait.until(lambda _: self.js(script, *args))

    def type(self, name: str, text: str) -> None:
        box = self.tid(name)
        box.clear()
        box.send_keys(text)

    def edit(self, script: str) -> None:
        """Change the open file through CodeMirror's own API (as typing does)."""
        self.js(f"const cm = {CM};" + script)

    def shot(self, name: str) -> None:
        """docs/studio/NAME from the real page, when FUNNEL_STUDIO_SHOTS names that folder."""
        if os.environ.get("FUNNEL_STUDIO_SHOTS"):
            self.d.save_screenshot(os.path.join(os.environ["FUNNEL_STUDIO_SHOTS"], name))

    def console_errors(self) -> list[str]:
        return [e["message"] for e in self.d.get_log("browser") if e["level"] == "SEVERE"]


def _answer(page: Page, customer: str, fields: dict[str, str], turn: int) -> str:
    """One turn "as the model": the customer's message, the form's fields, Answer."""
    page.until("return document.querySelector('[data-testid=\"field-reply\"]')")
    page.type("chat-input", customer)
    for name, value in fields.items():
        page.type(f"field-{name}", value)
    page.tid("model-form-submit").click()
    page.until(f"return document.querySelectorAll('#log li.turn').length === {turn}"
               " && !document.getElementById('send').disabled")
    return str(page.js("return document.getElementById('graph').dataset.current"))


def test_from_nothing_to_a_funnel_that_passes_its_scenarios(
        studio: tuple[str, Path, str], tmp_path: Path) -> None:
    url, project, db = studio
    with headless_chromium(tmp_path / "profile") as d:
        page = Page(d)

        # 1. The empty studio opens on the Editor with New funnel.
        d.get(url + "/")
        page.until("return document.getElementById('notice').textContent.startsWith('No funnel yet')")
        assert str(project.resolve()) in page.tid("notice").text
        none = httpx.get(f"{url}/api/session", params={"funnel": "", "session": "s"}).json()
        assert "it has none yet: New funnel makes one" in none["error"]["message"]
        page.until("return !document.getElementById('editor').hidden"
                   " && document.querySelector('[data-testid=new-funnel-name]')")
        page.shot("walk-empty.png")
        # Nothing to start, save or run yet: the header's buttons wait for a funnel.
        assert not any(page.tid(b).is_displayed()
                       for b in ("new-session", "save-scenario", "run-scenarios"))

        # 2. New funnel: `pet-shop` is the funnel `pet_shop`, its funnel file open (Enter
        # in the name box is Create).
        page.type("new-funnel-name", "pet-shop\n")
        page.until("return document.getElementById('funnel').value === 'pet_shop'"
                   " && document.querySelector('[data-testid=editor-file-tab][data-file=\"funnel.yaml\"].on')"
                   f" && {CM}.getValue().includes('funnel: pet_shop')")
        assert not page.tid("notice").is_displayed()
        assert page.tid("editor-state").text == ""  # no stale "No funnel yet"
        assert page.tid("new-funnel-name").get_attribute("value") == ""
        assert all(page.tid(b).is_displayed()
                   for b in ("new-session", "save-scenario", "run-scenarios"))

        # 3. Edit: a state field (with a mistake), the stage that fills it, an exit's reason.
        page.edit("const l = cm.getValue().split('\\n').indexOf('state:');"
                  "cm.replaceRange('  budget: {type: integr, default: 0}\\n', {line: l + 1, ch: 0});")
        found = page.until("const d = document.querySelector('[data-testid=editor-diagnostic]');"
                           "return d && d.dataset.code + ' ' + d.textContent")
        assert found.startswith("F004") and "did you mean 'integer'" in found, found
        page.shot("walk-diagnostic.png")
        page.edit("cm.setValue(cm.getValue().replace('type: integr,', 'type: integer,')"
                  ".replace('updates: [need, customer]', 'updates: [need, customer, budget]')"
                  ".replace('reason: contacts_taken', 'reason: contacts_complete'));")
        page.until("return !document.querySelector('[data-testid=editor-diagnostic]')"
                   " && document.getElementById('ed-diags').textContent.includes('no problems')")

        # 4. Save; the new field needs a column: Run the migration.
        page.tid("editor-save").click()
        ddl = page.until("const p = document.querySelector('[data-testid=migrate-ddl]');"
                         "return p && !document.getElementById('migrate-box').hidden && p.textContent")
        assert 'ADD COLUMN "budget" INT' in ddl
        page.tid("migrate").click()
        page.until("return document.getElementById('ed-state').textContent.startsWith('migrated')")

        # 5. Playground, "I am the model": a conversation from greeting to done.
        page.tid("tab-play").click()
        assert page.js("return document.getElementById('model').value") == "human"
        stages = [
            _answer(page, "Hi!", {"reply": "Hello! What can I help you with?"}, 1),
            _answer(page, "A website for my bakery, about 2000", {
                "reply": "Lovely. May I have your name and phone number?",
                "updates.need": "a website for a bakery", "updates.budget": "2000"}, 2),
            _answer(page, "Anna, +15551234567", {
                "reply": "Thank you, Anna! A colleague will call you.",
                "updates.customer.name": "Anna", "updates.customer.phone": "+15551234567"}, 3)]
        assert stages == ["discovery", "contact", "done"]
        assert "contacts_complete" in page.tid("state-panel").text
        page.js("window.scrollTo(0, 0)")
        page.shot("walk-playground.png")

        # 6. Save as scenario, with a name.
        page.tid("save-scenario").click()
        page.type("scenario-name", "bakery-website")
        page.tid("scenario-save-confirm").click()
        page.until("return document.getElementById('scenario-out').textContent.startsWith('saved 3 turn(s)')")
        assert (project / "pet_shop" / "scenarios" / "bakery-website.yaml").is_file()

        # 7. Run all scenarios: the edit broke the template's happy path; accept it.
        page.tid("tab-scenarios").click()
        page.tid("run-all-scenarios").click()
        status = page.until("const s = document.getElementById('scenario-status').textContent;"
                            "return s.includes('passed') && s")
        assert "3 scenario(s)" in status and "2 passed, 1 failed" in status, status
        failing = page.js("return [...document.querySelectorAll('[data-testid=scenario-item]"
                          "[data-passed=false]')].map(e => e.dataset.name)")
        assert failing == ["happy-path"]
        assert "contacts_taken" in page.tid("scenario-expectation").text
        page.tid("accept-scenario").click()
        diff = page.until("const d = document.querySelector('[data-testid=scenario-diff]');"
                          "return d && d.textContent")
        assert "contacts_complete" in diff
        page.shot("walk-accept.png")
        page.tid("accept-confirm").click()
        page.until("return document.getElementById('scenario-status').textContent.includes('passes now')")
        page.tid("run-all-scenarios").click()
        status = page.until("const s = document.getElementById('scenario-status').textContent;"
                            "return s.includes('passed') && s")
        assert "3 passed, 0 failed" in status, status
        page.shot("walk-scenarios.png")
        assert page.console_errors() == []

    # 8. From outside: `funnel test` passes the funnel's scenarios.
    tested = run_funnel("test", "pet_shop/scenarios/", "--db", db, cwd=project)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert tested.stdout.strip().endswith("3 passed, 0 failed"), tested.stdout
    checked = run_funnel("validate", "--strict", "pet_shop/", cwd=project)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The next `funnel studio` in that folder opens it (and writes new funnels there).
    assert resolve([str(project)]) == ([project.resolve() / "pet_shop" / "funnel.yaml"],
                                       project.resolve())
    with pytest.raises(ConfigError, match="two folders"):
        resolve([str(project), str(tmp_path)])
    refused = run_funnel("studio", "no-such-folder", cwd=project)
    assert refused.returncode != 0 and "no funnel file or folder at no-such-folder" in refused.stderr
    assert "Traceback" not in refused.stderr
