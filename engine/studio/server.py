"""`funnel studio`: the studio on uvicorn, bound to loopback unless a key is set."""

from __future__ import annotations

import ipaddress
import os
import signal
from types import FrameType

import uvicorn

from ..errors import ConfigError
from ..store.embedded import stop_started
from .app import create_studio_app
from .home import resolve
from .playground import Studio
from .whatif import WhatIfSettings

__all__ = ["LOOPBACK_HOSTS", "is_loopback", "serve_studio"]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
KEY_ENV = "FUNNEL_STUDIO_KEY"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve_studio(funnels: list[str], *, db: str | None = None, model: str | None = None,
                 api_base: str | None = None, host: str = "127.0.0.1", port: int = 8700,
                 key: str | None = None, what_if_days: float = 7.0,
                 what_if_max: int = 200) -> None:
    """Run the studio until interrupted (``what_if_*``: engine.studio.whatif's settings).

    Raises:
        ConfigError: bound to a non-loopback address without a key, or a path missing
            (``funnels``: funnel files and at most one folder, engine.studio.home).
    """
    key = key or os.environ.get(KEY_ENV) or None
    loopback = is_loopback(host)
    if not loopback and not key:
        raise ConfigError(f"the studio runs turns and writes scenario files: bound to {host} "
                          f"it needs a key; set {KEY_ENV} (or bind it to 127.0.0.1)")
    paths, home = resolve(funnels)  # a folder (none: the current one) may hold no funnel yet

    async def opened() -> Studio:
        studio = await Studio.open(list(paths), db=db, model=model, api_base=api_base,
                                   what_if=WhatIfSettings(what_if_days, what_if_max), home=home)
        for held in studio.broken.values():  # started anyway: the page's Editor fixes it
            print(f"funnel studio: {held.path} does not validate ({held.errors} problem(s)): "
                  "the page lists it; fix it in its Editor tab", flush=True)
        return studio

    hosts = (LOOPBACK_HOSTS | {host}) if loopback and not key else None
    app = create_studio_app(opened, key=key, hosts=hosts)
    print(f"funnel studio: http://{host}:{port}/", flush=True)
    if not paths:
        print(f"funnel studio: no funnel in {home} yet: the page's New funnel makes one there",
              flush=True)
    # uvicorn shuts down on SIGTERM and then raises the signal again: with the default
    # handler the process would die there, before any clean-up. Ours turns it into an
    # exit, and the embedded PostgreSQL the studio started is stopped (Ctrl-C too).
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop_started()


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)
