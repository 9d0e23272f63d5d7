"""The client's CPU instructions per realistic turn, counted by callgrind: a figure that does
not drift with the machine's speed.

CPU time per turn (``bench/realistic_turn.py``) moves by up to 2x within minutes on a
shared VM; instructions do not. This runs ``bench/realistic_turn.py``'s two
configurations (the engine playing Puramur's conversation, and the raw psycopg SELECT +
UPSERT baseline, and the same work's floor of bench/floor.py: the engine's own statements on
plain psycopg), one session at a time, under ``valgrind --tool=callgrind`` at two
sizes, and prints ``(I(large) - I(small)) / extra turns``: start-up, imports and the
warm-up cancel out. Instructions are not time (cache misses and system calls are not
in them), so read them next to the CPU times, as the stable part of the comparison.

    python bench/turn_instructions.py [--db URL] [--small 8] [--large 28] [--uvloop]

``--small`` is at least 8: both sizes then warm up on the same 8 sessions
(``realistic_turn``'s warm-up takes up to 8), which would otherwise not cancel out.

Needs valgrind (Debian's package). Takes a few minutes: the engine runs some 50 times
slower under callgrind.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TURNS = 10  # per session, as in bench/realistic_turn.py
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def child(config: str, sessions: int, db: str | None, uvloop: bool) -> None:
    """Play ``sessions`` sessions of one configuration (run under callgrind)."""
    from _db import server_url, throwaway_schema
    from realistic_turn import run_engine, run_floor, run_raw

    run = {"engine": run_engine, "floor": run_floor, "raw": run_raw}[config]

    async def main() -> None:
        with throwaway_schema(server_url(db)) as url:
            await run(url, [f"i{i:04d}" for i in range(sessions)], TURNS, 1)

    if uvloop:
        import uvloop as loop  # uvicorn[standard] brings it

        with asyncio.Runner(loop_factory=loop.new_event_loop) as runner:
            runner.run(main())
    else:
        asyncio.run(main())


def count(config: str, sessions: int, args: argparse.Namespace) -> int:
    """Instructions of a whole child run of ``sessions`` sessions."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
           sys.executable, __file__, "--child", config, "--sessions", str(sessions)]
    if args.db:
        cmd += ["--db", args.db]
    if args.uvloop:
        cmd.append("--uvloop")
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{config} with {sessions} sessions failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=os.environ.get("FUNNEL_TEST_DSN") or os.environ.get("FUNNEL_DB"))
    ap.add_argument("--small", type=int, default=8)
    ap.add_argument("--large", type=int, default=28)
    ap.add_argument("--uvloop", action="store_true", help="run on uvloop's event loop")
    ap.add_argument("--child", choices=["engine", "floor", "raw"], help=argparse.SUPPRESS)
    ap.add_argument("--sessions", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        import logging

        logging.getLogger("funnel").setLevel(logging.ERROR)
        child(args.child, args.sessions, args.db, args.uvloop)
        return
    if args.small < 8 or args.large <= args.small:
        raise SystemExit("--small must be at least 8 (the warm-up's sessions) and --large more")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    extra = (args.large - args.small) * TURNS
    print(f"client instructions per turn, callgrind, ({args.large} - {args.small} sessions) x "
          f"{TURNS} turns, one session at a time, on "
          f"{'uvloop' if args.uvloop else 'asyncio'}'s event loop")
    print("| config | instructions/turn | x raw | x floor |\n|---|---|---|---|")
    per = {}
    for config in ("raw", "floor", "engine"):
        per[config] = (count(config, args.large, args) - count(config, args.small, args)) / extra
    for config, label in (("raw", "raw psycopg SELECT + UPSERT"),
                          ("floor", "the same work's floor (bench/floor.py)"), ("engine", "funnel")):
        print(f"| {label} | {per[config]:,.0f} | {per[config] / per['raw']:.2f} | "
              f"{per[config] / per['floor']:.2f} |")


if __name__ == "__main__":
    main()
