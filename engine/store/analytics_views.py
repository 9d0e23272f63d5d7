"""The analysts' views of a funnel: one per report section, created by ``funnel migrate``.

A view's comment carries a hash of its definition, so that ``funnel migrate``
replaces exactly the views whose SQL changed (:func:`view_changes`); the SQL is
the report's own (:mod:`engine.store.analytics_sql`), values inlined.
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg
from psycopg import sql

from ..format.spec import FunnelSpec
from .analytics_sql import SECTIONS, inline_queries

VIEW_COMMENT = "funnel analytics view "


def view_name(spec: FunnelSpec, section: str) -> str:
    name = f"{spec.table}_v_{section}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha1(spec.table.encode()).hexdigest()[:6]
    return f"{spec.table[:63 - len(section) - 10]}_{digest}_v_{section}"


def view_statements(spec: FunnelSpec) -> dict[str, tuple[sql.Composed, str]]:
    """View name -> (``CREATE OR REPLACE VIEW ...; COMMENT ON VIEW ...``, its comment)."""
    out = {}
    for section, query in inline_queries(spec).items():
        name = view_name(spec, section)
        body = query.as_string()
        comment = VIEW_COMMENT + hashlib.sha1(body.encode()).hexdigest()[:16]
        out[name] = (sql.SQL("CREATE OR REPLACE VIEW {v} AS {q}; COMMENT ON VIEW {v} IS {c}").format(
            v=sql.Identifier(name), q=sql.SQL(body), c=sql.Literal(comment)), comment)
    return out


async def view_changes(conn: psycopg.AsyncConnection[Any], spec: FunnelSpec, *,
                       dropping: bool = False
                       ) -> tuple[list[tuple[str, sql.Composed]], list[tuple[str, sql.Composed]]]:
    """What ``funnel migrate`` must do to the funnel's views: (before, after) the table changes.

    A view is (re)created when missing or when its definition changed (its
    comment carries a hash of the definition). Our views the funnel no longer
    needs are dropped first; when columns are dropped, every view is dropped
    before and recreated after, since a view may read a dropped column.
    """
    wanted = view_statements(spec)
    rows = await (await conn.execute(
        "SELECT c.relname, obj_description(c.oid, 'pg_class') FROM pg_class c "
        "WHERE c.relkind = 'v' AND c.relnamespace = current_schema()::regnamespace "
        "AND c.relname = ANY(%s)",
        ([view_name(spec, s) for s in SECTIONS],))).fetchall()
    existing = {name: comment or "" for name, comment in rows}
    before: list[tuple[str, sql.Composed]] = []
    after: list[tuple[str, sql.Composed]] = []
    for name, comment in existing.items():
        if (name not in wanted or dropping) and comment.startswith(VIEW_COMMENT):
            before.append((f"drop view {name}", sql.SQL("DROP VIEW IF EXISTS {}").format(
                sql.Identifier(name))))
    dropped = {what.removeprefix("drop view ") for what, _ in before}
    for name, (stmt, comment) in wanted.items():
        if name in dropped or name not in existing:
            after.append((f"create view {name}", stmt))
        elif existing[name] != comment:
            after.append((f"replace view {name}", stmt))
    return before, after


__all__ = ["VIEW_COMMENT", "view_changes", "view_name", "view_statements"]
