"""A threaded HTTP server on 127.0.0.1 for the tests' fake services (stdlib only).

Subclasses set ``handler`` (a ``BaseHTTPRequestHandler`` whose ``fake`` attribute is
the server object) and get ``start()``/``stop()``, ``port`` and a context manager;
``_stopping`` is set when the server stops, to wake handlers that are sleeping.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class LoopbackServer:
    handler: type[BaseHTTPRequestHandler]
    name = "fake"

    def __init__(self) -> None:
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._httpd is not None, "the server is not started"
        return int(self._httpd.server_address[1])

    def start(self) -> Self:
        handler: Any = type("Handler", (self.handler,), {"fake": self})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"{self.name}-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes handlers that are sleeping
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
