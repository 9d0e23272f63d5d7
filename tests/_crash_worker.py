"""A process for tests/test_heartbeat.py to kill -9: it starts a turn whose model never
answers (``turn``), or delivers the outbox to a webhook that never answers (``dispatch``)."""

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import Engine, ScriptedModel  # noqa: E402
from engine.funnel.compiled import load_funnel  # noqa: E402
from engine.store import open_store  # noqa: E402
from engine.turn.notify import dispatch, make_notifier  # noqa: E402


async def turn(url: str, session: str, key: str) -> None:
    model = ScriptedModel.from_data({"default": {"reply": "never"}, "delay": 3600})
    engine = await Engine.open(ROOT / "funnels" / "puramur.yaml", db=url, model=model)
    await engine.handle(session, "I take two lotions", key=key or None)


async def deliver(url: str, webhook: str) -> None:
    spec = load_funnel(ROOT / "funnels" / "puramur.yaml").spec
    store = await open_store(url)
    await dispatch(store, {"puramur": make_notifier(spec, webhook=webhook)})


if __name__ == "__main__":
    mode, url = sys.argv[1], sys.argv[2]
    if mode == "turn":
        asyncio.run(turn(url, sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else ""))
    else:
        asyncio.run(deliver(url, sys.argv[3]))
