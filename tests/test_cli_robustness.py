"""`funnel chat` takes hostile stdin line by line; `funnel check-state` finds broken rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import PURAMUR, ROOT, run_funnel

pytestmark = pytest.mark.postgres


def run_cli(*args: str, db_url: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "FUNNEL_DB": db_url, "PYTHONPATH": str(ROOT)}
    env.pop("FUNNEL_MODEL", None)
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=ROOT, env=env,
                          input=stdin, capture_output=True, timeout=180)


def test_chat_reports_a_bad_line_and_goes_on_with_the_next(db_url: str, tmp_path: Path,
                                                           sql: Any) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"default": {"reply": "Got it."}}))
    stdin = b"Hi\n" + b"a\x00b\n" + b"y" * 8001 + b"\n" + b"caf\xe9 au lait\n" + b"ok\n"
    done = run_cli("chat", str(PURAMUR), "--session", "cli-1", "--model",
                   f"scripted:{script}", db_url=db_url, stdin=stdin)
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "Traceback" not in err
    assert done.stdout.decode().splitlines() == ["Got it."] * 3
    assert "line 2 refused" in err and "NUL" in err
    assert "line 3 refused" in err and "8001 characters" in err
    assert "line 4 is not UTF-8" in err
    assert [r[0] for r in sql("SELECT content FROM funnel_messages WHERE role = 'user' "
                              "ORDER BY id")] == ["Hi", "caf\ufffd au lait", "ok"]


def test_check_state_finds_invalid_rows_and_unpaired_messages(db_url: str, tmp_path: Path,
                                                              sql: Any) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"default": {"reply": "Got it."}}))
    env: dict[str, str | None] = {"FUNNEL_DB": db_url, "FUNNEL_MODEL": None}
    # In process (conftest.run_funnel): this test is about what check-state finds.
    run_funnel("chat", str(PURAMUR), "--session", "ok-1", "--model", f"scripted:{script}",
               env=env, stdin=b"Hi\nI have a dog\n")
    clean = run_funnel("check-state", str(PURAMUR), env=env)
    assert clean.returncode == 0, clean.stderr
    assert "puramur: 0 error(s), 0 warning(s)" in clean.stdout

    sql("UPDATE puramur_sessions_state SET pet = '{\"age_years\": \"three\"}', "
        "notices = %s::jsonb", (json.dumps(["n" * 500] * 3),))
    sql("INSERT INTO funnel_messages (funnel, session_id, role, content) "
        "VALUES ('puramur', 'ok-1', 'assistant', 'orphan reply')")
    broken = run_funnel("check-state", str(PURAMUR), "--format", "json", env=env)
    assert broken.returncode == 1
    rules = {v["rule"] for v in json.loads(broken.stdout)}
    assert rules == {"invalid field", "notice too long", "reply without turn record"}


@pytest.mark.parametrize("command", ["replay", "report"])
def test_a_period_past_ten_years_is_a_usage_error(db_url: str, command: str) -> None:
    done = run_cli(command, str(PURAMUR), "--since", "99999999999d", db_url=db_url)
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err, err
    assert "longer than ten years (3650d)" in err
