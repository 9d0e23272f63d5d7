"""The OpenAPI document is generated from the handlers' own models (engine.service.models,
the route table in engine.service.handlers): it validates, every response of a real
conversation, state read, order and refusal conforms to it, and a client generated from
it by openapi-python-client (offline, into tmp_path) asks for ``explain``.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from openapi_spec_validator import validate
from starlette.testclient import TestClient

from engine import __version__
from engine.boundary.customer import MAX_MESSAGE_CHARS
from engine.service.app import create_app
from engine.service.config import ServiceConfig
from engine.service.handlers import OPERATIONS
from engine.service.openapi import document

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"
DEMO = ROOT / "funnels" / "puramur" / "demo.yaml"
ADMIN = "openapi-admin-key-7c1d93"
READER = "openapi-reader-key-2b8e40"
BASE = "/v1/funnels/puramur"

pytestmark = pytest.mark.postgres


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    config = ServiceConfig(funnels=[PURAMUR], db=db_url, model=f"scripted:{DEMO}",
                           api_keys={ADMIN: frozenset({"admin"}),
                                     READER: frozenset({"read_state"})},
                           secret=b"openapi-secret-0123456789abcdef", rate_limit=(1000, 60.0))
    with TestClient(create_app(config)) as c:
        yield c


class Checked:
    """Every response through it is validated against the served document."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.doc = client.get("/openapi.json").json()
        self.schema = schemathesis.openapi.from_dict(self.doc)
        self.seen: list[tuple[str, int]] = []

    def __call__(self, method: str, path: str, template: str, **kwargs: Any) -> Any:
        response = self.client.request(method, path, **kwargs)
        operation = self.schema[template][method]
        # An undocumented status is drift too.
        assert str(response.status_code) in self.doc["paths"][template][method.lower()][
            "responses"], (method, path, response.status_code, response.text)
        operation.validate_response(response)
        self.seen.append((f"{method} {template}", response.status_code))
        return response


def test_the_document_is_valid_openapi_and_generated_from_the_table() -> None:
    doc = document(OPERATIONS, __version__)
    validate(doc)  # openapi-spec-validator: raises on any problem
    assert doc["openapi"] == "3.1.0"
    ops = {(op.method.lower(), op.path) for op in OPERATIONS}
    assert {(m, p) for p, item in doc["paths"].items() for m in item} == ops
    session = doc["paths"]["/v1/funnels/{funnel}/sessions/{session}"]["get"]
    params = {p["name"]: p for p in session["parameters"]}
    # A plain string: a generated client serves funnels added after it was generated.
    assert params["funnel"]["schema"]["type"] == "string" and "enum" not in params["funnel"][
        "schema"]
    assert params["explain"]["in"] == "query"
    schemas = doc["components"]["schemas"]
    assert "versions" in schemas["Ready"]["required"]
    assert {"session_id", "stage", "turns", "explain"} <= set(
        schemas["SessionState"]["properties"])
    assert schemas["MessageIn"]["properties"]["text"]["maxLength"] == MAX_MESSAGE_CHARS


def test_every_response_of_a_conversation_conforms(client: TestClient) -> None:
    check = Checked(client)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    messages = f"{BASE}/sessions/{{session}}/messages".replace(BASE, "/v1/funnels/{funnel}")
    state = "/v1/funnels/{funnel}/sessions/{session}"
    conversions = f"{state}/conversions"
    for n, text in enumerate(str(m) for m in yaml.safe_load(DEMO.read_text())["customer"]):
        r = check("POST", f"{BASE}/sessions/c-1/messages", messages, json={"text": text},
                  headers=admin)
        assert r.status_code == 200, r.text
        if n == 0:
            early = check("GET", f"{BASE}/sessions/c-1?explain=true", state, headers=admin)
            assert early.json()["explain"][0]["transitions"], early.text
    assert r.json()["stage"] == "handoff"
    r = check("POST", f"{BASE}/sessions/c-1/messages", messages, json={"text": "again"},
              headers={**admin, "Idempotency-Key": "k-1"})
    r = check("POST", f"{BASE}/sessions/c-1/messages", messages, json={"text": "again"},
              headers={**admin, "Idempotency-Key": "k-1"})
    assert r.json()["replayed"] is True
    plain = check("GET", f"{BASE}/sessions/c-1", state, headers=admin).json()
    assert "explain" not in plain
    explained = check("GET", f"{BASE}/sessions/c-1?explain=1", state, headers=admin).json()
    assert explained["explain"] is not None and explained["stage"] == plain["stage"]
    order = {"order_id": "ORD-1", "amount": "697.00", "currency": "UAH",
             "lines": [{"sku": "PR251010", "qty": 1, "price": "697.00"}]}
    assert check("POST", f"{BASE}/sessions/c-1/conversions", conversions, json=order,
                 headers=admin).status_code == 201
    assert check("POST", f"{BASE}/sessions/c-1/conversions", conversions, json=order,
                 headers=admin).status_code == 200
    refusals: list[tuple[str, str, str, dict[str, Any], int]] = [
        ("POST", f"{BASE}/sessions/c-1/conversions", conversions,
         {"json": {**order, "amount": "698.00"}, "headers": admin}, 409),
        ("POST", f"{BASE}/sessions/c-1/conversions", conversions,
         {"json": {**order, "order_id": "ORD-2", "currency": "XXX"}, "headers": admin}, 422),
        ("POST", f"{BASE}/sessions/c-1/conversions", conversions,
         {"json": {**order, "order_id": "ORD-3", "extra": 1}, "headers": admin}, 400),
        ("POST", f"{BASE}/sessions/c-1/conversions", conversions,
         {"json": {**order, "order_id": 3}, "headers": admin}, 400),
        ("POST", f"{BASE}/sessions/nobody/conversions", conversions,
         {"json": order, "headers": admin}, 404),
        ("POST", f"{BASE}/sessions/c-1/messages", messages,
         {"content": b"{not json", "headers": admin}, 400),
        ("POST", f"{BASE}/sessions/c-1/messages", messages,
         {"json": {"text": "  "}, "headers": admin}, 400),
        ("POST", f"{BASE}/sessions/c-1/messages", messages,
         {"json": {"text": 5}, "headers": admin}, 400),
        ("POST", f"{BASE}/sessions/c-1/messages", messages,
         {"json": ["text"], "headers": admin}, 400),
        ("POST", f"{BASE}/sessions/c-1/messages", messages,
         {"json": {"text": "x" * (MAX_MESSAGE_CHARS + 1)}, "headers": admin}, 413),
        ("POST", f"{BASE}/sessions/c-1/messages", messages, {"json": {"text": "hi"}}, 401),
        ("POST", f"{BASE}/sessions/c-1/messages", messages,
         {"json": {"text": "hi"}, "headers": {"Authorization": f"Bearer {READER}"}}, 403),
        ("POST", "/v1/funnels/nope/sessions/c-1/messages", messages,
         {"json": {"text": "hi"}, "headers": admin}, 404),
        ("GET", f"{BASE}/sessions/nobody", state, {"headers": admin}, 404),
        ("GET", f"{BASE}/sessions/bad%20id", state, {"headers": admin}, 400),
    ]
    for method, path, template, kwargs, status in refusals:
        r = check(method, path, template, **kwargs)
        assert r.status_code == status, (path, kwargs, r.text)
        assert r.json()["error"] and r.json()["message"]
    assert check("GET", "/readyz", "/readyz").json()["versions"]["puramur"]["running"] >= 1
    check("GET", "/healthz", "/healthz")
    token = check("POST", f"{BASE}/widget/session", "/v1/funnels/{funnel}/widget/session")
    widget = {"Authorization": f"Bearer {token.json()['token']}"}
    check("POST", f"{BASE}/widget/messages", "/v1/funnels/{funnel}/widget/messages",
          json={"text": "Hi!"}, headers=widget)
    history = check("GET", f"{BASE}/widget/messages", "/v1/funnels/{funnel}/widget/messages",
                    headers=widget).json()
    assert [m["role"] for m in history["messages"]] == ["user", "assistant"]
    assert check("GET", "/metrics", "/metrics", headers=admin).status_code == 200


def test_a_generated_client_asks_for_explain(client: TestClient, tmp_path: Path) -> None:
    doc = tmp_path / "openapi.json"
    doc.write_text(json.dumps(client.get("/openapi.json").json()))
    (tmp_path / "config.yaml").write_text("post_hooks: []\n")  # no formatter run
    done = subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(doc),
         "--output-path", str(tmp_path / "funnel_client"), "--meta", "none",
         "--config", str(tmp_path / "config.yaml")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout, done.stdout
    sys.path.insert(0, str(tmp_path))
    try:
        generated = importlib.import_module("funnel_client")
        send = importlib.import_module("funnel_client.api.default.send_message")
        get_session = importlib.import_module("funnel_client.api.default.get_session")
        models = importlib.import_module("funnel_client.models")
        api = generated.AuthenticatedClient(base_url="http://testserver", token=ADMIN)
        client.headers["Authorization"] = f"Bearer {ADMIN}"
        api.set_httpx_client(client)  # the generated calls go through the real app
        turn = send.sync(funnel="puramur", session="gen-1", client=api,
                         body=models.MessageIn(text="Hi!"))
        assert isinstance(turn, models.Turn) and turn.stage == "discovery"
        state = get_session.sync(funnel="puramur", session="gen-1", client=api, explain=True)
        assert isinstance(state, models.SessionState) and state.turns == 1
        assert state.explain[0].stage == "greeting" and state.explain[0].fired == "discovery"
        missing = get_session.sync(funnel="puramur", session="nobody", client=api)
        assert isinstance(missing, models.ErrorBody) and missing.error == "not_found"
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == "funnel_client" or
                     n.startswith("funnel_client.")]:
            del sys.modules[name]
