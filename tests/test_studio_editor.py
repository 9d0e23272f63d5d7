"""Make and change a funnel in the page (docs/studio.md#make-and-change-a-funnel, issue 39
§2), in headless Chromium: a new funnel named with a `-`, a state field added in the
editor with the validator's diagnostic seen inline (file:line:col and code) and cleared
once fixed, completion from the funnel's JSON Schema, the save, the migration's DDL shown
and run (the column exists in PostgreSQL) and the funnel running it with no other save; a
save refused when the file changed on disk, showing the other change; an invalid save that
leaves the last good version running; a model key shown masked and found on no disk and
in no log. No console errors."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import temporary_schema
from service_support import running
from studio_support import headless_chromium

from engine.authoring.scaffold import scaffold
from engine.studio import Studio, create_studio_app
from engine.studio.server import LOOPBACK_HOSTS
from engine.validation import check_file

pytestmark = [pytest.mark.postgres]
KEY = "sk-test-7Hq2SECRETxYz90abcd"
WAIT = 30
CM = "document.querySelector('#ed-cm .CodeMirror').CodeMirror"  # the editor's CodeMirror


class Page:
    """The studio in the browser, found by data-testid."""

    def __init__(self, d: Any, url: str) -> None:
        from selenium.webdriver.support.ui import WebDriverWait

        self.d, self.url, self.wait = d, url, WebDriverWait(d, WAIT)

    def tid(self, name: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.d.find_element(By.CSS_SELECTOR, f'[data-testid="{name}"]')

    def js(self, script: str, *args: Any) -> Any:
        return self.d.execute_script(script, *args)

    def until(self, script: str, *args: Any) -> Any:
        return self.wait.until(lambda _: self.js(script, *args))

    def diagnostics(self) -> list[dict[str, str]]:
        return list(self.js("return [...document.querySelectorAll('[data-testid=editor-diagnostic]')]"
                            ".map(e => ({...e.dataset, text: e.textContent}))"))

    def edit(self, script: str) -> None:
        """Change the open file through CodeMirror's own API (as typing does)."""
        self.js("const cm = document.querySelector('#ed-cm .CodeMirror').CodeMirror;" + script)

    def open_editor(self, funnel: str) -> None:
        self.d.get(f"{self.url}/?funnel={funnel}")
        self.until("return document.getElementById('session').textContent")
        self.tid("tab-editor").click()
        self.until("return document.querySelector('[data-testid=editor-file-tab].on')")

    def open_tab(self, file: str) -> None:
        self.js("document.querySelector(`[data-testid=editor-file-tab][data-file='${arguments[0]}']`)"
                ".click()", file)

    def console_errors(self) -> list[str]:
        return [e["message"] for e in self.d.get_log("browser") if e["level"] == "SEVERE"]


@pytest.fixture(scope="module")
def studio(server_dsn: str, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, Path, str, Any]]:
    """The studio on a project holding one funnel made by `funnel new`, its own schema."""
    project = tmp_path_factory.mktemp("project")
    (project / "pyproject.toml").write_text("")
    scaffold("shop", project / "shop")
    with temporary_schema(server_dsn, "t") as db:
        async def opened() -> Studio:
            return await Studio.open([project / "shop" / "funnel.yaml"], db=db)

        app = create_studio_app(opened, hosts=LOOPBACK_HOSTS)
        with running(app) as url:
            yield url, project, db, app


@pytest.fixture(scope="module")
def page(studio: tuple[str, Path, str, Any], tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Page]:
    with headless_chromium(tmp_path_factory.mktemp("profile")) as d:
        yield Page(d, studio[0])


def shot(page: Page, name: str) -> None:
    """docs/studio/NAME from the real page, when FUNNEL_STUDIO_SHOTS names that folder."""
    if os.environ.get("FUNNEL_STUDIO_SHOTS"):
        page.d.save_screenshot(os.path.join(os.environ["FUNNEL_STUDIO_SHOTS"], name))


def column_exists(db: str, table: str, column: str) -> bool:
    import psycopg

    with psycopg.connect(db) as conn:
        row = conn.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = "
                           "current_schema() AND table_name = %s AND column_name = %s",
                           (table, column)).fetchone()
    return row is not None


def test_a_new_funnel_made_edited_and_migrated_in_the_page(
        page: Page, studio: tuple[str, Path, str, Any]) -> None:
    url, project, db, _app = studio
    page.open_editor("shop")
    page.d.get_log("browser")

    # A name that is no identifier is refused with the rule; `-` becomes `_`.
    page.tid("new-funnel-name").send_keys("9-lives")
    page.tid("new-funnel-create").click()
    page.until("return document.getElementById('nf-out').textContent.includes('starting with a letter')")
    assert not (project / "9_lives").exists()
    page.d.get_log("browser")  # the refusal's 400, which Chromium logs as a failed load
    name = page.tid("new-funnel-name")
    name.clear()
    name.send_keys("pet-shop")
    page.tid("new-funnel-language").clear()
    page.tid("new-funnel-language").send_keys("uk")
    page.tid("new-funnel-create").click()
    page.until("return document.getElementById('funnel').value === 'pet_shop' && "
               "document.querySelector('[data-testid=editor-file-tab][data-file=\"funnel.yaml\"].on')"
               " && document.querySelector('#ed-cm .CodeMirror').CodeMirror.getValue()"
               ".includes('funnel: pet_shop')")
    made = project / "pet_shop" / "funnel.yaml"
    assert made.is_file() and (project / "pet_shop" / "scenarios").is_dir()  # what `funnel new` writes
    assert check_file(made)[0] is not None  # it validates
    tabs = page.js("return [...document.querySelectorAll('[data-testid=editor-file-tab]')]"
                   ".map(t => t.dataset.file)")
    assert "prompts/greeting.j2" in tabs and "scenarios/happy_path.yaml" in tabs

    # Hover: a stage's `fallback:` key says what it is, from the JSON Schema.
    page.edit("const l = cm.getValue().split('\\n').findIndex(t => t.startsWith('    fallback:'));"
              "const c = cm.charCoords({line: l, ch: 6}, 'window');"
              "cm.getWrapperElement().dispatchEvent(new MouseEvent('mousemove', "
              "{clientX: c.left + 1, clientY: (c.top + c.bottom) / 2, bubbles: true}));")
    tip = page.until("const h = document.getElementById('ed-hover'); return !h.hidden && h.textContent")
    assert tip.startswith("stages.greeting.fallback") and "The reply sent when" in tip

    # Completion from the JSON Schema: a key inside a stage.
    page.edit("const l = cm.getValue().split('\\n').indexOf('  greeting:');"
              "cm.replaceRange('    \\n', {line: l + 1, ch: 0}); cm.setCursor({line: l + 1, ch: 4});"
              "cm.execCommand('autocomplete');")
    hints = page.until("const h = [...document.querySelectorAll('.CodeMirror-hint')]"
                       ".map(e => e.textContent); return h.length ? h : null")
    assert {"description", "fallback", "transitions", "updates"} <= set(hints)
    page.edit("cm.getInputField().blur(); cm.undo();")

    # A new state field with a mistake: the diagnostic inline, file:line:col and code.
    page.edit("const l = cm.getValue().split('\\n').indexOf('state:');"
              "cm.replaceRange('  budget: {type: integr, default: 0}\\n', {line: l + 1, ch: 0});")
    line = 1 + int(page.js("return document.querySelector('#ed-cm .CodeMirror').CodeMirror"
                           ".getValue().split('\\n').indexOf('  budget: {type: integr, default: 0}')"))
    diags = page.until("const d = [...document.querySelectorAll('[data-testid=editor-diagnostic]')];"
                       "return d.length ? d.map(e => ({...e.dataset, text: e.textContent})) : null")
    assert diags[0]["code"] == "F004" and diags[0]["line"] == str(line), diags
    assert f"funnel.yaml:{line}:" in diags[0]["text"] and "did you mean 'integer'" in diags[0]["text"]
    assert page.js("return document.querySelectorAll('.CodeMirror-lint-mark-error').length") >= 1
    page.edit(f"cm.scrollIntoView({{line: {line - 1}, ch: 0}}, 120);")
    shot(page, "editor.png")

    # Fixed: the diagnostic clears (no stale one stays).
    page.edit("const t = cm.getValue(); cm.setValue(t.replace('type: integr,', 'type: integer,'));")
    page.until("return document.querySelectorAll('[data-testid=editor-diagnostic]').length === 0"
               " && document.getElementById('ed-diags').textContent.includes('no problems')")

    # Saved: the table lacks the column; the page shows the DDL, and no stale diagnostics.
    page.tid("editor-save").click()
    ddl = page.until("const p = document.querySelector('[data-testid=migrate-ddl]');"
                     "return p && !document.getElementById('migrate-box').hidden && p.textContent")
    assert 'ALTER TABLE "pet_shop_sessions_state" ADD COLUMN "budget" INT' in ddl
    assert "budget: {type: integer" in made.read_text("utf-8")
    assert page.js("return document.querySelectorAll('[data-testid=diagnostic]').length") == 0
    assert not column_exists(db, "pet_shop_sessions_state", "budget")
    saved_at = made.stat().st_mtime_ns
    shot(page, "migrate.png")

    # Migrated: the column exists and the funnel runs the edit, with no other save.
    page.tid("migrate").click()
    page.until("return document.getElementById('ed-state').textContent.startsWith('migrated')")
    assert column_exists(db, "pet_shop_sessions_state", "budget")
    status = httpx.get(f"{url}/api/status").json()["pet_shop"]
    assert status["ok"] and status["problem"] is None and status["diagnostics"] == []
    assert made.stat().st_mtime_ns == saved_at
    page.until("return document.getElementById('notice').textContent.startsWith('reloaded')")
    assert page.js("return document.getElementById('migrate-box').hidden")
    assert page.console_errors() == []


def test_a_save_is_refused_when_the_file_changed_on_disk_and_a_bad_one_keeps_the_last_good(
        page: Page, studio: tuple[str, Path, str, Any]) -> None:
    url, project, _db, _app = studio
    page.open_editor("shop")
    page.d.get_log("browser")
    prompt = project / "shop" / "prompts" / "greeting.j2"
    page.open_tab("prompts/greeting.j2")
    page.until(f"return {CM}.getOption('mode') === 'jinja2'")
    prompt.write_text(prompt.read_text("utf-8") + "Someone else's line.\n", "utf-8")
    page.edit("cm.replaceRange('My line.\\n', {line: 0, ch: 0});")
    page.tid("editor-save").click()
    diff = page.until("const b = document.getElementById('ed-conflict');"
                      "return !b.hidden && b.querySelector('pre').textContent")
    assert "+Someone else's line." in diff
    assert not prompt.read_text("utf-8").startswith("My line.")  # nothing written
    page.d.get_log("browser")  # the refusal's 409, which Chromium logs as a failed load
    page.tid("editor-conflict-overwrite").click()
    page.until("return document.getElementById('ed-conflict').hidden")
    assert prompt.read_text("utf-8").startswith("My line.")
    assert not [p for p in prompt.parent.iterdir() if p.name.startswith(".")]  # no temp left

    # A prompt reading a name the state lacks: the whole validator finds it on the save, and
    # the prompt's tab lists it (a prompt as typed is checked for its syntax only).
    page.edit("cm.replaceRange('{{ nosuchfield }}\\n', {line: 1, ch: 0});")
    page.tid("editor-save").click()
    page.until("return document.getElementById('ed-state').textContent.includes('last good version')")
    found = page.until("const d = [...document.querySelectorAll('[data-testid=editor-diagnostic]"
                       "[data-source=save][data-code=F203]')]; return d.length ? d[0].textContent : null")
    assert "prompts/greeting.j2:2:" in found and "nosuchfield" in found
    page.edit("cm.undo();")
    page.tid("editor-save").click()
    page.until("return document.getElementById('ed-state').textContent.startsWith('saved and reloaded')")
    page.until("return !document.querySelector('[data-testid=editor-diagnostic]')")

    # An invalid funnel file is saved, its problems shown; the last good version runs on.
    page.open_tab("funnel.yaml")
    page.until(f"return {CM}.getValue().includes('funnel: shop')")
    page.edit("cm.setValue(cm.getValue().replace('initial: greeting', 'initial: greting'));")
    page.tid("editor-save").click()
    page.until("return document.getElementById('ed-state').textContent.includes('last good version')")
    codes = {d["code"] for d in page.diagnostics()}
    assert codes, "the save's problems are shown"
    funnels = {f["name"]: f for f in httpx.get(f"{url}/api/funnels").json()["funnels"]}
    assert funnels["shop"]["initial"] == "greeting" and not funnels["shop"]["status"]["ok"]
    page.edit("cm.setValue(cm.getValue().replace('initial: greting', 'initial: greeting'));")
    page.tid("editor-save").click()
    page.until("return document.getElementById('ed-state').textContent.startsWith('saved and reloaded')")
    assert page.console_errors() == []


def test_a_model_key_stays_in_memory_and_shows_masked(
        page: Page, studio: tuple[str, Path, str, Any], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, project, _db, app = studio
    caplog.set_level("DEBUG")
    page.open_editor("shop")
    page.d.get_log("browser")
    page.tid("model-key-model").send_keys("gpt-4o-mini")
    page.tid("model-key-key").send_keys(KEY)
    page.tid("model-key-set").click()
    shown = page.until("return document.querySelector('[data-testid=model-key-masked]').textContent")
    assert shown == "gpt-4o-mini: sk-…abcd"
    assert page.tid("model-key-key").get_attribute("value") == ""
    assert page.js("return document.getElementById('model-name').value") == "gpt-4o-mini"
    assert KEY not in page.d.page_source
    # The studio's turns with that model carry it (litellm's api_key, per call), and it is
    # nowhere else: not in the environment, on disk in the project, the answers or the log.
    studio_model = app.state.studio.model
    assert studio_model.keys == {"gpt-4o-mini": KEY} and KEY not in repr(studio_model)
    built: dict[str, Any] = {}
    monkeypatch.setattr("engine.studio.model.make_model",
                        lambda name, **kw: built.setdefault(name, kw))
    monkeypatch.setattr("engine.studio.keys.make_model", lambda name, **kw: built.update({name: kw}))
    studio_model.choose("studio-key", "gpt-4o-mini")
    assert built["gpt-4o-mini"]["api_key"] == KEY
    built.clear()  # a model built already is built anew with a new key
    r = httpx.post(f"{url}/api/editor/model-key", json={"model": "gpt-4o-mini", "key": KEY + "2"})
    assert r.json() == {"keys": {"gpt-4o-mini": "sk-…bcd2"}}
    assert built["gpt-4o-mini"]["api_key"] == KEY + "2"
    studio_model.models.pop("gpt-4o-mini")
    studio_model.keys.clear()
    assert KEY not in json.dumps(dict(os.environ))
    assert KEY not in httpx.get(f"{url}/api/editor/model-key").text
    for path in project.rglob("*"):
        assert not path.is_file() or KEY.encode() not in path.read_bytes(), path
    studio_logs = [r.getMessage() for r in caplog.records
                   if r.name.split(".")[0] in ("funnel", "uvicorn", "litellm", "LiteLLM")]
    assert studio_logs and not [m for m in studio_logs if KEY[-10:] in m]
    assert page.console_errors() == []


def test_the_editor_touches_only_the_funnels_files_and_takes_strict_bodies(
        studio: tuple[str, Path, str, Any]) -> None:
    url, project, _db, _app = studio
    outside = project.parent / "secret.txt"
    outside.write_text("not the funnel's")
    (project / "shop" / "prompts" / "evil.j2").symlink_to(outside)
    with httpx.Client(base_url=url, timeout=30) as h:
        files = {f["id"] for f in h.get("/api/editor/files", params={"funnel": "shop"}).json()["files"]}
        assert "funnel.yaml" in files and "prompts/evil.j2" not in files
        for name in ("../../secret.txt", "prompts/evil.j2", "/etc/passwd", "../pyproject.toml"):
            r = h.get("/api/editor/file", params={"funnel": "shop", "file": name})
            assert r.status_code == 400 and "not one of funnel 'shop''s files" in r.text, name
            r = h.post("/api/editor/save", json={"funnel": "shop", "file": name, "text": "x",
                                                 "base": "0" * 64})
            assert r.status_code == 400, name
        assert outside.read_text() == "not the funnel's"
        base = h.get("/api/editor/file", params={"funnel": "shop", "file": "funnel.yaml"}).json()
        r = h.post("/api/editor/save", json={"funnel": "shop", "file": "funnel.yaml",
                                             "text": base["text"], "base": base["hash"], "x": 1})
        assert r.status_code == 400 and "x: Extra inputs are not permitted" in r.text
        r = h.post("/api/editor/lint", content=b"{}", headers={"content-type": "text/plain"})
        assert r.status_code == 400
        r = h.post("/api/editor/model-key", json={"model": "human", "key": "k" * 20})
        assert r.status_code == 400 and "takes no key" in r.text
        r = h.post("/api/editor/new", json={"name": "a" * 61})
        assert r.status_code == 400
        for asset in ("vendor/../app.py", "vendor/codemirror/../../app.py", "..%2Fapp.py"):
            assert h.get(f"/static/{asset}").status_code == 404, asset
        assert h.get("/static/vendor/codemirror/codemirror.js").status_code == 200


def test_a_migration_from_a_terminal_is_noticed_without_another_save(
        studio: tuple[str, Path, str, Any]) -> None:
    url, project, db, _app = studio
    path = project / "shop" / "funnel.yaml"
    path.write_text(path.read_text("utf-8").replace(
        "\nstate:\n", "\nstate:\n  note: {type: string, default: \"\"}\n", 1), "utf-8")

    def status() -> dict[str, Any]:
        return dict(httpx.get(f"{url}/api/status").json()["shop"])

    deadline = time.monotonic() + WAIT
    while not status()["problem"] and time.monotonic() < deadline:
        time.sleep(0.05)
    held = status()
    assert "missing column(s) note" in held["problem"] and held["diagnostics"] == []

    async def migrate() -> None:  # what `funnel migrate` does, from another store
        from engine.funnel.compiled import load_funnel
        from engine.store import open_store

        store = await open_store(db)
        try:
            await store.migrate(load_funnel(path).spec)
        finally:
            await store.close()

    saved_at = path.stat().st_mtime_ns
    asyncio.run(migrate())
    while not status()["ok"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status()["ok"] and status()["problem"] is None
    assert status()["generation"] == held["generation"] + 1 and path.stat().st_mtime_ns == saved_at
