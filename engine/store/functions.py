"""The server-side function that opens a turn, one per funnel table.

A turn's first round trip is one call: take the session's lease (or queue for
it), log the user's message with the stage it arrived in, and, when the lease
is ours, read the row (as one JSON object, decoded once) and the message
window, and the session's control row (a manager's take-over, an approval that
waits). With a delivery key (``p_ikey``: a Telegram update, an HTTP
``Idempotency-Key``) it first records the key in ``funnel_inbound``; a key
seen before logs nothing and takes no lease, and returns the first delivery's
stored answer instead (``replayed``; see engine.store.idempotency). It is one
statement and one commit, and an asynchronous one (``synchronous_commit`` off for
this transaction only: the turn does not wait for a WAL flush before calling the
model; see docs/persistence.md for what that risks). Inside it, each statement sees
what committed before it ran, so the row and the window include the previous
turn's save even if that committed while this call waited on the lease.

The function is written per funnel table, with the table's name in its SQL,
because PL/pgSQL plans static SQL once per connection while a dynamic
``EXECUTE`` is planned on every call (measured: a sixth of a turn's database
CPU). Like the analysts' views, it is a derived object: created or replaced
when its definition changes (its comment carries a hash), not recorded as a
migration.
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg
from psycopg import sql

from ..format.spec import FunnelSpec
from .ddl import CONTROL, INBOUND, LEASES, MESSAGES

FUNCTION_COMMENT = "funnel turn function "
_MAX_IDENTIFIER = 63  # PostgreSQL's NAMEDATALEN - 1


def begin_function_name(table: str) -> str:
    """``funnel_turn_<table>``, shortened with a hash when it would pass 63 bytes."""
    name = f"funnel_turn_{table}"
    if len(name.encode()) <= _MAX_IDENTIFIER:
        return name
    digest = hashlib.sha1(table.encode()).hexdigest()[:8]
    short = table.encode()[:_MAX_IDENTIFIER - len("funnel_turn__") - 8].decode(errors="ignore")
    return f"funnel_turn_{short}_{digest}"


_BODY = """
DECLARE
    logged bigint;
    answer jsonb;
BEGIN
    -- This commit is not waited for (docs/persistence.md): a crash of the service loses
    -- nothing, since PostgreSQL writes it out within the WAL writer's delay; only a crash
    -- of PostgreSQL itself within that delay can lose the message, and then its turn failed
    -- (its save, a synchronous commit, would have flushed it) and the customer resends.
    -- Transaction-local: the turn's save commits synchronously as before.
    PERFORM set_config('synchronous_commit', 'off', true);
    replayed := FALSE;
    IF p_text IS NOT NULL AND p_ikey IS NOT NULL THEN
        -- A delivery key seen before: no message, no lease, no turn; the first
        -- delivery's answer (NULL while its turn runs) goes back instead.
        INSERT INTO {inbound} AS i (funnel, channel, key, session_id, holder, alive_until)
        VALUES (p_funnel, p_channel, p_ikey, p_session, p_holder,
                NOW() + p_seconds * INTERVAL '1 second')
        ON CONFLICT (funnel, channel, key) DO NOTHING;
        IF NOT FOUND THEN
            SELECT i.message_id, i.response INTO message_id, state FROM {inbound} i
            WHERE i.funnel = p_funnel AND i.channel = p_channel AND i.key = p_ikey;
            leased := FALSE;
            replayed := TRUE;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    INSERT INTO {leases} AS l (lock_key, holder, expires_at)
    VALUES (p_key, p_holder, NOW() + p_seconds * INTERVAL '1 second')
    ON CONFLICT (lock_key) DO UPDATE SET holder = EXCLUDED.holder,
        expires_at = EXCLUDED.expires_at, next_holder = NULL, next_at = NULL
    WHERE l.holder = EXCLUDED.holder OR (l.expires_at < NOW() AND (l.next_holder IS NULL
        OR l.next_holder = EXCLUDED.holder OR l.next_at < NOW() - INTERVAL '1 second'));
    leased := FOUND;
    IF p_text IS NULL AND p_ikey IS NOT NULL THEN
        -- the turn of a message accepted before (maybe by a process that died): this
        -- turn's holder keeps the key's claim alive from now on (engine.store.heartbeat)
        UPDATE {inbound} AS i SET holder = p_holder,
            alive_until = NOW() + p_seconds * INTERVAL '1 second'
        WHERE i.funnel = p_funnel AND i.channel = p_channel AND i.key = p_ikey
            AND i.response IS NULL;
    END IF;
    IF NOT leased AND p_queue THEN  -- waiting already: hold our place in line
        UPDATE {leases} AS l SET next_holder = p_holder, next_at = NOW()
        WHERE l.lock_key = p_key AND l.holder <> p_holder AND (l.next_holder IS NULL
            OR l.next_holder = p_holder OR l.next_at < NOW() - INTERVAL '1 second');
    END IF;
    SELECT to_jsonb(s) INTO state FROM {table} s WHERE s.session_id = p_session;
    message_id := p_current;
    IF p_text IS NOT NULL THEN
        INSERT INTO {messages} (funnel, session_id, role, content, stage)
        VALUES (p_funnel, p_session, 'user', p_text, COALESCE(state->>'stage', p_initial))
        RETURNING id INTO logged;
        message_id := logged;
        IF p_ikey IS NOT NULL THEN
            UPDATE {inbound} AS i SET message_id = logged
            WHERE i.funnel = p_funnel AND i.channel = p_channel AND i.key = p_ikey;
        END IF;
    END IF;
    IF NOT leased THEN
        state := NULL;
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_text IS NULL AND p_ikey IS NOT NULL THEN
        -- Answered meanwhile (a stalled worker's turn saved after all): the save gave
        -- the lease back with the answer, so holding the lease, we would see it.
        SELECT i.response INTO answer FROM {inbound} i
        WHERE i.funnel = p_funnel AND i.channel = p_channel AND i.key = p_ikey;
        IF answer IS NOT NULL THEN
            UPDATE {leases} SET holder = '', expires_at = '-infinity'
            WHERE lock_key = p_key AND holder = p_holder;
            leased := FALSE;
            replayed := TRUE;
            state := answer;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    -- Who answers the session besides the bot (engine.store.control): read here, under
    -- the lease, so that a turn needs no round trip of its own to learn it.
    IF p_control THEN
        SELECT to_jsonb(c) INTO control FROM {control} c
        WHERE c.funnel = p_funnel AND c.session_id = p_session;
    END IF;
    -- Replies logged after the current message (a turn that finished while this
    -- message waited for the lease) still belong to its window.
    SELECT COALESCE(jsonb_agg(jsonb_build_array(w.role, w.content, w.id) ORDER BY w.id), '[]')
    INTO recent FROM (SELECT m.id, m.role, m.content FROM {messages} m
        WHERE m.funnel = p_funnel AND m.session_id = p_session AND m.id <> message_id
        AND (m.id < message_id OR m.role = 'assistant') ORDER BY m.id DESC
        LIMIT p_window) w;
    RETURN NEXT;
END
"""

_SIGNATURE = (
    "p_funnel text, p_session text, p_text text, p_initial text, p_key text, p_holder text, "
    "p_seconds float8, p_window int, p_current bigint, p_queue boolean, p_channel text, "
    "p_ikey text, p_control boolean"
)
_RESULT = ("message_id bigint, leased boolean, state jsonb, recent jsonb, replayed boolean, "
           "control jsonb")


def begin_function(spec: FunnelSpec) -> tuple[str, list[sql.Composed], str]:
    """(name, statements that create it, its comment) for the funnel's table."""
    name = sql.Identifier(begin_function_name(spec.table))
    body = _BODY.format(leases=sql.Identifier(LEASES).as_string(),
                        messages=sql.Identifier(MESSAGES).as_string(),
                        inbound=sql.Identifier(INBOUND).as_string(),
                        control=sql.Identifier(CONTROL).as_string(),
                        table=sql.Identifier(spec.table).as_string())
    comment = FUNCTION_COMMENT + hashlib.sha1((_SIGNATURE + body).encode()).hexdigest()[:16]
    create = sql.SQL(
        "CREATE OR REPLACE FUNCTION {name}({signature}) RETURNS TABLE ({result}) "
        "LANGUAGE plpgsql AS {body}"
    ).format(name=name, signature=sql.SQL(_SIGNATURE), result=sql.SQL(_RESULT),
             body=sql.Literal(body))
    describe = sql.SQL("COMMENT ON FUNCTION {name}({signature}) IS {comment}").format(
        name=name, signature=sql.SQL(_SIGNATURE), comment=sql.Literal(comment))
    return begin_function_name(spec.table), [create, describe], comment


# The parameters' types, in the order of the signature: sent with the statement, so
# that the call names one overload (others of older engines may stay, see below).
_TYPES = {"text": 25, "float8": 701, "int": 23, "bigint": 20, "boolean": 16}
TYPES = [_TYPES[p.split()[1]] for p in _SIGNATURE.split(", ")]


def call(spec: FunnelSpec) -> str:
    """The turn's first statement: ``$n`` parameters in the order of the signature
    (their types are :data:`TYPES`)."""
    return sql.SQL("SELECT message_id, leased, state, recent, replayed, control "
                   "FROM {}({})").format(
        sql.Identifier(begin_function_name(spec.table)),
        sql.SQL(", ").join(sql.SQL(f"${i}") for i in range(1, len(TYPES) + 1))).as_string()


async def function_changes(conn: psycopg.AsyncConnection[Any], spec: FunnelSpec
                           ) -> list[tuple[str, sql.Composed]]:
    """What must run for the turn function to match this engine: nothing when it does."""
    name, statements, comment = begin_function(spec)
    # Overloads of other engine versions (another signature) stay: a server still
    # running the previous version keeps calling its own during a rolling deploy.
    rows = await (await conn.execute(
        "SELECT obj_description(p.oid, 'pg_proc') FROM pg_proc p WHERE p.proname = %s "
        "AND p.pronamespace = current_schema()::regnamespace", (name,))).fetchall()
    if any(r[0] == comment for r in rows):
        return []
    what = f"{'create' if not rows else 'replace'} function {name}"
    return [(what, stmt) for stmt in statements]
