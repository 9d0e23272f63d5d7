"""The invariants every session of a funnel keeps, checked against the database.

Used by the fault, concurrency and hostile-input tests after they run, and by
``funnel check-state FUNNEL [--db URL]`` in production:

- every state row is valid: each declared field against its schema (and its
  column), a known stage, notices within their caps (count and length);
- every reply has its turn record (assistant messages = turn records), and no
  turn record lacks its customer message; messages ``held`` while a manager held the
  session (engine.turn.manager) have no turn, by design, and are not counted;
- a session a manager holds (``funnel_control``) exists in the funnel's table;
- an approval that waits (engine.turn.approval) holds a move from the session's stage
  into a stage with an ``approval`` gate, and has a deadline;
- a customer message with no turn (the database went away mid-turn, the
  session stayed busy) is reported as a warning: the message is kept, the
  customer got an error to retry, nothing else was written;
- a turn record whose error starts with ``bug:`` is reported as a warning: the
  customer got the fallback, and the service log has the traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from ..errors import StoreUnavailable
from ..format.names import CONTROL, MESSAGES, TURNS
from ..funnel.compiled import CompiledFunnel
from ..funnel.state import plain
from ..store.connect import safe_url
from ..store.embedded import embedded_url
from .budget import MAX_NOTICES, NOTICE_CHARS


@dataclass(frozen=True)
class Violation:
    """One broken invariant: ``severity`` is ``error`` or ``warning``."""

    severity: str
    session_id: str
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.severity}: session {self.session_id!r}: {self.rule}: {self.detail}"


def check_row(funnel: CompiledFunnel, row: dict[str, Any]) -> list[Violation]:
    """The invariants of one state row (as read from the table)."""
    sid = str(row.get("session_id"))
    out = []
    for name in funnel.spec.state:
        if name not in row:
            continue
        problem = funnel.rules.invalid(name, plain(row[name]))
        if problem is not None:
            out.append(Violation("error", sid, "invalid field", problem))
    stage = row.get("stage")
    if stage not in funnel.stages and stage not in funnel.spec.removed_stages:
        out.append(Violation("error", sid, "unknown stage", f"{stage!r}"))
    notices = row.get("notices") or []
    if not isinstance(notices, list) or len(notices) > MAX_NOTICES:
        out.append(Violation("error", sid, "too many notices",
                             f"{len(notices)} notices, over {MAX_NOTICES}"))
    elif any(not isinstance(n, str) or len(n) > NOTICE_CHARS for n in notices):
        out.append(Violation("error", sid, "notice too long",
                             f"a notice is over {NOTICE_CHARS} characters"))
    return out


# A follow-up (engine.turn.follow_up) is a reply and a turn record with no customer
# message: both left out of the pairs (read through the row: a database from before
# the column reads the same).
_PAIRS = """
WITH m AS (
    SELECT session_id, count(*) FILTER (WHERE role = 'user' AND NOT held) AS users,
           count(*) FILTER (WHERE role = 'assistant' AND NOT held
                            AND (to_jsonb(mm) ->> 'follow_up') IS NULL) AS replies
    FROM {messages} mm WHERE funnel = %(funnel)s GROUP BY session_id),
t AS (
    SELECT session_id, count(*) FILTER (WHERE (to_jsonb(tr) ->> 'follow_up') IS NULL) AS turns,
           count(*) FILTER (WHERE error LIKE 'bug:%%') AS bugs
    FROM {turns} tr WHERE funnel = %(funnel)s GROUP BY session_id)
SELECT coalesce(m.session_id, t.session_id), coalesce(users, 0), coalesce(replies, 0),
       coalesce(turns, 0), coalesce(bugs, 0)
FROM m FULL JOIN t ON m.session_id = t.session_id
"""


def check_pairs(session_id: str, users: int, replies: int, turns: int, bugs: int
                ) -> list[Violation]:
    """The invariants of one session's message log against its turn records."""
    out = []
    if replies != turns:
        out.append(Violation("error", session_id, "reply without turn record",
                             f"{replies} replies logged, {turns} turn records"))
    if users < turns:
        out.append(Violation("error", session_id, "turn without message",
                             f"{turns} turn records, {users} customer messages"))
    elif users > turns:
        out.append(Violation("warning", session_id, "unanswered message",
                             f"{users - turns} customer message(s) with no turn (the turn "
                             "failed to reach the database; the customer was told to retry)"))
    if bugs:
        out.append(Violation("warning", session_id, "bug", f"{bugs} turn(s) failed on a bug; "
                             "see the service log"))
    return out


async def check_funnel(funnel: CompiledFunnel, url: str | None = None) -> list[Violation]:
    """Check every session of ``funnel`` in the database at ``url`` (embedded without).

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    url = url or embedded_url()
    try:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL at {safe_url(url)}: {exc}; "
                               "check --db / FUNNEL_DB") from None
    out: list[Violation] = []
    async with conn:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql.SQL("SELECT * FROM {}").format(
                sql.Identifier(funnel.spec.table)))
            async for row in cur:
                out.extend(check_row(funnel, row))
        query = sql.SQL(_PAIRS).format(messages=sql.Identifier(MESSAGES),
                                       turns=sql.Identifier(TURNS))
        pairs = await conn.execute(query, {"funnel": funnel.spec.name})
        for session_id, users, replies, turns, bugs in await pairs.fetchall():
            out.extend(check_pairs(session_id, users, replies, turns, bugs))
        orphans = await conn.execute(sql.SQL(_CONTROL_ORPHANS).format(
            control=sql.Identifier(CONTROL), table=sql.Identifier(funnel.spec.table)),
            {"funnel": funnel.spec.name})
        for session_id, mode in await orphans.fetchall():
            out.append(Violation("error", session_id, "control without session",
                                 f"a {mode} holds a session the funnel's table lacks"))
        waiting = await conn.execute(sql.SQL(_APPROVALS).format(
            control=sql.Identifier(CONTROL), table=sql.Identifier(funnel.spec.table)),
            {"funnel": funnel.spec.name})
        for session_id, stage, held, deadline in await waiting.fetchall():
            out.extend(check_approval(funnel, session_id, stage, held, deadline))
    return out


def check_approval(funnel: CompiledFunnel, session_id: str, stage: str, held: Any,
                   deadline: Any) -> list[Violation]:
    """An approval that waits (engine.turn.approval): it holds a move from the stage the
    session is in, into a stage with an ``approval`` gate, and has a deadline."""
    problems = []
    held = held if isinstance(held, dict) else {}
    if deadline is None or not held:
        problems.append("it has no held move or no deadline")
    if held and held.get("from") != stage:
        problems.append(f"it holds a move from stage {held.get('from')!r}, but the session "
                        f"is in {stage!r}")
    to = funnel.stages.get(str(held.get("to")))
    if held and (to is None or to.spec.approval is None):
        problems.append(f"it leads to {held.get('to')!r}, which has no `approval:` gate")
    return [Violation("error", session_id, "approval", p) for p in problems]


# A take-over names a session the table has (the API refuses others; a purge deletes both).
_CONTROL_ORPHANS = """
SELECT c.session_id, c.mode FROM {control} c WHERE c.funnel = %(funnel)s
AND NOT EXISTS (SELECT 1 FROM {table} s WHERE s.session_id = c.session_id)
"""

# The approvals that wait, with the stage their session is in.
_APPROVALS = """
SELECT c.session_id, s.stage, c.held, c.deadline FROM {control} c JOIN {table} s
ON s.session_id = c.session_id WHERE c.funnel = %(funnel)s AND c.mode = 'approval'
"""
