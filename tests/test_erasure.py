"""Erasure and access requests for one customer (issue 40, item 7).

Two customers talk to Puramur (with an approval gate on discovery) on the real
engine and PostgreSQL; each leaves a marker in every place a session's data lands:
its messages and session id, a grounded name in the state row, the model's raw
output (an invalid first answer), a manager's approval note, the hand-off alert in
the outbox, a conversion, an idempotency record, an embedding, an unreachable mark.
The service's export (scope ``erase``) holds the first customer's markers; then
``DELETE`` erases that customer, and ``pg_dump --data-only`` of the schema (the
approach of tests/test_anonymize_dump.py) has none of them while every marker of
the other customer is still there. The receipt lists each table with its rows; the
request is logged without the customer's id. Then the races: an erasure waits for
the turn in flight, and a turn that lost its lease cannot bring the session back.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PURAMUR, run_funnel
from projects import copy_puramur
from starlette.testclient import TestClient
from test_anonymize_dump import dump

from engine.errors import ConcurrentUpdate, SessionBusy, UnknownSession
from engine.format.names import SHARED_TABLES
from engine.funnel.compiled import load_funnel
from engine.llm.models import Completion, LiteLLMModel, ModelRequest
from engine.records.orders import order_from_body
from engine.service.app import create_app
from engine.service.config import ServiceConfig
from engine.store import open_store
from engine.store.ddl import (
    CONTROL_EVENTS,
    CONVERSIONS,
    EMBEDDINGS,
    INBOUND,
    LEASES,
    MESSAGES,
    OUTBOX,
    TURNS,
    UNREACHABLE,
)
from engine.store.erasure import SESSION_TABLES
from engine.turn import manager
from engine.turn.engine import Engine
from engine.turn.invariants import check_funnel

pytestmark = pytest.mark.postgres

TABLE = "puramur_sessions_state"
ERASER = "erase-key-5e1d0c9b7a3f"
READER = "read-key-8a2c4e6f1b3d"
A, B = "Qzalpha7731", "Qzbravo4402"  # the two customers' markers
BASE = "/v1/funnels/puramur"


def sid(marker: str) -> str:
    return f"tg-{marker}"


def gated(root: Path) -> Path:
    """Puramur, where moving on to discovery with a cat waits for a manager."""
    path = copy_puramur(root / "project")
    data = yaml.safe_load(path.read_text())
    data["stages"]["discovery"]["approval"] = {
        "when": "pet.type == 'cat'", "timeout": "15m", "on_timeout": "reject",
        "holding_reply": "A manager checks this.", "reason": "cats need the vet's word"}
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


class Parrot:
    """Repeats what the customer said: their name into the state and the replies; the
    first answer of each session is invalid and quotes the marker (the raw output)."""

    name = "parrot"

    def __init__(self) -> None:
        self.answered: set[str] = set()

    async def complete(self, request: ModelRequest) -> Completion:
        marker = request.session_id.removeprefix("tg-")
        # The customer's last message (a repair call adds its own instructions after it).
        said = [m["content"] for m in request.messages if m["role"] == "user"
                and "rejected" not in m["content"]][-1]
        name = f"Olena {marker}"
        if request.session_id not in self.answered:
            self.answered.add(request.session_id)
            out: dict[str, Any] = {"reply": 7, "note": f"raw output of {marker}"}
        elif "cat" in said:
            out = {"reply": f"A cat, {name}!", "updates": {"customer": {"name": name},
                                                         "pet": {"type": "cat"}}}
        elif "manager" in said:
            out = {"reply": f"A manager will call you, {name}.",
                   "actions": [{"type": "request_handoff", "reason": "explicit_request"}]}
        else:
            out = {"reply": "Tell me more."}
        return Completion(text=json.dumps(out), prompt_tokens=10, completion_tokens=5,
                          model="parrot", latency_ms=1.0)


async def plant(engine: Engine, sql: Any, marker: str) -> None:
    """Everything a session leaves, each copy carrying ``marker``."""
    s = sid(marker)
    first = await engine.handle(s, f"Hi, I am Olena {marker}, I have a cat",
                                channel="telegram", key=f"update-{marker}",
                                reply_to={"chat_id": 5550001})
    assert first.approval == "discovery" and first.validation_failures == 1, first
    assert first.state["customer"]["name"] == f"Olena {marker}"  # grounded: kept
    await manager.reject(engine, s, "Taras", note=f"not for {marker}")
    second = await engine.handle(s, "Please get me a manager", channel="telegram",
                                 key=f"update2-{marker}", reply_to={"chat_id": 5550001})
    assert second.handoff, second
    await engine.store.record_conversion(engine.spec, order_from_body(s, {
        "order_id": f"order-{marker}", "amount": "12.00", "currency": "UAH",
        "lines": [{"sku": "PM-CAT-FOOD-2KG", "qty": 1, "price": "12.00"}],
        "ordered_at": datetime.now(UTC).isoformat()}))
    sql(f"INSERT INTO {EMBEDDINGS} (message_id, funnel, session_id, model, embedding) "
        f"SELECT id, funnel, session_id, 'fake', ARRAY[0.6, 0.8]::real[] FROM {MESSAGES} "
        "WHERE session_id = %s", (s,))
    sql(f"INSERT INTO {UNREACHABLE} (funnel, session_id, channel, reason) VALUES "
        "('puramur', %s, 'telegram', 'blocked')", (s,))


def places(sql: Any, marker: str) -> dict[str, int]:
    """Where the marker is stored, by table (every column as text)."""
    found = {}
    for table in (TABLE, *SHARED_TABLES):
        [(n,)] = sql(f"SELECT count(*) FROM {table} t WHERE t::text LIKE %s", (f"%{marker}%",))
        if n:
            found[table] = n
    return found


@pytest.fixture
def funnel_path(tmp_path: Path) -> Path:
    return gated(tmp_path)


async def test_an_erased_customer_is_nowhere_in_a_dump(db_url: str, sql: Any,
                                                      funnel_path: Path) -> None:
    model = Parrot()
    engine = await Engine.open(funnel_path, db=db_url, model=model)
    try:
        for marker in (A, B):
            await plant(engine, sql, marker)
        await engine.dispatch()  # the alerts' delivery (no webhook: they stay, failed)
    finally:
        await engine.close()
    where = {m: places(sql, m) for m in (A, B)}
    for marker in (A, B):  # every copy is planted, for both customers
        assert {TABLE, MESSAGES, TURNS, OUTBOX, INBOUND, CONTROL_EVENTS, CONVERSIONS,
                EMBEDDINGS, UNREACHABLE, LEASES} <= set(where[marker]), where[marker]
    [(raw,)] = sql(f"SELECT raw_output::text FROM {TURNS} WHERE session_id = %s AND "
                   "validation_failures = 1", (sid(A),))
    assert f"raw output of {A}" in raw
    before = dump(db_url)
    assert A in before and B in before

    config = ServiceConfig(funnels=[funnel_path], db=db_url, model=model,
                           api_keys={ERASER: frozenset({"erase"}),
                                     READER: frozenset({"read_state"})},
                           secret=b"erasure-secret-0123456789", rate_limit=(1000, 60.0))
    with TestClient(create_app(config)) as client:
        auth = {"Authorization": f"Bearer {ERASER}"}
        # Access: everything, the markers included; read_state is not enough.
        assert client.get(f"{BASE}/sessions/{sid(A)}/export",
                          headers={"Authorization": f"Bearer {READER}"}).status_code == 403
        exported = client.get(f"{BASE}/sessions/{sid(A)}/export", headers=auth)
        assert exported.status_code == 200, exported.text
        doc = exported.json()
        assert doc["state"]["customer"]["name"] == f"Olena {A}"
        assert any(f"raw output of {A}" in json.dumps(t["raw_output"]) for t in doc["turns"])
        assert [c["order_id"] for c in doc["conversions"]] == [f"order-{A}"]
        assert any(e["event"] == "rejected" and A in json.dumps(e["detail"])
                   for e in doc["control_events"])
        assert {o["kind"] for o in doc["outbox"]} >= {"handoff"}
        assert [d["key"] for d in doc["deliveries"]] == [f"update-{A}", f"update2-{A}"]
        assert doc["embeddings"]["count"] == len(doc["messages"]) > 0
        assert B not in exported.text

        erased = client.delete(f"{BASE}/sessions/{sid(A)}", headers=auth)
        assert erased.status_code == 200, erased.text
        receipt = erased.json()
        # Erased already: nothing left to name.
        again = client.delete(f"{BASE}/sessions/{sid(A)}", headers=auth)
        assert again.status_code == 404 and "nothing of it is stored" in again.text
        assert client.get(f"{BASE}/sessions/{sid(A)}/export", headers=auth).status_code == 404
    print(json.dumps(receipt, indent=2))
    tables = receipt["tables"]
    assert list(tables) == [TABLE, *SESSION_TABLES]
    assert tables == {TABLE: 1, **{t: n for t, n in where[A].items() if t not in
                                   (TABLE, LEASES)}, "funnel_control": 0, "funnel_playground": 0,
                     "funnel_follow_ups": 0}
    assert receipt["total"] == sum(tables.values())
    assert receipt["memory"] == {"studio_prompts": 0}  # the studio was never opened

    after = dump(db_url)
    left = [line[:200] for line in after.splitlines() if A in line]
    assert left == []
    assert places(sql, B) == where[B]  # the other customer is intact
    # Logged: who, what, when, the counts; never the customer's id.
    events = sql(f"SELECT session_id, event, detail FROM {CONTROL_EVENTS} WHERE event IN "
                 "('erased', 'exported') ORDER BY id")
    assert [(s, e) for s, e, _ in events] == [("", "exported"), ("", "erased")]
    assert events[1][2] == {"by": "key#1", "receipt": receipt["receipt"], "rows": tables}
    assert events[0][2]["rows"]["messages"] == len(doc["messages"])
    problems = await check_funnel(load_funnel(funnel_path), db_url)
    assert [p for p in problems if p.severity == "error"] == [], problems


async def test_forget_and_export_on_the_command_line(db_url: str, sql: Any,
                                                     funnel_path: Path, tmp_path: Path) -> None:
    engine = await Engine.open(funnel_path, db=db_url, model=Parrot())
    try:
        for marker in (A, B):
            await plant(engine, sql, marker)
    finally:
        await engine.close()
    out = tmp_path / "export.json"
    done = run_funnel("export", str(funnel_path), sid(A), "-o", str(out), "--db", db_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["state"]["customer"]["name"] == f"Olena {A}"
    done = run_funnel("forget", str(funnel_path), sid(A), sid(B), "no-such-session",
                      "--db", db_url)
    assert done.returncode == 1  # one session was not found: said, the others erased
    assert "no session 'no-such-session' in funnel 'puramur'" in done.stderr
    assert done.stdout.count("erased session") == 2 and f"  {MESSAGES}: " in done.stdout
    assert places(sql, A) == {} and places(sql, B) == {}
    [(by,)] = sql(f"SELECT DISTINCT detail->>'by' FROM {CONTROL_EVENTS}")
    assert by == "cli"
    done = run_funnel("export", str(funnel_path), sid(A), "--db", db_url)
    assert done.returncode == 1 and "erased already, or never seen" in done.stderr


def test_every_table_that_keeps_a_session_is_erased(db_url: str, sql: Any) -> None:
    """The erasure's list is every shared table with a `session_id` column: a table
    added later without it fails here (and the purge deletes from the same list)."""
    from engine.store.ddl import SHARED_MIGRATIONS

    for statement in SHARED_MIGRATIONS:
        sql(statement)
    keyed = {r[0] for r in sql(
        "SELECT table_name FROM information_schema.columns WHERE table_schema = "
        "current_schema() AND column_name = 'session_id'")}
    assert keyed == set(SESSION_TABLES)


async def _opened(db_url: str, fake: Any) -> Engine:
    return await Engine.open(PURAMUR, db=db_url,
                             model=LiteLLMModel("openai/gpt-4o-mini", api_base=fake.api_base))


async def test_an_erasure_waits_for_the_turn_in_flight(db_url: str, fake_llm: Any,
                                                       sql: Any) -> None:
    engine = await _opened(db_url, fake_llm)
    store = await open_store(db_url)
    try:
        fake_llm.reply(json.dumps({"reply": "Hello! A cat or a dog?"}))
        await engine.handle("w-1", "Hi")
        gate = fake_llm.hold(json.dumps({"reply": "A cat, lovely."}))
        turn = asyncio.create_task(engine.handle("w-1", "A cat"))
        await asyncio.to_thread(gate.wait_arrived)
        with pytest.raises(SessionBusy, match="nothing was erased"):
            await store.erase_session(engine.spec, "w-1", by="test", wait=0.3)
        erasing = asyncio.create_task(store.erase_session(engine.spec, "w-1", by="test"))
        await asyncio.sleep(0.3)
        assert not erasing.done()  # the turn holds the session
        gate.release()
        result = await turn
        receipt = await erasing
    finally:
        await store.close()
        await engine.close()
    assert result.reply == "A cat, lovely."
    # Erased after the turn: its message and reply went too.
    assert receipt["tables"][MESSAGES] == 4 and receipt["tables"][TURNS] == 2
    assert sql(f"SELECT count(*) FROM {MESSAGES}") == [(0,)]
    assert sql(f"SELECT count(*) FROM {TABLE}") == [(0,)]
    assert sql(f"SELECT count(*) FROM {LEASES}") == [(0,)]


async def test_a_turn_that_lost_its_lease_cannot_bring_back_an_erased_session(
        db_url: str, fake_llm: Any, sql: Any) -> None:
    engine = await _opened(db_url, fake_llm)
    store = await open_store(db_url)
    try:
        fake_llm.reply(json.dumps({"reply": "Hello! A cat or a dog?"}))
        await engine.handle("w-2", "Hi")
        gate = fake_llm.hold(json.dumps({"reply": "Welcome back!"}))
        turn = asyncio.create_task(engine.handle("w-2", "I am back"))
        await asyncio.to_thread(gate.wait_arrived)
        # The worker stalled past its lease (no heartbeat): the erasure takes the session.
        sql(f"UPDATE {LEASES} SET expires_at = NOW() - INTERVAL '1 second'")
        receipt = await store.erase_session(engine.spec, "w-2", by="test", wait=5)
        assert receipt["tables"][TABLE] == 1
        gate.release()
        with pytest.raises(ConcurrentUpdate):  # the session is gone: not saved again
            await turn
        with pytest.raises(UnknownSession):
            await store.erase_session(engine.spec, "w-2", by="test")
    finally:
        await store.close()
        await engine.close()
    assert sql(f"SELECT count(*) FROM {TABLE}") == [(0,)]
    assert sql(f"SELECT count(*) FROM {MESSAGES}") == [(0,)]  # no reply without its message
    assert sql(f"SELECT count(*) FROM {TURNS}") == [(0,)]
    # The next message starts a new, empty session.
    engine = await _opened(db_url, fake_llm)
    try:
        fake_llm.reply(json.dumps({"reply": "Hello!"}))
        fresh = await engine.handle("w-2", "Hi again")
    finally:
        await engine.close()
    assert fresh.reply == "Hello!"
    assert sql(f"SELECT turns FROM {TABLE}") == [(1,)]


def test_the_mounted_studio_forgets_an_erased_session(db_url: str) -> None:
    """The studio keeps the prompts it sent per session, in memory: an erasure through
    the service drops them, and says so in the receipt."""
    admin = "admin-key-erasure-9f8e7d6c"
    config = ServiceConfig(funnels=[PURAMUR], db=db_url,
                           model=f"scripted:{PURAMUR.parent / 'puramur' / 'demo.yaml'}",
                           api_keys={admin: frozenset({"admin"})},
                           secret=b"erasure-secret-0123456789", rate_limit=(1000, 60.0),
                           reload=False)
    auth = {"Authorization": f"Bearer {admin}"}
    with TestClient(create_app(config)) as client:
        turn = client.post("/studio/api/turn", headers=auth, json={
            "funnel": "puramur", "session": "studio-e1", "text": f"Hi, I am {A}",
            "answer": {"reply": "Hello! Cat or dog?", "language": "en"}})
        assert turn.status_code == 200, turn.text
        assert A in json.dumps(turn.json()["prompt"])
        erased = client.delete(f"{BASE}/sessions/studio-e1", headers=auth)
        assert erased.status_code == 200, erased.text
        assert erased.json()["memory"]["studio_prompts"] >= 1
        studio = client.app.state.service.forgetters  # type: ignore[attr-defined]
        assert len(studio) == 1 and studio[0]("puramur", "studio-e1") == 0


def test_the_answers_conform_to_the_document(db_url: str, sql: Any) -> None:
    """Export, receipt and refusals, each validated against the served /openapi.json."""
    from test_openapi import Checked

    config = ServiceConfig(funnels=[PURAMUR], db=db_url,
                           model=f"scripted:{PURAMUR.parent / 'puramur' / 'demo.yaml'}",
                           api_keys={ERASER: frozenset({"erase"}),
                                     READER: frozenset({"converse", "read_state"})},
                           secret=b"erasure-secret-0123456789", rate_limit=(1000, 60.0),
                           reload=False)
    eraser, reader = {"Authorization": f"Bearer {ERASER}"}, {"Authorization": f"Bearer {READER}"}
    session, export = "/v1/funnels/{funnel}/sessions/{session}", \
        "/v1/funnels/{funnel}/sessions/{session}/export"
    with TestClient(create_app(config)) as client:
        check = Checked(client)
        assert client.post(f"{BASE}/sessions/c-1/messages", json={"text": "Hi!"},
                           headers=reader).status_code == 200
        assert check("GET", f"{BASE}/sessions/c-1/export", export,
                     headers=eraser).json()["messages"]
        assert check("GET", f"{BASE}/sessions/c-1/export", export,
                     headers=reader).status_code == 403
        assert check("DELETE", f"{BASE}/sessions/c-1", session, headers=reader).status_code == 403
        assert check("DELETE", f"{BASE}/sessions/c-1", session, headers=eraser).json()["total"]
        assert check("DELETE", f"{BASE}/sessions/c-1", session, headers=eraser).status_code == 404
        assert check("GET", f"{BASE}/sessions/c-1/export", export,
                     headers=eraser).status_code == 404
        assert check("DELETE", f"{BASE}/sessions/bad%20id", session,
                     headers=eraser).status_code == 400
