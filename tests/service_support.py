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
def running(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on a free port; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # log_config=None: uvicorn's records reach the root logger, so caplog sees them.
    config = uvicorn.Config(app, log_config=None, ws="none", lifespan="on", access_log=True)
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


class FakeTelegram:
    """A Bot API on 127.0.0.1: records ``POST /bot<token>/<method>`` calls in ``calls``.

    ``fail = True`` makes it answer HTTP 500.
    """

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                token, _, method = self.path.removeprefix("/bot").partition("/")
                fake.calls.append({"token": token, "method": method,
                                   "body": json.loads(body or b"{}")})
                status = 500 if fake.fail else 200
                payload = {"ok": not fake.fail, "result": {"message_id": len(fake.calls)}}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def sent(self, method: str = "sendMessage") -> list[dict[str, Any]]:
        return [c["body"] for c in self.calls if c["method"] == method]

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
    """Wait until a `funnel serve` answers /readyz with 200; fail with its log if it dies."""
    import httpx

    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(f"{url}/readyz").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
