"""A manager in the session: the SQL of ``funnel_control`` and ``funnel_control_events``.

A session has no control row while the bot answers it. A take-over writes one
(``mode = 'manager'``); while it is there the turn logs each customer message,
marks it ``held`` and calls no model (:func:`hold`, run under the session's lease
by :meth:`engine.store.session.SessionHandle.hold`). A manager's message is logged
with the role ``manager`` and the manager's name, and goes to the customer through
the outbox. A release deletes the row, and may write the session's stage and
fields in the same transaction (if the row is still at the version read). Every
step is an event in ``funnel_control_events``, in order.

A mixin of :class:`engine.store.postgres.PostgresStore`, like ``engine.store.delivery``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from ..errors import ConcurrentUpdate, DuplicateDelivery
from ..format.spec import FunnelSpec
from . import ddl, idempotency, outbox
from .base import Control, Held, OutboxItem
from .statements import RELEASE, dumps

_C = sql.Identifier(ddl.CONTROL)
_E = sql.Identifier(ddl.CONTROL_EVENTS)
_M = sql.Identifier(ddl.MESSAGES)

_COLUMNS = "mode, manager, since, holding_sent, held, deadline"
READ = sql.SQL("SELECT " + _COLUMNS + " FROM {} WHERE funnel = %s AND "
               "session_id = %s").format(_C)
TAKE = sql.SQL(
    "INSERT INTO {} AS c (funnel, session_id, mode, manager, since) VALUES (%s, %s, %s, %s, "
    "NOW()) ON CONFLICT (funnel, session_id) DO UPDATE SET mode = EXCLUDED.mode, "
    "manager = EXCLUDED.manager, since = CASE WHEN c.mode = EXCLUDED.mode THEN c.since "
    "ELSE EXCLUDED.since END, held = NULL, deadline = NULL RETURNING " + _COLUMNS).format(_C)
DROP = sql.SQL("DELETE FROM {} WHERE funnel = %s AND session_id = %s "
               "RETURNING " + _COLUMNS).format(_C)
# An approval's row only: a take-over that came first is not ended by an approval.
DROP_APPROVAL = sql.SQL("DELETE FROM {} WHERE funnel = %s AND session_id = %s AND "
                        "mode = 'approval' RETURNING " + _COLUMNS).format(_C)
# The approvals past their deadline, oldest first (the sweep, engine.turn.approval).
DUE = sql.SQL("SELECT session_id FROM {} WHERE funnel = %s AND mode = 'approval' AND "
              "deadline <= %s ORDER BY deadline LIMIT %s").format(_C)
EVENT_AT = sql.SQL("INSERT INTO {} (funnel, session_id, event, manager, detail, created_at) "
                   "VALUES (%s, %s, %s, %s, %s, %s)").format(_E)
EVENT = sql.SQL("INSERT INTO {} (funnel, session_id, event, manager, detail) "
                "VALUES (%s, %s, %s, %s, %s)").format(_E)
LOG = sql.SQL("INSERT INTO {} (funnel, session_id, role, content, stage, author, held) "
              "VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id").format(_M)
MARK_HELD = sql.SQL("UPDATE {} SET held = TRUE WHERE id = %s").format(_M)
# A manager's message's delivery key (engine.store.idempotency's table, its own channel).
MANAGER_CHANNEL = "manager"
CLAIM_KEY = sql.SQL("INSERT INTO {} (funnel, channel, key, session_id) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (funnel, channel, key) DO NOTHING RETURNING key").format(
    sql.Identifier(ddl.INBOUND))
KEY_ANSWERED = sql.SQL("UPDATE {} SET message_id = %s, response = %s, answered_at = NOW() "
                       "WHERE funnel = %s AND channel = %s AND key = %s").format(
    sql.Identifier(ddl.INBOUND))
HOLDING_SENT = sql.SQL("UPDATE {} SET holding_sent = TRUE WHERE funnel = %s AND "
                       "session_id = %s").format(_C)
ANSWERED = sql.SQL("UPDATE {} SET response = %s, answered_at = NOW() WHERE funnel = %s AND "
                   "channel = %s AND key = %s").format(sql.Identifier(ddl.INBOUND))
# Where the session's channel reaches the customer: the newest message of theirs that
# came with a target (a Telegram chat, its topic), as the channel stored it.
TARGET = sql.SQL(
    "SELECT meta->'reply_to' FROM {} WHERE funnel = %s AND session_id = %s AND channel = %s "
    "AND meta ? 'reply_to' ORDER BY created_at DESC LIMIT 1").format(
        sql.Identifier(ddl.INBOUND))


def _control(row: Any) -> Control | None:
    return Control(row[0], row[1], row[2], bool(row[3]), row[4], row[5]) if row else None


def control_from_json(value: Mapping[str, Any] | None) -> Control | None:
    """The control row as the turn function returns it (``to_jsonb``), or None."""
    if not value:
        return None
    deadline = value.get("deadline")
    return Control(str(value["mode"]), value.get("manager"),
                   datetime.fromisoformat(str(value["since"])),
                   bool(value.get("holding_sent")), value.get("held"),
                   datetime.fromisoformat(str(deadline)) if deadline else None)


def _json(value: Any) -> Jsonb:
    return Jsonb(value, dumps=lambda v: dumps(v).decode())


async def hold(conn: psycopg.AsyncConnection[Any], spec: FunnelSpec, session_id: str,
               held: Held, lock_key: str, holder: str, channel_key: tuple[str, str] | None
               ) -> None:
    """The held turn in one transaction (see :class:`engine.store.base.Held`)."""
    async with conn.transaction():
        await conn.execute(MARK_HELD, (held.message_id,))
        if held.holding is not None:
            await conn.execute(LOG, (spec.name, session_id, "assistant", held.holding,
                                     held.stage, None, True))
            await conn.execute(HOLDING_SENT, (spec.name, session_id))
        if held.outbox:
            await outbox.add(conn, spec.name, session_id, held.outbox)
        if channel_key is not None:
            await conn.execute(ANSWERED, (_json(held.response), spec.name, *channel_key))
        await conn.execute(RELEASE, {"key": lock_key, "holder": holder})


def _release_row(spec: FunnelSpec) -> sql.Composed:
    columns = ["stage", "stage_iteration", "stage_history", "notices", *spec.state]
    names = sql.SQL(", ").join(map(sql.Identifier, columns))
    return sql.SQL(
        "UPDATE {t} SET ({names}) = (SELECT {names} FROM jsonb_populate_record(NULL::{t}, "
        "%s)), row_version = {t}.row_version + 1 WHERE session_id = %s AND "
        "row_version = %s").format(t=sql.Identifier(spec.table), names=names)


class ControlMixin:
    """Take-over, manager messages and release: methods of the PostgreSQL store."""

    def _conn(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        raise NotImplementedError

    async def control(self, funnel: str, session_id: str) -> Control | None:
        """The session's control row; None while the bot answers it."""
        async with self._conn() as conn:
            return _control(await (await conn.execute(READ, (funnel, session_id))).fetchone())

    async def take_over(self, funnel: str, session_id: str, manager: str,
                        mode: str = "manager", detail: Mapping[str, Any] | None = None
                        ) -> Control:
        """Hand the session to ``manager`` (call it holding the session's lease)."""
        async with self._conn() as conn, conn.transaction():
            row = await (await conn.execute(TAKE, (funnel, session_id, mode, manager))
                         ).fetchone()
            await conn.execute(EVENT, (funnel, session_id, "takeover" if mode == "manager"
                                       else mode, manager, _json(dict(detail or {}))))
        control = _control(row)
        assert control is not None
        return control

    async def manager_message(self, funnel: FunnelSpec, session_id: str, manager: str,
                              text: str, stage: str, delivery: OutboxItem | None, *,
                              key: str | None = None,
                              answer: Mapping[str, Any] | None = None) -> int:
        """Log a manager's message (role ``manager``) and its delivery; the message's id.

        With a delivery ``key`` (the client's ``Idempotency-Key``, scoped) the key is
        recorded in ``funnel_inbound`` in the same commit, with ``answer`` and the id as
        its response: a second call with the key logs and sends nothing.

        Raises:
            DuplicateDelivery: the key was recorded before (its first answer attached).
        """
        async with self._conn() as conn, conn.transaction():
            if key is not None:
                # A concurrent first delivery holds the key's row: this insert waits for
                # its commit, then finds the key taken.
                taken = await (await conn.execute(CLAIM_KEY, (
                    funnel.name, MANAGER_CHANNEL, key, session_id))).fetchone() is None
                if taken:
                    found = await idempotency.pending(conn, funnel.name, MANAGER_CHANNEL, key)
                    raise DuplicateDelivery(session_id, key, found.message_id if found else None,
                                            found.response if found else None)
            row = await (await conn.execute(LOG, (funnel.name, session_id, "manager", text,
                                                  stage, manager, False))).fetchone()
            assert row is not None
            message_id = int(row[0])
            if delivery is not None:
                delivery.key = f"{delivery.key}:{message_id}"
                await outbox.add(conn, funnel.name, session_id, [delivery])
            await conn.execute(EVENT, (funnel.name, session_id, "message", manager,
                                       _json({"message_id": message_id})))
            if key is not None:
                await conn.execute(KEY_ANSWERED, (
                    message_id, _json({**(answer or {}), "message_id": message_id}),
                    funnel.name, MANAGER_CHANNEL, key))
        return message_id

    async def reply_target(self, funnel: str, session_id: str, channel: str
                           ) -> dict[str, Any] | None:
        """Where ``channel`` reaches the session's customer (a Telegram chat), or None."""
        async with self._conn() as conn:
            row = await (await conn.execute(TARGET, (funnel, session_id, channel))).fetchone()
        return row[0] if row and isinstance(row[0], dict) else None

    async def release_control(self, funnel: FunnelSpec, session_id: str, manager: str,
                              values: dict[str, Any] | None, expected_version: int,
                              detail: Mapping[str, Any] | None = None) -> Control | None:
        """Give the session back to the bot, writing ``values`` (stage, fields) when
        given and the row is still at ``expected_version``; the control row it had
        (None: the bot had it already; nothing written then).

        Call it holding the session's lease.
        """
        async with self._conn() as conn, conn.transaction():
            row = await (await conn.execute(DROP, (funnel.name, session_id))).fetchone()
            if row is None:
                return None
            if values is not None:
                cur = await conn.execute(_release_row(funnel),
                                         (_json(values), session_id, expected_version))
                if cur.rowcount != 1:  # the lease was lost meanwhile: nothing is written
                    raise ConcurrentUpdate(session_id, expected_version, None)
            await conn.execute(EVENT, (funnel.name, session_id, "release", manager,
                                       _json(dict(detail or {}))))
        return _control(row)

    async def resolve_approval(self, funnel: FunnelSpec, session_id: str, event: str,
                               manager: str | None, values: dict[str, Any] | None,
                               expected_version: int, detail: Mapping[str, Any], at: datetime,
                               outbox_items: Sequence[OutboxItem] = ()) -> Control | None:
        """End the session's approval (``event``: approved, rejected, timeout), writing
        ``values`` (stage, fields, notices) when the row is still at ``expected_version``,
        and ``outbox_items``; the approval's control row (None: no approval waited, nothing
        written). Call it holding the session's lease.

        Raises:
            ConcurrentUpdate: the row changed since it was read; nothing is written.
        """
        async with self._conn() as conn, conn.transaction():
            row = await (await conn.execute(DROP_APPROVAL, (funnel.name, session_id))
                         ).fetchone()
            if row is None:
                return None
            if values is not None:
                cur = await conn.execute(_release_row(funnel),
                                         (_json(values), session_id, expected_version))
                if cur.rowcount != 1:
                    raise ConcurrentUpdate(session_id, expected_version, None)
            if outbox_items:
                await outbox.add(conn, funnel.name, session_id, list(outbox_items))
            await conn.execute(EVENT_AT, (funnel.name, session_id, event, manager,
                                          _json(dict(detail)), at))
        return _control(row)

    async def due_approvals(self, funnel: str, now: datetime, limit: int = 100) -> list[str]:
        """The sessions whose approval is past its deadline at ``now``, oldest first."""
        async with self._conn() as conn:
            rows = await (await conn.execute(DUE, (funnel, now, limit))).fetchall()
        return [str(r[0]) for r in rows]
