"""Does a hot reload stall the turns? The event loop's lag while funnels are reloaded.

A copy of Puramur (its own project folder) is edited and reloaded RELOADS times by
:class:`engine.service.reload.Reloader` (validation and compilation in a thread), while
a ticker on the event loop measures how late each 1 ms sleep wakes up: that lateness is
what every turn in flight would wait. The baseline, measured in the same run, compiles
the same edits *on* the event loop, as a naive reload would. No database is needed (the
service is not started, so the table check is skipped; it is one short query).

Run: ``PYTHONPATH=. python bench/reload_stall.py [--reloads 20]``. Target: the worst
lag of the threaded reload stays well under one compile (the baseline's worst).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the Puramur project copy (tests/projects.py)

from projects import copy_puramur  # noqa: E402

from engine.funnel.compiled import load_funnel  # noqa: E402
from engine.service.config import ServiceConfig  # noqa: E402
from engine.service.core import Service  # noqa: E402


def edit(path: Path, n: int) -> None:
    text = path.read_text("utf-8").splitlines(keepends=True)
    text = [f"description: edit {n}\n" if line.startswith("description:") else line
            for line in text]
    path.write_text("".join(text), "utf-8")


async def lag_during(work: Coroutine[Any, Any, None]) -> list[float]:
    """Lateness (ms) of 1 ms sleeps on the loop while ``work`` (a coroutine) runs."""
    lags: list[float] = []
    task = asyncio.ensure_future(work)
    while not task.done():
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append((time.perf_counter() - t) * 1000 - 1.0)
    await task
    return lags


def summary(name: str, lags: list[float]) -> str:
    if len(lags) < 2:  # a loop blocked for a whole short run ticks once
        q = [lags[0] if lags else 0.0] * 99
    else:
        q = statistics.quantiles(lags, n=100, method="inclusive")
    return (f"{name:<28} ticks {len(lags):>6}  p50 {q[49]:6.2f} ms  p99 {q[98]:6.2f} ms  "
            f"max {max(lags, default=0.0):7.2f} ms  over 20 ms: {sum(v > 20 for v in lags)}")


async def main(reloads: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        funnel = copy_puramur(Path(tmp))
        script = Path(tmp) / "script.yaml"
        script.write_text(yaml.safe_dump({"default": {"reply": "ok"}}))
        service = Service(ServiceConfig(funnels=[funnel], model=f"scripted:{script}",
                                        reload=False))
        started = time.perf_counter()
        load_funnel(funnel)
        compile_ms = (time.perf_counter() - started) * 1000

        async def threaded() -> None:
            for n in range(reloads):
                edit(funnel, n)
                assert await service.reloader.reload("puramur", "bench") == "applied"

        async def inline() -> None:
            for n in range(reloads):
                edit(funnel, 1000 + n)
                load_funnel(funnel)  # on the loop: what the reloader must not do
                await asyncio.sleep(0)

        # As the service does after start-up (engine.service.app): what exists now is
        # out of the collector's reach, or a full collection walks it all.
        gc.collect()
        gc.freeze()
        base = await lag_during(inline())
        ours = await lag_during(threaded())
        print(f"one compile of Puramur: {compile_ms:.0f} ms; {reloads} reloads each")
        print(summary("baseline: compile on loop", base))
        print(summary("Reloader (thread)", ours))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reloads", type=int, default=20)
    asyncio.run(main(parser.parse_args().reloads))
