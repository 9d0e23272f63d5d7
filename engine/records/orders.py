"""Conversions: what was actually bought, recorded against a session.

A shop (its order webhook, its back office) tells the engine that a session's
customer placed an order: ``Engine.record_conversion`` in Python, or
``POST /v1/funnels/{funnel}/sessions/{id}/conversions`` over HTTP. Both go
through :func:`make_order`, the one place that bounds an order:

- ``order_id``: 1-128 characters of ``A-Z a-z 0-9 _ . : # / -``; the order is
  recorded once per funnel and id (the same order again is a no-op, the same
  id with other content a :class:`~engine.errors.OrderConflict`);
- ``amount`` and each line's ``price``: a decimal string (or ``Decimal``/``int``
  in Python) from 0 to 999999999999.99 with at most two decimals;
- ``currency``: an ISO 4217 code (upper case);
- ``lines``: at most 500 of ``{"sku", "qty", "price"}``, ``sku`` like an order
  id up to 64 characters, ``qty`` 1-100000;
- ``ordered_at``: an ISO 8601 time with its offset, after 2000 and at most
  10 minutes ahead of the server's clock (omitted: now).

Refusals are :class:`OrderRejected`: ``shape`` (the body is not an order: HTTP
400) or ``value`` (a field out of bounds: HTTP 422), each naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from ..errors import OrderRejected

__all__ = ["AMOUNT_PATTERN", "CURRENCIES", "MAX_AMOUNT", "MAX_LINES", "MAX_QTY", "ORDER_ID_PATTERN",
           "SKU_PATTERN",
           "Conversion", "Order", "OrderLine", "make_order", "order_from_body"]

ORDER_ID_PATTERN = "^[A-Za-z0-9_.:#/-]{1,128}$"
SKU_PATTERN = "^[A-Za-z0-9_.:#/-]{1,64}$"
AMOUNT_PATTERN = "^(0|[1-9][0-9]{0,11})(\\.[0-9]{1,2})?$"
MAX_AMOUNT = Decimal("999999999999.99")  # NUMERIC(14, 2)
MAX_LINES = 500
MAX_QTY = 100_000
FUTURE_SLACK = timedelta(minutes=10)  # clocks of shops and servers disagree a little
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
_ORDER_ID, _SKU, _AMOUNT = (re.compile(p) for p in (ORDER_ID_PATTERN, SKU_PATTERN,
                                                     AMOUNT_PATTERN))
_FIELDS = frozenset({"order_id", "amount", "currency", "lines", "ordered_at"})
_LINE_FIELDS = frozenset({"sku", "qty", "price"})

# ISO 4217 codes of money (funds, precious metals and test codes left out).
CURRENCIES = frozenset("""
AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BRL BSD BTN BWP
BYN BZD CAD CDF CHF CLP CNY COP CRC CUC CUP CVE CZK DJF DKK DOP DZD EGP ERN ETB EUR FJD FKP
GBP GEL GHS GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR IQD IRR ISK JMD JOD JPY KES KGS
KHR KMF KPW KRW KWD KYD KZT LAK LBP LKR LRD LSL LYD MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR
MWK MXN MYR MZN NAD NGN NIO NOK NPR NZD OMR PAB PEN PGK PHP PKR PLN PYG QAR RON RSD RUB RWF
SAR SBD SCR SDG SEK SGD SHP SLE SLL SOS SRD SSP STN SVC SYP SZL THB TJS TMT TND TOP TRY TTD
TWD TZS UAH UGX USD UYU UZS VED VES VND VUV WST XAF XCD XCG XOF XPF YER ZAR ZMW ZWG ZWL
""".split())


@dataclass(frozen=True)
class OrderLine:
    """One line of an order: a product (``sku``), how many, at what unit price."""

    sku: str
    qty: int
    price: Decimal

    def plain(self) -> dict[str, Any]:
        """The line as stored (``lines`` JSONB): the price as a decimal string, exact."""
        return {"sku": self.sku, "qty": self.qty, "price": str(self.price)}


@dataclass(frozen=True)
class Order:
    """An order, checked (see :func:`make_order`); ``ordered_at`` None means now."""

    order_id: str
    session_id: str
    amount: Decimal
    currency: str
    lines: tuple[OrderLine, ...]
    ordered_at: datetime | None


@dataclass(frozen=True)
class Conversion:
    """A recorded order, as stored; ``replayed`` when it had been recorded before."""

    order_id: str
    session_id: str
    amount: Decimal
    currency: str
    lines: list[dict[str, Any]]
    ordered_at: datetime
    recorded_at: datetime
    replayed: bool

    def plain(self) -> dict[str, Any]:
        """JSON-ready: amounts as decimal strings, times in ISO 8601."""
        return {"order_id": self.order_id, "session_id": self.session_id,
                "amount": f"{self.amount:.2f}", "currency": self.currency, "lines": self.lines,
                "ordered_at": self.ordered_at.isoformat(),
                "recorded_at": self.recorded_at.isoformat(), "replayed": self.replayed}


def _money(value: Any, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
        raise OrderRejected(where, 'a decimal string such as "19.99"', "shape")
    if isinstance(value, str) and not _AMOUNT.fullmatch(value):
        raise OrderRejected(where, 'a decimal string such as "19.99" (digits, at most two '
                            f"decimals, at most {MAX_AMOUNT})", "value")
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise OrderRejected(where, "a finite decimal amount", "value") from None
    if not amount.is_finite() or amount < 0 or amount > MAX_AMOUNT:
        raise OrderRejected(where, f"an amount from 0 to {MAX_AMOUNT}", "value")
    if amount != amount.quantize(Decimal("0.01")):
        raise OrderRejected(where, "an amount with at most two decimals", "value")
    return amount.quantize(Decimal("0.01"))


def _line(raw: Any, n: int) -> OrderLine:
    where = f"lines[{n}]"
    if not isinstance(raw, Mapping):
        raise OrderRejected(where, 'an object {"sku", "qty", "price"}', "shape")
    extra = set(raw) - _LINE_FIELDS
    if extra:
        raise OrderRejected(f"{where}.{sorted(extra)[0]}", "no such field (a line has sku, qty "
                            "and price)", "shape")
    sku, qty = raw.get("sku"), raw.get("qty")
    if not isinstance(sku, str):
        raise OrderRejected(f"{where}.sku", "a string", "shape")
    if not _SKU.fullmatch(sku):
        raise OrderRejected(f"{where}.sku", f"a SKU matching {SKU_PATTERN}", "value")
    if isinstance(qty, bool) or not isinstance(qty, int):
        raise OrderRejected(f"{where}.qty", "an integer", "shape")
    if not 1 <= qty <= MAX_QTY:
        raise OrderRejected(f"{where}.qty", f"a quantity from 1 to {MAX_QTY}", "value")
    return OrderLine(sku, qty, _money(raw.get("price"), f"{where}.price"))


def make_order(session_id: str, order_id: Any, amount: Any, currency: Any,
               lines: Sequence[Any] = (), ordered_at: Any = None, *,
               now: datetime | None = None) -> Order:
    """Check an order's fields (see the module docstring) and return it.

    Raises:
        OrderRejected: a field is missing, of the wrong type or out of bounds.
    """
    if not isinstance(order_id, str):
        raise OrderRejected("order_id", "a string", "shape")
    if not _ORDER_ID.fullmatch(order_id):
        raise OrderRejected("order_id", f"an id matching {ORDER_ID_PATTERN}", "value")
    total = _money(amount, "amount")
    if not isinstance(currency, str):
        raise OrderRejected("currency", "a string", "shape")
    if currency not in CURRENCIES:
        raise OrderRejected("currency", "an ISO 4217 code in upper case, such as UAH or EUR",
                            "value")
    if isinstance(lines, str | bytes) or not isinstance(lines, Sequence):
        raise OrderRejected("lines", "a list of lines", "shape")
    if len(lines) > MAX_LINES:
        raise OrderRejected("lines", f"at most {MAX_LINES} lines", "value")
    checked = tuple(_line(item, n) for n, item in enumerate(lines))
    return Order(order_id, session_id, total, currency, checked,
                 _time(ordered_at, now or datetime.now(UTC)))


def _time(value: Any, now: datetime) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise OrderRejected("ordered_at", "an ISO 8601 time such as "
                                "2026-03-01T12:30:00+02:00", "value") from None
    if not isinstance(value, datetime):
        raise OrderRejected("ordered_at", "an ISO 8601 time string", "shape")
    if value.tzinfo is None or value.utcoffset() is None:
        raise OrderRejected("ordered_at", "a time with its UTC offset (Z or +02:00)", "value")
    if value < EARLIEST or value > now + FUTURE_SLACK:
        raise OrderRejected("ordered_at", "a time after 2000 and not in the future", "value")
    return value


def order_from_body(session_id: str, body: Any, *, now: datetime | None = None) -> Order:
    """An order from a request body (a JSON object with the fields of :func:`make_order`).

    Raises:
        OrderRejected: the body is not such an object, or a field is refused.
    """
    if not isinstance(body, Mapping):
        raise OrderRejected("(body)", 'a JSON object {"order_id", "amount", "currency", '
                            '"lines", "ordered_at"}', "shape")
    extra = set(body) - _FIELDS
    if extra:
        raise OrderRejected(sorted(extra)[0], "no such field (an order has "
                            f"{', '.join(sorted(_FIELDS))})", "shape")
    for name in ("order_id", "amount", "currency"):
        if name not in body:
            raise OrderRejected(name, "a value: the field is required", "shape")
    lines = body.get("lines", [])
    if not isinstance(lines, list):
        raise OrderRejected("lines", "a list of lines", "shape")
    # Over JSON, money is a string: a JSON number is a float to most parsers.
    money = [("amount", body["amount"])] + [
        (f"lines[{n}].price", line.get("price")) for n, line in enumerate(lines)
        if isinstance(line, Mapping)]
    for where, value in money:
        if not isinstance(value, str):
            raise OrderRejected(where, 'a decimal string such as "19.99"', "shape")
    return make_order(session_id, body["order_id"], body["amount"], body["currency"], lines,
                      body.get("ordered_at"), now=now)
