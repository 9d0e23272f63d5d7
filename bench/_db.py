"""Shared by the benchmarks: which PostgreSQL to use, and a throwaway schema on it."""

from __future__ import annotations

from contextlib import AbstractContextManager

from engine.store.connect import temporary_schema
from engine.store.embedded import embedded_url


def server_url(url: str | None) -> str:
    """``url`` (from --db / FUNNEL_DB), else the embedded PostgreSQL."""
    return url or embedded_url()


def throwaway_schema(url: str) -> AbstractContextManager[str]:
    """A fresh schema for one benchmark run, dropped afterwards; yields a URL that uses it."""
    return temporary_schema(url, "bench")
