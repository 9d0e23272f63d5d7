"""Recording an order against a session in ``funnel_conversions`` (engine.records.orders).

One transaction: the session must be in the funnel's table (held with ``FOR KEY
SHARE`` so a purge cannot delete it meanwhile), then the order is inserted once
per (funnel, order id). When the id is there already, the stored order is
compared with the one given: the same content is a replay, other content a
conflict; the first order stands either way.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from ..errors import OrderConflict, SchemaOutdated, UnknownSession
from ..format.spec import FunnelSpec
from ..records.orders import Conversion, Order
from . import ddl
from .session import Connect

_RETURNING = "session_id, amount, currency, lines, ordered_at, recorded_at"


async def record(connect: Connect, funnel: FunnelSpec, order: Order) -> Conversion:
    """Record ``order``; the stored conversion, ``replayed`` when it was there already.

    Raises:
        UnknownSession: the order's session is not in the funnel's table.
        OrderConflict: the order id was recorded before with other content.
        SchemaOutdated: ``funnel_conversions`` or the funnel's table is missing.
    """
    lines = [line.plain() for line in order.lines]
    try:
        async with connect() as conn, conn.transaction():
            found = await (await conn.execute(sql.SQL(
                "SELECT 1 FROM {} WHERE session_id = %s FOR KEY SHARE").format(
                    sql.Identifier(funnel.table)), (order.session_id,))).fetchone()
            if found is None:
                raise UnknownSession(
                    f"no session {order.session_id!r} in funnel '{funnel.name}': an order is "
                    "recorded against a session that has talked to the funnel")
            row = await (await conn.execute(sql.SQL(
                "INSERT INTO {} (funnel, order_id, session_id, amount, currency, lines, "
                "ordered_at) VALUES (%s, %s, %s, %s, %s, %s, COALESCE(%s, NOW())) "
                "ON CONFLICT (funnel, order_id) DO NOTHING RETURNING " + _RETURNING).format(
                    sql.Identifier(ddl.CONVERSIONS)),
                (funnel.name, order.order_id, order.session_id, order.amount, order.currency,
                 Jsonb(lines), order.ordered_at))).fetchone()
            if row is not None:
                return _conversion(order.order_id, row, replayed=False)
            row = await (await conn.execute(sql.SQL(
                "SELECT " + _RETURNING + " FROM {} WHERE funnel = %s AND order_id = %s").format(
                    sql.Identifier(ddl.CONVERSIONS)), (funnel.name, order.order_id))).fetchone()
    except psycopg.errors.UndefinedTable:
        raise SchemaOutdated(f"funnel '{funnel.name}' has no table for conversions yet: run "
                             "`funnel migrate` for it") from None
    assert row is not None  # inserted by another transaction that has committed
    _check_same(funnel, order, lines, row)
    return _conversion(order.order_id, row, replayed=True)


def _check_same(funnel: FunnelSpec, order: Order, lines: list[dict[str, Any]],
                row: tuple[Any, ...]) -> None:
    session_id, amount, currency, stored_lines, ordered_at, _ = row
    given: list[tuple[str, Any, Any]] = [
        ("session_id", order.session_id, session_id), ("amount", order.amount, amount),
        ("currency", order.currency, currency), ("lines", lines, stored_lines)]
    if order.ordered_at is not None:  # a retry that leaves the time out means the same order
        given.append(("ordered_at", order.ordered_at, ordered_at))
    differ = [name for name, mine, theirs in given if mine != theirs]
    if differ:
        raise OrderConflict(
            f"order {order.order_id!r} of funnel '{funnel.name}' was recorded before with "
            f"another {', '.join(differ)}; the first one stands: give another order id to "
            "record another order")


def _conversion(order_id: str, row: tuple[Any, ...], *, replayed: bool) -> Conversion:
    session_id, amount, currency, lines, ordered_at, recorded_at = row
    assert isinstance(amount, Decimal) and isinstance(ordered_at, datetime)
    return Conversion(order_id, session_id, amount, currency, list(lines), ordered_at,
                      recorded_at, replayed)
