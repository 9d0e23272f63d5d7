"""`funnel …` run in this process, for the tests that are about a command's output, not
about the process that runs it.

Each `python -m engine.cli` subprocess pays the engine's imports again (about a second of
CPU on the 2-core machine, more when the suite's workers share it); in process they are
paid once per pytest worker. What a separate process is needed for (signals, stdin's
bytes on a real pipe, a closed pipe, exit codes of a crash) stays a subprocess.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from engine.cli import main


@contextlib.contextmanager
def _environment(cwd: Path, env: Mapping[str, str], stdin: str) -> Iterator[None]:
    saved_env = {k: os.environ.get(k) for k in env}
    saved_cwd, saved_stdin = Path.cwd(), sys.stdin
    os.environ.update(env)
    os.chdir(cwd)
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8")), encoding="utf-8")
    try:
        yield
    finally:
        sys.stdin = saved_stdin
        os.chdir(saved_cwd)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_cli(*args: str, cwd: Path, env: Mapping[str, str] | None = None,
            stdin: str = "") -> subprocess.CompletedProcess[str]:
    """`funnel ARGS` in ``cwd`` with ``env`` added to the environment and ``stdin`` as its
    input; its exit code and what it printed, as ``subprocess.run`` would give them."""
    out, err = io.StringIO(), io.StringIO()
    with _environment(cwd, env or {}, stdin), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return subprocess.CompletedProcess(["funnel", *args], code, out.getvalue(), err.getvalue())
