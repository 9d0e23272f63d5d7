"""Shared by the benchmarks: which PostgreSQL to use, and a throwaway schema on it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


def server_url(url: str | None) -> str:
    """``url`` (from --db / FUNNEL_DB), else the embedded PostgreSQL."""
    if url:
        return url
    from engine.store.embedded import embedded_url

    return embedded_url()


@contextmanager
def throwaway_schema(url: str) -> Iterator[str]:
    """A fresh schema for one benchmark run, dropped afterwards; yields a URL that uses it."""
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}".encode())
    try:
        yield psycopg.conninfo.make_conninfo(url, options=f"-csearch_path={schema}")
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE".encode())
