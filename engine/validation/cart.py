"""F509: a cart whose total can overflow the column of its ``cart.total`` field.

The engine refuses a quantity over ``cart.max_qty`` per product (engine.funnel.actions),
so the largest cart holds every product of the catalog at ``max_qty``: its total is
``max_qty`` times the sum of the prices. A ``numeric(10,2)`` column holds at most
99,999,999.99 and an ``integer`` one 2,147,483,647; a cart past that fails the turn's
save (PostgreSQL's "numeric field overflow") on the turn that adds the last product.
Reported at the field's ``column:`` (or the field), with the column that would fit.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from ..format.spec import default_column_type
from .diagnostics import Report, as_dict

__all__ = ["check_cart_total", "column_capacity"]

DEFAULT_MAX_QTY = 20  # engine.format.build's default for `cart.max_qty`
_NUMERIC = re.compile(r"numeric\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)")
_INTEGERS = {"smallint": Decimal(2**15 - 1), "int": Decimal(2**31 - 1),
             "integer": Decimal(2**31 - 1), "bigint": Decimal(2**63 - 1)}


def column_capacity(column: str) -> Decimal | None:
    """The largest value a column of this SQL type holds; None for an unbounded one
    (``numeric``, ``double precision``) or one that holds no number."""
    name = " ".join(column.lower().split())
    if name in _INTEGERS:
        return _INTEGERS[name]
    m = _NUMERIC.fullmatch(name)
    if m is None:
        return None
    precision, scale = int(m[1]), int(m[2])
    return Decimal(10) ** (precision - scale) - Decimal(10) ** -scale


def _fitting(column: str, worst: Decimal) -> str:
    """A column of the same kind that holds ``worst``."""
    m = _NUMERIC.fullmatch(" ".join(column.lower().split()))
    if m is None:  # an integer column
        return "bigint" if worst <= _INTEGERS["bigint"] else "numeric"
    scale = int(m[2])
    digits = len(str(int(worst))) + 1  # a digit to spare
    return f"numeric({digits + scale},{scale})" if digits + scale <= 99 else "numeric"


def check_cart_total(data: dict[str, Any], prices: Sequence[Decimal], report: Report) -> None:
    """Warn (F509) when the largest cart's total does not fit ``cart.total``'s column."""
    cart = as_dict(data.get("cart"))
    total = cart.get("total")
    if not isinstance(total, str):
        return
    field = as_dict(as_dict(data.get("state")).get(total))
    max_qty = cart.get("max_qty", DEFAULT_MAX_QTY)
    if not field or not prices or isinstance(max_qty, bool) or not isinstance(max_qty, int) \
            or max_qty < 1 or field.get("type") not in ("integer", "number"):
        return  # no total, or a broken one: the format's checks say why
    column = field.get("column")
    if not isinstance(column, str):
        column = default_column_type(str(field["type"]), None)
    capacity = column_capacity(column)
    if capacity is None:
        return
    worst = max_qty * sum(prices, Decimal(0))
    if worst <= capacity:
        return
    where: tuple[str, ...] = ("state", total, "column") if "column" in field else ("state", total)
    report.at(where, "warning", "F509",
              f"`{total}`'s column is {column} (at most {capacity:,}), but a cart can reach "
              f"{worst:,}: the catalog's {len(prices)} products at cart.max_qty {max_qty} "
              f"each (the dearest at {max(prices):,}); the turn that passes it fails its "
              f"save. Widen the column (`column: {_fitting(column, worst)}`, then `funnel "
              "migrate`) or lower `cart.max_qty`")
