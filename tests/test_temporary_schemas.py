"""Temporary schemas hold copies of customers' messages: none outlives its run.

`funnel simulate` (and `funnel replay --model`, `funnel test`) play in a schema
``funnel_tmp_<kind>_<unix time>_<random>`` (engine.store.connect). Real processes, real
signals: SIGTERM (what ``timeout``, systemd and CI send) mid-run drops the schema on
the way out; SIGKILL leaves it, and `funnel purge` / `funnel check-state` drop it once
it is stale, and say so. Also the bounds of ``-n`` and of the personas file, which is
read with the guarded YAML loader (aliases, nesting, size) every other loader uses.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import yaml
from conftest import PURAMUR, ROOT, run_funnel

from engine.store.connect import drop_stale_schemas, temporary_name, temporary_schema

pytestmark = [pytest.mark.postgres]
EVIDENCE = Path(__file__).with_name("evidence")
PERSONAS = EVIDENCE / "personas.yaml"
_TIME = re.compile(r"_([0-9]{10,})_")


def _schemas(dsn: str, like: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (like,)).fetchall()}


def _messages(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn) as conn:
        try:
            row = conn.execute(f'SELECT count(*) FROM "{schema}".funnel_messages').fetchone()
        except psycopg.Error:
            return 0
    return int(row[0]) if row else 0


def _slow_model(tmp_path: Path) -> Path:
    """The simulation's scripted funnel model, each call taking 0.2 s (a remote model)."""
    data = yaml.safe_load((EVIDENCE / "funnel_model.yaml").read_text("utf-8"))
    data["delay"] = 0.2
    path = tmp_path / "slow_model.yaml"
    path.write_text(yaml.safe_dump(data), "utf-8")
    return path


def _start(tmp_path: Path, db: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "simulate", str(PURAMUR), "--personas",
         str(PERSONAS), "--model", f"scripted:{_slow_model(tmp_path)}", "-n", "200",
         "--db", db],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)


def _mid_run(proc: subprocess.Popen[str], dsn: str, before: set[str]) -> str:
    """The run's temporary schema, once it holds customers' messages."""
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"simulate ended early: {proc.communicate()}")
        made = sorted(_schemas(dsn, "funnel%simulate%") - before)
        if made and _messages(dsn, made[0]) >= 4:
            return made[0]
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"no temporary schema with messages appeared: {proc.communicate()}")


def test_sigterm_mid_simulation_drops_its_schema(server_dsn: str, db_url: str,
                                                 tmp_path: Path) -> None:
    before = _schemas(server_dsn, "funnel%simulate%")
    proc = _start(tmp_path, db_url)
    try:
        schema = _mid_run(proc, server_dsn, before)
        assert schema.startswith("funnel_tmp_simulate_")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert "terminated; its temporary schema was dropped" in err
    assert "Traceback" not in err
    assert schema not in _schemas(server_dsn, "funnel%")


def test_sigkill_leaves_the_schema_and_purge_drops_it(server_dsn: str, db_url: str,
                                                      tmp_path: Path) -> None:
    before = _schemas(server_dsn, "funnel%simulate%")
    proc = _start(tmp_path, db_url)
    try:
        schema = _mid_run(proc, server_dsn, before)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert schema in _schemas(server_dsn, "funnel_tmp%")  # nothing ran on the way out
    assert _messages(server_dsn, schema) >= 4
    # An hour younger than stale: a purge now leaves it (a run may still be at work).
    assert schema not in drop_stale_schemas(server_dsn)
    # Killed two hours ago: the name carries the time it was made.
    aged = _TIME.sub(f"_{int(time.time()) - 7200}_", schema, count=1)
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'ALTER SCHEMA "{schema}" RENAME TO "{aged}"')
    done = run_funnel("purge", str(PURAMUR), "--older-than", "90d", "--dry-run", "--db", db_url)
    assert done.returncode == 0 and aged in done.stderr, done
    assert re.search(r"would drop \d+ stale temporary schema", done.stderr)
    assert aged in _schemas(server_dsn, "funnel_tmp%")  # a dry run changes nothing
    done = run_funnel("purge", str(PURAMUR), "--older-than", "90d", "--db", db_url)
    assert done.returncode == 0, done
    line = next(ln for ln in done.stderr.splitlines() if "stale temporary schema" in ln)
    assert re.match(r"dropped \d+ stale temporary schema\(s\) left by a killed ", line), line
    assert "simulate" in line and aged in line
    assert aged not in _schemas(server_dsn, "funnel_tmp%")


def test_check_state_drops_stale_schemas_and_leaves_live_ones(server_dsn: str, db_url: str
                                                              ) -> None:
    stale = temporary_name("replay", time.time() - 7200)
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{stale}"')
        conn.execute(f'CREATE TABLE "{stale}".funnel_messages (content text)')
        conn.execute(f"INSERT INTO \"{stale}\".funnel_messages VALUES ('Anna, 066 123 45 67')")
    # A run at work holds its schema: even past the hour, no sweep drops it.
    with temporary_schema(server_dsn, "funnel_tmp_simulate") as url:
        live = re.findall(r"search_path=(\w+)", url)[-1]
        run_funnel("migrate", str(PURAMUR), "--db", db_url)
        done = run_funnel("check-state", str(PURAMUR), "--db", db_url)
        assert done.returncode == 0, done
        assert re.search(r"dropped \d+ stale temporary schema\(s\) left by a killed .*replay",
                         done.stderr), done
        assert stale in done.stderr and live not in done.stderr
        assert live not in drop_stale_schemas(server_dsn, older_than=0)
        assert live in _schemas(server_dsn, "funnel_tmp%")
    assert stale not in _schemas(server_dsn, "funnel_tmp%")
    assert live not in _schemas(server_dsn, "funnel_tmp%")


@pytest.mark.parametrize("n", ["0", "-5", "10001", "100000000", "many"])
def test_simulate_refuses_a_count_out_of_bounds(n: str) -> None:
    done = run_funnel("simulate", str(PURAMUR), "--personas", str(PERSONAS), "-n", n, "--db",
                      "postgresql://nobody@127.0.0.1:1/none")
    assert done.returncode == 2
    assert "argument -n:" in done.stderr and "Traceback" not in done.stderr
    if n != "many":
        assert "from 1 to 10,000 conversations" in done.stderr


def _bounded(*args: str) -> subprocess.CompletedProcess[str]:
    """`funnel ARGS` in a process capped at 1 GB of memory and 60 s."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=60, preexec_fn=cap)


# Under 1 KB, 9^9 = 387 million values once its aliases are expanded: the persona's
# `knows` is told to the customer (Persona.brief), which expands it.
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n"
    for i in range(8)) + "personas:\n  - {name: bomb, script: [Hi], knows: {pet: *i}}\n"


@pytest.mark.parametrize(("name", "content", "says", "line"), [
    ("bomb.yaml", BOMB.encode(), "alias bomb", 6),
    ("deep.yaml", b"personas: " + b"[" * 5000 + b"]" * 5000 + b"\n", "levels deep", 1),
    ("binary.yaml", b"personas:\n  - name: x\n" + bytes(range(256)) * 4, "not UTF-8", 4),
    ("nul.yaml", b"personas:\n\x00\x00\x00", "NUL bytes", 2),
    ("twice.yaml", b"personas:\n  - name: a\n    script: [Hi]\npersonas: []\n",
     "duplicate key 'personas'", 4),
])
def test_a_hostile_personas_file_is_one_line_with_its_file(
        tmp_path: Path, db_url: str, name: str, content: bytes, says: str, line: int) -> None:
    assert len(content) < (1024 if name == "bomb.yaml" else 30_000)
    path = tmp_path / name
    path.write_bytes(content)
    done = _bounded("simulate", str(PURAMUR), "--personas", str(path), "--model",
                    "scripted:" + str(EVIDENCE / "funnel_model.yaml"), "-n", "1",
                    "--db", db_url)
    assert done.returncode == 1, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"funnel: error: {path}:{line}: "), lines[0]
    assert says in lines[0]


def test_an_endless_personas_file_is_refused_unread() -> None:
    done = _bounded("simulate", str(PURAMUR), "--personas", "/dev/zero", "-n", "1")
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip() == ("funnel: error: /dev/zero: the personas file is larger than "
                                   "16 MB; a personas file is a few kilobytes of YAML")
