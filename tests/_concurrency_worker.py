"""A separate process for tests/test_concurrency.py: sends one message to each session."""

import asyncio
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import Engine, ScriptedModel  # noqa: E402

SCRIPT = {
    "match": [
        {"pattern": "alpha", "output": {"reply": "a", "updates": {"pet": {"type": "cat"}}}},
        {"pattern": "beta", "output": {"reply": "b", "updates": {"customer": {"name": "Bo"}}}},
        {"pattern": "manager", "output": {"reply": "m", "actions": [
            {"type": "request_handoff", "reason": "explicit_request"}]}},
    ],
    "default": {"reply": "ok"},
}


async def main(url: str, word: str, sessions: list[str], concurrency: int) -> None:
    delivered: list[str] = []

    async def notify(payload: Mapping[str, Any]) -> None:
        delivered.append(payload["session_id"])

    engine = await Engine.open(ROOT / "funnels" / "puramur.yaml", db=url,
                               model=ScriptedModel.from_data(SCRIPT), notifier=notify)
    gate = asyncio.Semaphore(concurrency)

    async def one(sid: str) -> None:
        async with gate:
            await engine.handle(sid, f"{word} message")

    await asyncio.gather(*(one(s) for s in sessions))
    await engine.close()
    print(json.dumps({"delivered": delivered}))


if __name__ == "__main__":
    url, word, count, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    prefix = sys.argv[5] if len(sys.argv) > 5 else "s"
    repeat = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    sessions = ([f"{prefix}-{i}" for i in range(count)] if count > 1 else [prefix]) * repeat
    asyncio.run(main(url, word, sessions, concurrency))
