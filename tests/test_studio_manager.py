"""A conversation as a manager sees it, in the studio (docs/studio.md#manager, issue 39 §4-5).

One `funnel serve` with the studio under /studio and one headless Chromium for the module.
A customer's session (Telegram, handed off on its third turn) is opened in the page: the
hand-off and the action are marked on the turn that made them; the manager takes it over,
a customer's message is held, the manager writes, then hands it back at another stage, each
seen through the REST API (the control endpoint, the session, the export) and marked in the
transcript. The address holds the session and the tab; a reload opens the same view. An
answer "I am the model" gives that the engine refuses is explained in plain words; the
stage prompt shows as the model would read it; change-answer fills the model's form.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import sql_runner, temporary_schema
from projects import copy_puramur
from service_support import running
from studio_support import headless_chromium, opener, real_session

from engine.llm.models import ScriptedModel
from engine.studio import create_studio_app
from engine.studio.server import LOOPBACK_HOSTS

ROOT = Path(__file__).resolve().parent.parent
OPERATOR = "I want to talk to an operator"
SAY: dict[str, dict[str, Any]] = {
    "Hi!": {"reply": "Hello! Cat or dog?", "language": "en"},
    "A Sphynx, her skin is dry": {"reply": "Sphynx skin needs care.", "updates": {
        "pet": {"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"]}}},
    OPERATOR: {"reply": "Connecting you with a manager.",
               "actions": [{"type": "request_handoff", "reason": "explicit_request"}]},
    "A cat here": {"reply": "A cat!", "updates": {"pet": {"type": "cat"}}}}
REAL = "tg-real-1"
GATED = "tg-real-2"  # its move to discovery waits for a manager's approval
ADMIN = {"authorization": "Bearer admin-key"}
API = f"/v1/funnels/puramur/sessions/{REAL}"

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def script() -> ScriptedModel:
    return ScriptedModel.from_data({"match": [{"pattern": f"^{re.escape(t)}$", "output": o}
                                              for t, o in SAY.items()]})


@pytest.fixture(scope="module")
def served(server_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The service (studio mounted), its database with the customer's session, a browser."""
    from engine.service.app import create_app
    from engine.service.config import ServiceConfig

    tmp = tmp_path_factory.mktemp("manager")
    funnel = copy_puramur(tmp / "project")
    data = yaml.safe_load(funnel.read_text("utf-8"))  # moving on with a cat waits for a manager
    data["stages"]["discovery"]["approval"] = {
        "when": "pet.type == 'cat'", "timeout": "15m", "on_timeout": "reject",
        "holding_reply": "A manager confirms in a minute.", "reason": "cats need the vet's word"}
    funnel.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    scripted = tmp / "script.yaml"
    scripted.write_text(yaml.safe_dump({"match": [
        {"pattern": f"^{re.escape(t)}$", "output": o} for t, o in SAY.items()]}), "utf-8")
    with temporary_schema(server_dsn, "t") as db:
        config = ServiceConfig(funnels=[funnel], db=db, model=f"scripted:{scripted}",
                               api_keys={"admin-key": frozenset({"admin"}),
                                         "talk-key": frozenset({"converse"})},
                               secret=b"s" * 32, reload=False)
        with running(create_app(config)) as url, \
                httpx.Client(base_url=url, timeout=60) as client, \
                headless_chromium(tmp / "profile") as driver, sql_runner(db) as sql:
            # After the service made the tables: an engine on them opens at once.
            real_session(funnel, db, REAL, texts=("Hi!", "A Sphynx, her skin is dry",
                                                  OPERATOR), model=script())
            for text in ("A cat here", "Hello?"):  # another customer, through the API
                r = client.post(f"/v1/funnels/puramur/sessions/{GATED}/messages",
                                json={"text": text}, headers={"authorization": "Bearer talk-key"})
                assert r.status_code == 200, r.text
            yield {"url": url, "client": client, "driver": driver, "funnel": funnel,
                   "db": db, "sql": sql, "tmp": tmp}


class Page:
    def __init__(self, d: Any) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        self.d, self.by, self.wait = d, By, WebDriverWait(d, 30)

    def tid(self, name: str) -> Any:
        return self.d.find_element(self.by.CSS_SELECTOR, f'[data-testid="{name}"]')

    def all(self, css: str) -> list[str]:
        return [str(t) for t in self.d.execute_script(
            f"return [...document.querySelectorAll('{css}')].map(e => e.textContent)")]

    def text(self, name: str) -> str:
        return str(self.d.execute_script(
            f"return (document.querySelector('[data-testid=\"{name}\"]') || {{}}).textContent"
            " || ''"))

    def until(self, check: Any) -> None:
        self.wait.until(lambda _: check())

    def turns(self) -> int:
        return int(self.d.execute_script("return document.querySelectorAll('#log .turn').length"))


def test_take_over_send_and_release_a_customers_session(served: Any) -> None:
    d, c, sql = served["driver"], served["client"], served["sql"]
    p = Page(d)
    d.get("about:blank")
    d.get_log("browser")
    d.get(served["url"] + f"/studio/?key=admin-key&funnel=puramur&session={REAL}")
    p.until(lambda: p.text("session-id") == REAL and p.turns() == 3)
    assert d.title == "puramur — Funnel Studio"
    assert p.text("funnel-description").startswith("Pet-cosmetics consultant")
    # The hand-off and the action are on the turn that made them (the third).
    p.until(lambda: p.all('li.turn[data-turn="3"] [data-testid="turn-handoff"]'))
    assert "the manager was notified here" in p.all('[data-testid="turn-handoff"]')[0]
    assert p.all('li.turn[data-turn="3"] [data-testid="turn-action"]') == ["▸ request_handoff"]
    assert not p.all('li.turn[data-turn="2"] [data-testid="turn-handoff"]')
    p.until(lambda: p.tid("manager-desk").is_displayed())
    assert "The bot answers this customer" in p.text("desk-control")
    assert not p.tid("manager-send").is_enabled()

    # Take over: the REST API's view says a manager holds it; the transcript marks it.
    p.tid("manager-name").send_keys("Olena")
    p.tid("takeover").click()
    p.until(lambda: p.all('[data-testid="takeover-mark"]'))
    control = c.get(f"{API}/control", headers=ADMIN).json()
    assert control["control"] == "manager" and control["manager"] == "Olena"
    assert "Olena took the session over (stage handoff)" in p.all(
        'li.turn[data-turn="3"] ~ [data-testid="takeover-mark"]')[0]
    assert "Olena has this session" in p.text("desk-control")

    # The customer writes meanwhile: held, no model asked; the page shows it held.
    held = c.post(f"{API}/messages", json={"text": "Hello? Anyone?"},
                  headers={"authorization": "Bearer talk-key"}).json()
    assert held["held"] is True
    # Send as the manager: in the session's messages, as the REST API logs them.
    p.tid("manager-text").send_keys("Hello, this is Olena: your cart is ready.")
    p.tid("manager-send").click()
    p.until(lambda: p.all('[data-testid="manager-message"]'))
    assert p.all('[data-testid="manager-message"]') == [
        "Olena (manager): Hello, this is Olena: your cart is ready."]
    assert any("Hello? Anyone?" in t for t in p.all('[data-testid="held-message"]'))
    shot = served["tmp"] / "manager.png"  # the picture in docs/studio.md
    d.save_screenshot(str(shot))
    docs = ROOT / "docs" / "studio" / "manager.png"
    if os.environ.get("FUNNEL_UPDATE_SCREENSHOT") or not docs.exists():
        shutil.copyfile(shot, docs)
    exported = c.get(f"{API}/export", headers=ADMIN).json()
    assert [(m["role"], m["author"], m["content"]) for m in exported["messages"]
            if m["role"] == "manager"] == [
        ("manager", "Olena", "Hello, this is Olena: your cart is ready.")]

    # The address holds the session; a reload opens the same view, marks included.
    assert f"session={REAL}" in d.current_url and "funnel=puramur" in d.current_url
    d.refresh()
    p.until(lambda: p.text("session-id") == REAL and len(p.all('[data-testid="takeover-mark"]')) == 1
            and len(p.all('[data-testid="manager-message"]')) == 1)
    assert "Olena has this session" in p.text("desk-control")

    # Release at another stage with an update: validated as the REST API validates it.
    p.tid("release-updates").send_keys('{"customer": {"name": "Ann"}}')
    d.execute_script("const s = document.getElementById('release-stage');"
                     " s.value = 'contact_collection'; s.dispatchEvent(new Event('change'))")
    p.tid("release").click()
    p.until(lambda: any(e == "release" for e in d.execute_script(
        "return [...document.querySelectorAll('[data-testid=\"takeover-mark\"]')]"
        ".map(e => e.dataset.event)")))
    assert c.get(f"{API}/control", headers=ADMIN).json()["control"] == "bot"
    state = c.get(API, headers=ADMIN).json()
    assert state["stage"] == "contact_collection"
    assert state["customer"]["name"] == "Ann"
    events = [e["event"] for e in exported["control_events"]]
    assert events == ["takeover", "message"]
    assert sql("SELECT event, manager FROM funnel_control_events WHERE session_id = %s "
               "ORDER BY id", (REAL,)) == [("takeover", "Olena"), ("message", "Olena"),
                                          ("release", "Olena")]
    p.until(lambda: "The bot answers this customer" in p.text("desk-control"))
    assert "handed the session back to the bot (stage contact_collection); changed customer" \
        in p.all('[data-testid="takeover-mark"]')[-1]
    assert d.execute_script("return document.getElementById('graph').dataset.current") == \
        "contact_collection"

    # The same rules as the REST API: nothing to send or release without a take-over.
    r = c.post("/studio/api/manager-message", headers=ADMIN, json={
        "funnel": "puramur", "session": REAL, "text": "hi"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_taken_over"
    r = c.post("/studio/api/takeover", headers=ADMIN, json={"funnel": "puramur",
                                                            "session": "nobody-1"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    c.post("/studio/api/takeover", headers=ADMIN, json={"funnel": "puramur", "session": REAL})
    r = c.post("/studio/api/release", headers=ADMIN, json={
        "funnel": "puramur", "session": REAL, "stage": "nowhere"})
    assert r.status_code == 422 and "no stage 'nowhere'" in r.json()["error"]["message"]
    assert c.get(f"{API}/control", headers=ADMIN).json()["manager"] == "key#1"  # the key's name
    r = c.post("/studio/api/release", headers=ADMIN, json={"funnel": "puramur", "session": REAL})
    assert r.status_code == 200 and r.json()["control"] == "bot"

    # Another session is a new entry in the history: Back opens this one again.
    p.tid("new-session").click()
    p.until(lambda: p.text("session-id").startswith("studio-") and "session=studio-" in
            d.current_url)
    d.back()
    p.until(lambda: p.text("session-id") == REAL and p.all('[data-testid="manager-message"]'))

    # The tab is in the address too.
    p.tid("tab-sessions").click()
    p.until(lambda: "tab=sessions" in d.current_url)
    d.refresh()
    p.until(lambda: p.d.find_element(p.by.ID, "sessions").is_displayed())
    severe = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def test_the_model_form_explains_refusals_and_shows_the_stage_prompt(served: Any) -> None:
    d = served["driver"]
    p = Page(d)
    d.get(served["url"] + "/studio/?key=admin-key&funnel=puramur&session=studio-plain1")
    d.get_log("browser")
    p.until(lambda: p.text("session-id") == "studio-plain1")
    assert "session=studio-plain1" in d.current_url
    # The stage prompt as the model would read it, the stage's own words first.
    p.until(lambda: "(the customer's next message)" in p.text("stage-prompt"))
    assert p.text("stage-description").startswith("greeting: ")
    assert "Stage: greeting" in p.text("stage-prompt")

    p.tid("chat-input").send_keys("Hi, my number is +380501234567")
    d.execute_script("document.getElementById('raw-box').open = true")
    p.tid("model-form-raw").send_keys(
        '{"reply": "Hi!", "updates": {"customer": {"phone": "+380501234567"}, '
        '"pet": {"age_years": 99}}}')
    p.tid("model-form-submit").click()
    p.until(lambda: p.all('[data-testid="refusal-plain"]'))
    plain = p.all('[data-testid="refusal-plain"]')
    assert plain[0].startswith("this stage may not change `customer.phone` (it may change ")
    assert "`pet.age_years` is at most 40; not 99" in plain
    assert "Additional properties" in p.text("model-form-errors")  # the repair's words, folded
    assert p.turns() == 0

    # A good answer, then change it: the same form, filled with the turn's answer.
    d.execute_script("document.getElementById('raw').value = ''")
    p.tid("field-reply").send_keys("Hello! Cat or dog?")
    d.execute_script("const s = document.querySelector('[data-testid=\"field-updates.pet.type\"]');"
                     " s.value = '\"cat\"'")
    p.tid("model-form-submit").click()
    p.until(lambda: p.turns() == 1)
    p.until(lambda: p.all('li.turn[data-turn="1"] .turn-marks'))
    d.find_element(p.by.CSS_SELECTOR, '[data-testid="branch-edit"][data-turn="1"]').click()
    p.until(lambda: d.execute_script(
        "const f = document.querySelector('[data-testid=\"field-reply\"]'); return f && f.value")
        == "Hello! Cat or dog?")
    assert d.execute_script("return document.querySelector("
                            "'[data-testid=\"field-updates.pet.type\"]').value") == '"cat"'
    assert d.execute_script("return document.getElementById('raw').value") == ""
    assert "changing the answer of turn 1" in p.text("why-panel")
    assert "changing the answer of turn 1" in p.text("prompt-panel")
    severe = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe



def test_an_approval_decided_at_the_desk(served: Any) -> None:
    d, c = served["driver"], served["client"]
    p = Page(d)
    d.get(served["url"] + f"/studio/?funnel=puramur&session={GATED}")
    d.get_log("browser")
    p.until(lambda: p.text("session-id") == GATED and p.all('[data-testid="approval-mark"]'))
    assert "a move waits for a manager's approval greeting → discovery" in p.all(
        '[data-testid="approval-mark"]')[0]
    assert any("Hello?" in t for t in p.all('[data-testid="held-message"]'))
    assert "A move waits for a manager's approval (greeting → discovery)" in p.text("desk-control")
    p.tid("manager-name").clear()
    p.tid("manager-name").send_keys("Taras")
    p.tid("approve").click()
    p.until(lambda: len(p.all('[data-testid="approval-mark"]')) == 2)
    assert "Taras approved the move greeting → discovery" in p.all(
        '[data-testid="approval-mark"]')[1]
    gated = f"/v1/funnels/puramur/sessions/{GATED}"
    assert c.get(f"{gated}/control", headers=ADMIN).json()["control"] == "bot"
    assert c.get(gated, headers=ADMIN).json()["stage"] == "discovery"
    r = c.post("/studio/api/reject", headers=ADMIN, json={"funnel": "puramur", "session": GATED})
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_awaiting_approval"
    severe = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def test_a_key_without_the_manage_scope_reads_only(served: Any) -> None:
    """The desk's rule, whatever the mount: ``manage`` decides who may act."""
    app = create_studio_app(opener(served["funnel"], served["db"]), hosts=LOOPBACK_HOSTS,
                            manage=lambda presented: None)
    with running(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        desk = c.get("/api/desk", params={"funnel": "puramur", "session": REAL}).json()
        assert desk["may_manage"] is False and desk["manager"] is None
        r = c.post("/api/takeover", json={"funnel": "puramur", "session": REAL})
        assert r.status_code == 403 and "`manage` scope" in r.json()["error"]["message"]
