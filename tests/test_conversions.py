"""Conversions: orders recorded against a session, by `Engine.record_conversion` and by
``POST /v1/funnels/{funnel}/sessions/{id}/conversions``, on a real PostgreSQL.

Idempotent on the order id; the same id with other content is a conflict and
the first order stands; every refusal is a clear 4xx, never a 500.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from engine import Engine, ScriptedModel
from engine.errors import OrderConflict, OrderRejected, UnknownSession
from engine.records.orders import make_order
from engine.service.app import create_app
from engine.service.config import ServiceConfig

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
DEMO = ROOT / "funnels" / "puramur" / "demo.yaml"
SHOP = "shop-key-2e8b0c6d4f1a93"
CONVERSE = "converse-key-7a1d3e5b9c20"
SECRET = b"test-secret-0123456789abcdef"
BASE = "/v1/funnels/puramur"
LINES = [{"sku": "PR251010", "qty": 2, "price": "199.00"},
         {"sku": "PR251020", "qty": 1, "price": "299.00"}]
ORDER = {"order_id": "ORD-1001", "amount": "697.00", "currency": "UAH", "lines": LINES,
         "ordered_at": "2026-03-01T12:30:00+02:00"}

pytestmark = pytest.mark.postgres


def conversions(sql: Any) -> list[tuple[Any, ...]]:
    return sql("SELECT order_id, session_id, amount, currency, lines FROM funnel_conversions "
               "ORDER BY order_id")


# -- Engine.record_conversion --------------------------------------------------------


async def test_engine_records_an_order_once(db_url: str, sql: Any) -> None:
    model = ScriptedModel.from_data({"default": {"reply": "Cat or dog?"}})
    async with await Engine.open(PURAMUR, db=db_url, model=model) as engine:
        with pytest.raises(UnknownSession, match="no session 'nobody'"):
            await engine.record_conversion("nobody", "A-1", "10.00", "UAH")
        await engine.handle("buyer", "Hi")
        first = await engine.record_conversion(
            "buyer", "A-1", Decimal("697"), "UAH", LINES,
            datetime(2026, 3, 1, 10, 30, tzinfo=UTC))
        assert not first.replayed and first.amount == Decimal("697.00")
        # The same order again (a retried webhook): the stored one, no second row.
        again = await engine.record_conversion("buyer", "A-1", "697.00", "UAH", LINES,
                                               "2026-03-01T12:30:00+02:00")
        assert again.replayed and again.recorded_at == first.recorded_at
        # Without its time, a retry is still the same order.
        assert (await engine.record_conversion("buyer", "A-1", 697, "UAH", LINES)).replayed
        with pytest.raises(OrderConflict, match="another amount, lines"):
            await engine.record_conversion("buyer", "A-1", "10.00", "UAH", LINES[:1])
        with pytest.raises(OrderRejected, match="'currency'"):
            await engine.record_conversion("buyer", "A-2", "10.00", "uah")
    assert conversions(sql) == [("A-1", "buyer", Decimal("697.00"), "UAH", [
        {"sku": "PR251010", "qty": 2, "price": "199.00"},
        {"sku": "PR251020", "qty": 1, "price": "299.00"}])]


NOW = datetime(2026, 6, 1, tzinfo=UTC)


@pytest.mark.parametrize(("fields", "field", "kind"), [
    ({"order_id": ""}, "order_id", "value"),
    ({"order_id": "a b"}, "order_id", "value"),
    ({"order_id": "x" * 129}, "order_id", "value"),
    ({"order_id": 7}, "order_id", "shape"),
    ({"amount": "-1.00"}, "amount", "value"),
    ({"amount": "1.001"}, "amount", "value"),
    ({"amount": "1000000000000.00"}, "amount", "value"),
    ({"amount": "NaN"}, "amount", "value"),
    ({"amount": Decimal("Infinity")}, "amount", "value"),
    ({"amount": 1.5}, "amount", "shape"),
    ({"amount": True}, "amount", "shape"),
    ({"currency": "XYZ"}, "currency", "value"),
    ({"currency": "eur"}, "currency", "value"),
    ({"lines": "PR1"}, "lines", "shape"),
    ({"lines": [{"sku": "PR1", "qty": 0, "price": "1.00"}]}, "lines[0].qty", "value"),
    ({"lines": [{"sku": "PR1", "qty": 1.0, "price": "1.00"}]}, "lines[0].qty", "shape"),
    ({"lines": [{"sku": "", "qty": 1, "price": "1.00"}]}, "lines[0].sku", "value"),
    ({"lines": [{"sku": "PR1", "qty": 1, "price": "1.00", "x": 1}]}, "lines[0].x", "shape"),
    ({"lines": [{"sku": "PR1", "qty": 1, "price": "1"}] * 501}, "lines", "value"),
    ({"ordered_at": "yesterday"}, "ordered_at", "value"),
    ({"ordered_at": "2026-06-01T00:00:00"}, "ordered_at", "value"),  # no offset
    ({"ordered_at": "2026-06-01T00:11:00+00:00"}, "ordered_at", "value"),  # the future
    ({"ordered_at": "1999-12-31T23:59:59+00:00"}, "ordered_at", "value"),
])
def test_make_order_bounds(fields: dict[str, Any], field: str, kind: str) -> None:
    given = {"order_id": "A-1", "amount": "1.00", "currency": "EUR", "lines": [],
             "ordered_at": None, **fields}
    with pytest.raises(OrderRejected) as caught:
        make_order("s", given["order_id"], given["amount"], given["currency"], given["lines"],
                   given["ordered_at"], now=NOW)
    assert (caught.value.field, caught.value.kind) == (field, kind)
    assert f"order field '{field}': expected" in str(caught.value)


def test_make_order_accepts_the_edges() -> None:
    order = make_order("s", "a" * 128, "999999999999.99", "EUR",
                       [{"sku": "b" * 64, "qty": 100_000, "price": "0"}],
                       "2026-06-01T00:09:00+00:00", now=NOW)
    assert order.amount == Decimal("999999999999.99") and order.lines[0].price == Decimal("0")


# -- over HTTP -----------------------------------------------------------------------


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    config = ServiceConfig(
        funnels=[PURAMUR], db=db_url, model=f"scripted:{DEMO}", secret=SECRET,
        api_keys={SHOP: frozenset({"conversions"}), CONVERSE: frozenset({"converse"})},
        rate_limit=(1000, 60.0))
    with TestClient(create_app(config)) as c:
        yield c


def post(client: TestClient, session: str, body: Any, key: str = SHOP, **kw: Any) -> Any:
    return client.post(f"{BASE}/sessions/{session}/conversions", json=body,
                       headers={"Authorization": f"Bearer {key}"}, **kw)


def test_http_conversions(client: TestClient, sql: Any) -> None:
    assert post(client, "s-1", ORDER).status_code == 404  # no such session yet
    r = client.post(f"{BASE}/sessions/s-1/messages", json={"text": "Hi!"},
                    headers={"Authorization": f"Bearer {CONVERSE}"})
    assert r.status_code == 200, r.text

    # The key needs the `conversions` scope (a converse key cannot record sales).
    assert post(client, "s-1", ORDER, key=CONVERSE).status_code == 403
    r = post(client, "s-1", ORDER)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["amount"] == "697.00" and body["replayed"] is False
    assert datetime.fromisoformat(body["ordered_at"]) == datetime(2026, 3, 1, 10, 30, tzinfo=UTC)
    # A retry: 200, the same conversion, no second row.
    r = post(client, "s-1", ORDER)
    assert r.status_code == 200 and r.json() == {**body, "replayed": True}
    # Same id, other content: 409, the first order stands.
    r = post(client, "s-1", {**ORDER, "amount": "1.00"})
    assert r.status_code == 409 and r.json()["error"] == "conflict"
    assert "another amount" in r.json()["message"]
    assert conversions(sql) == [("ORD-1001", "s-1", Decimal("697.00"), "UAH", LINES)]

    refusals = [
        (b"{not json", 400, "bad_request"),
        (b"[]", 400, "bad_request"),
        (b'{"order_id": "X", "amount": 5, "currency": "UAH"}', 400, "bad_request"),
        (b'{"order_id": "X", "amount": "5", "currency": "UAH", "extra": 1}', 400,
         "bad_request"),
        (b'{"amount": "5", "currency": "UAH"}', 400, "bad_request"),
        (b'{"order_id": "X", "amount": "5.001", "currency": "UAH"}', 422, "invalid_order"),
        (b'{"order_id": "X", "amount": "5", "currency": "ABC"}', 422, "invalid_order"),
        (b'{"order_id": "X\\n", "amount": "5", "currency": "UAH"}', 422, "invalid_order"),
        (b'{"order_id": "X", "amount": "5", "currency": "UAH", "ordered_at": "'
         + (datetime.now(UTC) + timedelta(days=1)).isoformat().encode() + b'"}', 422,
         "invalid_order"),
        (b'{"order_id": "X", "amount": "5", "currency": "UAH", "lines": '
         + b"[" * 200 + b"]" * 200 + b"}", 400, "bad_request"),  # too deep
        (b'{"order_id": "' + b"x" * 200_000 + b'"}', 413, "too_large"),
    ]
    for raw, status, code in refusals:
        r = client.post(f"{BASE}/sessions/s-1/conversions", content=raw,
                        headers={"Authorization": f"Bearer {SHOP}",
                                 "Content-Type": "application/json"})
        assert (r.status_code, r.json()["error"]) == (status, code), (raw[:80], r.text)
        assert r.json()["message"]
    assert len(conversions(sql)) == 1

