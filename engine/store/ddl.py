"""SQL for a funnel's session table, generated from its `state`; identifiers via psycopg.sql."""

from __future__ import annotations

import json

from psycopg import sql

from ..format.names import CONTROL as CONTROL
from ..format.names import CONTROL_EVENTS as CONTROL_EVENTS
from ..format.names import CONVERSIONS as CONVERSIONS
from ..format.names import EMBEDDINGS as EMBEDDINGS
from ..format.names import EXITS as EXITS
from ..format.names import FOLLOW_UPS as FOLLOW_UPS
from ..format.names import INBOUND as INBOUND  # the shared tables' names, re-exported
from ..format.names import JOBS as JOBS
from ..format.names import KNOWLEDGE as KNOWLEDGE
from ..format.names import KNOWLEDGE_SETS as KNOWLEDGE_SETS
from ..format.names import KNOWLEDGE_TERMS as KNOWLEDGE_TERMS
from ..format.names import LEASES as LEASES
from ..format.names import MESSAGES as MESSAGES
from ..format.names import MIGRATIONS as MIGRATIONS
from ..format.names import OUTBOX as OUTBOX
from ..format.names import PLAYGROUND as PLAYGROUND
from ..format.names import TURNS as TURNS
from ..format.names import UNREACHABLE as UNREACHABLE
from ..format.names import VERSIONS as VERSIONS
from ..format.spec import COLUMN_TYPE, FieldSpec, FunnelSpec


def column_type(name: str) -> sql.SQL:
    # Types come from the funnel file, so they are checked against a closed list.
    if not COLUMN_TYPE.match(name):
        raise ValueError(f"unsupported column type {name!r}")
    return sql.SQL(name.upper())


def _literal_default(field: FieldSpec) -> sql.Composable | None:
    if field.default is None:
        return None
    if field.is_json:
        return sql.Literal(json.dumps(field.default, separators=(",", ":")))
    return sql.Literal(field.default)


def engine_columns(spec: FunnelSpec) -> list[tuple[str, str, sql.Composable | None, bool]]:
    """(name, type, default, not null) of the columns the engine owns."""
    return [
        ("stage", "text", sql.Literal(spec.initial), True),
        ("stage_iteration", "int", sql.Literal(0), True),
        ("stage_history", "jsonb", sql.Literal("[]"), True),
        ("turns", "int", sql.Literal(0), True),
        ("funnel_version", "int", sql.Literal(spec.version), True),
        ("row_version", "bigint", sql.Literal(1), True),
        ("notices", "jsonb", sql.Literal("[]"), True),
        ("summary_upto", "bigint", sql.Literal(0), True),
        # The experiment's variant the session runs on (engine.experiments); NULL outside one.
        ("variant", "text", None, False),
    ]


TIMESTAMPS = ("created_at", "updated_at", "last_message_at")


def column_defs(spec: FunnelSpec) -> list[tuple[str, sql.Composable]]:
    """Every column of the session table as (name, definition), in table order."""
    cols: list[tuple[str, sql.Composable]] = [
        ("session_id", sql.SQL("{} TEXT PRIMARY KEY").format(sql.Identifier("session_id")))
    ]
    entries: list[tuple[str, str, sql.Composable | None, bool]] = engine_columns(spec)[:3]
    entries += [
        (f.name, f.column_type, _literal_default(f), not f.nullable) for f in spec.state.values()
    ]
    entries += engine_columns(spec)[3:]
    for name, ctype, default, not_null in entries:
        parts: list[sql.Composable] = [sql.Identifier(name), column_type(ctype)]
        if not_null:
            parts.append(sql.SQL("NOT NULL"))
        if default is not None:
            parts.append(sql.SQL("DEFAULT {}").format(default))
        cols.append((name, sql.SQL(" ").join(parts)))
    for name in TIMESTAMPS:
        cols.append((name, sql.SQL("{} TIMESTAMPTZ NOT NULL DEFAULT NOW()").format(
            sql.Identifier(name))))
    return cols


def create_table(spec: FunnelSpec) -> sql.Composed:
    body = sql.SQL(",\n    ").join(d for _, d in column_defs(spec))
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} (\n    {}\n)").format(
        sql.Identifier(spec.table), body)


def create_indexes(spec: FunnelSpec) -> list[sql.Composed]:
    out = []
    for ix in spec.indexes:
        order = sql.SQL(" DESC") if ix.descending else sql.SQL("")
        where = (sql.SQL(" WHERE {} IS NOT NULL").format(sql.Identifier(ix.column))
                 if ix.where_not_null else sql.SQL(""))
        out.append(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({}{}){}").format(
            sql.Identifier(ix.name), sql.Identifier(spec.table), sql.Identifier(ix.column),
            order, where))
    return out


# Once a session row passes 2 KB, PostgreSQL moves its largest values out of line
# until the row is under this size; a turn's save keeps the values it did not change
# (engine.store.statements), so a summary or a history that did not change this turn
# stays where it is, and the turn's WAL carries an 18-byte pointer instead of the
# value. Below 2 KB nothing changes (issue 19: docs/persistence.md).
TOAST_TARGET = "toast_tuple_target=800"


def set_toast_target(spec: FunnelSpec) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} SET ({})").format(sql.Identifier(spec.table),
                                                     sql.SQL(TOAST_TARGET))


def funnel_ddl(spec: FunnelSpec) -> list[sql.Composed]:
    """CREATE TABLE and CREATE INDEX statements for the funnel's session table."""
    return [create_table(spec), *create_indexes(spec)]


def render(spec: FunnelSpec) -> str:
    """The DDL as text, for `funnel sql` (``| psql`` runs it)."""
    parts = [f"-- Session state of funnel '{spec.name}' v{spec.version}, from {spec.path}"]
    parts += [q.as_string() + ";" for q in funnel_ddl(spec)]
    return "\n".join(parts) + "\n"


# Shared tables, one set for every funnel. Append-only: index + 1 is the version,
# recorded in funnel_migrations as funnel '' (see langgraph-checkpoint-postgres).
SHARED_MIGRATIONS: list[str] = [
    f"""CREATE TABLE IF NOT EXISTS {MESSAGES} (
        id BIGSERIAL PRIMARY KEY,
        funnel TEXT NOT NULL,
        session_id TEXT NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
        content TEXT NOT NULL,
        stage TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT NOW()
    )""",
    f"CREATE INDEX IF NOT EXISTS idx_{MESSAGES}_session ON {MESSAGES} (funnel, session_id, id DESC)",
    f"""CREATE TABLE IF NOT EXISTS {TURNS} (
        id BIGSERIAL PRIMARY KEY,
        funnel TEXT NOT NULL,
        funnel_version INT NOT NULL,
        session_id TEXT NOT NULL,
        stage_before TEXT NOT NULL,
        stage_after TEXT NOT NULL,
        transitions JSONB NOT NULL DEFAULT '[]',
        actions JSONB NOT NULL DEFAULT '[]',
        refused JSONB NOT NULL DEFAULT '[]',
        validation_failures INT NOT NULL DEFAULT 0,
        repaired BOOLEAN NOT NULL DEFAULT FALSE,
        fallback BOOLEAN NOT NULL DEFAULT FALSE,
        llm_ms INT,
        turn_ms INT,
        prompt_tokens INT NOT NULL DEFAULT 0,
        completion_tokens INT NOT NULL DEFAULT 0,
        cost NUMERIC(12,6),
        model TEXT,
        error TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT NOW()
    )""",
    f"CREATE INDEX IF NOT EXISTS idx_{TURNS}_time ON {TURNS} (funnel, created_at)",
    f"CREATE INDEX IF NOT EXISTS idx_{TURNS}_session ON {TURNS} (funnel, session_id)",
    f"""CREATE TABLE IF NOT EXISTS {OUTBOX} (
        id BIGSERIAL PRIMARY KEY,
        idempotency_key TEXT NOT NULL UNIQUE,
        funnel TEXT NOT NULL,
        session_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        payload JSONB NOT NULL,
        attempts INT NOT NULL DEFAULT 0,
        last_error TEXT,
        next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
        delivered_at TIMESTAMPTZ,
        created_at TIMESTAMPTZ NOT NULL DEFAULT NOW()
    )""",
    f"CREATE INDEX IF NOT EXISTS idx_{OUTBOX}_due ON {OUTBOX} (next_attempt_at) "
    "WHERE delivered_at IS NULL",
    # A session with a turn in progress or waiting: who holds it ('' when free),
    # until when, and which waiting turn goes next (so a busy session is fair).
    f"""CREATE TABLE IF NOT EXISTS {LEASES} (
        lock_key TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL,
        next_holder TEXT,
        next_at TIMESTAMPTZ
    )""",
    # Leases need no WAL: taking and giving one back is then no disk flush, and after
    # a crash of the database (which empties an unlogged table) every lease is free,
    # which is right, since the turns that held them lost their connections too.
    f"ALTER TABLE {LEASES} SET UNLOGGED",
    # Inbound idempotency (engine.store.idempotency): one row per delivery key of a
    # customer message (Telegram bot + update_id, an HTTP Idempotency-Key), written with
    # the message in the turn's first round trip; the turn's save stores its answer here,
    # so a second delivery of the key replays it instead of running another turn.
    f"""CREATE TABLE IF NOT EXISTS {INBOUND} (
        funnel TEXT NOT NULL,
        channel TEXT NOT NULL,
        key TEXT NOT NULL,
        session_id TEXT NOT NULL,
        message_id BIGINT,
        holder TEXT NOT NULL DEFAULT '',
        alive_until TIMESTAMPTZ NOT NULL DEFAULT NOW(),
        attempts INT NOT NULL DEFAULT 0,
        meta JSONB,
        response JSONB,
        created_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
        answered_at TIMESTAMPTZ,
        delivery TEXT,
        PRIMARY KEY (funnel, channel, key)
    )""",
    f"CREATE INDEX IF NOT EXISTS idx_{INBOUND}_pending ON {INBOUND} (alive_until) "
    "WHERE response IS NULL",
    f"CREATE INDEX IF NOT EXISTS idx_{INBOUND}_session ON {INBOUND} (funnel, session_id)",
    # A session its channel refuses to reach (Telegram 403: the customer blocked the bot).
    f"""CREATE TABLE IF NOT EXISTS {UNREACHABLE} (
        funnel TEXT NOT NULL,
        session_id TEXT NOT NULL,
        channel TEXT NOT NULL,
        reason TEXT NOT NULL,
        since TIMESTAMPTZ NOT NULL DEFAULT NOW(),
        PRIMARY KEY (funnel, session_id, channel)
    )""",
    # Per-target delivery state of an outbox row (engine.turn.notify): a target that took
    # the row is never sent it again because another target failed.
    f"ALTER TABLE {OUTBOX} ADD COLUMN IF NOT EXISTS done_targets JSONB NOT NULL DEFAULT '[]'",
    # HTTP calls a turn's model answer took (retries, repair and fallback models
    # included); NULL for turns recorded before it was counted.
    f"ALTER TABLE {TURNS} ADD COLUMN IF NOT EXISTS attempts INT",
    # The knowledge base (engine/knowledge, docs/knowledge.md): one row per funnel (its
    # text search configuration, the digest of its folder, how many chunks), the
    # chunks with their tsvector, and how many chunks each lexeme is in (a search
    # drops the lexemes most chunks have, as a ranking function would weigh them
    # little anyway, so that it ranks hundreds of rows, not thousands).
    f"""CREATE TABLE IF NOT EXISTS {KNOWLEDGE_SETS} (
        funnel TEXT PRIMARY KEY,
        config REGCONFIG NOT NULL,
        digest TEXT NOT NULL,
        chunks INT NOT NULL,
        indexed_at TIMESTAMPTZ NOT NULL DEFAULT NOW()
    )""",
    f"""CREATE TABLE IF NOT EXISTS {KNOWLEDGE} (
        funnel TEXT NOT NULL,
        id TEXT NOT NULL,
        source TEXT NOT NULL,
        title TEXT NOT NULL,
        body TEXT NOT NULL,
        tokens INT NOT NULL,
        tsv TSVECTOR NOT NULL,
        PRIMARY KEY (funnel, id)
    )""",
    f"CREATE INDEX IF NOT EXISTS idx_{KNOWLEDGE}_tsv ON {KNOWLEDGE} USING GIN (tsv)",
    f"""CREATE TABLE IF NOT EXISTS {KNOWLEDGE_TERMS} (
        funnel TEXT NOT NULL,
        lexeme TEXT NOT NULL,
        ndoc INT NOT NULL,
        PRIMARY KEY (funnel, lexeme)
    )""",
    f"ALTER TABLE {TURNS} ADD COLUMN IF NOT EXISTS knowledge JSONB NOT NULL DEFAULT '[]'",
    # Why each turn moved or stayed: every exit evaluated, with the values it read
    # (engine.turn.explain).
    f"ALTER TABLE {TURNS} ADD COLUMN IF NOT EXISTS explain JSONB",
    # The model's outputs as received (first answer, then the repair), for
    # `funnel record`; cleared by `funnel purge --anonymize` (they quote the customer).
    f"ALTER TABLE {TURNS} ADD COLUMN IF NOT EXISTS raw_output JSONB",
    # What was actually bought: orders recorded against a session (a channel's or a
    # shop's webhook, Engine.record_conversion), idempotent on the order id.
    f"""CREATE TABLE IF NOT EXISTS {CONVERSIONS} (
        funnel TEXT NOT NULL,
        order_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        amount NUMERIC(14, 2) NOT NULL CHECK (amount >= 0),
        currency TEXT NOT NULL,
        lines JSONB NOT NULL DEFAULT '[]',
        ordered_at TIMESTAMPTZ NOT NULL,
        recorded_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
        PRIMARY KEY (funnel, order_id)
    )""",
    f"CREATE INDEX IF NOT EXISTS idx_{CONVERSIONS}_session ON {CONVERSIONS} (funnel, session_id)",
    # The version store (engine.versions, docs/versions.md): every deployed version of a
    # funnel as its bundle of files, once per content hash; a version's current bundle is
    # the one deployed last. Sessions pinned to an old version are run from here.
    f"""CREATE TABLE IF NOT EXISTS {VERSIONS} (
        funnel TEXT NOT NULL,
        version INT NOT NULL,
        hash TEXT NOT NULL,
        entry TEXT NOT NULL,
        files JSONB NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
        deployed_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
        PRIMARY KEY (funnel, version, hash)
    )""",
    # The declared state migration a turn applied when its session moved to a newer
    # version (from, to, the steps and what each changed); NULL for every other turn.
    f"ALTER TABLE {TURNS} ADD COLUMN IF NOT EXISTS migration JSONB",
    # The experiment's variant each turn ran on (engine.experiments); NULL outside one.
    f"ALTER TABLE {TURNS} ADD COLUMN IF NOT EXISTS variant TEXT",
    # When a periodic job last ran (the retention purge of `funnel serve`, per funnel), so
    # that of several workers one runs it once per period (engine.store.jobs).
    f"""CREATE TABLE IF NOT EXISTS {JOBS} (
        job TEXT PRIMARY KEY,
        last_run_at TIMESTAMPTZ NOT NULL,
        result JSONB
    )""",
    # Of prompt_tokens, those the provider read from its prompt cache (OpenAI's
    # usage.prompt_tokens_details.cached_tokens, Anthropic's cache_read_input_tokens).
    f"ALTER TABLE {TURNS} ADD COLUMN IF NOT EXISTS cached_prompt_tokens INT NOT NULL DEFAULT 0",
    # A stage's exits as an explanation lists them (to, condition, global), once per
    # distinct list, under a digest that turn records cite instead of repeating them on
    # every turn (engine.turn.explain.compact): content-addressed, so a version or variant
    # whose exits differ gets a digest of its own, and nothing here is ever rewritten.
    f"""CREATE TABLE IF NOT EXISTS {EXITS} (
        digest TEXT PRIMARY KEY,
        exits JSONB NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT NOW()
    )""",
    # Of prompt_tokens, those the provider wrote to its prompt cache (Anthropic's
    # cache_creation_input_tokens, Bedrock's cacheWriteInputTokens: billed at 1.25x input).
    f"ALTER TABLE {TURNS} ADD COLUMN IF NOT EXISTS cache_write_tokens INT NOT NULL DEFAULT 0",
    # A manager in the session (engine.turn.manager): who wrote a message that is not the
    # bot's (a manager's name), and the messages the bot let pass while a manager held
    # the session (a customer's message it did not answer, its one holding reply).
    f"ALTER TABLE {MESSAGES} ADD COLUMN IF NOT EXISTS author TEXT",
    f"ALTER TABLE {MESSAGES} ADD COLUMN IF NOT EXISTS held BOOLEAN NOT NULL DEFAULT FALSE",
    f"ALTER TABLE {MESSAGES} DROP CONSTRAINT IF EXISTS {MESSAGES}_role_check",
    # NOT VALID: every row logged so far is valid already; no scan of the whole log.
    f"ALTER TABLE {MESSAGES} ADD CONSTRAINT {MESSAGES}_role_check CHECK (role IN "
    "('user', 'assistant', 'system', 'manager')) NOT VALID",
    # Who answers a session besides the bot: no row, the bot; `manager`, a manager took it
    # over (the bot logs and holds every customer message); `approval`, the session waits
    # for a manager's approval until `deadline`. One row per session at most.
    f"""CREATE TABLE IF NOT EXISTS {CONTROL} (
        funnel TEXT NOT NULL,
        session_id TEXT NOT NULL,
        mode TEXT NOT NULL CHECK (mode IN ('manager', 'approval')),
        manager TEXT,
        since TIMESTAMPTZ NOT NULL DEFAULT NOW(),
        holding_sent BOOLEAN NOT NULL DEFAULT FALSE,
        PRIMARY KEY (funnel, session_id)
    )""",
    # Every take-over, manager message and release, in order: the report's time under a
    # manager, and who did what.
    f"""CREATE TABLE IF NOT EXISTS {CONTROL_EVENTS} (
        id BIGSERIAL PRIMARY KEY,
        funnel TEXT NOT NULL,
        session_id TEXT NOT NULL,
        event TEXT NOT NULL,
        manager TEXT,
        detail JSONB NOT NULL DEFAULT '{{}}',
        created_at TIMESTAMPTZ NOT NULL DEFAULT NOW()
    )""",
    f"CREATE INDEX IF NOT EXISTS idx_{CONTROL_EVENTS}_session ON {CONTROL_EVENTS} "
    "(funnel, session_id, id)",
    # An approval gate (a stage's `approval:`, engine.turn.approval): the move it holds
    # (from, to, trigger, reason) and when it times out; the sweep finds the due ones.
    f"ALTER TABLE {CONTROL} ADD COLUMN IF NOT EXISTS held JSONB, "
    "ADD COLUMN IF NOT EXISTS deadline TIMESTAMPTZ",
    f"CREATE INDEX IF NOT EXISTS idx_{CONTROL}_deadline ON {CONTROL} (funnel, deadline) "
    "WHERE deadline IS NOT NULL",
    # Semantic recall (engine.memory.recall, docs/memory.md): one embedding per logged
    # message, a unit vector by the model named; `real[]` here, turned into pgvector's
    # `vector` at start where the server has it (engine.store.recall). A copy of the
    # message: deleted with it (the cascade), and by an anonymization.
    f"""CREATE TABLE IF NOT EXISTS {EMBEDDINGS} (
        message_id BIGINT PRIMARY KEY REFERENCES {MESSAGES} (id) ON DELETE CASCADE,
        funnel TEXT NOT NULL,
        session_id TEXT NOT NULL,
        model TEXT NOT NULL,
        embedding REAL[] NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT NOW()
    )""",
    f"CREATE INDEX IF NOT EXISTS idx_{EMBEDDINGS}_session ON {EMBEDDINGS} (funnel, session_id)",
    # The claims of a turn's replies that the catalog and the state did not back
    # (engine.claims): {kind, name, text, expected, attempt} each; `funnel report` counts
    # them per stage. They quote the model's reply: an anonymization empties them.
    f"ALTER TABLE {TURNS} ADD COLUMN IF NOT EXISTS claims JSONB NOT NULL DEFAULT '[]'",
    # Every HTTP call of a turn (engine.records.calls: model, attempt, outcome, ms, tokens,
    # whether the engine counted them, cost), the timed-out and failed ones too; and
    # whether any call's tokens were counted by the engine (the provider sent no usage).
    f"ALTER TABLE {TURNS} ADD COLUMN IF NOT EXISTS calls JSONB, "
    "ADD COLUMN IF NOT EXISTS tokens_counted BOOLEAN NOT NULL DEFAULT FALSE",
    # A session's outbox rows by the session (an erasure or an export, engine.store.erasure;
    # the retention purge): without it each is a scan of the whole outbox, which keeps
    # every delivered channel reply (measured: 56 ms at 300,000 rows; 0.1 ms with it).
    f"CREATE INDEX IF NOT EXISTS idx_{OUTBOX}_session ON {OUTBOX} (funnel, session_id)",
    # The playground's sessions (engine.store.playground): made by the studio, never a
    # customer's; where one was branched from. `funnel report`, `funnel replay`, the
    # experiments' figures, /metrics and the studio's list leave them out by default.
    f"""CREATE TABLE IF NOT EXISTS {PLAYGROUND} (
        funnel TEXT NOT NULL,
        session_id TEXT NOT NULL,
        branched_from TEXT,
        branched_turn INT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
        PRIMARY KEY (funnel, session_id)
    )""",
    # Trying is not deploying (docs/versions.md): a copy an engine ran on without being
    # deployed (the studio, `funnel chat`, `funnel test`, ...) is stored as a trial, by
    # hash, for replay to read; a pinned session never loads one. Rows stored before are
    # taken as deployments, as they were.
    f"ALTER TABLE {VERSIONS} ADD COLUMN IF NOT EXISTS trial BOOLEAN NOT NULL DEFAULT FALSE",
    # The content hash of the copy of the funnel (its bundle in the version store) each
    # turn ran on: what `funnel replay` plays a session's recording on. NULL: recorded
    # before it was kept.
    f"ALTER TABLE {TURNS} ADD COLUMN IF NOT EXISTS funnel_hash TEXT",
    # Follow-ups (engine.turn.follow_up, docs/follow-ups.md): per session, the next one
    # due (`due_at`, NULL when none is), the step it is, when the customer last wrote
    # (`anchor_at`, `anchor_id`: the message), how many of each stage:step went out, and
    # whether the customer opted out. The scheduler finds the due ones with one range
    # scan of the partial index, whatever the number of sessions that wait for nothing.
    f"""CREATE TABLE IF NOT EXISTS {FOLLOW_UPS} (
        funnel TEXT NOT NULL,
        session_id TEXT NOT NULL,
        stage TEXT NOT NULL,
        step INT NOT NULL DEFAULT 0,
        anchor_at TIMESTAMPTZ NOT NULL,
        anchor_id BIGINT NOT NULL DEFAULT 0,
        due_at TIMESTAMPTZ,
        sent JSONB NOT NULL DEFAULT '{{}}',
        opted_out BOOLEAN NOT NULL DEFAULT FALSE,
        updated_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
        PRIMARY KEY (funnel, session_id)
    )""",
    f"CREATE INDEX IF NOT EXISTS idx_{FOLLOW_UPS}_due ON {FOLLOW_UPS} (funnel, due_at) "
    "WHERE due_at IS NOT NULL",
    # A follow-up's message and turn record say so: {stage, step, due} (the turn) and
    # "stage:step" (the message); NULL for every other.
    f"ALTER TABLE {TURNS} ADD COLUMN IF NOT EXISTS follow_up JSONB",
    f"ALTER TABLE {MESSAGES} ADD COLUMN IF NOT EXISTS follow_up TEXT",
]
