"""Shared fixtures: a real PostgreSQL for every test that needs one.

``FUNNEL_TEST_DSN`` names a server (CI sets it to the machine's server); without
it the embedded PostgreSQL starts once per run in a temporary folder. Either
way each test gets its own schema, so tests never see each other's rows. A
database that cannot be reached fails the tests: it never skips them.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
B2B = ROOT / "funnels" / "b2b_demo.yaml"

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# Tests copy the reference funnels into temporary folders that point back at the
# repository's prompts and schemas: the operator's FUNNEL_ROOT lets them read there.
os.environ.setdefault("FUNNEL_ROOT", str(ROOT))


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


@contextmanager
def fresh_schema(dsn: str, prefix: str = "t") -> Iterator[str]:
    """A new, empty schema on ``dsn`` for one test, dropped afterwards; yields its URL."""
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield with_search_path(dsn, schema)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@contextmanager
def sql_runner(url: str) -> Iterator[Any]:
    """``run("SELECT ...", params)`` -> list of tuples, on one autocommit connection."""
    conn = psycopg.connect(url, autocommit=True)

    def run(query: str, params: Any = None) -> list[tuple[Any, ...]]:
        cur = conn.execute(query.encode() if params is None else query, params)
        return cur.fetchall() if cur.description else []

    try:
        yield run
    finally:
        conn.close()


def seed_queries() -> dict[str, str]:
    """The seed's five observability queries (section 08), verbatim, by name."""
    text = (Path(__file__).with_name("seed_queries.sql")).read_text("utf-8")
    parts = re.split(r"^-- query: (\w+)\n", text, flags=re.M)[1:]
    queries = dict(zip(parts[::2], (p.strip() for p in parts[1::2]), strict=True))
    assert len(queries) == 5
    return queries


@pytest.fixture
def db_url(server_dsn: str) -> Iterator[str]:
    """A fresh, empty schema on the test server, as a connection URL."""
    with fresh_schema(server_dsn) as url:
        yield url


@pytest.fixture
def sql(db_url: str) -> Iterator[Any]:
    """Run SQL in the test's schema: ``sql("SELECT ...", params)`` -> list of tuples."""
    with sql_runner(db_url) as run:
        yield run


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
