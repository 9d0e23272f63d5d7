"""Operations: readiness through a rolling migration, the trusted-proxy list, metrics that
exist from the start."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_support import record_fault, running
from starlette.testclient import TestClient

from engine.funnel.compiled import load_funnel
from engine.service.app import create_app
from engine.service.config import ServiceConfig
from engine.service.server import proxy_options
from engine.store import open_store

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
DEMO = ROOT / "funnels" / "puramur" / "demo.yaml"
KEY = "converse-key-3f9a1c77e2b4"
AUTH = {"Authorization": f"Bearer {KEY}"}
BASE = "/v1/funnels/puramur"

pytestmark = pytest.mark.postgres


def config(db_url: str, **overrides: Any) -> ServiceConfig:
    options: dict[str, Any] = {
        "funnels": [PURAMUR], "db": db_url, "model": f"scripted:{DEMO}",
        "api_keys": {KEY: frozenset({"admin"})}, "secret": b"test-secret-0123456789abcdef",
        "rate_limit": (1000, 60.0), "metrics_public": True,
    }
    options.update(overrides)
    return ServiceConfig(**options)


def next_version(tmp_path: Path) -> Path:
    """Puramur v+1: one more state field (what a rollout's `funnel migrate` adds)."""
    for folder in ("funnels", "prompts", "schemas"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    # A copy of the project: its funnels read ../prompts and ../schemas (engine.format.paths)
    (tmp_path / "pyproject.toml").write_text("", "utf-8")
    path = tmp_path / "funnels" / "puramur.yaml"
    text = path.read_text("utf-8").replace(
        "\nstate:\n", "\nstate:\n  source: {type: string, nullable: true, owner: engine}\n", 1)
    path.write_text(text, "utf-8")
    return path


async def test_migrate_under_a_running_server_keeps_it_ready(db_url: str, sql: Any,
                                                             tmp_path: Path) -> None:
    with TestClient(create_app(config(db_url))) as client:
        for n in range(8):
            r = client.post(f"{BASE}/sessions/m-{n % 2}/messages", json={"text": "Hi!"},
                            headers=AUTH)
            assert r.status_code == 200
        for _ in range(30):  # enough for psycopg to prepare it, were it prepared
            assert client.get(f"{BASE}/sessions/m-0", headers=AUTH).status_code == 200
        assert client.get("/readyz").status_code == 200
        store = await open_store(db_url)
        try:
            done = await store.migrate(load_funnel(next_version(tmp_path)).spec)
        finally:
            await store.close()
        assert "add column source" in done
        ready = client.get("/readyz")
        turns = [client.post(f"{BASE}/sessions/m-{n % 2}/messages", json={"text": "Hi!"},
                             headers=AUTH).status_code for n in range(6)]
        state = client.get(f"{BASE}/sessions/m-0", headers=AUTH)
    assert ready.status_code == 200, ready.text
    assert ready.json()["funnels"] == {"puramur": "ok"}
    assert "source" in ready.json()["notes"]["puramur"]
    assert turns == [200] * 6 and state.status_code == 200
    record_fault("funnel migrate adds a column under a running server", tried=6,
                 lost=turns.count(503), duplicated=0, readyz=ready.status_code)


def test_readyz_says_what_is_wrong_without_the_database_address(db_url: str,
                                                                tmp_path: Path) -> None:
    behind = next_version(tmp_path)
    with TestClient(create_app(config(db_url))) as client:  # the table: current version
        assert client.get("/readyz").status_code == 200
    with TestClient(create_app(config(db_url, funnels=[behind]))) as client:
        r = client.get("/readyz")
    assert r.status_code == 503 and "Retry-After" in r.headers
    assert "source" in r.json()["funnels"]["puramur"]
    assert "funnel migrate" in r.json()["funnels"]["puramur"]
    dead = "postgresql://postgres@127.0.0.1:9/secretdb?connect_timeout=1"
    with TestClient(create_app(config(dead, db_timeout=1.0))) as client:
        r = client.get("/readyz")
    assert r.status_code == 503
    assert "127.0.0.1" not in r.text and ":9" not in r.text and "secretdb" not in r.text
    assert r.json()["database"].startswith("unreachable")


def test_x_forwarded_for_is_believed_only_from_trusted_proxies(db_url: str) -> None:
    app = create_app(config(db_url, rate_limit=(3, 60.0)))
    with running(app, **proxy_options([])) as url:
        codes = [httpx.post(f"{url}{BASE}/widget/session",
                            headers={"X-Forwarded-For": f"10.0.0.{n}"}).status_code
                 for n in range(6)]
    assert codes == [200, 200, 200, 429, 429, 429]  # one client, whatever it claims
    app = create_app(config(db_url, rate_limit=(3, 60.0)))
    with running(app, **proxy_options(["127.0.0.1"])) as url:
        codes = [httpx.post(f"{url}{BASE}/widget/session",
                            headers={"X-Forwarded-For": f"10.0.0.{n}"}).status_code
                 for n in range(6)]
    assert codes == [200] * 6  # the trusted proxy's word: six clients
    assert ServiceConfig.from_env({"FUNNEL_SERVE_FUNNELS": str(PURAMUR),
                                   "FUNNEL_TRUSTED_PROXIES": "10.1.0.5, 10.1.0.6"}
                                  ).trusted_proxies == ["10.1.0.5", "10.1.0.6"]


def test_metrics_exist_from_the_start(db_url: str) -> None:
    with TestClient(create_app(config(db_url))) as client:
        text = client.get("/metrics").text
        client.post(f"{BASE}/sessions/x/messages", json={"text": "Hi!"}, headers=AUTH)
        after = client.get("/metrics").text
    for line in ('funnel_turns_total{funnel="puramur",stage="greeting"} 0',
                 'funnel_fallbacks_total{funnel="puramur",stage="presentation"} 0',
                 'funnel_requests_refused_total{funnel="puramur",reason="rate_limited"} 0',
                 'funnel_replays_total{channel="api",funnel="puramur"} 0',
                 'funnel_tokens_total{funnel="puramur",kind="prompt"} 0',
                 'funnel_cached_prompt_tokens_total{funnel="puramur"} 0',
                 'funnel_cache_write_tokens_total{funnel="puramur"} 0',
                 "funnel_turns_in_flight 0", "funnel_turns_queued 0",
                 'funnel_outbox_backlog{funnel="puramur"} 0'):
        assert line in text, line
    assert 'funnel_turns_total{funnel="puramur",stage="greeting"} 1' in after
    assert "funnel_model_seconds_bucket" in after
    assert 'funnel_tokens_total{funnel="puramur",kind="prompt"} 0' not in after
