"""SQL for one funnel's session table and the message log, built once per funnel.

Identifiers go through ``psycopg.sql.Identifier``; every value is a parameter.
The statements are rendered to text once, so a turn pays no composition cost.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from ..spec import FunnelSpec
from . import TurnWrite, ddl


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_default)


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


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
        self.columns += [(n, engine_types[n]) for n in ("turns", "funnel_version", "notices")]
        self.json_columns = {n for n, ty in self.columns if ty == "jsonb"}
        write_once = {f.name for f in spec.state.values() if f.write_once}
        names = [sql.Identifier(n) for n, _ in self.columns]
        values = [sql.SQL("{}::{}").format(sql.Placeholder(n), ddl.column_type(ty))
                  for n, ty in self.columns]
        sets = []
        update_sets = []
        # The rolling summary is written only by the summarizer (engine.memory).
        only_insert = {spec.memory.summary} if spec.memory.summary else set()
        for (n, _), value in zip(self.columns[1:], values[1:], strict=True):
            if n in only_insert:
                # Written by a turn only when it folded a new summary (else kept).
                keep = sql.SQL("{} = COALESCE(%(__summary)s::text, {}.{})").format(
                    sql.Identifier(n), t, sql.Identifier(n))
                sets.append(keep)
                update_sets.append(keep)
                continue
            col = sql.Identifier(n)
            if n in write_once:
                sets.append(sql.SQL("{} = COALESCE({}.{}, EXCLUDED.{})").format(col, t, col, col))
                update_sets.append(sql.SQL("{} = COALESCE({}.{}, {})").format(col, t, col, value))
            else:
                sets.append(sql.SQL("{} = EXCLUDED.{}").format(col, col))
                update_sets.append(sql.SQL("{} = {}").format(col, value))
        upto = sql.SQL("summary_upto = COALESCE(%(__summary_upto)s::bigint, {}.summary_upto)"
                       ).format(t)
        # A session the turn loaded is only ever updated: if it was deleted
        # meanwhile (purge), the save must not bring it back.
        update = sql.SQL(
            "UPDATE {t} SET {sets}, {upto}, row_version = {t}.row_version + 1, updated_at = %(__now)s, "
            "last_message_at = %(__now)s WHERE session_id = %(session_id)s "
            "AND row_version = %(__expected)s RETURNING row_version"
        ).format(t=t, sets=sql.SQL(", ").join(update_sets), upto=upto)
        upsert = sql.SQL(
            "INSERT INTO {t} ({names}, row_version, created_at, updated_at, last_message_at) "
            "VALUES ({values}, 1, %(__now)s, %(__now)s, %(__now)s) "
            "ON CONFLICT (session_id) DO UPDATE SET {sets}, {upto}, "
            "row_version = {t}.row_version + 1, updated_at = %(__now)s, "
            "last_message_at = %(__now)s "
            "WHERE {t}.row_version = %(__expected)s "
            "RETURNING row_version"
        ).format(t=t, names=sql.SQL(", ").join(names), values=sql.SQL(", ").join(values),
                 sets=sql.SQL(", ").join(sets), upto=upto)
        # One statement saves the whole turn: the state (if the version still
        # matches), the reply, the turn record and the outbox rows. Atomic, one
        # round trip, one commit; nothing but the state is written on a mismatch.
        def whole_turn(write: sql.Composable) -> str:
            return sql.SQL(
                "WITH s AS ({write}), "
                "m AS (INSERT INTO {messages} (funnel, session_id, role, content, stage) "
                "SELECT %(__funnel)s, %(session_id)s, 'assistant', %(__reply)s::text, "
                "%(__stage_after)s FROM s WHERE %(__reply)s::text IS NOT NULL), "
                "tr AS (INSERT INTO {turns} (funnel, funnel_version, session_id, stage_before, "
                "stage_after, transitions, actions, refused, validation_failures, repaired, fallback, "
                "llm_ms, turn_ms, prompt_tokens, completion_tokens, cost, model, error) "
                "SELECT %(__funnel)s, %(funnel_version)s, %(session_id)s, %(__t_stage_before)s, "
                "%(__stage_after)s, %(__t_transitions)s, %(__t_actions)s, %(__t_refused)s, "
                "%(__t_validation_failures)s, %(__t_repaired)s, %(__t_fallback)s, %(__t_llm_ms)s, "
                "%(__t_turn_ms)s, %(__t_prompt_tokens)s, %(__t_completion_tokens)s, "
                "%(__t_cost)s, %(__t_model)s, %(__t_error)s FROM s), "
                "lease AS (UPDATE {leases} SET holder = '', expires_at = '-infinity' "
                "WHERE lock_key = %(__lock_key)s AND holder = %(__holder)s), "
                "o AS (INSERT INTO {outbox} (idempotency_key, funnel, session_id, kind, payload) "
                "SELECT x.key, %(__funnel)s, %(session_id)s, x.kind, x.payload FROM s, "
                "jsonb_to_recordset(%(__outbox)s::jsonb) AS x(key text, kind text, payload jsonb) "
                "ON CONFLICT (idempotency_key) DO NOTHING) "
                "SELECT row_version FROM s"
            ).format(write=write, messages=sql.Identifier(ddl.MESSAGES),
                     leases=sql.Identifier(ddl.LEASES),
                     turns=sql.Identifier(ddl.TURNS), outbox=sql.Identifier(ddl.OUTBOX)).as_string()

        # How long a turn may hold its session before another may take it over: the
        # slowest model call the funnel allows (first call and repair, with retries).
        self.lease_seconds = 30 + max(
            (2 * st.model.timeout * (st.model.retries + 1) for st in spec.stages.values()),
            default=60)
        self.save = whole_turn(upsert)
        self.save_existing = whole_turn(update)
        # The row alone, as `funnel state` and Engine.state show it.
        self.select_row = sql.SQL("SELECT * FROM {} WHERE session_id = %s").format(
            t).as_string()
        self.select = self.select_row
        self.select_args: tuple[str, ...] = ()
        if spec.memory.summary:
            # A turn reads, with the row, how many messages are not in the summary yet.
            self.select = sql.SQL(
                "SELECT s.*, (SELECT COUNT(*) FROM {m} WHERE funnel = %s AND session_id = "
                "s.session_id AND id > s.summary_upto) AS message_backlog FROM {t} s "
                "WHERE s.session_id = %s").format(m=sql.Identifier(ddl.MESSAGES), t=t).as_string()
            self.select_args = (spec.name,)
        self.log = sql.SQL(
            "INSERT INTO {m} (funnel, session_id, role, content, stage) VALUES "
            "(%s, %s, %s, %s, COALESCE((SELECT stage FROM {t} WHERE session_id = %s), %s)) "
            "RETURNING id"
        ).format(m=sql.Identifier(ddl.MESSAGES), t=t).as_string()
        self.version_of = sql.SQL("SELECT row_version FROM {} WHERE session_id = %s").format(
            t).as_string()

    def statement(self, write: TurnWrite) -> str:
        """INSERT-or-update for a new session, UPDATE for one the turn loaded."""
        return self.save if write.expected_version == 0 else self.save_existing

    def params(self, write: TurnWrite) -> dict[str, Any]:
        # Timestamps come from the engine's clock (tests and scenarios move it);
        # without one, the current time.
        out: dict[str, Any] = {"__expected": write.expected_version,
                               "session_id": write.session_id,
                               "__now": write.message_time or datetime.now(UTC)}
        for name, _ in self.columns[1:]:
            value = write.values.get(name)
            out[name] = Jsonb(value, dumps=dumps) if name in self.json_columns and \
                value is not None else value
        t = write.turn
        out["__lock_key"] = f"{self.spec.name}/{write.session_id}"
        out["__holder"] = write.holder
        out["__summary_upto"] = write.summary_upto
        if self.spec.memory.summary:
            out["__summary"] = write.summary
        out.update({
            "__funnel": self.spec.name, "__reply": write.reply,
            "__stage_after": write.stage_after, "__t_stage_before": t["stage_before"],
            "__t_transitions": Jsonb(t["transitions"], dumps=dumps),
            "__t_actions": Jsonb(t["actions"], dumps=dumps),
            "__t_refused": Jsonb(t["refused"], dumps=dumps),
            "__outbox": Jsonb([{"key": o.key, "kind": o.kind, "payload": o.payload}
                               for o in write.outbox], dumps=dumps),
        })
        for key in ("validation_failures", "repaired", "fallback", "llm_ms", "turn_ms",
                    "prompt_tokens", "completion_tokens", "cost", "model", "error"):
            out[f"__t_{key}"] = t.get(key)
        return out


def default_literal(field: Any) -> sql.Composable:
    if field.default is None:
        return sql.SQL("NULL")
    if field.is_json:
        return sql.SQL("{}::jsonb").format(sql.Literal(dumps(field.default)))
    return sql.Literal(field.default)


# A turn's lease on its session: taken if it is ours already, or if it is free (or
# expired) and no other waiting turn is next in line (a waiter that stopped asking
# for a second loses its place).
ACQUIRE = (
    f"INSERT INTO {ddl.LEASES} (lock_key, holder, expires_at) "
    "VALUES (%(key)s, %(holder)s, NOW() + %(seconds)s * INTERVAL '1 second') "
    f"ON CONFLICT (lock_key) DO UPDATE SET holder = EXCLUDED.holder, "
    "expires_at = EXCLUDED.expires_at, next_holder = NULL, next_at = NULL "
    f"WHERE {ddl.LEASES}.holder = EXCLUDED.holder OR ({ddl.LEASES}.expires_at < NOW() "
    f"AND ({ddl.LEASES}.next_holder IS NULL OR {ddl.LEASES}.next_holder = EXCLUDED.holder "
    f"OR {ddl.LEASES}.next_at < NOW() - INTERVAL '1 second')) RETURNING holder"
)
# Sent right after ACQUIRE: a turn that did not get the lease queues as next in line.
QUEUE = (
    f"UPDATE {ddl.LEASES} SET next_holder = %(holder)s, next_at = NOW() "
    "WHERE lock_key = %(key)s AND holder <> %(holder)s AND (next_holder IS NULL "
    "OR next_holder = %(holder)s OR next_at < NOW() - INTERVAL '1 second')"
)
# Giving a lease back leaves the row, free, for the session's next turn. (Deleting
# it instead would race with a waiter queueing on it at that moment: the delete
# would skip the row, and the lease would stay taken until it expired.)
RELEASE = (
    f"UPDATE {ddl.LEASES} SET holder = '', expires_at = '-infinity' "
    "WHERE lock_key = %(key)s AND holder = %(holder)s"
)

# The window is applied in SQL. Replies logged after the current message (a
# turn that finished while this message waited for the lock) still belong to it.
RECENT = (
    f"SELECT role, content, id FROM (SELECT id, role, content FROM {ddl.MESSAGES} "
    "WHERE funnel = %s AND session_id = %s AND id <> %s "
    "AND (id < %s OR role = 'assistant') ORDER BY id DESC LIMIT %s) w ORDER BY id"
)

# The same, for the message this connection has just logged (currval is per connection).
RECENT_AFTER_LOG = (
    f"SELECT role, content, id FROM (SELECT id, role, content FROM {ddl.MESSAGES} "
    "WHERE funnel = %s AND session_id = %s "
    f"AND id <> currval(pg_get_serial_sequence('{ddl.MESSAGES}', 'id')) "
    f"AND (id < currval(pg_get_serial_sequence('{ddl.MESSAGES}', 'id')) OR role = 'assistant') "
    "ORDER BY id DESC LIMIT %s) w ORDER BY id"
)
