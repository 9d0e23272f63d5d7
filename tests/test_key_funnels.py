"""API keys limited to funnels (issue 40, item 8): ``KEY:scopes@a+b``.

The service serves Puramur and the B2B demo; keys limited to Puramur reach every
route family there (turns, state, conversions, the manager API, erasure and export,
metrics) and get, for the B2B demo, exactly the 404 of a funnel that does not
exist: before the scope is checked and before the body is read, so no status or
message tells them the funnel is there. ``/metrics`` shows such a key its funnels'
series only; the mounted studio (every funnel) refuses it. Bad specs stop the start
with the key's position, never the key.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import B2B, PURAMUR
from starlette.testclient import TestClient

from engine.errors import ConfigError
from engine.service.app import create_app
from engine.service.config import ServiceConfig, parse_api_keys, parse_key_funnels
from engine.service.metrics import only_funnels

pytestmark = pytest.mark.postgres

DEMO = PURAMUR.parent / "puramur" / "demo.yaml"
TALK = "talk-key-puramur-0a1b2c3d"
SHOP = "shop-key-puramur-4e5f6a7b"
MANAGE = "manage-key-puramur-8c9d0e1f"
PRIVACY = "privacy-key-puramur-2a3b4c5d"
METRICS = "metrics-key-puramur-6e7f8a9b"
LIMITED_ADMIN = "admin-key-puramur-0c1d2e3f"
ADMIN = "admin-key-everything-4a5b6c7d"
KEYS = (f"{TALK}:converse,read_state@puramur;{SHOP}:conversions@puramur;"
        f"{MANAGE}:manage@puramur;{PRIVACY}:erase@puramur;{METRICS}:metrics@puramur;"
        f"{LIMITED_ADMIN}:admin@puramur;{ADMIN}:admin")
ORDER = {"order_id": "o-1", "amount": "10.00", "currency": "UAH", "lines": []}

# (method, path after /v1/funnels/{funnel}, body, the limited key with the route's scope)
ROUTES: list[tuple[str, str, Any, str]] = [
    ("POST", "/sessions/s-1/messages", {"text": "Hi!"}, TALK),
    ("GET", "/sessions/s-1", None, TALK),
    ("POST", "/sessions/s-1/conversions", ORDER, SHOP),
    ("POST", "/sessions/s-1/takeover", {"manager": "Olena"}, MANAGE),
    ("POST", "/sessions/s-1/manager-messages", {"manager": "Olena", "text": "Hello"}, MANAGE),
    ("GET", "/sessions/s-1/control", None, MANAGE),
    ("POST", "/sessions/s-1/approve", {}, MANAGE),
    ("POST", "/sessions/s-1/reject", {}, MANAGE),
    ("POST", "/sessions/s-1/release", {}, MANAGE),
    ("GET", "/sessions/s-1/export", None, PRIVACY),
    ("DELETE", "/sessions/s-1", None, PRIVACY),
]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    config = ServiceConfig.from_env({
        "FUNNEL_SERVE_FUNNELS": f"{PURAMUR}:{B2B}", "FUNNEL_DB": db_url,
        "FUNNEL_MODEL": f"scripted:{DEMO}", "FUNNEL_API_KEYS": KEYS,
        "FUNNEL_SECRET": "key-funnels-secret-0123456789", "FUNNEL_RATE_LIMIT": "1000/60",
        "FUNNEL_RELOAD": "0"})
    with TestClient(create_app(config)) as c:
        yield c


def call(client: TestClient, method: str, path: str, body: Any, key: str) -> Any:
    return client.request(method, path, json=body, headers=bearer(key))


def test_a_key_reaches_its_funnels_and_no_other(client: TestClient) -> None:
    # Its own funnel: every route family answers as it would for any key.
    assert call(client, "POST", "/v1/funnels/puramur/sessions/s-1/messages", {"text": "Hi!"},
                TALK).status_code == 200
    assert call(client, "GET", "/v1/funnels/puramur/sessions/s-1", None, TALK).status_code == 200
    assert call(client, "POST", "/v1/funnels/puramur/sessions/s-1/conversions", ORDER,
                SHOP).status_code == 201
    assert call(client, "GET", "/v1/funnels/puramur/sessions/s-1/control", None,
                MANAGE).json()["control"] == "bot"
    assert call(client, "GET", "/v1/funnels/puramur/sessions/s-1/export", None,
                PRIVACY).status_code == 200
    for method, path, body, key in ROUTES:
        for who in (key, LIMITED_ADMIN):
            other = call(client, method, f"/v1/funnels/b2b_demo{path}", body, who)
            missing = call(client, method, f"/v1/funnels/no_such{path}", body, who)
            # The same answer as a funnel that is not served: no oracle.
            assert other.status_code == missing.status_code == 404, (method, path, other.text)
            assert other.json()["error"] == missing.json()["error"] == "not_found"
            assert other.json()["message"].replace("b2b_demo", "X") == \
                missing.json()["message"].replace("no_such", "X")
            assert set(other.headers) == set(missing.headers)
    # Before the scope (403) and the body (400): the funnel is not there for this key.
    assert call(client, "DELETE", "/v1/funnels/b2b_demo/sessions/s-1", None,
                TALK).status_code == 404
    assert call(client, "DELETE", "/v1/funnels/puramur/sessions/s-1", None,
                TALK).status_code == 403
    bad = client.post("/v1/funnels/b2b_demo/sessions/s-1/messages", content=b"{",
                      headers=bearer(TALK))
    assert bad.status_code == 404
    # The session of the other funnel was never touched; the admin key sees it.
    assert call(client, "POST", "/v1/funnels/b2b_demo/sessions/s-9/messages", {"text": "Hi"},
                ADMIN).status_code == 200
    assert call(client, "GET", "/v1/funnels/b2b_demo/sessions/s-9", None,
                TALK).status_code == 404


def test_metrics_show_a_limited_key_its_funnels_only(client: TestClient) -> None:
    call(client, "POST", "/v1/funnels/puramur/sessions/m-1/messages", {"text": "Hi!"}, ADMIN)
    call(client, "POST", "/v1/funnels/b2b_demo/sessions/m-2/messages", {"text": "Hi!"}, ADMIN)
    everything = client.get("/metrics", headers=bearer(ADMIN)).text
    assert 'funnel="b2b_demo"' in everything and 'funnel="puramur"' in everything
    mine = client.get("/metrics", headers=bearer(METRICS))
    assert mine.status_code == 200
    assert 'funnel="b2b_demo"' not in mine.text and 'funnel="puramur"' in mine.text
    # The same series, less the other funnel's; the process's own stay (values may move
    # between two scrapes: the series are compared).
    def series(text: str) -> set[str]:
        return {line.rpartition(" ")[0] for line in text.splitlines()}

    assert series(mine.text) == series(only_funnels(everything, frozenset({"puramur"})))
    assert "funnel_turns_total" in mine.text
    assert client.get("/metrics", headers=bearer(TALK)).status_code == 403


def test_only_funnels_keeps_comments_and_unlabelled_series() -> None:
    text = ('# HELP x_total X.\n# TYPE x_total counter\nx_total{funnel="a",stage="s"} 1.0\n'
            'x_total{stage="s",funnel="b"} 2.0\nup 1.0\ny{reason="funnel=\\"b\\""} 3.0\n')
    assert only_funnels(text, frozenset({"a"})) == (
        '# HELP x_total X.\n# TYPE x_total counter\nx_total{funnel="a",stage="s"} 1.0\n'
        'up 1.0\ny{reason="funnel=\\"b\\""} 3.0\n')


def test_the_studio_needs_a_key_of_every_funnel(client: TestClient) -> None:
    assert client.get("/studio/api/status", headers=bearer(LIMITED_ADMIN)).status_code == 401
    ok = client.get("/studio/api/status", headers=bearer(ADMIN))
    assert ok.status_code == 200 and set(ok.json()) >= {"puramur", "b2b_demo"}


def test_the_format_and_its_mistakes(db_url: str) -> None:
    keys = "k" * 16 + ":converse,read_state@puramur+b2b_demo;" + "m" * 16 + ":admin"
    assert parse_api_keys(keys) == {"k" * 16: frozenset({"converse", "read_state"}),
                                    "m" * 16: frozenset({"admin"})}
    assert parse_key_funnels(keys) == {"k" * 16: frozenset({"puramur", "b2b_demo"})}
    secret = "q" * 20
    for spec, message in ((f"{secret}:converse@", "entry 1 has '@' but names no funnel"),
                          (f"{secret}:converse@ + ", "entry 1 has '@' but names no funnel"),
                          (f"{'m' * 16}:admin;{secret}:@puramur", "entry 2 is not KEY:SCOPE")):
        with pytest.raises(ConfigError, match=message) as caught:
            ServiceConfig.from_env({"FUNNEL_SERVE_FUNNELS": str(PURAMUR),
                                    "FUNNEL_API_KEYS": spec})
        assert secret not in str(caught.value)
    # An unknown funnel: a start-up error naming the key's position, never the key.
    config = ServiceConfig.from_env({
        "FUNNEL_SERVE_FUNNELS": str(PURAMUR), "FUNNEL_DB": db_url,
        "FUNNEL_API_KEYS": f"{'m' * 16}:admin;{secret}:converse@puramur+puramr"})
    with pytest.raises(ConfigError, match=r"key #2 is limited to 'puramr', which this "
                       r"service does not serve; it serves puramur") as caught:
        create_app(config)
    assert secret not in str(caught.value)
    with pytest.raises(ConfigError, match="key #1 is limited to no funnel"):
        ServiceConfig(funnels=[PURAMUR], api_keys={secret: frozenset({"admin"})},
                      key_funnels={secret: frozenset()})


def test_funnel_serve_refuses_to_start_with_a_key_for_an_unknown_funnel(db_url: str) -> None:
    import os
    import subprocess
    import sys

    secret = "z" * 24
    env = {**os.environ, "FUNNEL_API_KEYS": f"{ADMIN}:admin;{secret}:converse@puramur+nope",
           "FUNNEL_SECRET": "s" * 32}
    done = subprocess.run([sys.executable, "-m", "engine.cli", "serve", str(PURAMUR),
                           "--db", db_url, "--port", "0"], capture_output=True, text=True,
                          env=env, timeout=120, cwd=PURAMUR.parent.parent)
    assert done.returncode == 1, done.stderr
    assert "key #2 is limited to 'nope', which this service does not serve" in done.stderr
    assert secret not in done.stderr + done.stdout and "Traceback" not in done.stderr
