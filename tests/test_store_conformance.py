"""One suite of store cases, run against every PostgreSQL backend the engine supports.

Like langgraph's checkpoint conformance suite: the same cases run against the
embedded PostgreSQL (always started here) and against the server named by
``FUNNEL_TEST_DSN``. Without ``FUNNEL_TEST_DSN`` the ``server`` case runs on the
embedded server too and its test id says so; nothing is ever skipped. Every
case gets a fresh schema.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import CliResult, run_funnel, sql_runner, temporary_schema

from engine.errors import ConcurrentUpdate
from engine.format.spec import FunnelSpec
from engine.funnel.compiled import CompiledFunnel, load_funnel
from engine.funnel.state import defaults, plain
from engine.store import OutboxItem, Store, TurnWrite, ddl, open_store
from engine.store.embedded import embedded_url

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
B2B = ROOT / "funnels" / "b2b_demo.yaml"
TABLE = "puramur_sessions_state"
SHARED = {ddl.MESSAGES, ddl.TURNS, ddl.OUTBOX, ddl.MIGRATIONS, ddl.LEASES, ddl.INBOUND,
          ddl.UNREACHABLE, ddl.KNOWLEDGE, ddl.KNOWLEDGE_SETS, ddl.KNOWLEDGE_TERMS,
          ddl.CONVERSIONS, ddl.VERSIONS, ddl.JOBS, ddl.EXITS, ddl.CONTROL, ddl.CONTROL_EVENTS,
          ddl.EMBEDDINGS, ddl.PLAYGROUND, ddl.FOLLOW_UPS}
DAY = 86400.0

SERVER_DSN = os.environ.get("FUNNEL_TEST_DSN")
# Without FUNNEL_TEST_DSN the server is the embedded one: the suite runs once, not twice.
BACKENDS = ["embedded", "server"] if SERVER_DSN else ["embedded"]

SQL = Callable[..., list[tuple[Any, ...]]]


# -- backends ----------------------------------------------------------------------------
@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The DSN of one backend: the embedded PostgreSQL, or FUNNEL_TEST_DSN's server."""
    if request.param == "server" and SERVER_DSN:
        dsn = SERVER_DSN
    else:
        dsn = embedded_url(tmp_path_factory.mktemp("embedded") / "pgdata")
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        conn.execute("SELECT 1")
    return dsn


@pytest.fixture
def url(backend: str) -> Iterator[str]:
    """A fresh, empty schema on the backend, as a connection string."""
    with temporary_schema(backend, "c") as schema_url:
        yield schema_url


@pytest.fixture
def db(url: str) -> Iterator[SQL]:
    """Plain SQL in the case's schema: ``db("SELECT ...", params)`` -> list of tuples."""
    with sql_runner(url) as run:
        yield run


@pytest.fixture
async def raw_store(url: str) -> AsyncIterator[Store]:
    """A store on the fresh schema, before ``ensure_schema``."""
    s = await open_store(url)
    yield s
    await s.close()


@pytest.fixture
async def store(raw_store: Store, spec: FunnelSpec) -> Store:
    await raw_store.ensure_schema(spec)
    return raw_store


@pytest.fixture(scope="module")
def funnel() -> CompiledFunnel:
    return load_funnel(PURAMUR)


@pytest.fixture(scope="module")
def spec(funnel: CompiledFunnel) -> FunnelSpec:
    return funnel.spec


@pytest.fixture(scope="module")
def other_spec() -> FunnelSpec:
    """A second funnel, for rows that must never mix with Puramur's."""
    return load_funnel(B2B).spec


# -- helpers -----------------------------------------------------------------------------
def state_values(spec: FunnelSpec, **changes: Any) -> dict[str, Any]:
    """Every column a save writes: the declared defaults plus the engine's columns."""
    values: dict[str, Any] = defaults(spec)
    values.update(stage=spec.initial, stage_iteration=0, turns=1, funnel_version=spec.version,
                  notices=[], stage_history=[{"stage": spec.initial,
                                              "entered_at": "2024-05-01T10:00:00+00:00"}])
    values.update(changes)
    return values


def turn_write(spec: FunnelSpec, session_id: str, expected: int, *, reply: str | None = "ok",
               outbox: list[OutboxItem] | None = None, error: str | None = None,
               **changes: Any) -> TurnWrite:
    values = state_values(spec, **changes)
    return TurnWrite(
        session_id=session_id, values=values, expected_version=expected, reply=reply,
        stage_after=values["stage"],
        turn={"stage_before": spec.initial, "stage_after": values["stage"], "transitions": [],
              "actions": [], "refused": [], "validation_failures": 0, "repaired": False,
              "fallback": error is not None, "llm_ms": 1, "turn_ms": 3, "prompt_tokens": 10,
              "completion_tokens": 5, "cost": None, "model": "conformance", "error": error},
        outbox=outbox or [],
    )


async def one_turn(store: Store, spec: FunnelSpec, session_id: str, text: str, *,
                   reply: str | None = "ok", outbox: list[OutboxItem] | None = None,
                   **changes: Any) -> int:
    """A whole turn through ``session()``: log + lock + load, then save."""
    async with store.session(spec, session_id) as access:
        _, row, _ = await access.load(6, text=text)
        expected = int(row["row_version"]) if row else 0
        return await access.save(turn_write(spec, session_id, expected, reply=reply,
                                            outbox=outbox, **changes))


def counts(db: SQL) -> tuple[int, int, int]:
    """(messages, turn records, outbox rows) in the schema."""
    [(m,)] = db(f"SELECT COUNT(*) FROM {ddl.MESSAGES}")
    [(t,)] = db(f"SELECT COUNT(*) FROM {ddl.TURNS}")
    [(o,)] = db(f"SELECT COUNT(*) FROM {ddl.OUTBOX}")
    return m, t, o


def tables(db: SQL) -> set[str]:
    return {r[0] for r in db("SELECT table_name FROM information_schema.tables "
                             "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'")}


# -- schema ------------------------------------------------------------------------------
async def test_ensure_schema_creates_the_tables_and_is_idempotent(raw_store: Store,
                                                                 spec: FunnelSpec,
                                                                 db: SQL) -> None:
    assert tables(db) == set()
    await raw_store.ensure_schema(spec)
    assert tables(db) == SHARED | {TABLE}
    columns = [r[0] for r in db("SELECT column_name FROM information_schema.columns WHERE "
                                "table_schema = current_schema() AND table_name = %s "
                                "ORDER BY ordinal_position", (TABLE,))]
    assert columns == [name for name, _ in ddl.column_defs(spec)]
    indexes = {r[0] for r in db("SELECT indexname FROM pg_indexes WHERE "
                                "schemaname = current_schema() AND tablename = %s", (TABLE,))}
    assert {ix.name for ix in spec.indexes} <= indexes
    applied = db(f"SELECT funnel, version, description FROM {ddl.MIGRATIONS} ORDER BY 1, 2")
    assert [v for f, v, _ in applied if f == ""] == list(range(1, len(ddl.SHARED_MIGRATIONS) + 1))

    await raw_store.ensure_schema(spec)
    assert tables(db) == SHARED | {TABLE}
    assert db(f"SELECT funnel, version, description FROM {ddl.MIGRATIONS} ORDER BY 1, 2") == \
        applied


@pytest.mark.parametrize("same_store", [True, False], ids=["one-store", "two-stores"])
async def test_ensure_schema_from_concurrent_tasks(url: str, spec: FunnelSpec, db: SQL,
                                                   same_store: bool) -> None:
    stores = [await open_store(url) for _ in range(1 if same_store else 2)]
    try:
        for _ in range(2):  # on an empty schema, then on a complete one
            # every task runs to its end before anything is checked or closed
            results = await asyncio.gather(*(stores[i % len(stores)].ensure_schema(spec)
                                             for i in range(2)), return_exceptions=True)
            assert results == [None, None]
    finally:
        for s in stores:
            await s.close()
    assert tables(db) == SHARED | {TABLE}
    shared = db(f"SELECT version FROM {ddl.MIGRATIONS} WHERE funnel = '' ORDER BY version")
    assert [v for (v,) in shared] == list(range(1, len(ddl.SHARED_MIGRATIONS) + 1))
    ours = db(f"SELECT version, description FROM {ddl.MIGRATIONS} WHERE funnel = %s "
              "ORDER BY version", (TABLE,))
    assert [v for v, _ in ours] == list(range(1, len(ours) + 1))
    assert len({d for _, d in ours}) == len(ours)  # every change recorded once
    assert f"v{spec.version}: create table {TABLE}" in {d for _, d in ours}


# -- the message log ---------------------------------------------------------------------
async def test_log_message_returns_increasing_ids_and_records_the_stage(
        store: Store, spec: FunnelSpec, db: SQL) -> None:
    first = await store.log_message(spec, "s1", "user", "Hi")
    second = await store.log_message(spec, "s1", "assistant", "Hello!")
    await store.save_turn(spec, turn_write(spec, "s1", 0, reply=None, stage="discovery"))
    third = await store.log_message(spec, "s1", "user", "I have a cat")
    other = await store.log_message(spec, "s2", "user", "Hey")
    assert all(isinstance(i, int) for i in (first, second, third, other))
    assert first < second < third < other
    assert db(f"SELECT id, session_id, role, content, stage FROM {ddl.MESSAGES} ORDER BY id") == [
        (first, "s1", "user", "Hi", "greeting"),  # a new session is in the initial stage
        (second, "s1", "assistant", "Hello!", "greeting"),
        (third, "s1", "user", "I have a cat", "discovery"),
        (other, "s2", "user", "Hey", "greeting"),
    ]


async def test_load_of_a_new_session(store: Store, spec: FunnelSpec, db: SQL) -> None:
    async with store.session(spec, "new") as access:
        message_id, row, messages = await access.load(6, text="Hello")
    assert row is None and messages == []
    assert db(f"SELECT id, role, content FROM {ddl.MESSAGES}") == [(message_id, "user", "Hello")]
    async with store.session(spec, "newer") as access:
        assert await access.load(6) == (0, None, [])
    assert await store.load(spec, "new") is None
    assert db(f"SELECT COUNT(*) FROM {TABLE}") == [(0,)]


# -- state rows --------------------------------------------------------------------------
ODD_TEXT = "Ганна \"Ann\" O'Neil \\ 🐾 日本 \u00e9\u0301 '; DROP TABLE x; --"


async def test_save_then_load_round_trips_every_column_type(store: Store, spec: FunnelSpec
                                                            ) -> None:
    when = "2024-05-01T10:15:30.123456+03:00"
    saved = {
        "stage": "cart_building", "stage_iteration": 2, "turns": 7,
        "stage_history": [{"stage": "greeting", "entered_at": "2024-05-01T10:00:00+00:00",
                           "exited_at": "2024-05-01T10:01:00+00:00"},
                          {"stage": "cart_building", "entered_at": "2024-05-01T10:01:00+00:00"}],
        "customer": {"name": ODD_TEXT, "phone": "+380661234567",
                     "nested": {"list": [1, 2.5, None, True, "ü"], "empty": {}}, "": "empty key"},
        "pet": {"type": "cat", "problems": ["dry_skin", "odor"], "age_years": 3.5},
        "presented_products": ["PR251010", "ПР-2"],
        "objections_raised": [],
        "cart": [{"sku": "PR251010", "qty": 2, "price": Decimal("449.50")}],
        "cart_item_count": 2, "cart_total": Decimal("899.00"), "discovery_completeness": 75,
        "cart_gift_eligible": True, "cart_free_delivery": False,
        "conversation_summary": ODD_TEXT, "detected_language": None, "response_language": "en",
        "handoff_channel": "telegram", "handoff_triggered_at": when, "handoff_reason": None,
        "notices": ["(engine) note ✓"],
    }
    version = await store.save_turn(spec, turn_write(spec, "rt", 0, **saved))  # type: ignore[arg-type]
    assert version == 1
    row = await store.load(spec, "rt")
    assert row is not None
    expected = {**saved, "cart": [{"sku": "PR251010", "qty": 2, "price": 449.5}],
                "cart_total": Decimal("899.00"),
                "handoff_triggered_at": datetime.fromisoformat(when)}
    for name, value in expected.items():
        assert row[name] == value, name
        assert type(row[name]) is type(value), name
    assert row["session_id"] == "rt" and row["row_version"] == 1
    assert row["funnel_version"] == spec.version
    assert isinstance(row["created_at"], datetime) and row["created_at"].tzinfo is not None

    # numeric(10,2) takes floats and Decimals and rounds to cents; NULL stays NULL.
    for i, (total, stored) in enumerate([(0.1 + 0.2, Decimal("0.30")),
                                         (Decimal("12345678.91"), Decimal("12345678.91")),
                                         (99.999, Decimal("100.00")), (7, Decimal("7.00"))]):
        await store.save_turn(spec, turn_write(spec, "rt", 1 + i, cart_total=total,
                                               handoff_triggered_at=None))
        row = await store.load(spec, "rt")
        assert row is not None and row["cart_total"] == stored
        assert str(row["cart_total"]) == str(stored)
        assert row["handoff_triggered_at"] == datetime.fromisoformat(when)  # write-once
        assert row["detected_language"] == "uk" and row["handoff_reason"] is None

    # the same row through the locked handle, as the JSON-friendly values the engine uses
    async with store.session(spec, "rt") as access:
        _, locked_row, _ = await access.load(0)
    assert locked_row is not None
    assert locked_row == plain(row)
    assert locked_row["cart_total"] == 7 and type(locked_row["cart_total"]) is int


async def test_a_write_once_field_keeps_its_first_value(store: Store, spec: FunnelSpec) -> None:
    first, later = "2024-05-01T10:00:00+00:00", "2024-06-01T10:00:00+00:00"
    assert {"handoff_triggered_at", "handoff_reason"} <= {
        n for n, f in spec.state.items() if f.write_once}
    v = await one_turn(store, spec, "w", "a", handoff_triggered_at=None, handoff_reason=None)
    v = await one_turn(store, spec, "w", "b", handoff_triggered_at=first,
                       handoff_reason="cart_confirmed")
    v = await one_turn(store, spec, "w", "c", handoff_triggered_at=later, handoff_reason="complaint")
    v = await store.save_turn(spec, turn_write(spec, "w", v, handoff_triggered_at=None,
                                               handoff_reason=None))
    assert v == 4
    row = await store.load(spec, "w")
    assert row is not None
    assert row["handoff_triggered_at"] == datetime.fromisoformat(first)
    assert row["handoff_reason"] == "cart_confirmed"


@pytest.mark.parametrize("path", ["save_turn", "session"])
async def test_a_stale_save_raises_and_writes_nothing(store: Store, spec: FunnelSpec, db: SQL,
                                                      path: str) -> None:
    box = [OutboxItem(key="k-stale", kind="handoff", payload={"x": 1})]
    assert await one_turn(store, spec, "s", "one", pet={"type": "cat"}) == 1
    assert await one_turn(store, spec, "s", "two", pet={"type": "dog"}) == 2
    before = db(f"SELECT * FROM {TABLE}")
    before_counts = counts(db)

    for expected in (1, 0, 5):  # older, "new session", and a version never seen
        write = turn_write(spec, "s", expected, reply="stale reply", outbox=box,
                           pet={"type": "stale"}, error="stale turn")
        with pytest.raises(ConcurrentUpdate) as info:
            if path == "save_turn":
                await store.save_turn(spec, write)
            else:
                async with store.session(spec, "s") as access:
                    await access.load(6)
                    await access.save(write)
        assert info.value.session_id == "s" and info.value.expected == expected
        assert "'s'" in str(info.value)
        assert db(f"SELECT * FROM {TABLE}") == before
        assert counts(db) == before_counts  # no reply, no turn record, no outbox row
    assert db(f"SELECT COUNT(*) FROM {ddl.MESSAGES} WHERE content = 'stale reply'") == [(0,)]

    # the session is not left locked: the next turn goes through
    assert await one_turn(store, spec, "s", "three") == 3


async def test_a_save_never_brings_back_a_deleted_session(store: Store, spec: FunnelSpec,
                                                          db: SQL) -> None:
    assert await one_turn(store, spec, "gone", "one") == 1
    db(f"DELETE FROM {TABLE} WHERE session_id = 'gone'")  # purged while a turn ran
    write = turn_write(spec, "gone", 1, reply="late reply")
    with pytest.raises(ConcurrentUpdate):
        await store.save_turn(spec, write)
    assert db(f"SELECT COUNT(*) FROM {TABLE}") == [(0,)]
    assert db(f"SELECT COUNT(*) FROM {ddl.MESSAGES} WHERE content = 'late reply'") == [(0,)]


# -- the message window ------------------------------------------------------------------
async def test_the_message_window_is_the_last_n_before_the_current_message(
        store: Store, spec: FunnelSpec, other_spec: FunnelSpec, db: SQL,
        monkeypatch: pytest.MonkeyPatch) -> None:
    await store.ensure_schema(other_spec)
    m = ddl.MESSAGES

    def noise(tag: str) -> None:  # same session id in another funnel, another session here
        db(f"INSERT INTO {m} (funnel, session_id, role, content) SELECT f, s, r, %s || g "
           "FROM generate_series(1, 300) g, (VALUES (%s, 'w'), (%s, 'w-other')) x(f, s), "
           "(VALUES ('user'), ('assistant')) y(r)", (tag, other_spec.name, spec.name))

    noise("early-")
    db(f"INSERT INTO {m} (funnel, session_id, role, content) SELECT %s, 'w', "
       "CASE WHEN g %% 2 = 1 THEN 'user' ELSE 'assistant' END, 'm' || g "
       "FROM generate_series(1, 2000) g", (spec.name,))
    noise("late-")
    ours = [(f"m{i}", "user" if i % 2 else "assistant") for i in range(1, 2001)]

    fetched: list[int] = []
    original = psycopg.AsyncCursor.fetchall

    async def spy(self: psycopg.AsyncCursor[Any]) -> list[Any]:
        rows = await original(self)
        assert self.pgresult is not None
        fetched.append(self.pgresult.ntuples)  # what the server sent, before any slicing
        return rows

    monkeypatch.setattr(psycopg.AsyncCursor, "fetchall", spy)
    for window in (6, 1):
        fetched.clear()
        async with store.session(spec, "w") as access:
            current, row, messages = await access.load(window, text=f"now-{window}")
        assert row is None
        # oldest first; the window is applied in SQL (the turn's first statement
        # returns it as one JSON array, and the handle does not slice it)
        assert [(msg.content, msg.role) for msg in messages] == ours[-window:]
        assert fetched == []
        noise(f"after-{window}-")  # later messages of others never enter the window
        ours.append((f"now-{window}", "user"))

        # a retried turn reads the window again around its own, already logged message
        async with store.session(spec, "w") as access:
            again_id, _, again = await access.load(window, current_id=current)
        assert again_id == current
        assert [(msg.content, msg.role) for msg in again] == ours[-window - 1:-1]
        assert fetched == []

    async with store.session(spec, "w") as access:
        assert (await access.load(0, text="no window"))[2] == []


# -- session ids -------------------------------------------------------------------------
ODD_IDS = ["it's", 'say "hi"', "back\\slash", "\\'; DELETE FROM puramur_sessions_state; --",
           "%", "_", "victim%", "VICTIM", "victim ", " victim", "ünï-日本-🐈",
           "x" * 200, "я" * 200, "🐈" * 200, "tab\there\nnewline"]


async def test_odd_session_ids_are_stored_as_is_and_touch_no_other_row(
        store: Store, spec: FunnelSpec, db: SQL) -> None:
    await one_turn(store, spec, "victim", "hello", pet={"name": "victim"})
    victim = db(f"SELECT * FROM {TABLE} WHERE session_id = 'victim'")
    for sid in ODD_IDS:
        assert await store.load(spec, sid) is None
        assert await one_turn(store, spec, sid, f"text of {sid}", pet={"name": sid}) == 1
        assert await one_turn(store, spec, sid, "again", pet={"name": sid}) == 2
        await store.log_message(spec, sid, "user", sid)
    rows = dict(db(f"SELECT session_id, pet->>'name' FROM {TABLE}"))
    assert rows == {"victim": "victim", **{sid: sid for sid in ODD_IDS}}
    assert db(f"SELECT * FROM {TABLE} WHERE session_id = 'victim'") == victim
    for sid in ODD_IDS:
        row = await store.load(spec, sid)
        assert row is not None and row["session_id"] == sid and row["row_version"] == 2
        history = await store.history(spec, sid, 10)
        assert [h["content"] for h in history] == [f"text of {sid}", "ok", "again", "ok", sid]
    per_session = dict(db(f"SELECT session_id, COUNT(*) FROM {ddl.MESSAGES} GROUP BY 1"))
    assert per_session == {"victim": 2, **{sid: 5 for sid in ODD_IDS}}
    turns = dict(db(f"SELECT session_id, COUNT(*) FROM {ddl.TURNS} GROUP BY 1"))
    assert turns == {"victim": 1, **{sid: 2 for sid in ODD_IDS}}


# -- the outbox --------------------------------------------------------------------------
async def test_the_same_idempotency_key_yields_one_outbox_row(store: Store, spec: FunnelSpec,
                                                              db: SQL) -> None:
    first = OutboxItem(key="puramur:o:handoff", kind="handoff", payload={"n": 1, "t": ODD_TEXT})
    again = OutboxItem(key="puramur:o:handoff", kind="handoff", payload={"n": 2})
    await one_turn(store, spec, "o", "a", outbox=[first])
    await one_turn(store, spec, "o", "b", outbox=[again])
    await store.save_turn(spec, turn_write(spec, "o", 2, outbox=[again, again]))
    rows = db(f"SELECT idempotency_key, funnel, session_id, kind, payload FROM {ddl.OUTBOX}")
    assert rows == [("puramur:o:handoff", "puramur", "o", "handoff", {"n": 1, "t": ODD_TEXT})]


async def test_a_failed_delivery_is_retried_later(store: Store, spec: FunnelSpec,
                                                  other_spec: FunnelSpec, db: SQL) -> None:
    await one_turn(store, spec, "f", "a", outbox=[OutboxItem("k1", "handoff", {"a": 1}),
                                                   OutboxItem("k2", "hook", {"b": 2})])
    assert await store.claim_outbox(other_spec.name) == []
    assert await store.claim_outbox(spec.name, "someone else") == []
    claimed = await store.claim_outbox(spec.name, "f")
    assert [(c["idempotency_key"], c["kind"], c["payload"], c["attempts"]) for c in claimed] == [
        ("k1", "handoff", {"a": 1}, 1), ("k2", "hook", {"b": 2}, 1)]
    assert await store.claim_outbox(spec.name) == []  # claimed rows are not due

    ok, failed = claimed
    await store.finish_outbox(ok["id"], None)
    await store.finish_outbox(failed["id"], "CRM said 502 " + "x" * 5000)
    [(delivered, error)] = db(f"SELECT delivered_at, last_error FROM {ddl.OUTBOX} WHERE id = %s",
                              (ok["id"],))
    assert delivered is not None and error is None
    [(delivered, error, delay)] = db(
        f"SELECT delivered_at, last_error, EXTRACT(EPOCH FROM next_attempt_at - NOW()) "
        f"FROM {ddl.OUTBOX} WHERE id = %s", (failed["id"],))
    assert delivered is None and error.startswith("CRM said 502") and len(error) <= 1000
    assert 5 < delay <= 3600  # pushed into the future, with backoff

    db(f"UPDATE {ddl.OUTBOX} SET next_attempt_at = NOW() - INTERVAL '1 s'")  # time passes
    [retry] = await store.claim_outbox()
    assert retry["id"] == failed["id"] and retry["attempts"] == 2


async def test_concurrent_claimers_never_get_the_same_row(url: str, store: Store,
                                                          spec: FunnelSpec, db: SQL) -> None:
    n = 60
    for i in range(n // 6):
        await store.save_turn(spec, turn_write(spec, f"c{i}", 0, outbox=[
            OutboxItem(f"c{i}:{j}", "hook", {"i": i, "j": j}) for j in range(6)]))
    others = [await open_store(url) for _ in range(2)]
    try:
        claimers = [store, *others]
        rounds = [await asyncio.gather(*(claimers[k % 3].claim_outbox(limit=7)
                                         for k in range(24))) for _ in range(2)]
    finally:
        for s in others:
            await s.close()
    ids = [row["id"] for batch in rounds for rows in batch for row in rows]
    assert len(ids) == len(set(ids))  # nobody got a row twice
    assert sorted(ids) == [r[0] for r in db(f"SELECT id FROM {ddl.OUTBOX} ORDER BY id")]
    assert db(f"SELECT DISTINCT attempts FROM {ddl.OUTBOX}") == [(1,)]


# -- purge -------------------------------------------------------------------------------
async def _sessions(store: Store, spec: FunnelSpec, db: SQL, idle: list[str], fresh: list[str]
                    ) -> None:
    for sid in idle + fresh:
        await one_turn(store, spec, sid, f"my name is {sid}",
                       customer={"name": f"Name {sid}", "phone": "+380661234567"},
                       pet={"type": "cat"}, conversation_summary=f"{sid} has a cat",
                       outbox=[OutboxItem(f"{sid}:handoff", "handoff", {
                           "session_id": sid, "state": {"customer": {"name": f"Name {sid}"},
                                                        "pet": {"type": "cat"}}})])
    db(f"UPDATE {TABLE} SET last_message_at = NOW() - INTERVAL '400 days' "
       "WHERE session_id = ANY(%s)", (idle,))


@asynccontextmanager
async def _count_transactions(store: Store, monkeypatch: pytest.MonkeyPatch
                              ) -> AsyncIterator[list[int]]:
    """Count the store's short connections (each purge batch is one)."""
    calls: list[int] = []
    original = store._conn  # type: ignore[attr-defined]

    def counting() -> Any:
        calls.append(1)
        return original()

    monkeypatch.setattr(store, "_conn", counting)
    yield calls
    monkeypatch.setattr(store, "_conn", original)


async def test_purge_deletes_idle_sessions_with_their_rows_in_batches(
        store: Store, spec: FunnelSpec, other_spec: FunnelSpec, db: SQL,
        monkeypatch: pytest.MonkeyPatch) -> None:
    idle = [f"idle-{i}" for i in range(5)]
    fresh = ["fresh-1", "fresh-2"]
    await _sessions(store, spec, db, idle, fresh)
    await store.ensure_schema(other_spec)  # the same session id in another funnel is kept
    await store.log_message(other_spec, "idle-0", "user", "other funnel")

    async with _count_transactions(store, monkeypatch) as calls:
        done = await store.purge(spec, 365 * DAY, batch=2)
    assert done == {"sessions": 5, "messages": 10, "turns": 5}
    assert len(calls) == 6  # batches of 2, 2, 1, one that finds nothing; keys expire

    assert sorted(r[0] for r in db(f"SELECT session_id FROM {TABLE}")) == fresh
    for table in (ddl.MESSAGES, ddl.TURNS, ddl.OUTBOX):
        left = db(f"SELECT DISTINCT funnel, session_id FROM {table} ORDER BY 1, 2")
        extra = [(other_spec.name, "idle-0")] if table == ddl.MESSAGES else []
        assert left == extra + [(spec.name, s) for s in fresh], table
    assert await store.purge(spec, 365 * DAY, batch=2) == {"sessions": 0, "messages": 0,
                                                            "turns": 0}
    assert await store.purge(spec, 0.0) == {"sessions": 2, "messages": 4, "turns": 2}


async def test_purge_takes_the_messages_of_sessions_that_never_saved_a_turn(
        store: Store, spec: FunnelSpec, other_spec: FunnelSpec, db: SQL) -> None:
    # A message is logged before its turn runs; a turn that failed before its save (the
    # database went away, the process died) leaves messages with no state row.
    await store.ensure_schema(other_spec)
    for sid, funnel in (("orphan-old", spec), ("orphan-new", spec), ("orphan-old", other_spec)):
        await store.log_message(funnel, sid, "user", f"my phone is +38066 ({sid})")
        await store.log_message(funnel, sid, "user", "hello?")
    db(f"UPDATE {ddl.MESSAGES} SET created_at = NOW() - INTERVAL '400 days' "
       "WHERE session_id = 'orphan-old'")
    await _sessions(store, spec, db, [], ["fresh"])

    anonymized = await store.purge(spec, 365 * DAY, anonymize=True, batch=1)
    assert anonymized == {"sessions": 0, "messages": 2, "turns": 0}
    rows = db(f"SELECT funnel, session_id, content FROM {ddl.MESSAGES} "
              "WHERE session_id LIKE 'orphan%%' ORDER BY id")
    assert [r for r in rows if r[:2] == (spec.name, "orphan-old")] == [
        (spec.name, "orphan-old", "[anonymized]")] * 2
    assert all("[anonymized]" not in r[2] for r in rows if r[:2] != (spec.name, "orphan-old"))
    assert await store.purge(spec, 365 * DAY, anonymize=True) == {
        "sessions": 0, "messages": 0, "turns": 0}  # done once

    assert await store.purge(spec, 365 * DAY, batch=1) == {
        "sessions": 0, "messages": 2, "turns": 0}
    left = db(f"SELECT DISTINCT funnel, session_id FROM {ddl.MESSAGES} ORDER BY 1, 2")
    assert left == sorted([(other_spec.name, "orphan-old"), (spec.name, "orphan-new"),
                           (spec.name, "fresh")])


def _snapshot(db: SQL) -> list[Any]:
    return [db(f"SELECT * FROM {TABLE} ORDER BY session_id"),
            db(f"SELECT * FROM {ddl.MESSAGES} ORDER BY id"),
            db(f"SELECT * FROM {ddl.TURNS} ORDER BY id"),
            db(f"SELECT * FROM {ddl.OUTBOX} ORDER BY id")]


async def test_purge_anonymize_clears_personal_data_and_keeps_the_rows(
        url: str, store: Store, spec: FunnelSpec, db: SQL) -> None:
    assert [n for n, f in spec.state.items() if f.personal] == ["customer"]
    idle, fresh = ["idle-1", "idle-2", "idle-3"], ["fresh"]
    await _sessions(store, spec, db, idle, fresh)
    db(f"UPDATE {ddl.TURNS} SET error = 'at $.updates.customer.phone: ' || session_id, "
       "explain = jsonb_build_array(jsonb_build_object('phone', session_id)), "
       "raw_output = jsonb_build_array('{\"reply\": \"hi ' || session_id || '\"}')")
    before = _snapshot(db)

    done = await store.purge(spec, 365 * DAY, anonymize=True, batch=2)
    assert done == {"sessions": 3, "messages": 6, "turns": 0}
    rows = {r[0]: r[1:] for r in db(f"SELECT session_id, customer, pet, row_version FROM {TABLE}")}
    assert rows == {**{s: ({}, {"type": "cat"}, 2) for s in idle},  # a stale save loses
                    "fresh": ({"name": "Name fresh", "phone": "+380661234567"},
                              {"type": "cat"}, 1)}
    messages = db(f"SELECT session_id, role, content FROM {ddl.MESSAGES} ORDER BY id")
    assert len(messages) == 8
    for sid, role, content in messages:
        if sid in idle:
            assert content == "[anonymized]"
        else:
            assert content in ("my name is fresh", "ok")
        assert role in ("user", "assistant")
    assert db(f"SELECT COUNT(*) FROM {ddl.TURNS}") == [(4,)]
    errors = dict(db(f"SELECT session_id, error FROM {ddl.TURNS}"))  # may quote the customer
    assert errors == {**{s: "[anonymized]" for s in idle},
                      "fresh": "at $.updates.customer.phone: fresh"}
    # So may the model's raw output and the values an explanation read.
    kept = {r[0]: r[1:] for r in db(f"SELECT session_id, explain, raw_output FROM {ddl.TURNS}")}
    assert kept == {**{s: (None, None) for s in idle},
                    "fresh": ([{"phone": "fresh"}], ['{"reply": "hi fresh"}'])}
    summaries = dict(db(f"SELECT session_id, conversation_summary FROM {TABLE}"))
    assert summaries == {**{s: "" for s in idle}, "fresh": "fresh has a cat"}  # retold messages
    payloads = dict(db(f"SELECT session_id, payload::text FROM {ddl.OUTBOX}"))
    for sid in idle:  # the outbox's copy of the state holds the customer too
        assert f"Name {sid}" not in payloads[sid] and '"pet"' in payloads[sid]
    assert "Name fresh" in payloads["fresh"]

    after = _snapshot(db)
    assert after != before
    assert await store.purge(spec, 365 * DAY, anonymize=True, batch=2) == {
        "sessions": 0, "messages": 0, "turns": 0}
    assert _snapshot(db) == after  # a second anonymize changes nothing

    # the command line does the same
    db(f"UPDATE {TABLE} SET last_message_at = NOW() - INTERVAL '40 days' "
       "WHERE session_id = 'fresh'")
    no_db: dict[str, str | None] = {"FUNNEL_DB": None}  # in process (conftest.run_funnel)
    dry = run_funnel("purge", str(PURAMUR), "--older-than", "30d", "--anonymize", "--dry-run",
                     "--db", url, env=no_db)
    assert dry.stdout.strip() == ("would anonymize 1 session(s) idle for more than 30 days: "
                                  "2 message(s)"), dry.stdout + dry.stderr
    assert db(f"SELECT customer FROM {TABLE} WHERE session_id = 'fresh'") != [({},)]
    cli = run_funnel("purge", str(PURAMUR), "--older-than", "30d", "--anonymize", "--db", url,
                     env=no_db)
    assert cli.returncode == 0, cli.stderr
    assert "would anonymize 1 session(s)" in cli.stderr  # counted before it is done
    assert "anonymized 1 session(s)" in cli.stdout and "2 message(s)" in cli.stdout
    assert db(f"SELECT customer FROM {TABLE} WHERE session_id = 'fresh'") == [({},)]
    assert db(f"SELECT COUNT(*) FROM {TABLE}") == [(4,)]


def test_each_backend_is_the_one_it_names(backend: str, request: pytest.FixtureRequest
                                           ) -> None:
    """"embedded" is the embedded server (a Unix socket); "server" is FUNNEL_TEST_DSN if set."""
    host = str(psycopg.conninfo.conninfo_to_dict(backend).get("host") or "")
    name = request.node.callspec.params["backend"]
    if name == "embedded" or not SERVER_DSN:
        assert host.startswith("/")
    else:
        assert backend == SERVER_DSN
    with psycopg.connect(backend) as conn:
        assert conn.execute("SELECT 1").fetchall() == [(1,)]


def test_purge_counts_first_and_creates_nothing(url: str, db: SQL) -> None:
    def purge(*args: str) -> CliResult:  # in process (conftest.run_funnel)
        return run_funnel("purge", str(PURAMUR), "--db", url, *args, env={"FUNNEL_DB": None})

    tables = "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"
    before = db(tables)
    empty = purge("--older-than", "1s")
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.startswith("nothing to purge: table puramur_sessions_state does not")
    assert db(tables) == before  # nothing was created
    dry = purge("--older-than", "1s", "--dry-run")
    assert dry.returncode == 0 and "nothing to purge" in dry.stdout
