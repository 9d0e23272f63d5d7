"""Reading the sessions to replay: their turn records, customer messages and orders.

One read-only transaction (PostgreSQL refuses any write in it), three queries for the
whole population, not one per session: the turns, the customers' messages, and the
orders of the sessions selected. A turn's customer message is the last ``user``
message of the session logged before its record, as :mod:`engine.store.turns` pairs
them; the messages of every role are kept too (one list per session), since the turn's
window of them is where grounding finds the customer's words.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson
import psycopg
from psycopg import sql
from psycopg.types.json import set_json_loads

from ..errors import StoreUnavailable, first_line
from ..format.names import CONVERSIONS, MESSAGES, PLAYGROUND, TURNS, VERSIONS
from ..store.connect import safe_url
from ..store.embedded import embedded_url
from ..store.playground import real_session
from .play import Recorded

__all__ = ["Population", "Session", "read_bundle", "read_copy", "read_population"]

ANONYMIZED = "[anonymized]"


@dataclass
class Session:
    """One session's recorded turns, what it was sold, and why it cannot be replayed."""

    session_id: str
    version: int
    variant: str | None
    turns: list[Recorded] = field(default_factory=list)
    revenue: Decimal = Decimal(0)  # its recorded orders (funnel_conversions)
    orders: int = 0
    tokens: int = 0
    skipped: str | None = None  # why it is not replayed
    # The content hash of the copy of the funnel its turns ran on (the version store's
    # bundle, deployed or a trial); None: a turn was recorded before turn records kept it.
    digest: str | None = None
    # Its copy changed between its turns (a patch deployed while it was open): which, and
    # where. Replay plays it turn by turn on the copies its turns ran on (each turn's
    # ``Recorded.funnel_hash``), on ``--base`` when given; this is the reason given when
    # one of them is gone.
    changed_copy: str | None = None


@dataclass
class Population:
    sessions: list[Session]
    seconds_read: float = 0.0


def _connect(url: str | None) -> psycopg.Connection[Any]:
    url = url or embedded_url()
    try:
        conn = psycopg.connect(url, connect_timeout=10)
    except psycopg.Error as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL at {safe_url(url)}: "
                               f"{first_line(exc)}; check --db / FUNNEL_DB") from None
    # Replay reads; it never writes where the live sessions are.
    conn.read_only = True
    set_json_loads(orjson.loads, conn)
    return conn


def read_population(url: str | None, funnel: str, *, since: float | None = None,
                    sessions: Sequence[str] = (), variant: str | None = None,
                    now: datetime | None = None, include_playground: bool = False
                    ) -> Population:
    """The sessions of ``funnel`` to replay: those with a turn in the last ``since``
    seconds (all when None), or the ``sessions`` named; only ``variant``'s when given.
    The studio's playground sessions (engine.store.playground) are customers' of no
    one: left out unless named or ``include_playground``."""
    conn = _connect(url)
    with conn:
        # A follow-up's record (engine.turn.follow_up) is the bot's, not a customer's turn:
        # nothing to replay. Read through the row, so a database from before the column
        # reads the same.
        where: list[sql.Composable] = [sql.SQL("funnel = %s"), sql.SQL(
            "(to_jsonb({}) ->> 'follow_up') IS NULL").format(sql.Identifier(TURNS))]
        params: list[Any] = [funnel]
        if sessions:
            where.append(sql.SQL("session_id = ANY(%s)"))
            params.append(list(sessions))
        elif not include_playground and _has(conn, PLAYGROUND):
            where.append(real_session(sql.Placeholder(), sql.Identifier(TURNS, "session_id")))
            params.append(funnel)
        if since is not None:
            where.append(sql.SQL("session_id IN (SELECT session_id FROM {} WHERE funnel = %s "
                                 "AND created_at >= %s)").format(sql.Identifier(TURNS)))
            start = (now or datetime.now().astimezone()) - timedelta(seconds=since)
            params += [funnel, start]
        if variant is not None:
            where.append(sql.SQL("variant = %s"))
            params.append(variant)
        cond = sql.SQL(" AND ").join(where)
        # Read-only: a database not migrated yet has no funnel_hash (its records' copies
        # are not known; replay falls back to the version's deployed copy).
        digest = sql.SQL("funnel_hash" if _has_column(conn, TURNS, "funnel_hash")
                         else "NULL::text")
        turns = conn.execute(sql.SQL(
            "SELECT session_id, funnel_version, variant, stage_before, stage_after, fallback, "
            "error, raw_output, created_at, prompt_tokens + completion_tokens, {} "
            "FROM {} WHERE {} ORDER BY session_id, id").format(digest, sql.Identifier(TURNS),
                                                              cond),
            params).fetchall()
        ids = sorted({t[0] for t in turns})
        # Every role: the turn's window (what grounding reads the customer's words from)
        # is the session's last messages, the replies among them (engine.turn.engine).
        messages = conn.execute(sql.SQL(
            "SELECT session_id, role, content, created_at FROM {} WHERE funnel = %s "
            "AND session_id = ANY(%s) ORDER BY session_id, id").format(
                sql.Identifier(MESSAGES)), (funnel, ids)).fetchall()
        orders = conn.execute(sql.SQL(
            "SELECT session_id, count(*), sum(amount) FROM {} WHERE funnel = %s AND "
            "session_id = ANY(%s) GROUP BY session_id").format(sql.Identifier(CONVERSIONS)),
            (funnel, ids)).fetchall()
    return Population(_sessions(turns, messages, {o[0]: (o[1], o[2]) for o in orders}))


def _has_column(conn: psycopg.Connection[Any], table: str, column: str) -> bool:
    row = conn.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = "
                       "current_schema() AND table_name = %s AND column_name = %s",
                       (table, column)).fetchone()
    return row is not None


def _has(conn: psycopg.Connection[Any], table: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                       (sql.Identifier(table).as_string(conn),)).fetchone()
    return bool(row and row[0])


def _sessions(turns: list[Any], messages: list[Any], orders: dict[str, Any]
              ) -> list[Session]:
    # Per session: its messages (role, content), shared by its turns, and its customer
    # messages' times and positions among them.
    by_session: dict[str, tuple[list[datetime], list[int], list[tuple[str, str]]]] = {}
    for sid, role, content, at in messages:
        times, where, log = by_session.setdefault(sid, ([], [], []))
        if role == "user":
            times.append(at)
            where.append(len(log))
        log.append((role, content))
    out: list[Session] = []
    current: Session | None = None
    legacy = False  # a turn of the current session without the hash of its copy
    for sid, version, variant, before, after, fallback, error, raw, at, tokens, digest in turns:
        if current is None or current.session_id != sid:
            current = Session(sid, int(version), variant, digest=digest)
            legacy = digest is None
            count, amount = orders.get(sid, (0, None))
            current.orders, current.revenue = int(count), Decimal(amount or 0)
            out.append(current)
        elif digest is None or legacy:
            legacy, current.digest = True, None  # a copy not known: the version's
        elif digest != current.digest and current.changed_copy is None \
                and int(version) == current.version:
            current.changed_copy = (f"its copy of v{version} changed between turns (turn "
                               f"{len(current.turns)} ran on {str(current.digest)[:12]}, turn "
                               f"{len(current.turns) + 1} on {digest[:12]}: files deployed "
                               "without a `version:` bump while it was open)")
        current.tokens += int(tokens or 0)
        if int(version) != current.version and current.skipped is None:
            current.skipped = (f"it ran on versions {current.version} and {version}; replay "
                               "plays one version against the edit")
        times, where, log = by_session.get(sid, ([], [], []))
        i = bisect.bisect_right(times, at) - 1
        index = where[i] if i >= 0 else -1
        customer = log[index][1] if i >= 0 else ""
        if (not customer or customer == ANONYMIZED) and current.skipped is None:
            current.skipped = "a turn has no customer message (anonymized or purged)"
        if raw is None and current.skipped is None:
            current.skipped = ("a turn kept no model output (recorded before the engine kept "
                               "them, seeded, or anonymized)")
        current.turns.append(Recorded(customer, [str(x) for x in raw] if raw is not None
                                      else None, at, before, after, bool(fallback), error,
                                      messages=log, index=index, funnel_hash=digest))
    return out


def read_bundle(url: str | None, funnel: str, version: int
                ) -> tuple[str, str, dict[str, str]] | None:
    """(hash, entry, files) of the version's bundle deployed last (never a trial), or
    None."""
    conn = _connect(url)
    with conn:
        if not _has(conn, VERSIONS):
            return None
        deployed = sql.SQL("AND NOT trial" if _has_column(conn, VERSIONS, "trial") else "")
        row = conn.execute(sql.SQL(
            "SELECT hash, entry, files FROM {} WHERE funnel = %s AND version = %s {} "
            "ORDER BY deployed_at DESC, created_at DESC LIMIT 1").format(
                sql.Identifier(VERSIONS), deployed), (funnel, version)).fetchone()
    return (str(row[0]), str(row[1]), dict(row[2])) if row else None


def read_copy(url: str | None, funnel: str, version: int, digest: str
              ) -> tuple[str, str, dict[str, str]] | None:
    """(hash, entry, files) of the copy of ``version`` whose content hash is ``digest``
    (deployed or a trial: the one a turn record names), or None."""
    conn = _connect(url)
    with conn:
        if not _has(conn, VERSIONS):
            return None
        row = conn.execute(sql.SQL(
            "SELECT hash, entry, files FROM {} WHERE funnel = %s AND version = %s AND "
            "hash = %s").format(sql.Identifier(VERSIONS)), (funnel, version, digest)
        ).fetchone()
    return (str(row[0]), str(row[1]), dict(row[2])) if row else None
