"""Shared fixtures: a real PostgreSQL for every test that needs one.

``FUNNEL_TEST_DSN`` names a server (CI sets it to the machine's server); without
it the embedded PostgreSQL starts once per run in a temporary folder. Either
way each test gets its own schema, so tests never see each other's rows. A
database that cannot be reached fails the tests: it never skips them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
B2B = ROOT / "funnels" / "b2b_demo.yaml"

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _embedded(tmp: Path) -> str:
    from engine.store.embedded import embedded_url

    return embedded_url(tmp / "pgdata")


@pytest.fixture(scope="session")
def server_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The PostgreSQL the tests use: FUNNEL_TEST_DSN, else the embedded server."""
    dsn = os.environ.get("FUNNEL_TEST_DSN") or _embedded(tmp_path_factory.mktemp("pg"))
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        conn.execute("SELECT 1")
    return dsn


def with_search_path(dsn: str, schema: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, options=f"-csearch_path={schema}")


@pytest.fixture
def db_url(server_dsn: str) -> Iterator[str]:
    """A fresh, empty schema on the test server, as a connection URL."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield with_search_path(server_dsn, schema)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def sql(db_url: str) -> Iterator[Any]:
    """Run SQL in the test's schema: ``sql("SELECT ...", params)`` -> list of tuples."""
    conn = psycopg.connect(db_url, autocommit=True)

    def run(query: str, params: Any = None) -> list[tuple[Any, ...]]:
        cur = conn.execute(query.encode() if params is None else query, params)
        return cur.fetchall() if cur.description else []

    yield run
    conn.close()


@pytest.fixture(scope="session")
def puramur() -> Any:
    from engine.funnel import load_funnel

    return load_funnel(PURAMUR)


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Any]:
    from engine.store import open_store

    s = await open_store(db_url)
    yield s
    await s.close()


@pytest.fixture
def fake_llm() -> Iterator[Any]:
    """An OpenAI-compatible server on 127.0.0.1 (see tests/fake_openai.py), one per test.

    Queue behaviours with ``fake_llm.reply(text)``, ``.fail(500)``, ``.sleep(seconds)``;
    point a model at ``fake_llm.api_base``; read ``fake_llm.requests`` afterwards.
    """
    from fake_openai import FakeOpenAI

    server = FakeOpenAI().start()
    try:
        yield server
    finally:
        server.stop()
