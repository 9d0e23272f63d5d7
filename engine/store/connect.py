"""Connection helpers the store's modules share: URLs fit for messages, temporary schemas."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from ..errors import StoreError, StoreUnavailable, first_line
from .embedded import embedded_url


def safe_url(url: str) -> str:
    """``host:port/dbname`` of a connection URL: no user, no password, for error messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "the given database URL"
    host = info.get("host") or "localhost"
    return f"{host}:{info.get('port') or 5432}/{info.get('dbname') or ''}"


def with_search_path(url: str, schema: str) -> str:
    """``url`` with ``schema`` first on its search path (keeping any other ``options``)."""
    options = psycopg.conninfo.conninfo_to_dict(url).get("options")
    path = f"-csearch_path={schema}"
    return psycopg.conninfo.make_conninfo(url, options=f"{options} {path}" if options else path)


@contextmanager
def temporary_schema(url: str | None, prefix: str = "funnel_test") -> Iterator[str]:
    """Create the schema ``<prefix>_<random>``; yield a URL whose search_path is it; drop it
    with everything in it afterwards.

    ``url`` ``None`` is the embedded server. `funnel test` plays its scenarios in
    one; the tests and the benchmarks use it too.

    Raises:
        StoreUnavailable: the server cannot be reached.
        StoreError: the schema cannot be created (no CREATE privilege on the database).
    """
    url = url or embedded_url()
    schema = f"{prefix}_{secrets.token_hex(6)}"
    try:
        admin = psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL at {safe_url(url)}: "
                               f"{first_line(exc)}; check --db / FUNNEL_DB") from None
    with admin:
        try:
            admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        except psycopg.Error as exc:
            raise StoreError(f"cannot create the temporary schema {schema}: {first_line(exc)}; "
                             "it needs the CREATE privilege on the database") from None
        try:
            yield with_search_path(url, schema)
        finally:
            try:
                admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
            except psycopg.Error as exc:
                print(f"warning: could not drop the temporary schema {schema}: "
                      f"{first_line(exc)}; drop it by hand", file=sys.stderr)
