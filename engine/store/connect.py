"""Connection helpers the store's modules share: URLs fit for messages, temporary schemas."""

from __future__ import annotations

import re
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

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


# The temporary schemas the engine's own commands play in (`funnel test`, `funnel replay
# --model`, `funnel simulate`, the studio's "Run scenarios"): ``funnel_tmp_<kind>_<unix
# time>_<random>``. The name says when it was made; while its process lives, that process
# holds the schema's advisory lock. A process killed outright (SIGKILL, a machine lost)
# leaves its schema, with copies of customers' messages: `funnel purge` and `funnel
# check-state` drop those (:func:`drop_stale_schemas`).
TEMPORARY = "funnel_tmp"
STALE_AFTER = 3600.0  # seconds: a schema this old whose process is gone is left over
_TEMPORARY_NAME = re.compile(rf"^{TEMPORARY}_([a-z]+)_([0-9]{{10,}})_[0-9a-f]+$")
_HOLD = "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))"
_UNHOLD = "SELECT pg_advisory_unlock(hashtextextended(%s, 0))"


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, systemd, CI) while the main thread held a temporary schema:
    raised like Ctrl-C's ``KeyboardInterrupt`` so that the work unwinds and every
    ``finally`` runs (the schema is dropped); the CLI exits ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"terminated by signal {signum}")


def temporary_name(kind: str, at: float | None = None) -> str:
    """A new temporary schema's name, ``funnel_tmp_<kind>_<unix time>_<random>``."""
    return f"{TEMPORARY}_{kind}_{int(time.time() if at is None else at)}_{secrets.token_hex(6)}"


@contextmanager
def temporary_schema(url: str | None, prefix: str = f"{TEMPORARY}_test") -> Iterator[str]:
    """Create the schema ``<prefix>_<unix time>_<random>``; yield a URL whose search_path
    is it; drop it with everything in it afterwards, also when the process is sent
    SIGTERM meanwhile (what ``timeout``, systemd and CI send): the signal raises
    :class:`Terminated` in the main thread, the caller's work unwinds, the
    schema is dropped, and the exception goes on up.

    ``url`` ``None`` is the embedded server. `funnel test` plays its scenarios in
    one; the tests and the benchmarks use it too. The engine's own commands use a
    ``funnel_tmp_<kind>`` prefix, which :func:`drop_stale_schemas` recognises.

    Raises:
        StoreUnavailable: the server cannot be reached.
        StoreError: the schema cannot be created (no CREATE privilege on the database).
    """
    url = url or embedded_url()
    schema = f"{prefix}_{int(time.time())}_{secrets.token_hex(6)}"
    try:
        admin = psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL at {safe_url(url)}: "
                               f"{first_line(exc)}; check --db / FUNNEL_DB") from None
    with admin:
        try:
            # Held by this connection while the process lives (before the schema exists:
            # a sweep never sees it unheld).
            admin.execute(_HOLD, (schema,))
            admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        except psycopg.Error as exc:
            raise StoreError(f"cannot create the temporary schema {schema}: {first_line(exc)}; "
                             "it needs the CREATE privilege on the database") from None
        previous = _on_sigterm()
        try:
            yield with_search_path(url, schema)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            try:
                admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
            except psycopg.Error as exc:
                print(f"warning: could not drop the temporary schema {schema}: "
                      f"{first_line(exc)}; drop it by hand", file=sys.stderr)


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def _on_sigterm() -> signal.Handlers | Callable[[int, FrameType | None], Any] | int | None:
    """SIGTERM raises :class:`Terminated` until the handler returned is put back; None
    (nothing changed) outside the main thread or when the program handles SIGTERM itself."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        return None
    signal.signal(signal.SIGTERM, _terminated)
    return previous


def drop_stale_schemas(url: str | None, older_than: float = STALE_AFTER, *,
                       dry_run: bool = False) -> list[str]:
    """Drop the temporary schemas (``funnel_tmp_*``) made more than ``older_than``
    seconds ago whose process is gone (nobody holds their advisory lock): what a
    replay, a simulation or a test killed outright left. The names dropped (with
    ``dry_run``, the names that would be, nothing dropped).

    Raises:
        StoreUnavailable: the server cannot be reached.
    """
    url = url or embedded_url()
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL at {safe_url(url)}: "
                               f"{first_line(exc)}; check --db / FUNNEL_DB") from None
    dropped = []
    with conn:
        names = [r[0] for r in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s ORDER BY nspname",
            (TEMPORARY.replace("_", "\\_") + "\\_%",)).fetchall()]
        for name in names:
            match = _TEMPORARY_NAME.match(name)
            if match is None or time.time() - int(match.group(2)) < older_than:
                continue
            row = conn.execute(_HOLD, (name,)).fetchone()
            if not row or not row[0]:
                continue  # its process is still at work
            try:
                if dry_run:
                    dropped.append(name)
                    continue
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    sql.Identifier(name)))
                dropped.append(name)
            except psycopg.Error as exc:
                print(f"warning: could not drop the stale temporary schema {name}: "
                      f"{first_line(exc)}; drop it by hand", file=sys.stderr)
            finally:
                conn.execute(_UNHOLD, (name,))
    return dropped


def stale_message(dropped: list[str], verb: str = "dropped") -> str:
    """What a command says after :func:`drop_stale_schemas` dropped ``dropped``."""
    kinds = sorted({m.group(1) for m in map(_TEMPORARY_NAME.match, dropped) if m})
    return (f"{verb} {len(dropped)} stale temporary schema(s) left by a killed "
            f"{'/'.join(kinds) or 'run'} (copies of messages out of retention's reach): "
            + ", ".join(dropped))
