"""SQL for one funnel's session table and the message log, built once per funnel.

Identifiers go through ``psycopg.sql.Identifier``; every value is a parameter.
The statements are rendered to text once, so a turn pays no composition cost.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson
from psycopg import sql
from psycopg.types.json import Jsonb

from ..format.spec import FunnelSpec
from ..records.explanation import exits_of
from . import ddl, functions
from .base import TurnWrite
from .heartbeat import LEASE_SECONDS
from .wire import Prepared, positional


def dumps(value: Any) -> bytes:
    """JSON for a JSONB parameter (orjson: a turn writes a few kilobytes of it)."""
    return orjson.dumps(value, default=_default, option=orjson.OPT_NON_STR_KEYS)


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# The turn record's columns, filled from one JSON parameter.
_TURN_COLUMNS = ("funnel_version", "stage_before", "transitions", "actions", "refused",
                 "validation_failures", "repaired", "fallback", "llm_ms", "turn_ms",
                 "prompt_tokens", "completion_tokens", "cost", "model", "error", "attempts",
                 "knowledge", "explain", "raw_output", "migration", "variant",
                 "cached_prompt_tokens", "cache_write_tokens", "claims", "calls",
                 "tokens_counted", "funnel_hash")
# What a record written without a column (a failed turn's, an older engine's) stores.
_TURN_DEFAULTS = {"knowledge": "'[]'", "cached_prompt_tokens": "0", "cache_write_tokens": "0",
                  "claims": "'[]'", "tokens_counted": "false"}


class Statements:
    """Statements for one funnel's session table, built once."""

    def __init__(self, spec: FunnelSpec) -> None:
        self.spec = spec
        t = sql.Identifier(spec.table)
        engine_types = {n: ty for n, ty, _, _ in ddl.engine_columns(spec)}
        self.columns: list[tuple[str, str]] = [("session_id", "text")]
        self.columns += [(n, engine_types[n]) for n in ("stage", "stage_iteration",
                                                         "stage_history")]
        self.columns += [(f.name, f.column_type) for f in spec.state.values()]
        self.columns += [(n, engine_types[n]) for n in ("turns", "funnel_version", "notices",
                                                          "variant")]
        # A session keeps the experiment's variant it was first given (engine.experiments).
        write_once = {f.name for f in spec.state.values() if f.write_once} | {"variant"}
        # The state travels as one JSON object, typed by the table's own row type
        # (jsonb_populate_record): two parameters instead of one per column.
        names = [sql.Identifier(n) for n, _ in self.columns]
        update_sets = []
        # The rolling summary is written only by the summarizer (engine.memory.summary).
        only_insert = {spec.memory.summary} if spec.memory.summary else set()
        # The row as it was is `cur`: shorter than the table's name, which every column
        # would otherwise repeat twice.
        cur = sql.Identifier("cur")
        for n, ty in self.columns[1:]:
            col = sql.Identifier(n)
            if n in only_insert:
                # Written by a turn only when it folded a new summary (else kept).
                update_sets.append(sql.SQL("{} = COALESCE(%(__summary)s::text, cur.{})").format(
                    col, col))
            elif n in write_once:
                update_sets.append(sql.SQL("{} = COALESCE(cur.{}, r.{})").format(col, col, col))
            elif ty.startswith(("jsonb", "text")):
                # An unchanged value is kept as stored: one PostgreSQL moved out of the
                # row (ddl.TOAST_TARGET) then stays there, instead of being written again.
                update_sets.append(sql.SQL(
                    "{} = CASE WHEN r.{} IS NOT DISTINCT FROM cur.{} THEN cur.{} ELSE r.{} END"
                ).format(col, col, col, col, col))
            else:
                update_sets.append(sql.SQL("{} = r.{}").format(col, col))
        upto = sql.SQL("summary_upto = COALESCE(%(__summary_upto)s::bigint, cur.summary_upto)")
        record = sql.SQL("jsonb_populate_record(NULL::{}, %(__state)s) r").format(t)
        # A session the turn loaded is only ever updated: if it was deleted
        # meanwhile (purge), the save must not bring it back.
        update = sql.SQL(
            "UPDATE {t} AS {cur} SET {sets}, {upto}, row_version = cur.row_version + 1, "
            "updated_at = %(__now)s, last_message_at = %(__now)s FROM {record} "
            "WHERE cur.session_id = %(session_id)s AND cur.row_version = %(__expected)s "
            "RETURNING cur.row_version"
        ).format(t=t, cur=cur, sets=sql.SQL(", ").join(update_sets), upto=upto, record=record)
        # A new session: if another turn created the row first, nothing is written
        # (and the turn is retried on that row, as for any stale save).
        upsert = sql.SQL(
            "INSERT INTO {t} ({names}, row_version, created_at, updated_at, last_message_at) "
            "SELECT %(session_id)s, {values}, 1, %(__now)s, %(__now)s, %(__now)s FROM {record} "
            "ON CONFLICT (session_id) DO NOTHING RETURNING row_version"
        ).format(t=t, names=sql.SQL(", ").join(names), record=record,
                 values=sql.SQL(", ").join(sql.SQL("r.{}").format(n) for n in names[1:]))
        turn_columns = sql.SQL(", ").join(map(sql.Identifier, _TURN_COLUMNS))
        # A record without `knowledge` (written before it existed) cites nothing.
        turn_values = sql.SQL(", ").join(
            sql.SQL(f"coalesce(x.{{}}, {_TURN_DEFAULTS[c]})" if c in _TURN_DEFAULTS
                    else "x.{}").format(sql.Identifier(c)) for c in _TURN_COLUMNS)

        # One statement saves the whole turn: the state (if the version still
        # matches), the reply, the turn record and the outbox rows. Atomic, one
        # round trip, one commit; nothing but the state is written on a mismatch.
        def whole_turn(write: sql.Composable, outbox: bool, inbound: bool,
                       gate: bool = False) -> str:
            # Most turns notify no one: they skip the outbox's part of the plan.
            return sql.SQL(
                "WITH s AS ({write}), "
                "m AS (INSERT INTO {messages} (funnel, session_id, role, content, stage) "
                "SELECT %(__funnel)s, %(session_id)s, 'assistant', %(__reply)s::text, "
                "%(__stage_after)s FROM s WHERE %(__reply)s::text IS NOT NULL), "
                "tr AS (INSERT INTO {turns} (funnel, session_id, stage_after, {turn_columns}) "
                "SELECT %(__funnel)s, %(session_id)s, %(__stage_after)s, {turn_values} "
                "FROM s, jsonb_populate_record(NULL::{turns}, %(__turn)s) x), "
                "lease AS (UPDATE {leases} SET holder = '', expires_at = '-infinity' "
                "WHERE lock_key = %(__lock_key)s AND holder = %(__holder)s), "
                # The exit lists the record's explanation cites, the first time this
                # store saves them (almost always '{{}}': nothing to insert).
                "ex AS (INSERT INTO {exits} (digest, exits) SELECT key, value FROM "
                "jsonb_each(%(__exits)s::jsonb) ON CONFLICT (digest) DO NOTHING){outbox_part}"
                "{inbound_part}{gate_part} SELECT row_version FROM s"
            ).format(write=write, messages=sql.Identifier(ddl.MESSAGES),
                     outbox_part=sql.SQL(
                         ", o AS (INSERT INTO {} (idempotency_key, funnel, session_id, kind, "
                         "payload) SELECT x.key, %(__funnel)s, %(session_id)s, x.kind, x.payload "
                         "FROM s, jsonb_to_recordset(%(__outbox)s::jsonb) AS x(key text, "
                         "kind text, payload jsonb) ON CONFLICT (idempotency_key) DO NOTHING)"
                     ).format(sql.Identifier(ddl.OUTBOX)) if outbox else sql.SQL(""),
                     # The answer a second delivery of the message's key replays.
                     inbound_part=sql.SQL(
                         ", i AS (UPDATE {} SET response = %(__response)s, answered_at = "
                         "%(__now)s FROM s WHERE funnel = %(__funnel)s AND channel = "
                         "%(__channel)s AND key = %(__key)s)"
                     ).format(sql.Identifier(ddl.INBOUND)) if inbound else sql.SQL(""),
                     # A move held for a manager's approval (engine.turn.approval): the
                     # control row, with the state, so that the next customer message
                     # finds it (or the save fails, and neither is written).
                     gate_part=sql.SQL(
                         ", g AS (INSERT INTO {c} (funnel, session_id, mode, since, held, "
                         "deadline) SELECT %(__funnel)s, %(session_id)s, 'approval', %(__now)s, "
                         "%(__held)s::jsonb, %(__deadline)s::timestamptz FROM s ON CONFLICT "
                         "(funnel, session_id) DO NOTHING), "
                         "ge AS (INSERT INTO {e} (funnel, session_id, event, detail, created_at) "
                         "SELECT %(__funnel)s, %(session_id)s, 'approval', %(__held)s::jsonb, "
                         "%(__now)s FROM s)"
                     ).format(c=sql.Identifier(ddl.CONTROL), e=sql.Identifier(ddl.CONTROL_EVENTS)
                              ) if gate else sql.SQL(""),
                     leases=sql.Identifier(ddl.LEASES), turn_columns=turn_columns,
                     exits=sql.Identifier(ddl.EXITS),
                     turn_values=turn_values,
                     turns=sql.Identifier(ddl.TURNS)).as_string()

        # How long a lease lasts unless renewed: the turn's process renews it while the
        # turn runs (engine.store.heartbeat), so a crashed process frees it in seconds.
        self.lease_seconds = LEASE_SECONDS
        # (new session?, anything for the outbox?, a delivery key?) -> the statement
        # Sent on libpq directly (engine.store.wire), the parameters' types inferred.
        # (... , a move held for approval?): built when first needed (rare).
        self.saves: dict[tuple[bool, bool, bool, bool], tuple[Prepared, tuple[str, ...]]] = {}
        self._whole_turn = whole_turn
        self._writes = (update, upsert)
        for new in (False, True):
            for out in (False, True):
                for key in (False, True):
                    query, order = positional(whole_turn(upsert if new else update, out, key))
                    self.saves[new, out, key, False] = (Prepared(query), order)
        # The row alone, as `funnel state` and Engine.state show it.
        # Never prepared (see PostgresStore.load): after `funnel migrate` adds a column
        # under a running server, a prepared `SELECT *` fails ("cached plan must not
        # change result type").
        self.select_row = sql.SQL("SELECT * FROM {} WHERE session_id = %s").format(
            t).as_string()
        # A turn's first round trip (engine.store.functions), on libpq directly.
        self.begin = Prepared(functions.call(spec), functions.TYPES)
        # The row arrives as JSON: numeric values as numbers, timestamps as text.
        self.numeric_columns = [n for n, ty in self.columns
                                if ty.startswith(("numeric", "decimal"))]
        self.timestamp_columns = [n for n, ty in self.columns if ty.startswith("timestamp")]
        self.timestamp_columns += list(ddl.TIMESTAMPS)
        self.log = sql.SQL(
            "INSERT INTO {m} (funnel, session_id, role, content, stage) VALUES "
            "(%s, %s, %s, %s, COALESCE((SELECT stage FROM {t} WHERE session_id = %s), %s)) "
            "RETURNING id"
        ).format(m=sql.Identifier(ddl.MESSAGES), t=t).as_string()
        self.version_of = sql.SQL("SELECT row_version FROM {} WHERE session_id = %s").format(
            t).as_string()
        # The exit lists (engine.turn.explain) this store saved: a turn sends only new ones.
        self.exits_saved: set[str] = set()

    def plain_row(self, row: dict[str, Any]) -> dict[str, Any]:
        """The row read as JSON, with the values :func:`engine.funnel.state.plain` gives a row
        read column by column: integral numerics as ints, timestamps in Python's ISO form."""
        for name in self.numeric_columns:
            value = row.get(name)
            if isinstance(value, float) and value.is_integer():
                row[name] = int(value)
        for name in self.timestamp_columns:
            value = row.get(name)
            if isinstance(value, str):
                row[name] = datetime.fromisoformat(value).isoformat()
        return row

    def statement(self, write: TurnWrite) -> tuple[Prepared, tuple[str, ...]]:
        """INSERT-or-update for a new session, UPDATE for one the turn loaded: the
        statement, and the name of each of its parameters in :meth:`params`."""
        which = (write.expected_version == 0, bool(write.outbox), write.inbound is not None,
                 write.approval is not None)
        if which not in self.saves:
            query, order = positional(self._whole_turn(self._writes[which[0]], *which[1:]))
            self.saves[which] = (Prepared(query), order)
        return self.saves[which]

    def params(self, write: TurnWrite) -> dict[str, Any]:
        # Timestamps come from the engine's clock (tests and scenarios move it);
        # without one, the current time.
        out: dict[str, Any] = {
            "__expected": write.expected_version, "session_id": write.session_id,
            "__now": write.message_time or datetime.now(UTC),
            "__state": Jsonb(write.values, dumps=dumps),
            "__turn": Jsonb({**write.turn, "funnel_version": self.spec.version}, dumps=dumps),
            "__lock_key": f"{self.spec.name}/{write.session_id}", "__holder": write.holder,
            "__summary_upto": write.summary_upto,
            "__funnel": self.spec.name, "__reply": write.reply,
            "__stage_after": write.stage_after,
        }
        out["__exits"] = Jsonb(self.new_exits(write), dumps=dumps)
        if write.outbox:
            out["__outbox"] = Jsonb([{"key": o.key, "kind": o.kind, "payload": o.payload}
                                     for o in write.outbox], dumps=dumps)
        if write.inbound is not None:
            out["__channel"], out["__key"] = write.inbound.channel, write.inbound.key
            out["__response"] = Jsonb(response(write), dumps=dumps)
        if self.spec.memory.summary:
            out["__summary"] = write.summary
        if write.approval is not None:
            out["__held"] = Jsonb(write.approval["held"], dumps=dumps)
            out["__deadline"] = write.approval["deadline"]
        return out


    def new_exits(self, write: TurnWrite) -> dict[str, Any]:
        """The exit lists the turn record cites that this store has not saved yet."""
        new: dict[str, Any] = {}
        for step in write.turn.get("explain") or ():
            digest = step.get("exits")
            if digest is not None and digest not in self.exits_saved:
                listed = exits_of(digest)
                if listed is not None:  # compacted in this process: always
                    new[digest] = listed
        return new

    def saved(self, write: TurnWrite) -> None:
        """The turn's save committed: its exit lists are in the store."""
        self.exits_saved.update(step["exits"] for step in write.turn.get("explain") or ()
                                if "exits" in step)


def response(write: TurnWrite) -> dict[str, Any]:
    """What a replay of the turn's message answers (the API's ``Turn``, but ``replayed``)."""
    return {"reply": write.reply, "stage": write.stage_after,
            "handoff": any(o.kind == "handoff" for o in write.outbox),
            "fallback": bool(write.turn.get("fallback")), "turn_id": write.message_id}


def default_literal(field: Any) -> sql.Composable:
    if field.default is None:
        return sql.SQL("NULL")
    if field.is_json:
        return sql.SQL("{}::jsonb").format(sql.Literal(dumps(field.default).decode()))
    return sql.Literal(field.default)


# Giving a lease back leaves the row, free, for the session's next turn. (Deleting
# it instead would race with a waiter queueing on it at that moment: the delete
# would skip the row, and the lease would stay taken until it expired.)
RELEASE = (
    f"UPDATE {ddl.LEASES} SET holder = '', expires_at = '-infinity' "
    "WHERE lock_key = %(key)s AND holder = %(holder)s"
)
