"""Helpers for tests/test_service.py: the app on a real port, a fake Telegram Bot API, and a
TCP proxy in front of PostgreSQL that a test can cut (all on 127.0.0.1, stdlib only)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import uvicorn


@contextmanager
def running(app: Any, **options: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on a free port; yield its base URL.
    ``options`` go to ``uvicorn.Config``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # log_config=None: uvicorn's records reach the root logger, so caplog sees them.
    config = uvicorn.Config(app, log_config=None, ws="none", lifespan="on", access_log=True,
                            **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


# The Bot API methods the service calls: required and optional parameters with their
# types (https://core.telegram.org/bots/api). Anything else is a contract violation.
BOT_API: dict[str, tuple[dict[str, tuple[type, ...]], dict[str, tuple[type, ...]]]] = {
    "sendMessage": ({"chat_id": (int, str), "text": (str,)},
                    {"message_thread_id": (int,), "reply_parameters": (dict,),
                     "parse_mode": (str,), "disable_notification": (bool,),
                     "reply_markup": (dict,)}),
    "answerCallbackQuery": ({"callback_query_id": (str,)},
                            {"text": (str,), "show_alert": (bool,), "cache_time": (int,)}),
    "editMessageText": ({"chat_id": (int, str), "message_id": (int,), "text": (str,)},
                        {"parse_mode": (str,), "reply_markup": (dict,)}),
    "getMe": ({}, {}),
    "sendChatAction": ({"chat_id": (int, str), "action": (str,)},
                       {"message_thread_id": (int,), "business_connection_id": (str,)}),
}


def bot_api_violations(method: str, body: Any) -> list[str]:
    """What is wrong with a Bot API call, by the contract above (empty: nothing)."""
    if method not in BOT_API:
        return [f"unknown method {method!r}"]
    if not isinstance(body, dict):
        return ["the body is not a JSON object"]
    required, optional = BOT_API[method]
    problems = [f"{method}: missing {k}" for k in required if k not in body]
    for k, v in body.items():
        types = required.get(k) or optional.get(k)
        if types is None:
            problems.append(f"{method}: unknown parameter {k}")
        elif type(v) not in types:
            problems.append(f"{method}: {k} has type {type(v).__name__}")
    text = body.get("text")
    if method == "sendMessage" and isinstance(text, str) and not text.strip():
        problems.append("sendMessage: text is empty")
    if method == "sendMessage" and isinstance(text, str) and len(text) > 4096:
        problems.append(f"sendMessage: text has {len(text)} characters, over 4096")
    reply = body.get("reply_parameters")
    if isinstance(reply, dict) and type(reply.get("message_id")) is not int:
        problems.append("sendMessage: reply_parameters.message_id must be an integer")
    return problems


class FakeTelegram:
    """A Bot API on 127.0.0.1: records ``POST /bot<token>/<method>`` calls in ``calls``.

    Every call is checked against :data:`BOT_API` (a violation is recorded in
    ``violations`` and answered 400). ``fail = True`` makes it answer HTTP 500;
    ``script`` is a list of (status, body) answers given to the next sendMessage
    calls, in order (then 200). ``blocked`` chat ids get 403 "bot was blocked".
    ``editMessageText`` edits a message sent before, and is refused as the real one
    refuses it: an unknown message, or a text that is the same as the message's.
    """

    def __init__(self, username: str = "puramur_shop_bot") -> None:
        self.calls: list[dict[str, Any]] = []
        self.violations: list[str] = []
        self.fail = False
        self.script: list[tuple[int, dict[str, Any]]] = []
        self.blocked: set[int] = set()
        self.texts: dict[int, str] = {}  # message_id -> its text (editMessageText)
        self.username = username
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                token, _, method = self.path.removeprefix("/bot").partition("/")
                data = json.loads(body or b"{}")
                status, payload = fake.answer(token, method, data)
                out = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def answer(self, token: str, method: str, data: Any) -> tuple[int, dict[str, Any]]:
        with self._lock:
            problems = bot_api_violations(method, data)
            call = {"token": token, "method": method, "body": data, "status": 200,
                    "at": time.monotonic()}
            self.calls.append(call)
            if problems:
                self.violations += problems
                call["status"] = 400
                return 400, {"ok": False, "error_code": 400,
                             "description": f"Bad Request: {problems[0]}"}
            if method == "getMe":
                return 200, {"ok": True, "result": {"id": int(token.partition(":")[0] or 0),
                                                    "is_bot": True, "first_name": "Shop",
                                                    "username": self.username}}
            if method == "sendMessage" and data.get("chat_id") in self.blocked:
                call["status"] = 403
                return 403, {"ok": False, "error_code": 403,
                             "description": "Forbidden: bot was blocked by the user"}
            if method == "sendMessage" and self.script:
                status, payload = self.script.pop(0)
                call["status"] = status
                return status, payload
            if self.fail:
                call["status"] = 500
                return 500, {"ok": False, "error_code": 500,
                             "description": "Internal Server Error"}
            if method == "editMessageText":
                sent = self.texts.get(data["message_id"])
                if sent is None or sent == data["text"]:  # as the real Bot API answers
                    call["status"] = 400
                    return 400, {"ok": False, "error_code": 400, "description": (
                        "Bad Request: message to edit not found" if sent is None else
                        "Bad Request: message is not modified: specified new message "
                        "content and reply markup are exactly the same")}
                self.texts[data["message_id"]] = data["text"]
                return 200, {"ok": True, "result": {"message_id": data["message_id"]}}
            if method == "sendMessage":
                self.texts[len(self.calls)] = data["text"]
            return 200, {"ok": True, "result": {"message_id": len(self.calls)}}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def sent(self, method: str = "sendMessage") -> list[dict[str, Any]]:
        """The calls of ``method`` the fake accepted (answered 200)."""
        return [c["body"] for c in self.calls if c["method"] == method and c["status"] == 200]

    def attempts(self, method: str = "sendMessage") -> list[dict[str, Any]]:
        return [c for c in self.calls if c["method"] == method]

    def wait_sent(self, count: int, timeout: float = 20, method: str = "sendMessage"
                  ) -> list[dict[str, Any]]:
        """Wait until ``count`` calls of ``method`` were accepted; return them all."""
        deadline = time.monotonic() + timeout
        while len(self.sent(method)) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.sent(method)

    def start(self) -> FakeTelegram:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class TcpProxy:
    """Forwards 127.0.0.1:<port> to the PostgreSQL of ``dsn``; ``cut()`` drops every
    connection and refuses new ones until ``restore()``. ``dsn`` gives the proxied URL."""

    def __init__(self, dsn: str) -> None:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        host = str(info.get("host") or "127.0.0.1")
        port = int(info.get("port") or 5432)
        self._target: tuple[int, Any] = (
            (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}") if host.startswith("/")
            else (socket.AF_INET, (host, port)))
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.dsn = psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=self.port)
        self.up = True
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            upstream = socket.socket(self._target[0], socket.SOCK_STREAM)
            try:
                upstream.connect(self._target[1])
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self.up = False
        with self._lock:
            for s in self._open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self._open.clear()

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()


def stop(proc: subprocess.Popen[Any]) -> None:
    """Stop a `funnel serve` started in its own process group: SIGINT, then SIGKILL."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def wait_ready(url: str, proc: subprocess.Popen[Any], log: Any, seconds: float = 60) -> None:
    """Wait until a `funnel serve` answers /readyz with 200; fail with its log if it dies
    or does not answer in time. A server that is late is stopped before the failure: the
    caller never got hold of it to stop it (a running Popen left to the collector fails
    whichever test runs then)."""
    import httpx

    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(f"{url}/readyz").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() >= deadline:
            if proc.poll() is None:
                stop(proc)
            raise AssertionError(f"`funnel serve` did not get ready; its log:\n{log.read_text()}")
        time.sleep(0.2)


def record_fault(case: str, *, tried: int, lost: int, duplicated: int, **figures: Any) -> None:
    """Count one fault case for bench/fault_suite.py: how many messages (or alerts) were
    tried, lost and duplicated. Written only when FUNNEL_FAULT_REPORT names a file."""
    path = os.environ.get("FUNNEL_FAULT_REPORT")
    if not path:
        return
    line = json.dumps({"case": case, "tried": tried, "lost": lost, "duplicated": duplicated,
                       **figures})
    with open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")
