"""Schema changes: the shared tables' append-only migrations, and bringing a funnel's
table up to its declaration (`funnel migrate`)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from ..format.spec import FunnelSpec
from . import ddl
from .analytics_views import view_changes
from .functions import function_changes

# Migrations of every funnel serialize on one lock; a bounded wait turns a stuck
# migration elsewhere into an error instead of a hang.
_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '30s'"
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('funnel-migrations', 0))"


async def apply_shared(conn: psycopg.AsyncConnection[Any]) -> None:
    """Apply the shared tables' migrations not applied yet; safe to run concurrently."""
    if len(await _shared_applied(conn)) >= len(ddl.SHARED_MIGRATIONS):
        return
    async with conn.transaction():
        # Under the lock: two concurrent CREATE TABLE IF NOT EXISTS of the same new
        # table collide in the catalog (a unique violation on pg_type), not a no-op.
        await conn.execute(_LOCK_TIMEOUT)
        await conn.execute(_LOCK)
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {ddl.MIGRATIONS} (funnel TEXT NOT NULL, "
            "version INT NOT NULL, description TEXT NOT NULL, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT NOW(), PRIMARY KEY (funnel, version))"
        )
        done = await _applied(conn, "")
        for version, stmt in enumerate(ddl.SHARED_MIGRATIONS, start=1):
            if version in done:
                continue
            await conn.execute(stmt.encode())
            await _record(conn, "", version, stmt.split("(")[0].strip()[:200])


async def _shared_applied(conn: psycopg.AsyncConnection[Any]) -> set[int]:
    """The shared migrations applied so far; none while ``funnel_migrations`` is missing."""
    exists = await (await conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                       (ddl.MIGRATIONS,))).fetchone()
    return await _applied(conn, "") if exists and exists[0] else set()


async def _applied(conn: psycopg.AsyncConnection[Any], funnel: str) -> set[int]:
    rows = await (await conn.execute(
        f"SELECT version FROM {ddl.MIGRATIONS} WHERE funnel = %s", (funnel,))).fetchall()
    return {int(r[0]) for r in rows}


async def _record(conn: psycopg.AsyncConnection[Any], funnel: str, version: int, text: str
                  ) -> None:
    await conn.execute(
        f"INSERT INTO {ddl.MIGRATIONS} (funnel, version, description) VALUES (%s, %s, %s) "
        "ON CONFLICT DO NOTHING", (funnel, version, text))


async def existing_columns(conn: psycopg.AsyncConnection[Any], table: str) -> list[str]:
    rows = await (await conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = "
        "current_schema() AND table_name = %s ORDER BY ordinal_position", (table,))).fetchall()
    return [r[0] for r in rows]


async def missing_columns(conn: psycopg.AsyncConnection[Any], spec: FunnelSpec) -> list[str]:
    have = set(await existing_columns(conn, spec.table))
    return [name for name, _ in ddl.column_defs(spec) if name not in have]


async def migrate_funnel(conn: psycopg.AsyncConnection[Any], spec: FunnelSpec, *,
                         drop: bool = False, check: bool = False) -> list[str]:
    """Create or alter the funnel's table to match its declaration.

    A new field adds a column with its default; a new index is created; a
    removed field is reported and kept unless ``drop``; sessions sitting in a
    stage the funnel no longer has are reported. With ``check`` nothing is
    changed. Each change is recorded in ``funnel_migrations``. The analysts'
    views (docs/analytics.md) and the turn function (engine.store.functions) are
    created or replaced too, not recorded.
    """
    report: list[str] = []
    if not check:
        await apply_shared(conn)
    else:  # report the shared tables' pending migrations without applying them
        pending = len(ddl.SHARED_MIGRATIONS) - len(await _shared_applied(conn))
        if pending > 0:
            report.append(f"would apply {pending} migration(s) of the shared tables")
    async with conn.transaction():
        await conn.execute(_LOCK_TIMEOUT)
        await conn.execute(_LOCK)
        have = await existing_columns(conn, spec.table)
        changes: list[tuple[str, sql.Composed]] = []
        if not have:
            changes += [(f"create table {spec.table}", ddl.create_table(spec))]
        else:
            for name, definition in ddl.column_defs(spec):
                if name not in have:
                    changes.append((f"add column {name}", sql.SQL("ALTER TABLE {} ADD COLUMN {}")
                                    .format(sql.Identifier(spec.table), definition)))
            declared = {name for name, _ in ddl.column_defs(spec)}
            for name in have:
                if name not in declared:
                    if drop:
                        changes.append((f"drop column {name}", sql.SQL(
                            "ALTER TABLE {} DROP COLUMN {}").format(
                                sql.Identifier(spec.table), sql.Identifier(name))))
                    else:
                        report.append(f"column {name} is no longer declared; kept (use --drop "
                                      "to remove it)")
        if not have or not await _has_toast_target(conn, spec.table):
            changes.append((f"set toast_tuple_target of {spec.table}",
                            ddl.set_toast_target(spec)))
        for ix, stmt in zip(spec.indexes, ddl.create_indexes(spec), strict=True):
            exists = await (await conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                               (f'"{ix.name}"',))).fetchone()
            if not (exists and exists[0]):
                changes.append((f"create index {ix.name}", stmt))
        if have:
            # Sessions on older versions keep their stages: they run on their own
            # version until they move to this one, through `migrations:` and
            # `removed_stages` then (docs/versions.md).
            older = sql.SQL("funnel_version < %s") if spec.pin and "funnel_version" in have \
                else sql.SQL("FALSE AND %s::int IS NULL")
            stages = await (await conn.execute(sql.SQL(
                "SELECT stage, {} AS older, COUNT(*) FROM {} GROUP BY 1, 2").format(
                    older, sql.Identifier(spec.table)), (spec.version,))).fetchall()
            renamed = {old for step in spec.migrations for old, _ in step.stages}
            for stage, pinned, count in stages:
                if pinned:
                    if stage not in spec.stages and stage not in spec.removed_stages \
                            and stage not in renamed:
                        report.append(f"error: {count} session(s) sit in stage '{stage}' on "
                                      f"older versions, which v{spec.version} does not "
                                      "declare: they cannot move to it when they end; add "
                                      f"`removed_stages: {{{stage}: <stage>}}` or a migration "
                                      "`stages:` rename")
                    continue
                if stage not in spec.stages:
                    target = spec.removed_stages.get(stage)
                    if target:
                        report.append(f"{count} session(s) in removed stage '{stage}' "
                                      f"{'will move' if check else 'moved'} to '{target}'")
                        if not check:
                            await conn.execute(sql.SQL(
                                "UPDATE {} SET stage = %s, stage_iteration = 0, "
                                "stage_history = {}, row_version = row_version + 1 "
                                "WHERE stage = %s").format(
                                    sql.Identifier(spec.table),
                                    _history_with(sql.Literal(target), sql.SQL("NOW()"))),
                                (target, stage))
                    else:
                        report.append(f"error: {count} session(s) sit in stage '{stage}', "
                                      "which the funnel no longer declares; add "
                                      f"`removed_stages: {{{stage}: <stage>}}`")
        changes = await _with_views(conn, spec, changes)
        changes += await function_changes(conn, spec)
        if check:
            unrecorded = await _unrecorded_stages(conn, spec) if have else 0
            if unrecorded:
                report.append(f"would record the current stage of {unrecorded} session(s) in "
                              "stage_history")
            return [f"would {what}" for what, _ in changes] + report
        done = await _applied(conn, spec.table)
        version = max(done, default=0)
        for what, stmt in changes:
            await conn.execute(stmt)
            if " view " in what or " function " in what:
                continue  # derived objects: (re)created from the funnel, not recorded
            version += 1
            await _record(conn, spec.table, version, f"v{spec.version}: {what}")
        # After the changes: a seed table gets row_version above, and sessions moved out
        # of a removed stage get their new one recorded.
        done_rows = await record_current_stages(conn, spec) if have else 0
        if done_rows:
            report.append(f"recorded the current stage of {done_rows} session(s) in "
                          "stage_history")
    return [what for what, _ in changes] + report


async def _has_toast_target(conn: psycopg.AsyncConnection[Any], table: str) -> bool:
    row = await (await conn.execute(
        "SELECT COALESCE(%s = ANY(reloptions), FALSE) FROM pg_class "
        "WHERE oid = to_regclass(%s)", (ddl.TOAST_TARGET, sql.Identifier(table).as_string())
    )).fetchone()
    return bool(row and row[0])


# A row whose history does not end in the stage it sits in: written in the seed's
# format (stage set, stage_history left '[]') or by another writer. The seed's queries
# read stages from stage_history only, so such a session would count nowhere.
# Only rows in a declared stage: one the funnel no longer has is reported above instead.
_UNRECORDED = ("jsonb_typeof(stage_history) = 'array' AND "
               "(stage_history -> -1 ->> 'stage') IS DISTINCT FROM stage AND stage = ANY(%s)")


async def _unrecorded_stages(conn: psycopg.AsyncConnection[Any], spec: FunnelSpec) -> int:
    row = await (await conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE {}").format(
        sql.Identifier(spec.table), sql.SQL(_UNRECORDED)), (list(spec.stages),))).fetchone()
    return int(row[0]) if row else 0


async def record_current_stages(conn: psycopg.AsyncConnection[Any], spec: FunnelSpec) -> int:
    """Append each session's current stage to its ``stage_history`` where the history
    does not end in it (one UPDATE; a second run changes nothing); how many rows.

    The entry is the one the engine writes on entering a stage, dated at the row's
    ``updated_at``; an open entry before it is closed at the same time.
    """
    cur = await conn.execute(sql.SQL(
        "UPDATE {t} SET stage_history = {h}, row_version = row_version + 1 WHERE {w}"
    ).format(t=sql.Identifier(spec.table), h=_history_with(sql.SQL("stage"), sql.SQL("updated_at")),
             w=sql.SQL(_UNRECORDED)), (list(spec.stages),))
    return cur.rowcount


def _history_with(stage: sql.Composable, at: sql.Composable) -> sql.Composed:
    """``stage_history`` with ``stage`` entered ``at`` (the open entry before it closed
    then), as the engine writes it on entering a stage."""
    return sql.SQL(
        "(CASE WHEN jsonb_typeof(stage_history) <> 'array' THEN '[]'::jsonb "
        "WHEN jsonb_array_length(stage_history) > 0 AND NOT (stage_history -> -1 ? 'exited_at') "
        "THEN jsonb_set(stage_history, '{{-1,exited_at}}', to_jsonb({at})) "
        "ELSE stage_history END) || jsonb_build_array(jsonb_build_object("
        "'stage', {stage}, 'entered_at', to_jsonb({at})))").format(stage=stage, at=at)


async def _with_views(conn: psycopg.AsyncConnection[Any], spec: FunnelSpec,
                      changes: list[tuple[str, sql.Composed]]) -> list[tuple[str, sql.Composed]]:
    """The table changes plus the analysts' views (docs/analytics.md), created or replaced
    when their definition changed, and dropped first when a column they may read is dropped."""
    dropping = any(what.startswith("drop column") for what, _ in changes)
    before, after = await view_changes(conn, spec, dropping=dropping)
    return before + changes + after


async def ensure_turn_function(conn: psycopg.AsyncConnection[Any], spec: FunnelSpec) -> None:
    """Create or replace the funnel's turn function if this engine needs another one
    (a table created by an older version): a derived object, made without asking."""
    if not await function_changes(conn, spec):
        return
    async with conn.transaction():
        await conn.execute(_LOCK_TIMEOUT)
        await conn.execute(_LOCK)  # two workers starting at once: one of them writes it
        for _, stmt in await function_changes(conn, spec):
            await conn.execute(stmt)
