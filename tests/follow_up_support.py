"""Helpers for the follow-up tests (tests/test_follow_ups.py, test_follow_up_surfaces.py):
Puramur with a funnel-wide follow-up, a clock to inject, a webhook receiver."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from conftest import puramur_data

from engine.llm.models import ScriptedModel

START = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)  # 12:00 in Kyiv
DAY = timedelta(days=1)
TEXTS = {"uk": "Привіт! Ми досі тут, якщо потрібна порада для {{ pet.name or 'улюбленця' }}.",
         "ru": "Здравствуйте! Мы здесь, если нужен совет.",
         "en": "Hi! We are still here if you need advice.",
         "pl": "Cześć! Jesteśmy tu, jeśli potrzebujesz porady."}


class Clock:
    """The engine's clock, set by the test."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now


class Receiver:
    """A webhook receiver on 127.0.0.1: the follow-ups POSTed to it, with their keys."""

    def __init__(self) -> None:
        got: list[tuple[str, dict[str, Any]]] = []
        self.got = got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                got.append((self.headers["Idempotency-Key"], json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/follow-ups"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def write_funnel(folder: Path, webhook: str | None = None) -> Path:
    """Puramur (its cart_building reminder included) with a funnel-wide follow-up a day
    after the customer's last message, quiet hours in Kyiv, `досить` as an opt-out."""
    data = puramur_data()
    # Without the knowledge base: indexing it costs each new schema seconds, and
    # follow-ups do not read it.
    del data["knowledge"]
    for stage in data["stages"].values():
        stage.pop("knowledge", None)
    data["follow_up"] = {
        "quiet_hours": {"from": "21:00", "to": "09:00", "timezone": "Europe/Kyiv"},
        "opt_out": ["досить"], "steps": [{"after": "24h", "text": TEXTS, "max": 1}]}
    if webhook:
        data["follow_up"]["webhook"] = webhook
    path = folder / "puramur.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), "utf-8")
    return path


def quiet_model() -> ScriptedModel:
    """A model that only asks how it can help (in Ukrainian)."""
    return ScriptedModel.from_data({"default": {"reply": "Чим можу допомогти?"}})


def outcomes(done: list[dict[str, Any]], session: str) -> list[str]:
    """The outcomes of one session in a scheduler pass."""
    return [d["outcome"] for d in done if d["session_id"] == session]
