"""The studio never writes into a session it did not create, never sends anything, and
its sessions are counted nowhere unless asked (docs/studio.md#isolation, issue 39 §1).

A customer's session opened and typed on in headless Chromium stays byte for byte as it
was (its row, messages, turn records, outbox, control rows, delivery keys, lease); the
turn goes to a branch. A hand-off played in the studio queues nothing, and the funnel's
webhook (a real HTTP receiver here) hears nothing; the page says what would have been
sent. The same holds in `funnel serve` under /studio, with the service's dispatcher
running. `funnel report`, `/metrics`, the sessions list, `funnel replay` and the
experiments' figures leave the playground's sessions out unless asked. `funnel studio`
says in one line what to install when its web stack is missing, and SIGTERM or Ctrl-C
stop the embedded PostgreSQL it started.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import run_funnel
from projects import copy_puramur
from service_support import running
from studio_support import headless_chromium, opener, real_session

from engine.llm.models import ScriptedModel
from engine.studio import create_studio_app
from engine.studio.server import LOOPBACK_HOSTS

ROOT = Path(__file__).resolve().parent.parent
OPERATOR = "I want to talk to an operator"
SAY: dict[str, dict[str, Any]] = {"Hi!": {"reply": "Hello! Cat or dog?", "language": "en"},
       "A Sphynx, her skin is dry": {"reply": "Sphynx skin needs care.", "updates": {
           "pet": {"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"]}}},
       OPERATOR: {"reply": "Connecting you with a manager.",
                  "actions": [{"type": "request_handoff", "reason": "explicit_request"}]}}
HANDOFF = SAY[OPERATOR]
# What a session owns, each row as PostgreSQL's own text of it: compared byte for byte.
OWNED = {
    "row": "SELECT to_jsonb(t)::text FROM puramur_sessions_state t WHERE session_id = %(s)s",
    "messages": "SELECT to_jsonb(x)::text FROM funnel_messages x WHERE funnel = 'puramur' "
                "AND session_id = %(s)s ORDER BY id",
    "turns": "SELECT to_jsonb(x)::text FROM funnel_turns x WHERE funnel = 'puramur' "
             "AND session_id = %(s)s ORDER BY id",
    "outbox": "SELECT to_jsonb(x)::text FROM funnel_outbox x WHERE funnel = 'puramur' "
              "AND session_id = %(s)s ORDER BY id",
    "control": "SELECT to_jsonb(x)::text FROM funnel_control x WHERE funnel = 'puramur' "
               "AND session_id = %(s)s",
    "control_events": "SELECT to_jsonb(x)::text FROM funnel_control_events x WHERE "
                      "funnel = 'puramur' AND session_id = %(s)s ORDER BY id",
    "inbound": "SELECT to_jsonb(x)::text FROM funnel_inbound x WHERE funnel = 'puramur' "
               "AND session_id = %(s)s ORDER BY key",
    "lease": "SELECT to_jsonb(x)::text FROM funnel_leases x WHERE lock_key = 'puramur/' || %(s)s",
    "playground": "SELECT to_jsonb(x)::text FROM funnel_playground x WHERE funnel = 'puramur' "
                  "AND session_id = %(s)s",
}

pytestmark = [pytest.mark.postgres]


def owned(sql: Any, session: str) -> dict[str, list[str]]:
    return {name: [r[0] for r in sql(q, {"s": session})] for name, q in OWNED.items()}


class Receiver:
    """The manager's webhook: a real HTTP server on 127.0.0.1 that records every POST."""

    def __init__(self) -> None:
        posts: list[dict[str, Any]] = []
        self.posts = posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("content-length") or 0)
                posts.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def with_webhook(tmp_path: Path, url: str) -> Path:
    """Puramur whose hand-off alert goes to ``url`` (and the log)."""
    funnel = copy_puramur(tmp_path)
    text = funnel.read_text("utf-8")
    assert "notify: {log: true}" in text
    funnel.write_text(text.replace("notify: {log: true}",
                                   f'notify: {{webhook: "{url}", log: true}}'), "utf-8")
    return funnel


def script() -> ScriptedModel:
    return ScriptedModel.from_data({"match": [{"pattern": f"^{re.escape(t)}$", "output": o}
                                              for t, o in SAY.items()]})


def handed_off(funnel: Path, db: str, session: str) -> None:
    """A customer's conversation that ends with a hand-off: its alert is in the outbox,
    delivered to the webhook by the engine's own dispatch."""
    real_session(funnel, db, session, texts=("Hi!", "A Sphynx, her skin is dry", OPERATOR),
                 model=script())


def wait_for(check: Any, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# -- in the browser ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with headless_chromium(tmp_path_factory.mktemp("profile")) as d:
        yield d


@pytest.mark.slow
def test_a_customers_session_typed_on_in_the_page_stays_as_it_was(
        driver: Any, db_url: str, sql: Any, tmp_path: Path, receiver: Receiver) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    funnel = with_webhook(tmp_path, receiver.url)
    real = "tg-555"
    handed_off(funnel, db_url, real)
    wait_for(lambda: len(receiver.posts) == 1)  # the customer's alert, sent once
    assert receiver.posts[0]["session_id"] == real
    before = owned(sql, real)
    assert len(before["turns"]) == 3 and len(before["outbox"]) == 1 and before["lease"]
    assert before["playground"] == []
    d, wait = driver, WebDriverWait(driver, 90)

    def tid(name: str) -> Any:
        return d.find_element(By.CSS_SELECTOR, f'[data-testid="{name}"]')

    def text_of(name: str) -> str:
        return str(d.execute_script(
            f"return document.querySelector('[data-testid=\"{name}\"]').textContent"))

    def shown(name: str) -> bool:
        return bool(d.execute_script(
            f"return !document.querySelector('[data-testid=\"{name}\"]').hidden"))

    def turns() -> int:
        return int(d.execute_script("return document.querySelectorAll('#log .turn').length"))

    def current() -> str:
        return str(d.execute_script("return document.getElementById('graph').dataset.current"))

    def listed() -> set[str]:
        return set(d.execute_script("return [...document.querySelectorAll('#sessions-list tr')]"
                                    ".map(r => r.dataset.session)"))

    def answer(customer: str, reply: str, done: Any, raw: dict[str, Any] | None = None) -> None:
        tid("chat-input").send_keys(customer)
        if raw is not None:  # the JSON box (the form's actions as JSON)
            d.execute_script("document.getElementById('raw-box').open = true")
            tid("model-form-raw").send_keys(json.dumps(raw))
        else:
            tid("field-reply").send_keys(reply)
        tid("model-form-submit").click()
        wait.until(lambda _: done())

    d.get("about:blank")  # the module's browser: what an earlier page logged is not ours
    d.get_log("browser")
    with running(create_studio_app(opener(funnel, db_url), hosts=LOOPBACK_HOSTS)) as url:
        d.get(url + "/")
        wait.until(lambda _: d.find_elements(By.CSS_SELECTOR, '[data-testid="stage-greeting"]'))
        tid("tab-sessions").click()
        wait.until(lambda _: listed() == {real})
        d.find_element(By.CSS_SELECTOR, f'tr[data-session="{real}"]').click()
        wait.until(lambda _: text_of("session-id") == real and turns() == 3)
        assert current() == "handoff"
        assert shown("branch-info") and "customer's session" in text_of("branch-info")

        # Typed on: the turn goes to a branch; the customer's session is untouched.
        answer("When will they call me?", "A manager will call you shortly.",
               lambda: text_of("session-id").startswith(real + ".b") and turns() == 4)
        branch = text_of("session-id")
        info = text_of("branch-info")
        assert f"went to a new playground session {branch}" in info
        assert f"{real} is untouched" in info
        assert owned(sql, real) == before
        assert sql("SELECT branched_from, branched_turn FROM funnel_playground "
                   "WHERE session_id = %s", (branch,)) == [(real, 3)]
        # The branch replayed the hand-off: withheld, like everything the studio plays.
        assert sql("SELECT count(*) FROM funnel_outbox WHERE session_id = %s", (branch,)) == [(0,)]

        # The list: the customers' sessions, and the studio's when asked.
        tid("tab-sessions").click()
        wait.until(lambda _: listed() == {real})
        tid("filter-playground").click()
        wait.until(lambda _: listed() == {real, branch})
        assert d.find_element(By.CSS_SELECTOR, f'tr[data-session="{branch}"]'
                              ).get_attribute("class") == "playground"

        # "Change the answer" does not survive opening another session.
        d.find_element(By.CSS_SELECTOR, f'tr[data-session="{branch}"]').click()
        wait.until(lambda _: text_of("session-id") == branch and turns() == 4)
        assert f"branched from {real} after turn 3" in text_of("branch-info")
        d.find_element(By.CSS_SELECTOR, '[data-testid="branch-edit"][data-turn="1"]').click()
        wait.until(lambda _: "changing the answer of turn 1" in text_of("notice"))
        # The model's form of turn 1's stage, filled with its answer (docs/studio.md#manager).
        wait.until(lambda _: d.execute_script(
            "const f = document.querySelector('[data-testid=\"field-reply\"]'); return f && f.value"))
        tid("new-session").click()
        wait.until(lambda _: text_of("session-id").startswith("studio-"))
        fresh = text_of("session-id")
        assert d.execute_script("return document.getElementById('raw').value") == ""
        assert not shown("replay-after") or not d.find_element(By.ID, "replay-box").is_displayed()
        assert "changing the answer" not in text_of("notice")
        assert not shown("branch-info")
        # A message now is a turn of the new session (in change-answer mode it would
        # have been a rewind of it, which has no turn 1).
        answer("Hi!", "Hello! Is your pet a cat or a dog?",
               lambda: turns() == 1 and current() == "discovery")
        assert text_of("session-id") == fresh

        # A hand-off in the playground: nothing queued, nothing sent; the page says what
        # would have been.
        assert not shown("would-send")
        answer(OPERATOR, "", lambda: turns() == 2 and current() == "handoff", raw=HANDOFF)
        assert shown("would-send")
        would = text_of("would-send")
        assert f"would notify the manager (webhook {receiver.url}, the log)" in would
        assert f"hand-off of session {fresh} (reason: explicit_request)" in would
        assert sql("SELECT count(*) FROM funnel_outbox WHERE session_id = %s", (fresh,)) == [(0,)]
        assert sql("SELECT count(*) FROM funnel_playground WHERE session_id = %s",
                   (fresh,)) == [(1,)]
        time.sleep(1.0)  # the engine dispatches after the reply: give it the time it would take
        assert len(receiver.posts) == 1
        assert owned(sql, real) == before

        severe = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        assert not severe, severe


# -- in `funnel serve` -------------------------------------------------------------------
def test_the_same_rules_in_serve_under_studio(db_url: str, sql: Any, tmp_path: Path,
                                              receiver: Receiver) -> None:
    """Mounted in the service (its dispatcher running every 0.1 s): a customer's session
    typed on is branched and left as it was; the studio's hand-off reaches no webhook;
    /metrics counts the customers' open sessions only."""
    from engine.service.app import create_app
    from engine.service.config import ServiceConfig

    funnel = with_webhook(tmp_path, receiver.url)
    scripted = tmp_path / "script.yaml"
    scripted.write_text(yaml.safe_dump({"match": [{"pattern": f"^{re.escape(t)}$", "output": o}
                                                  for t, o in SAY.items()]}), "utf-8")
    config = ServiceConfig(funnels=[funnel], db=db_url, model=f"scripted:{scripted}",
                           api_keys={"admin-key": frozenset({"admin"}),
                                     "talk-key": frozenset({"converse"})},
                           secret=b"s" * 32, reload=False, dispatch_interval=0.1)
    admin = {"authorization": "Bearer admin-key"}
    with running(create_app(config)) as url, httpx.Client(base_url=url, timeout=60) as c:
        for session, texts in (("web-1", ("Hi!", "A Sphynx, her skin is dry", OPERATOR)),
                               ("web-2", ("Hi!",))):
            for text in texts:
                r = c.post(f"/v1/funnels/puramur/sessions/{session}/messages",
                           json={"text": text}, headers={"authorization": "Bearer talk-key"})
                assert r.status_code == 200, r.text
        wait_for(lambda: len(receiver.posts) == 1 and sql(
            "SELECT count(*) FROM funnel_outbox WHERE delivered_at IS NULL") == [(0,)])
        before = owned(sql, "web-1")

        turn = c.post("/studio/api/turn", headers=admin, json={
            "funnel": "puramur", "session": "web-1", "text": "When will they call?",
            "answer": {"reply": "Soon."}}).json()
        assert turn["branched_from"] == {"session": "web-1", "turn": 3}
        assert turn["session"].startswith("web-1.b") and turn["turns"] == 4
        for text, out in (("Hi!", SAY["Hi!"]), (OPERATOR, HANDOFF)):
            played = c.post("/studio/api/turn", headers=admin, json={
                "funnel": "puramur", "session": "studio-m1", "text": text, "answer": out}).json()
        assert played["stage"] == "handoff" and played["result"]["handoff"]
        assert played["would_send"][0]["text"].startswith(
            f"would notify the manager (webhook {receiver.url}, the log)")
        c.post("/studio/api/turn", headers=admin, json={
            "funnel": "puramur", "session": "studio-m2", "text": "Hi!", "answer": SAY["Hi!"]})
        time.sleep(1.0)  # ten dispatches of the service

        assert owned(sql, "web-1") == before
        assert len(receiver.posts) == 1
        assert sql("SELECT count(*) FROM funnel_outbox WHERE session_id <> 'web-1'") == [(0,)]
        assert sql("SELECT count(*) FROM funnel_control") == [(0,)]
        ids = {s["session_id"] for s in c.get("/studio/api/sessions", headers=admin,
                                              params={"funnel": "puramur"}).json()["sessions"]}
        assert ids == {"web-1", "web-2"}
        ids = {s["session_id"] for s in c.get(
            "/studio/api/sessions", headers=admin,
            params={"funnel": "puramur", "playground": "true"}).json()["sessions"]}
        assert ids == {"web-1", "web-2", turn["session"], "studio-m1", "studio-m2"}
        # web-2 and studio-m2 are both open (in discovery): /metrics counts web-2 only.
        metrics = c.get("/metrics", headers=admin).text
        counts = re.findall(r'^funnel_open_sessions\{funnel="puramur",version="\d+"\} (\S+)$',
                            metrics, re.M)
        assert [float(n) for n in counts] == [1.0], metrics


# -- the figures ---------------------------------------------------------------------------
def test_report_list_and_replay_leave_the_playground_out_unless_asked(
        db_url: str, sql: Any, tmp_path: Path) -> None:
    from engine.evidence.records import read_population
    from engine.report import build_report

    funnel = copy_puramur(tmp_path)
    handed_off(funnel, db_url, "real-a")
    real_session(funnel, db_url, "real-b", texts=("Hi!",), model=script())
    with running(create_studio_app(opener(funnel, db_url), hosts=LOOPBACK_HOSTS)) as url, \
            httpx.Client(base_url=url, timeout=60) as c:
        for text in ("Hi!", OPERATOR):
            assert c.post("/api/turn", json={"funnel": "puramur", "session": "studio-1",
                                             "text": text, "answer": SAY[text]}).status_code == 200
        branch = c.post("/api/turn", json={"funnel": "puramur", "session": "real-b",
                                           "text": "A Sphynx, her skin is dry",
                                           "answer": SAY["A Sphynx, her skin is dry"]}).json()
        assert branch["branched_from"]["session"] == "real-b"
        mine = {"studio-1", branch["session"]}
        ids = {s["session_id"] for s in c.get("/api/sessions",
                                              params={"funnel": "puramur"}).json()["sessions"]}
        assert ids == {"real-a", "real-b"}
        listed = c.get("/api/sessions", params={"funnel": "puramur", "playground": "1"}).json()
        assert {s["session_id"]: s["playground"] for s in listed["sessions"]} == {
            "real-a": False, "real-b": False, **dict.fromkeys(mine, True)}
        # The studio's report is `funnel report`'s: the customers' sessions only.
        html = c.get("/report", params={"funnel": "puramur"}).text
        assert re.search(r'data-testid="report-sessions"[^>]*>\s*2\b', html), html[:2000]

    report = asyncio.run(build_report(funnel, db=db_url))
    everyone = asyncio.run(build_report(funnel, db=db_url, include_playground=True))
    assert report["stage_funnel"]["sessions"] == 2 and everyone["stage_funnel"]["sessions"] == 4
    assert report["costs"]["conversations"]["conversations"] == 2
    assert everyone["costs"]["conversations"]["conversations"] == 4
    reasons = {r["reason"]: r["handoffs"] for r in report["handoff_reasons"]}
    assert reasons == {"explicit_request": 1}  # real-a's; studio-1's is the playground's
    assert report["trends"]["sessions"] == 2
    assert sum(r["sessions"] for r in report["active_by_stage"]["rows"]) == 1  # real-b
    for flags, count in (((), 2), (("--include-playground",), 4)):
        done = run_funnel("report", str(funnel), "--db", db_url, "--format", "json", *flags)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["stage_funnel"]["sessions"] == count

    def replayed(**options: Any) -> set[str]:
        return {s.session_id for s in read_population(db_url, "puramur", **options).sessions}

    assert replayed() == {"real-a", "real-b"}
    assert replayed(include_playground=True) == {"real-a", "real-b", *mine}
    assert replayed(sessions=["studio-1"]) == {"studio-1"}  # named: played as asked
    for flags, sessions in (((), {"real-a", "real-b"}),
                            (("--include-playground",), {"real-a", "real-b", *mine})):
        done = run_funnel("replay", str(funnel), "--db", db_url, "--format", "json",
                          "--jobs", "1", *flags)
        assert done.returncode == 0, done.stderr
        assert {s["session_id"] for s in json.loads(done.stdout)["sessions"]} == sessions


def test_experiment_figures_leave_the_playground_out(db_url: str, tmp_path: Path) -> None:
    from test_experiments import experiment, funnel_copy

    from engine.report.variants import build_variant_report
    from engine.store import playground
    from engine.turn.engine import Engine

    path = funnel_copy(tmp_path, experiment())

    async def play() -> None:
        model = ScriptedModel.from_data({"default": {"reply": "Hello!"}})
        async with await Engine.open(path, db=db_url, model=model) as customers, \
                await Engine.open(path, db=db_url, model=model, playground=True) as studio:
            await customers.handle("c1", "Hi")
            for sid in ("p1", "p2"):
                await playground.mark(studio.store, "puramur", sid)
                await studio.handle(sid, "Hi")

    asyncio.run(play())
    report = asyncio.run(build_variant_report(path, db=db_url))
    everyone = asyncio.run(build_variant_report(path, db=db_url, include_playground=True))
    assert sum(v["sessions"] for v in report["variants"]) == 1
    assert sum(v["sessions"] for v in everyone["variants"]) == 3


def test_the_studio_never_changes_what_production_runs(db_url: str, sql: Any,
                                                      tmp_path: Path) -> None:
    """Opening the studio on a draft and editing it live leave ``funnel_versions`` (a
    production engine loads a pinned session's version from there, the bundle deployed
    last) and the knowledge index (production retrieves from it) as production left them."""
    funnel = copy_puramur(tmp_path)
    real_session(funnel, db_url, "c1", texts=("Hi!",), model=script())
    stored = "SELECT version, hash, deployed_at FROM funnel_versions WHERE NOT trial ORDER BY 1, 2"
    indexed = ("SELECT s.digest, s.indexed_at, (SELECT array_agg(body ORDER BY id) FROM "
               "funnel_knowledge k WHERE k.funnel = s.funnel) FROM funnel_knowledge_sets s")
    before, index = sql(stored), sql(indexed)
    assert len(before) == 1 and len(index) == 1
    note = next((funnel.parent / "puramur" / "knowledge").rglob("*.md"))
    note.write_text(note.read_text("utf-8") + "\n\nA draft line no customer may read.\n",
                    "utf-8")
    with running(create_studio_app(opener(funnel, db_url), hosts=LOOPBACK_HOSTS)) as url, \
            httpx.Client(base_url=url, timeout=60) as c:
        generation = c.get("/api/status").json()["puramur"]["generation"]
        funnel.write_text(funnel.read_text("utf-8").replace(
            "Build the pet profile", "Build the pet's profile (a draft)"), "utf-8")
        wait_for(lambda: (lambda st: st["ok"] and st["generation"] > generation)(
            c.get("/api/status").json()["puramur"]), 60)
        played = c.post("/api/turn", json={"funnel": "puramur", "session": "studio-v1",
                                           "text": "Hi!", "answer": SAY["Hi!"]}).json()
        assert played["stage"] == "discovery"
    assert sql(stored) == before
    assert sql(indexed) == index


def test_erasing_a_customer_erases_the_studios_branches_of_them(db_url: str, sql: Any,
                                                               tmp_path: Path) -> None:
    """A branch replays the customer's messages: `DELETE /v1/.../sessions/ID` (the
    erasure) takes the branches of the session, and theirs, with it; the studio's other
    sessions stay."""
    from starlette.testclient import TestClient

    from engine.service.app import create_app
    from engine.service.config import ServiceConfig

    funnel = copy_puramur(tmp_path)
    real_session(funnel, db_url, "tg-77", texts=("Hi!", "A Sphynx, her skin is dry"),
                 model=script())
    with running(create_studio_app(opener(funnel, db_url), hosts=LOOPBACK_HOSTS)) as url, \
            httpx.Client(base_url=url, timeout=60) as c:
        branch = c.post("/api/turn", json={"funnel": "puramur", "session": "tg-77",
                                           "text": "Hi again", "answer": {"reply": "Hello."}}
                        ).json()["session"]
        nested = c.post("/api/rewind", json={"funnel": "puramur", "session": branch,
                                             "turn": 1}).json()["session"]
        c.post("/api/turn", json={"funnel": "puramur", "session": "studio-x", "text": "Hi!",
                                  "answer": SAY["Hi!"]})
    copies = ("tg-77", branch, nested)
    messages = "SELECT count(*) FROM funnel_messages WHERE session_id = %s"
    held = sum(sql(messages, (s,))[0][0] for s in copies)
    assert held == 4 + 6 + 2  # the customer's 2 turns; the branch's 3; the nested one's 1
    config = ServiceConfig(funnels=[funnel], db=db_url,
                           model=f"scripted:{ROOT / 'funnels' / 'puramur' / 'demo.yaml'}",
                           api_keys={"erase-key": frozenset({"erase"})}, secret=b"e" * 32,
                           reload=False)
    with TestClient(create_app(config)) as client:
        erased = client.delete("/v1/funnels/puramur/sessions/tg-77",
                               headers={"Authorization": "Bearer erase-key"})
    assert erased.status_code == 200, erased.text
    assert erased.json()["tables"]["funnel_messages"] == held
    for session in copies:
        for table in ("puramur_sessions_state", "funnel_messages", "funnel_turns",
                      "funnel_playground"):
            assert sql(f"SELECT count(*) FROM {table} WHERE session_id = %s",
                       (session,)) == [(0,)], (session, table)
    assert sql(messages, ("studio-x",)) == [(2,)]


@pytest.mark.parametrize("anonymize", [False, True])
def test_a_purge_takes_the_studios_branches_of_the_sessions_it_purges(
        db_url: str, sql: Any, tmp_path: Path, anonymize: bool) -> None:
    """Retention reaches the copies too: `funnel purge` (deleting or anonymizing) deletes
    the studio's branches of the sessions it purges, which replay their messages."""
    funnel = copy_puramur(tmp_path)
    real_session(funnel, db_url, "tg-78", texts=("Hi!", "A Sphynx, her skin is dry"),
                 model=script())
    with running(create_studio_app(opener(funnel, db_url), hosts=LOOPBACK_HOSTS)) as url, \
            httpx.Client(base_url=url, timeout=60) as c:
        branch = c.post("/api/turn", json={"funnel": "puramur", "session": "tg-78",
                                           "text": "Hi again", "answer": {"reply": "Hello."}}
                        ).json()["session"]
    assert sql("SELECT count(*) FROM funnel_messages WHERE session_id = %s", (branch,))[0][0]
    time.sleep(1.2)
    out = run_funnel("purge", str(funnel), "--older-than", "1s", "--db", db_url,
                     *(["--anonymize"] if anonymize else []))
    assert out.returncode == 0, out.stdout + out.stderr
    for table in ("puramur_sessions_state", "funnel_messages", "funnel_turns",
                  "funnel_playground"):
        assert sql(f"SELECT count(*) FROM {table} WHERE session_id = %s",
                   (branch,)) == [(0,)], table
    kept = sql("SELECT count(*) FROM puramur_sessions_state WHERE session_id = 'tg-78'")
    assert kept == [(1 if anonymize else 0,)]


# -- the engine ---------------------------------------------------------------------------
async def test_a_playground_engine_queues_nothing_and_says_what_it_withheld(
        db_url: str, sql: Any, tmp_path: Path) -> None:
    from engine.turn.engine import Engine

    funnel = copy_puramur(tmp_path)
    async with await Engine.open(funnel, db=db_url, model=script(), playground=True) as engine:
        await engine.handle("p1", "Hi!")
        result = await engine.handle("p1", OPERATOR)
    assert result.handoff and result.stage_after == "handoff"
    assert [(w["kind"], w["key"], w["payload"]["reason"]) for w in result.withheld] == [
        ("handoff", "puramur:p1:handoff", "explicit_request")]
    assert sql("SELECT count(*) FROM funnel_outbox") == [(0,)]
    assert sql("SELECT handoff_reason FROM puramur_sessions_state") == [("explicit_request",)]


def test_a_playground_approval_asks_no_manager(db_url: str, sql: Any, tmp_path: Path) -> None:
    """A move that waits for a manager's approval, played in the studio: the customer's
    holding reply as a customer would read it, and no alert, control row or event: the
    managers' queue and the service's sweep never see it."""
    from test_approval import HOLD, gated

    funnel = gated(tmp_path)
    with running(create_studio_app(opener(funnel, db_url), hosts=LOOPBACK_HOSTS)) as url, \
            httpx.Client(base_url=url, timeout=60) as c:
        view = c.post("/api/turn", json={
            "funnel": "puramur", "session": "studio-a1", "text": "I have a cat",
            "answer": {"reply": "A cat!", "updates": {"pet": {"type": "cat"}}}}).json()
    assert view["result"]["reply"] == HOLD and view["stage"] == "greeting"
    said = [w["text"] for w in view["would_send"]]
    assert said[0] == ("would ask the managers (the log) to approve the move greeting → "
                       "discovery (reason: cats need the vet's word); on timeout: reject")
    assert said[1].startswith("would hold the move greeting → discovery for a manager's "
                              "approval until ")
    for table in ("funnel_outbox", "funnel_control", "funnel_control_events"):
        assert sql(f"SELECT count(*) FROM {table}") == [(0,)], table


# -- `funnel studio` itself -----------------------------------------------------------------
def test_studio_without_its_web_stack_says_what_to_install(tmp_path: Path) -> None:
    """One line naming the extra, never a traceback (as after an install that lacks it)."""
    blocked = ("import sys; sys.modules['starlette'] = None; sys.modules['uvicorn'] = None; "
               "from engine.cli import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", blocked, "studio",
                           str(ROOT / "funnels" / "puramur.yaml")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install -e '.[serve]'" in lines[0], done.stderr


def test_the_default_install_has_what_the_studio_imports() -> None:
    """`pip install -e .` (the README's first command) installs every distribution the
    studio's modules import: it is in the default dependencies, not only in an extra."""
    import ast
    import tomllib
    from importlib.metadata import packages_distributions

    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    default = {re.split(r"[<>=\[ ;]", d, maxsplit=1)[0].lower().replace("_", "-")
               for d in project["dependencies"]}
    owners = packages_distributions()
    imported: set[str] = set()
    for path in [*(ROOT / "engine" / "studio").glob("*.py"), ROOT / "engine" / "cli" / "studio.py"]:
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m in owners and m != "engine"}
    assert {"starlette", "uvicorn", "pydantic"} <= third_party
    missing = {m: owners[m] for m in third_party
               if not {d.lower().replace("_", "-") for d in owners[m]} & default}
    assert not missing, f"imported by the studio, not in the default install: {missing}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_stopping_the_studio_stops_its_embedded_postgresql(stop: signal.Signals) -> None:
    """A real `funnel studio` on the embedded server of a fresh FUNNEL_HOME: once it is
    serving, the signal ends it, and the PostgreSQL it started is gone."""
    with tempfile.TemporaryDirectory() as home:
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if k != "FUNNEL_DB"}
        env.update(FUNNEL_HOME=home, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "studio",
                                 str(ROOT / "funnels" / "puramur.yaml"), "--port", str(port)],
                                env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 180  # a first start runs initdb
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/api/status", timeout=5).is_success:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline, "the studio did not start"
                time.sleep(0.25)
            postmaster = int((Path(home) / "pgdata" / "postmaster.pid").read_text().split()[0])
            os.kill(postmaster, 0)  # running
            proc.send_signal(stop)
            out = proc.communicate(timeout=60)[0]
            assert "Traceback" not in out, out

            def gone() -> bool:
                try:
                    os.kill(postmaster, 0)
                except ProcessLookupError:
                    return True
                return False

            wait_for(gone, 30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            pid_file = Path(home) / "pgdata" / "postmaster.pid"
            if pid_file.exists():  # never leave a server behind, even when the test failed
                try:
                    os.kill(int(pid_file.read_text().split()[0]), signal.SIGQUIT)
                except (ProcessLookupError, ValueError):
                    pass
