"""Follow-ups on stalled stages (docs/follow-ups.md): planned after each customer turn,
found by one indexed query, sent once per due time through the outbox, in the
customer's language, never in quiet hours, never after a reply, a take-over or an
opt-out. The clock is injected: the engine's for the turns, ``now`` for the scheduler.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import run_funnel, sql_runner
from follow_up_support import DAY, START, TEXTS, Clock, Receiver, outcomes, quiet_model, write_funnel

from engine.evidence.records import read_population
from engine.format.follow_up import QuietHours, is_opt_out
from engine.store import Inbound, open_store
from engine.studio.follow_up import fast_forward
from engine.studio.playground import Studio
from engine.studio.sql import transcript
from engine.turn import follow_up_webhook, manager
from engine.turn.engine import Engine
from engine.turn.follow_up import run_due
from engine.turn.invariants import check_funnel


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def funnel_file(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Path:
    return write_funnel(tmp_path_factory.mktemp("follow"), receiver.url)


@pytest.fixture(scope="module")
def schema(server_dsn: str) -> Any:
    from engine.store.connect import temporary_schema

    with temporary_schema(server_dsn, "t") as url:
        yield url


@pytest.fixture(scope="module")
async def world(schema: str, funnel_file: Path) -> AsyncIterator[tuple[Engine, Clock]]:
    clock = Clock()
    engine = await Engine.open(funnel_file, db=schema, model=quiet_model(), clock=clock)
    yield engine, clock
    await engine.close()


async def _say(world: tuple[Engine, Clock], session: str, text: str, at: datetime,
               chat: int | None = None) -> None:
    engine, clock = world
    clock.now = at
    if chat is None:
        await engine.handle(session, text)
        return
    # As the Telegram channel does: the message and its reply target committed first.
    key = f"{chat}:{at.timestamp()}"
    message_id = await engine.store.accept_message(
        engine.spec, session, text, Inbound("telegram", key), "test",
        {"reply_to": {"chat_id": chat}})
    await engine.handle(session, text, channel="telegram", key=key, message_id=message_id,
                        reply_to={"chat_id": chat, "key": key})


def _sent(schema: str, session: str) -> list[tuple[Any, ...]]:
    with sql_runner(schema) as run:
        return run("SELECT content, follow_up FROM funnel_messages WHERE session_id = %s AND "
                   "follow_up IS NOT NULL ORDER BY id", (session,))


# -- pure ------------------------------------------------------------------------------
def test_quiet_hours_release_at_their_end_in_the_zone() -> None:
    quiet = QuietHours(time(21, 0), time(9, 0), "Europe/Kyiv")
    night = datetime(2026, 12, 1, 20, 30, tzinfo=UTC)  # 22:30 in Kyiv (UTC+2)
    assert quiet.contains(night)
    assert quiet.release(night) == datetime(2026, 12, 2, 7, 0, tzinfo=UTC)
    noon = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    assert not quiet.contains(noon) and quiet.release(noon) == noon


@pytest.mark.parametrize("text,stop", [("Стоп!", True), ("STOP", True), ("Не пишіть мені.", True),
                                       ("wypisz mnie", True), ("don't stop", False),
                                       ("stop the lotion, add shampoo", False), ("досить", True)])
def test_a_stop_in_any_language_is_an_opt_out(text: str, stop: bool) -> None:
    assert is_opt_out(text, ["досить"]) is stop


# -- the scheduler ---------------------------------------------------------------------
async def test_one_reminder_after_a_day_in_the_customers_language(world: Any,
                                                                    schema: str) -> None:
    engine, _ = world
    await _say(world, "f-one", "Привіт, у мене кішка, шерсть випадає", START, chat=501)
    assert await run_due(engine, now=START + DAY - timedelta(minutes=1)) == []
    done = await run_due(engine, now=START + DAY + timedelta(minutes=1))
    assert [(d["session_id"], d["outcome"], d["language"], d["channel"]) for d in done] == [
        ("f-one", "sent", "uk", "telegram")]
    assert done[0]["text"].startswith("Привіт! Ми досі тут")
    assert await run_due(engine, now=START + 3 * DAY) == []  # max: 1
    stage = done[0]["stage"]
    assert _sent(schema, "f-one") == [(done[0]["text"], f"{stage}:0")]
    with sql_runner(schema) as run:
        # The outbox row the Telegram channel delivers, keyed by the due time.
        assert run("SELECT kind, payload->>'chat_id', idempotency_key FROM funnel_outbox "
                   "WHERE session_id = 'f-one' AND payload ? 'follow_up'") == [
            ("reply", "501", f"puramur:f-one:follow_up:{stage}:0:{(START + DAY).isoformat()}")]
        assert run("SELECT stage_after, follow_up->>'step', model FROM funnel_turns WHERE "
                   "session_id = 'f-one' AND follow_up IS NOT NULL") == [
            (stage, "0", "follow-up")]
    # The studio's transcript shows it as a follow-up, with the text sent.
    page = await transcript(engine.store, engine.spec, "f-one")
    assert [(t["follow_up"] or {}).get("step") for t in page["turns"]] == [None, 0]
    assert page["turns"][-1]["reply"] == done[0]["text"]
    # `funnel check-state`: a follow-up is a reply with its record, and no customer's.
    assert [v for v in await check_funnel(engine.funnel, schema)
            if v.session_id == "f-one"] == []
    # `funnel record` and `state --explain` read the customer's turns only.
    assert len(await engine.store.turn_records(engine.spec, "f-one")) == 1
    # `funnel replay` plays the customer's turns: the follow-up's record is not one.
    population = read_population(schema, "puramur", sessions=["f-one"])
    assert [len(x.turns) for x in population.sessions] == [1]


async def test_english_customer_gets_english(world: Any) -> None:
    engine, _ = world
    await _say(world, "f-en", "Hello, I have a cat with dry skin, what do you suggest?",
               START)
    done = await run_due(engine, now=START + DAY + timedelta(minutes=1))
    assert [d["text"] for d in done if d["session_id"] == "f-en"] == [TEXTS["en"]]


async def test_a_session_no_channel_reaches_goes_to_the_webhook_once(
        world: Any, receiver: Receiver) -> None:
    engine, _ = world
    later = START + 30 * DAY
    await _say(world, "f-hook", "Привіт, у мене собака", later)
    done = await run_due(engine, now=later + DAY + timedelta(minutes=1))
    [mine] = [d for d in done if d["session_id"] == "f-hook"]
    assert mine["channel"] == "webhook"
    assert await follow_up_webhook.deliver(engine.store, "puramur") >= 1
    assert await follow_up_webhook.deliver(engine.store, "puramur") == 0  # taken: once
    [(key, body)] = [(k, b) for k, b in receiver.got if b["session_id"] == "f-hook"]
    assert key == body["idempotency_key"] and key.startswith("puramur:f-hook:follow_up:")
    assert (body["text"], body["language"], body["step"]) == (mine["text"], "uk", 0)


async def test_none_after_a_reply_the_clock_starts_again(world: Any) -> None:
    engine, _ = world
    await _say(world, "f-reply", "Привіт, у мене собака", START)
    await _say(world, "f-reply", "Яка ціна шампуню?", START + timedelta(hours=4))
    assert outcomes(await run_due(engine, now=START + DAY + timedelta(minutes=1)), "f-reply") == []
    done = await run_due(engine, now=START + timedelta(hours=28, minutes=1))
    assert outcomes(done, "f-reply") == ["sent"]


async def test_none_after_a_takeover(world: Any) -> None:
    engine, _ = world
    await _say(world, "f-manager", "Привіт, у мене собака", START)
    await manager.take_over(engine, "f-manager", "Olena")
    assert outcomes(await run_due(engine, now=START + 2 * DAY), "f-manager") == []
    assert (await engine.store.follow_up_state("puramur", "f-manager"))["due_at"] is None


@pytest.mark.parametrize("stop", ["Стоп", "досить"])
async def test_none_ever_after_an_opt_out(world: Any, stop: str) -> None:
    engine, _ = world
    session = f"f-stop-{len(stop)}"
    await _say(world, session, "Привіт, у мене собака", START)
    await _say(world, session, stop, START + timedelta(hours=1))
    assert outcomes(await run_due(engine, now=START + 2 * DAY), session) == []
    await _say(world, session, "А втім, порадьте шампунь", START + 3 * DAY)
    assert outcomes(await run_due(engine, now=START + 5 * DAY), session) == []  # for good
    assert (await engine.store.follow_up_state("puramur", session))["opted_out"] is True


async def test_none_in_quiet_hours_sent_when_they_end(world: Any) -> None:
    engine, _ = world
    evening = datetime(2026, 12, 1, 20, 0, tzinfo=UTC)  # 22:00 in Kyiv
    await _say(world, "f-night", "Привіт, у мене собака", evening)
    due = evening + DAY
    assert outcomes(await run_due(engine, now=due), "f-night") == ["deferred"]
    assert outcomes(await run_due(engine, now=due + timedelta(hours=5)), "f-night") == []  # 03:00
    morning = datetime(2026, 12, 3, 7, 0, tzinfo=UTC)  # 09:00 in Kyiv
    assert outcomes(await run_due(engine, now=morning - timedelta(seconds=1)), "f-night") == []
    assert outcomes(await run_due(engine, now=morning), "f-night") == ["sent"]


async def test_exactly_one_with_two_workers(world: Any, schema: str,
                                            funnel_file: Path) -> None:
    engine, _ = world
    later = START + 10 * DAY
    await _say(world, "f-race", "Привіт, у мене собака", later, chat=777)
    other_store = await open_store(schema)
    other = await Engine.open(funnel_file, store=other_store, model=quiet_model())
    try:
        due = later + DAY + timedelta(minutes=1)
        a, b = await asyncio.gather(run_due(engine, now=due), run_due(other, now=due))
    finally:
        await other.close()
        await other_store.close()
    sent = [d for d in (*a, *b) if d["session_id"] == "f-race" and d["outcome"] == "sent"]
    assert len(sent) == 1
    assert len(_sent(schema, "f-race")) == 1
    with sql_runner(schema) as run:
        assert run("SELECT count(*) FROM funnel_outbox WHERE session_id = 'f-race' AND "
                   "payload ? 'follow_up'") == [(1,)]


async def test_dry_run_writes_nothing_and_the_cli_says_so(world: Any, schema: str,
                                                          funnel_file: Path) -> None:
    engine, _ = world
    later = START + 20 * DAY
    await _say(world, "f-dry", "Привіт, у мене собака", later)
    due = later + DAY + timedelta(minutes=1)
    assert [(d["session_id"], d["outcome"]) for d in await run_due(
        engine, now=due, dry_run=True)] == [("f-dry", "due")]
    assert _sent(schema, "f-dry") == []
    result = run_funnel("follow-up", str(funnel_file), "--db", schema, "--dry-run",
                        "--now", due.isoformat())
    assert result.returncode == 0 and "f-dry" in result.stdout and "due" in result.stdout
    result = run_funnel("follow-up", str(funnel_file), "--db", schema, "--now", "yesterday")
    assert result.returncode == 2 and "--now" in result.stderr
    result = run_funnel("follow-up", str(funnel_file), "--db", schema, "--limit", "0")
    assert result.returncode == 2 and "--limit" in result.stderr


async def test_studio_fast_forward_shows_the_follow_up_and_sends_none(
        world: Any, schema: str, funnel_file: Path) -> None:
    engine, _ = world
    studio = await Studio.open([funnel_file], db=schema)
    try:
        await studio.engine("puramur").handle("studio-ff", "Привіт, у мене собака")
        shown = await fast_forward(studio, "puramur", "studio-ff")
    finally:
        await studio.close()
    [step] = shown["steps"]
    assert (step["step"], step["holds"], step["language"]) == (0, True, "uk")
    assert step["text"].startswith("Привіт! Ми досі тут")
    due = datetime.fromisoformat(step["due_at"])
    assert due - datetime.fromisoformat(shown["anchor"]) == DAY
    # A playground session is planned nothing: no scheduler ever finds it.
    assert await engine.store.follow_up_state("puramur", "studio-ff") is None
    assert outcomes(await run_due(engine, now=due + DAY), "studio-ff") == []


async def test_none_after_a_handoff_or_an_erasure(world: Any, schema: str) -> None:
    engine, _ = world
    later = START + 40 * DAY
    for session in ("f-handed", "f-erased"):
        await _say(world, session, "Привіт, у мене собака", later)
    with sql_runner(schema) as run:  # handed off by a manager's tool, outside a turn
        run("UPDATE puramur_sessions_state SET handoff_triggered_at = NOW() "
            "WHERE session_id = 'f-handed'")
    await engine.store.erase_session(engine.spec, "f-erased", by="test")
    assert await engine.store.follow_up_state("puramur", "f-erased") is None
    done = await run_due(engine, now=later + 2 * DAY)
    assert [(d["outcome"], d.get("why")) for d in done if d["session_id"] == "f-handed"] == [
        ("cancelled", "the session was handed off")]
    assert outcomes(done, "f-erased") == []


async def test_the_next_step_is_the_first_under_its_max_computed_in_one_statement(
        world: Any, schema: str) -> None:
    store, at = world[0].store, START + 50 * DAY
    steps = [(3600.0, 1), (7200.0, 2)]

    async def touch(**kw: Any) -> tuple[Any, ...]:
        await store.follow_up_touch("puramur", "f-steps", "discovery", at, 7, steps, **kw)
        row = await store.follow_up_state("puramur", "f-steps")
        return row["step"], row["due_at"], row["opted_out"]

    def sent(counts: str) -> None:
        with sql_runner(schema) as run:
            run("UPDATE funnel_follow_ups SET sent = %s::jsonb WHERE session_id = 'f-steps'",
                (counts,))

    assert await touch() == (0, at + timedelta(hours=1), False)
    sent('{"discovery:0": 1}')  # the first step went out once: its max
    assert await touch() == (1, at + timedelta(hours=2), False)
    sent('{"discovery:0": 1, "discovery:1": 1}')  # the second may go out once more
    assert await touch() == (1, at + timedelta(hours=2), False)
    sent('{"discovery:0": 1, "discovery:1": 2}')  # every step at its max: none is due
    assert await touch() == (0, None, False)
    sent("{}")
    assert await touch(opted_out=True) == (0, None, True)
    assert await touch() == (0, None, True)  # an opt-out is for good
