"""A long answer streamed a character a chunk: the worker's CPU and its event loop's stalls.

Issue 40: an OpenAI-format stream whose 40,000-character answer came one character a
chunk cost 17.7 s of CPU and held the event loop for 9 s. Here the Puramur greeting
turn runs on the real litellm HTTP path against the fake OpenAI server
(tests/fake_providers.py) in a child process (its CPU is not the engine's), answering an
envelope of N characters (a 1,400-character reply, then the JSON's whitespace):

* ``unstreamed``: ``Engine.handle`` without ``stream=``, the answer in one body: the
  baseline, measured in the same run;
* ``streamed``: ``Engine.handle(..., stream=listener)``, the answer in 1-character
  chunks (``Stream(piece=1, lean=True)``: chunks of ``choices`` only, some 60 bytes, so
  that 60,000 of them stay under the 8 MiB bound on a response);
* ``floor``: no engine and no litellm: aiohttp (litellm's transport) reading the same
  streamed body to its end: what the transport alone costs for 60,000 HTTP chunks.

For each: the process's CPU for the turn (all its threads), its wall time, the worst
stall of a ticker task beside it (``asyncio.sleep(0.01)`` in a loop: how much later
than 10 ms it woke, at worst), and the longest garbage collection meanwhile
(``gc.callbacks``: a full one walks the millions of objects litellm's import leaves).
Then Anthropic's wire (the fake Anthropic server), whose stream is read through
litellm's chunk objects: 5,000 characters a character a chunk. Last, a stream that
stops after 20,000 characters against a funnel whose ``model.deadline`` is 3 s: when
the turn ended.

    python bench/stream_chunks.py [--db URL] [--runs 3] [--sizes 10000,20000,40000,60000]
    python bench/stream_chunks.py --smoke   # the smallest run (tests/test_bench_smoke.py)

Without --db it uses $FUNNEL_DB, else the embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from _db import server_url, throwaway_schema  # noqa: E402

REPLY = ("Our oatmeal shampoo suits a long coat in winter; rinse twice and dry well. " * 20
         ).strip()[:1400]
MODEL = "openai/gpt-4o-mini"
OTHER_CHARS = 5_000  # Anthropic's wire: litellm's chunk objects, some 0.45 ms each


def envelope(chars: int) -> str:
    head = json.dumps({"reply": REPLY, "language": "en"})
    return head[:-1] + " " * max(0, chars - len(head)) + "}"


def serve(commands: Any, answers: Any) -> None:
    """The fake OpenAI and Anthropic servers, in a child process: each queues what
    ``commands`` asks."""
    from fake_providers import FakeProvider
    from fake_stream import Stream

    never = threading.Event()  # a held stream waits until the server stops
    with FakeProvider("openai") as openai, FakeProvider("anthropic") as anthropic:
        answers.put((openai.api_base, anthropic.api_base))
        while True:
            command = commands.get()
            if command is None:
                return
            kind, chars, wire = command
            stream = {"whole": None, "chunks": Stream(piece=1, lean=True),
                      "held": Stream(piece=1, lean=True, hold=never, hold_after=chars)
                      }[kind]
            fake = openai if wire == "openai" else anthropic
            fake.reply(envelope(60_000 if kind == "held" else chars),
                       completion_tokens=chars // 4, stream=stream)
            answers.put(True)


class Ticker:
    """A task that sleeps 10 ms at a time; ``worst`` is its latest wake-up, in seconds."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            self.worst = max(self.worst, now - last - 0.01)
            last = now

    def __enter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


class Collections:
    """The longest garbage collection while it is entered (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._started = 0.0

    def _note(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.longest = max(self.longest, time.perf_counter() - self._started)

    def __enter__(self) -> Collections:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._note)


async def measured(work: Callable[[], Coroutine[Any, Any, Any]]
                   ) -> tuple[float, float, float, float, Any]:
    """(CPU s, wall s, worst stall s, longest garbage collection s, result) of ``work``."""
    await asyncio.sleep(0.05)  # the ticker's first sleep starts before the work
    with Ticker() as ticker:
        await asyncio.sleep(0.02)
        with Collections() as collections:
            cpu, wall = time.process_time(), time.perf_counter()
            result = await work()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        await asyncio.sleep(0.02)
    return cpu, wall, ticker.worst, collections.longest, result


async def floor(api_base: str) -> Any:
    """aiohttp alone (the transport litellm reads with) reading a streamed answer to its
    end: no engine, no litellm, no parse."""
    import aiohttp

    async with aiohttp.ClientSession() as session, session.post(
            api_base + "/chat/completions", headers={"Authorization": "Bearer sk-bench"},
            json={"model": "gpt-4o-mini", "messages": [], "stream": True}) as response:
        async for _ in response.content.iter_any():
            pass


def funnel_file(folder: Path, **model: Any) -> Path:
    """Puramur with ``model`` settings changed, its files named absolutely."""
    data = yaml.safe_load((ROOT / "funnels" / "puramur.yaml").read_text("utf-8"))
    data["prompts"] = str(ROOT / "prompts" / "puramur")
    data["catalog"] = str(ROOT / "funnels" / "puramur" / "catalog.yaml")
    data["knowledge"]["folder"] = str(ROOT / "funnels" / "puramur" / "knowledge")
    data["model"].update(model)
    path = folder / f"puramur_{len(list(folder.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    return path


async def run(url: str, sizes: list[int], runs: int, other_chars: int = OTHER_CHARS,
              deadline_s: float = 3.0) -> None:
    from engine.llm.models import LiteLLMModel
    from engine.turn.engine import Engine

    os.environ.setdefault("OPENAI_API_KEY", "sk-bench")
    os.environ["FUNNEL_ROOT"] = os.pathsep.join(  # the copies read the repository's files
        p for p in (os.environ.get("FUNNEL_ROOT"), str(ROOT)) if p)
    spawn = multiprocessing.get_context("spawn")
    commands, answers = spawn.Queue(), spawn.Queue()
    child = spawn.Process(target=serve, args=(commands, answers), daemon=True)
    child.start()
    api_base, anthropic_base = answers.get(timeout=60)

    def program(kind: str, chars: int, wire: str = "openai") -> None:
        commands.put((kind, chars, wire))
        answers.get(timeout=30)

    folder = Path(tempfile.mkdtemp(prefix="stream-chunks-"))
    model = LiteLLMModel(MODEL, api_base=api_base)
    engine = await Engine.open(funnel_file(folder, retries=0), db=url, model=model)
    rows: list[tuple[str, int, list[tuple[float, float, float, float]]]] = []
    turn = 0
    try:
        for kind in ("whole", "chunks", "whole"):  # warm-up: imports, connections
            program(kind, 2_000)
            turn += 1
            await engine.handle(f"bench-chunks-{turn}", "Hi!",
                                stream=(lambda k, t: None) if kind == "chunks" else None)
        for chars in sizes:
            for kind in ("whole", "chunks", "floor"):
                found = []
                for _ in range(runs):
                    program("whole" if kind == "whole" else "chunks", chars)
                    turn += 1
                    shown: list[str] = []
                    if kind == "floor":
                        cpu, wall, stall, longest, _ = await measured(
                            lambda: floor(api_base))
                    else:
                        listener = ((lambda k, t, shown=shown: shown.append(t)) if kind == "chunks"
                                    else None)
                        session = f"bench-chunks-{turn}"
                        cpu, wall, stall, longest, result = await measured(
                            lambda s=session, li=listener: engine.handle(s, "Hi!",
                                                                         stream=li))
                        if result.fallback or result.reply != REPLY or (
                                kind == "chunks" and "".join(shown) != REPLY):
                            raise SystemExit(f"{kind} {chars}: the turn did not answer the "
                                             f"reply ({result.error})")
                    found.append((cpu, wall, stall, longest))
                rows.append((kind, chars, found))
        await engine.close()
        # Another wire: Anthropic's, read through litellm's chunk objects.
        os.environ.setdefault("ANTHROPIC_API_KEY", "sk-ant-bench")
        other = LiteLLMModel("anthropic/claude-sonnet-4-5", api_base=anthropic_base)
        engine = await Engine.open(funnel_file(folder, retries=0), db=url, model=other)
        try:
            program("chunks", 2_000, "anthropic")
            turn += 1
            await engine.handle(f"bench-chunks-{turn}", "Hi!", stream=lambda k, t: None)
            program("chunks", other_chars, "anthropic")
            turn += 1
            anthropic = await measured(lambda: engine.handle(
                f"bench-chunks-{turn}", "Hi!", stream=lambda k, t: None))
            program("whole", other_chars, "anthropic")
            turn += 1
            anthropic_whole = await measured(lambda: engine.handle(
                f"bench-chunks-{turn}", "Hi!"))
        finally:
            await engine.close()
            await other.aclose()
        # The deadline: a stream that stops after 20,000 characters, a 3 s deadline.
        engine = await Engine.open(funnel_file(folder, retries=0, deadline=deadline_s), db=url,
                                   model=model)
        program("held", 20_000)
        turn += 1
        deadline = await measured(
            lambda: engine.handle(f"bench-chunks-{turn}", "Hi!", stream=lambda k, t: None))
    finally:
        await engine.close()
        await model.aclose()
        commands.put(None)
        child.join(timeout=10)
    print(f"a {len(REPLY):,}-character reply in an envelope of N characters, the fake OpenAI "
          f"server in a child process, medians of {runs} turns")
    print(f"{'N chars':>8}  {'':<40} {'CPU':>8} {'wall':>8} {'worst stall':>12} "
          f"{'longest GC':>11}")
    names = {"whole": "unstreamed turn (baseline)",
             "chunks": "streamed turn, 1-char chunks",
             "floor": "floor: aiohttp reads the stream"}
    base: dict[int, float] = {}
    for kind, chars, found in rows:
        cpu = statistics.median(f[0] for f in found)
        wall = statistics.median(f[1] for f in found)
        stall = max(f[2] for f in found)
        longest = max(f[3] for f in found)
        if kind == "whole":
            base[chars] = cpu
        ratio = f"  ({cpu / base[chars]:.1f}x the unstreamed)" if kind != "whole" else ""
        print(f"{chars:>8,}  {names[kind]:<40} {cpu * 1000:>6.0f}ms {wall * 1000:>6.0f}ms "
              f"{stall * 1000:>10.1f}ms {longest * 1000:>9.1f}ms{ratio}")
    for name, other in (("unstreamed turn (baseline)", anthropic_whole),
                        ("streamed turn, 1-char chunks", anthropic)):
        cpu, wall, stall, longest, result = other
        print(f"{other_chars:>8,}  {'Anthropic: ' + name:<40} {cpu * 1000:>6.0f}ms "
              f"{wall * 1000:>6.0f}ms {stall * 1000:>10.1f}ms {longest * 1000:>9.1f}ms"
              + ("" if not result.fallback else f"  fallback: {result.error}"))
    cpu, wall, stall, longest, held = deadline
    print(f"deadline {deadline_s:g} s, a stream that stops after 20,000 characters: the turn "
          f"ended after "
          f"{wall:.2f} s (fallback {held.fallback}: {held.error}), CPU {cpu * 1000:.0f} ms, "
          f"worst stall {stall * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="10000,20000,40000,60000")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run: 2,000 characters, 300 on Anthropic's wire, "
                        "a 1 s deadline (a check that it runs; it measures nothing)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with throwaway_schema(server_url(args.db)) as url:
        if args.smoke:
            asyncio.run(run(url, [2_000], 1, other_chars=300, deadline_s=1.0))
        else:
            asyncio.run(run(url, sizes, args.runs))


if __name__ == "__main__":
    main()
