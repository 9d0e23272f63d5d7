"""Funnel Studio (engine/studio, docs/studio.md), end to end in headless Chromium.

One browser for the module, one test for the page's whole story on a copy of Puramur
(the issue's "How to prove it" list, in order), plus API checks without a browser.
Real parts only: the studio's Starlette app on uvicorn, a real PostgreSQL schema, the
engine's own turn path for every answer the page gives.
"""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from projects import copy_puramur
from service_support import running
from studio_support import headless_chromium, opener, real_session

from engine.studio import create_studio_app
from engine.studio.app import MAX_BODY
from engine.studio.server import LOOPBACK_HOSTS, serve_studio

pytestmark = [pytest.mark.postgres]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Chromium for the module (the widget test's flags), console kept."""
    with headless_chromium(tmp_path_factory.mktemp("profile")) as d:
        yield d


def _real_session(funnel: Path, db: str) -> str:
    """A conversation that did not happen in the studio: the demo script via the Engine."""
    return real_session(funnel, db)


_opener = opener


@pytest.mark.slow
def test_studio_in_headless_chromium(driver: Any, db_url: str, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    funnel = copy_puramur(tmp_path)
    real = _real_session(funnel, db_url)
    d, wait = driver, WebDriverWait(driver, 90)  # generous: the machine is shared

    def tid(name: str) -> Any:
        return d.find_element(By.CSS_SELECTOR, f'[data-testid="{name}"]')

    def text_of(name: str) -> str:
        return str(d.execute_script(
            f"return document.querySelector('[data-testid=\"{name}\"]').textContent"))

    def current() -> str:
        return str(d.execute_script("return document.getElementById('graph').dataset.current"))

    def turns() -> int:
        return int(d.execute_script("return document.querySelectorAll('#log .turn').length"))

    def answer(customer: str, reply: str, fields: dict[str, Any], done: Any) -> None:
        tid("chat-input").send_keys(customer)
        tid("field-reply").send_keys(reply)
        for path, value in fields.items():
            box = tid(f"field-{path}")
            if box.tag_name == "select":
                pick = Select(box)
                for v in value if isinstance(value, list) else [value]:
                    pick.select_by_visible_text(v)
            else:
                box.send_keys(str(value))
        tid("model-form-submit").click()
        wait.until(lambda _: done())

    d.get("about:blank")  # the module's browser: what an earlier test's page logged
    d.get_log("browser")  # (polling its studio, gone now) is not this test's
    with running(create_studio_app(_opener(funnel, db_url), hosts=LOOPBACK_HOSTS)) as url:
        d.get(url + "/")
        wait.until(lambda _: d.find_elements(By.CSS_SELECTOR, '[data-testid="stage-greeting"]'))
        assert current() == "greeting"
        assert Select(tid("model-picker")).first_selected_option.text == "I am the model"

        # "I am the model": greeting -> discovery -> (25, 50) -> presentation.
        answer("Hi!", "Hello! Is your pet a cat or a dog?", {"language": "en"},
               lambda: turns() == 1 and current() == "discovery")
        assert text_of("completeness-score") == "0"
        answer("I have a cat", "A cat! What worries you about her skin or coat?",
               {"updates.pet.type": "cat"}, lambda: turns() == 2)
        assert text_of("completeness-score") == "25"
        answer("Her skin is very dry", "Dry skin needs care. What breed is she?",
               {"updates.pet.problems": ["dry_skin"]}, lambda: turns() == 3)
        assert text_of("completeness-score") == "50"
        assert current() == "discovery"
        why = text_of("why-panel")
        assert "discovery_completeness >= 60" in why
        assert "discovery_completeness = 50" in why and "not held" in why
        assert "pet.type 25 + pet.problems 25" in why  # how the derived value came about
        assert "pet" in text_of("state-changed")
        assert "user" in text_of("prompt-panel") and "raw output" in text_of("prompt-panel")
        assert text_of("prompt-trimmed") == "the budget trimmed nothing"  # three short turns

        # An invalid answer: the errors as the repair call would quote them; no turn ran.
        answer("She is 99", "Noted.", {"updates.pet.age_years": 99},
               lambda: tid("model-form-errors").is_displayed())
        errors = text_of("model-form-errors")
        assert "$.updates.pet.age_years" in errors and "99 is greater than the maximum of 40" in errors
        assert turns() == 3
        for name in ("chat-input", "field-reply", "field-updates.pet.age_years"):
            tid(name).clear()  # the answer stays in the form, to be fixed

        answer("She is a Sphynx", "For a Sphynx I would suggest Exotic Spa.",
               {"updates.pet.breed": "Sphynx"}, lambda: turns() == 4 and current() == "presentation")
        assert text_of("completeness-score") == "75"
        held = d.execute_script("return [...document.querySelectorAll('#graph .edge.held')]"
                                ".map(e => e.dataset.from + '>' + e.dataset.to)")
        assert "presentation>cart_building" not in held  # the exits of the new stage: not held
        assert d.find_element(By.CSS_SELECTOR, '#graph .node.visited[data-stage="discovery"]')

        # Edit live: a stage name typo shows its diagnostic with its line; the fix reloads.
        good = funnel.read_text("utf-8")
        bad = good.replace("\n  discovery:\n", "\n  discovry:\n", 1)
        typo_line = bad.splitlines().index("  discovry:") + 1
        funnel.write_text(bad, "utf-8")
        wait.until(lambda _: tid("diagnostics").is_displayed())
        lines = {int(m) for m in re.findall(r"puramur\.yaml:(\d+):\d+", text_of("diagnostics"))}
        target_line = next(i for i, ln in enumerate(bad.splitlines(), 1) if "- to: discovery" in ln)
        assert lines & {typo_line, target_line}, (lines, text_of("diagnostics"))
        funnel.write_text(good.replace("Build the pet profile", "Build the pet's profile"), "utf-8")
        wait.until(lambda _: not tid("diagnostics").is_displayed()
                   and "reloaded" in text_of("notice"))
        assert current() == "presentation"  # the open session goes on, on the new version

        # Save as a scenario, which `funnel test` passes; and run the scenarios from the page.
        session = text_of("session-id")
        tid("save-scenario").click()
        tid("scenario-save-confirm").click()  # the name proposed: the session's id
        wait.until(lambda _: "saved 4 turn(s)" in text_of("scenario-result"))
        saved = funnel.parent / "puramur" / "scenarios" / f"{session}.yaml"
        assert saved.is_file()
        run = subprocess.run([sys.executable, "-m", "engine.cli", "test", str(saved),
                              "--db", db_url], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr

        # Rewind to turn 1 and branch: a new session from the state after turn 1.
        d.find_element(By.CSS_SELECTOR, '[data-testid="rewind"][data-turn="1"]').click()
        wait.until(lambda _: text_of("session-id") != session and turns() == 1)
        assert current() == "discovery" and text_of("completeness-score") == "0"
        assert "branched from " + session in text_of("branch-info")
        answer("I have a dog", "A dog! What worries you?", {"updates.pet.type": "dog"},
               lambda: turns() == 2)
        assert text_of("completeness-score") == "25"
        assert '"dog"' in text_of("state-panel")

        # A reply that quotes a price the catalog does not have is not sent: the why
        # panel says what it claimed and what the catalog says (engine.claims).
        answer("What shampoo?", "Exotic Spa shampoo is only 99 UAH!", {},
               lambda: turns() == 3 and bool(d.find_elements(
                   By.CSS_SELECTOR, '[data-testid="why-claim"]')))
        claim = text_of("why-claim")
        assert "price" in claim and "99 UAH" in claim and "277 UAH" in claim
        sent = d.execute_script("return [...document.querySelectorAll('#log .turn .bubble.bot')]"
                                ".map(b => b.textContent).pop()")
        assert "99 UAH" not in sent and sent.startswith("Tell me a little more")  # the fallback

        # Open a real session from the list: its transcript, from the turn records.
        tid("tab-sessions").click()
        wait.until(lambda _: d.find_elements(By.CSS_SELECTOR, f'tr[data-session="{real}"]'))
        d.find_element(By.CSS_SELECTOR, f'tr[data-session="{real}"]').click()
        wait.until(lambda _: text_of("session-id") == real and turns() == 2)
        assert "Sphynx" in text_of("chat-log")
        assert current() == "presentation"

        severe = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        assert not severe, severe


def test_studio_api(db_url: str, tmp_path: Path) -> None:
    """What the page relies on, without a browser: bad bodies get a sentence, another
    origin is refused, a changed answer replays the later turns, a non-loopback studio
    needs a key."""
    funnel = copy_puramur(tmp_path)
    with running(create_studio_app(_opener(funnel, db_url), hosts=LOOPBACK_HOSTS)) as url, \
            httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/api/turn", content=b"{", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        r = c.post("/api/turn", json={"funnel": "puramur", "session": "x y", "text": "hi"})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("session:")
        r = c.post("/api/turn", json={"funnel": "nope", "session": "s1", "text": "hi"})
        assert r.status_code == 400 and "no funnel 'nope'" in r.json()["error"]["message"]
        r = c.post("/api/turn", json={"funnel": "puramur", "session": "s1", "text": "hi"},
                   headers={"origin": "http://evil.example"})
        assert r.status_code == 403
        r = c.get("/api/status", headers={"host": "rebound.example"})
        assert r.status_code == 421
        # No answer in "I am the model" mode: the turn still ends well, in the fallback.
        r = c.post("/api/turn", json={"funnel": "puramur", "session": "s1", "text": "hi"})
        assert r.status_code == 200 and r.json()["result"]["fallback"]
        assert "no answer was given" in r.json()["result"]["error"]
        # A raw string is a model output too: sanitizing refuses it as it would a model's.
        r = c.post("/api/turn", json={"funnel": "puramur", "session": "s2", "text": "hi",
                                      "answer": "sure!"})
        assert r.status_code == 200 and "Your last answer was rejected" in r.json()["repair"]
        forced = c.post("/api/turn", json={"funnel": "puramur", "session": "s2", "text": "hi",
                                           "answer": "sure!", "force": True}).json()
        assert forced["result"]["fallback"] and forced["result"]["validation_failures"] == 2
        assert forced["record"]["raw_output"] == ["sure!", "sure!"]  # asked once, repaired once
        say = [("Hi!", {"reply": "Hello!", "language": "en"}),
               ("a cat", {"reply": "Ok", "updates": {"pet": {"type": "cat"}}}),
               ("dry skin, a Sphynx", {"reply": "Ok", "updates": {
                   "pet": {"problems": ["dry_skin"], "breed": "Sphynx"}}})]
        for text, out in say:
            assert c.post("/api/turn", json={"funnel": "puramur", "session": "s3", "text": text,
                                             "answer": out}).status_code == 200
        # Change turn 2's answer (a dog, no problems) and replay turn 3 as recorded.
        view = c.post("/api/rewind", json={
            "funnel": "puramur", "session": "s3", "turn": 2, "replay_after": True,
            "answer": {"reply": "Ok", "updates": {"pet": {"type": "dog"}}}}).json()
        assert view["state"]["pet"]["type"] == "dog" and view["turns"] == 3
        assert view["stage"] == "presentation" and view["diverged"] == []
        original = c.get("/api/session", params={"funnel": "puramur", "session": "s3"}).json()
        assert original["state"]["pet"]["type"] == "cat"
        page = c.get("/api/transcript", params={"funnel": "puramur", "session": "s3",
                                                "offset": 1, "limit": 1}).json()
        assert page["total"] == 3 and page["turns"][0]["number"] == 2
        # The studio's own sessions are listed when asked (customers' only by default).
        listed = c.get("/api/sessions", params={"funnel": "puramur", "stage": "presentation",
                                                "playground": "true"}).json()["sessions"]
        assert {s["session_id"] for s in listed} >= {"s3", view["session"]}
        assert all(s["playground"] for s in listed)
        assert c.get("/api/sessions", params={"funnel": "puramur"}).json()["sessions"] == []
        assert c.get("/api/sessions", params={"funnel": "puramur", "since": "soon"}
                     ).status_code == 400
        # Save a session as a scenario and run the funnel's scenarios, as the page's buttons do.
        saved = c.post("/api/scenario", json={"funnel": "puramur", "session": "s3",
                                              "name": "from-studio"}).json()
        assert saved["file"].endswith("puramur/scenarios/from-studio.yaml") and saved["turns"] == 3
        assert c.post("/api/scenario", json={"funnel": "puramur", "session": "s3",
                                             "name": "../up"}).status_code == 400
        ran = c.post("/api/scenarios/run", json={"funnel": "puramur"}).json()["results"]
        mine = [r for r in ran if r["name"] == "from-studio"]
        assert mine and mine[0]["passed"], mine
        assert all(r["passed"] for r in ran), [r for r in ran if not r["passed"]]
        form = c.get("/api/session", params={"funnel": "puramur", "session": view["session"]}
                     ).json()["form"]
        present = form["properties"]["actions"]["items"]["oneOf"][0]
        assert "PR251010" in present["properties"]["skus"]["items"]["enum"]  # SKUs from the catalog
    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match="needs a key"):
        serve_studio([str(funnel)], host="0.0.0.0", key=None)


def test_studio_mounted_in_serve_for_admin_keys(db_url: str) -> None:
    """`funnel serve` has the studio under /studio: admin-scoped keys only."""
    from engine.service.app import create_app
    from engine.service.config import ServiceConfig

    config = ServiceConfig(funnels=[ROOT / "funnels" / "puramur.yaml"], db=db_url,
                           model=f"scripted:{ROOT / 'funnels' / 'puramur' / 'demo.yaml'}",
                           api_keys={"admin-key": frozenset({"admin"}),
                                     "talk-key": frozenset({"converse"})},
                           secret=b"s" * 32, reload=False)
    with running(create_app(config)) as url, httpx.Client(base_url=url, timeout=60) as c:
        assert c.get("/studio/api/status").status_code == 401
        assert c.get("/studio/api/status",
                     headers={"authorization": "Bearer talk-key"}).status_code == 401
        ok = c.get("/studio/api/status", headers={"authorization": "Bearer admin-key"})
        assert ok.status_code == 200 and ok.json()["puramur"]["ok"]
        first = c.get("/studio/?key=admin-key")  # the page: the key once, then a cookie
        assert first.status_code == 303 and "funnel_studio" in first.headers["set-cookie"]
        page = c.get("/studio/", headers={"cookie": "funnel_studio=admin-key"})
        assert page.status_code == 200 and 'data-testid="chat-log"' in page.text
        turn = c.post("/studio/api/turn", headers={"authorization": "Bearer admin-key"},
                      json={"funnel": "puramur", "session": "studio-m1", "text": "Hi!",
                            "answer": {"reply": "Hello! Cat or dog?", "language": "en"}})
        assert turn.status_code == 200 and turn.json()["stage"] == "discovery"


# -- the report, served by the studio ------------------------------------------------------
SAY = {"hello": {"reply": "Hello! Cat or dog?", "language": "en"},
       "sphynx": {"reply": "Sphynx skin needs care.", "updates": {
           "pet": {"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"]}}},
       "show": {"reply": "Exotic Spa.", "actions": [{"type": "present_products",
                                                     "skus": ["PR251010"]}]},
       "expensive": {"reply": "I understand.",
                     "actions": [{"type": "record_objection", "objection": "price"}]},
       "operator": {"reply": "Connecting you.",
                    "actions": [{"type": "request_handoff", "reason": "explicit_request"}]},
       "garbage": {"output": "not json", "repair": "still not json"}}  # -> the fallback
# Who did what: E and G stop in discovery, E falls back there; A, C and D reach the
# presentation; D goes into objection handling (a side branch) and falls back in it; A
# and C are handed off; A and D buy.
PLAYED = {"A": ["hello", "sphynx", "show", "operator"], "C": ["hello", "sphynx", "operator"],
          "D": ["hello", "sphynx", "show", "expensive", "garbage"],
          "E": ["hello", "garbage"], "G": ["hello"]}


def _play_for_the_report(funnel: Path, db: str) -> None:
    from engine import Engine
    from engine.llm.models import ScriptedModel

    async def play() -> None:
        model = ScriptedModel.from_data({"match": [{"pattern": f"^{text}$", "output": out}
                                                   for text, out in SAY.items()]})
        async with await Engine.open(funnel, db=db, model=model) as engine:
            for session, messages in PLAYED.items():
                for text in messages:
                    await engine.handle(session, text, channel="test")
            for session in ("A", "D"):
                await engine.record_conversion(session, f"{session}-1", "100.00", "UAH",
                                               [{"sku": "PR251010", "qty": 1, "price": "100.00"}])

    asyncio.run(play())


@pytest.mark.slow
def test_report_numbers_open_their_sessions_in_chromium(driver: Any, db_url: str,
                                                        tmp_path: Path) -> None:
    """Each number of the report links to the sessions list filtered to exactly the
    sessions it counts: a stage's, the fallbacks', the buyers', a side branch's."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    funnel = copy_puramur(tmp_path)
    _play_for_the_report(funnel, db_url)
    d, wait = driver, WebDriverWait(driver, 90)

    def listed() -> set[str]:
        return set(d.execute_script(
            "return [...document.querySelectorAll('#sessions-list tr')].map(r => r.dataset.session)"))

    expected = {"report-sessions": set(PLAYED), "report-stopped-discovery": {"E", "G"},
                "report-reached-presentation": {"A", "C", "D"},
                "report-branch-objection_handling": {"D"},
                "report-branch-now-objection_handling": {"D"},
                "report-fallbacks": {"D", "E"}, "report-fallbacks-discovery": {"E"},
                "report-fallbacks-objection_handling": {"D"}, "report-buyers": {"A", "D"}}
    d.get("about:blank")  # the module's browser: an earlier test's page polled its studio
    d.get_log("browser")  # ... which is gone now; what it logged is not this test's
    with running(create_studio_app(_opener(funnel, db_url), hosts=LOOPBACK_HOSTS)) as url:
        d.get(url + "/")
        wait.until(lambda _: d.find_elements(By.CSS_SELECTOR, '[data-testid="stage-greeting"]'))
        report = d.find_element(By.CSS_SELECTOR, '[data-testid="open-report"]')
        assert report.get_attribute("href") == url + "/report?funnel=puramur"
        report.click()
        wait.until(lambda _: d.find_elements(By.CSS_SELECTOR, '[data-testid="report-funnel"]'))
        # The side branch apart from the main path; the trend a bar per day (8 for 7 days).
        branches = d.find_element(By.CSS_SELECTOR, '[data-testid="report-branches"]')
        assert "objection handling" in branches.text
        main = d.find_element(By.CSS_SELECTOR, '[data-testid="report-funnel"]')
        assert "objection handling" not in main.text and "cart building" in main.text
        assert len(d.find_elements(By.CSS_SELECTOR, '[data-testid="report-trend"] g.day')) == 8
        # (an <a> inside the SVG charts has no string .href: resolve its attribute)
        links = {t: (text, href) for t, text, href in d.execute_script(
            "return [...document.querySelectorAll('a.drill')].map(a => [a.dataset.testid, "
            "a.textContent, new URL(a.getAttribute('href'), location.href).href])")}
        assert set(expected) <= set(links), sorted(links)
        for testid, sessions in expected.items():
            number = int(re.sub(r"\D", "", links[testid][0]))
            d.get(links[testid][1])  # as the click does: the list, filtered by the address
            wait.until(lambda _: not d.find_element(By.ID, "sessions").get_attribute("hidden")
                       and d.find_elements(By.CSS_SELECTOR, "#sessions-list tr"))
            def shown(_: Any, want: set[str] = sessions) -> bool:
                return listed() == want
            wait.until(shown, f"{testid} -> {links[testid][1]}: not the sessions {sorted(sessions)}")
            assert number == len(listed()), (testid, number, listed())
            assert d.find_element(By.CSS_SELECTOR, '[data-testid="report-filter"]').is_displayed()
        # A real click on a number of the page does the same.
        d.get(url + "/report?funnel=puramur")
        d.find_element(By.CSS_SELECTOR, '[data-testid="report-buyers"]').click()
        wait.until(lambda _: listed() == {"A", "D"})
        assert "bought" in d.find_element(By.CSS_SELECTOR, '[data-testid="report-filter"]').text
        d.find_element(By.CSS_SELECTOR, '[data-testid="report-filter-clear"]').click()
        wait.until(lambda _: listed() == set(PLAYED))
        severe = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        assert not severe, severe


def test_the_prompt_panel_says_what_the_budget_trimmed(db_url: str, tmp_path: Path) -> None:
    """A tight prompt budget: the panel's call lists the window messages the budget cut;
    a roomy one says it cut nothing."""
    funnel = copy_puramur(tmp_path)
    funnel.write_text(funnel.read_text("utf-8").replace("prompt_budget: 1000",
                                                         "prompt_budget: 700"), "utf-8")
    with running(create_studio_app(_opener(funnel, db_url), hosts=LOOPBACK_HOSTS)) as url, \
            httpx.Client(base_url=url, timeout=60) as c:
        def turn(text: str, reply: str) -> dict[str, Any]:
            r = c.post("/api/turn", json={"funnel": "puramur", "session": "tight", "text": text,
                                          "answer": {"reply": reply, "language": "en"}})
            assert r.status_code == 200, r.text
            view: dict[str, Any] = r.json()
            return view

        first = turn("Hi!", "Hello! Is your pet a cat or a dog?")
        assert first["prompt"][0]["trimmed"] == []
        for i in range(4):  # long messages, still in discovery: the window outgrows 700
            last = turn(f"message {i}: " + "my pet has a long story " * 12,
                        f"reply {i}: " + "tell me more about the story " * 12)
        assert last["stage"] == "discovery"
        trimmed = last["prompt"][0]["trimmed"]
        assert any("oldest message" in t and "of the window left out" in t for t in trimmed)
        assert trimmed[-1] == "to fit the stage's prompt_budget of 700 tokens"
        # the panel's messages are the chat as sent: under the budget, each with its cost
        call = last["prompt"][0]
        assert call["tokens"] <= 700 and all(m["tokens"] > 0 for m in call["messages"])


def test_the_studio_refuses_what_crosses_its_boundary(db_url: str, tmp_path: Path) -> None:
    """A script outside the funnel's project, a period past ten years and a body past the
    limit get a clear refusal (not a 500); the key's redirect never names a host."""
    funnel = copy_puramur(tmp_path / "project")
    inside = tmp_path / "project" / "script.yaml"
    inside.write_text("default: {reply: ok}\n")
    with running(create_studio_app(_opener(funnel, db_url), key="studio-key-1")) as url, \
            httpx.Client(base_url=url, timeout=60,
                         headers={"authorization": "Bearer studio-key-1"}) as c:
        for outside in ("/proc/self/environ", str(tmp_path / "elsewhere.yaml"),
                        str(tmp_path / "project" / ".env")):
            r = c.post("/api/turn", json={"funnel": "puramur", "session": "p1", "text": "hi",
                                          "model": f"scripted:{outside}"})
            assert r.status_code == 400, r.text
            assert "outside funnel 'puramur''s project" in r.json()["error"]["message"]
        r = c.post("/api/turn", json={"funnel": "puramur", "session": "p1", "text": "hi",
                                      "model": f"scripted:{inside}"})
        assert r.status_code == 200 and r.json()["result"]["reply"] == "ok", r.text

        for path in ("/report?funnel=puramur&since=99999999999d",
                     "/api/sessions?funnel=puramur&since=99999999999d"):
            r = c.get(path)
            assert r.status_code == 400 and "ten years" in r.json()["error"]["message"], r.text

        # A chunked body that never ends: refused once it passes the limit, not read whole.
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=20) as raw:
            raw.sendall(b"POST /api/turn HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"Authorization: Bearer studio-key-1\r\n"
                        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(10):  # 640 KB, and no last chunk
                raw.sendall(b"10000\r\n" + b" " * 65536 + b"\r\n")
            assert raw.recv(4096).startswith(b"HTTP/1.1 413 ")
        r = c.post("/api/turn", content=b" " * (MAX_BODY + 1),
                   headers={"content-type": "application/json"})
        assert r.status_code == 413 and "524288 bytes" in r.json()["error"]["message"], r.text

        r = c.get("/?key=studio-key-1&tab=sessions", headers={"host": "evil.example"},
                  follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "./?tab=sessions"
        r = c.get("/?key=studio-key-1", follow_redirects=False)
        assert r.headers["location"] == "./"
