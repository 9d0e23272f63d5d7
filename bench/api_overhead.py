"""The HTTP layer's CPU per request, in process: full conversations through the real app.

    python3 bench/api_overhead.py --db postgresql://postgres@127.0.0.1:5432/test

drives ``engine.service.app.create_app`` (the real engine, PostgreSQL, the
scripted demo model) through httpx's ASGI transport, no sockets: each
conversation is the demo's messages, a state read with ``?explain=1`` and an
order. It prints this process's CPU time per request (client, app and engine;
PostgreSQL's own CPU is another process's) and, beside it, the same loop on a
bare Starlette route that parses the body and answers a fixed turn: what the
HTTP layer costs before the engine.

Used to choose the typed models (issue 27): the figure must not grow by more
than 5% when the handlers parse and answer through pydantic models.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._db import server_url, throwaway_schema  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("FUNNEL_ROOT", str(ROOT))
DEMO = ROOT / "funnels" / "puramur" / "demo.yaml"
KEY = "bench-admin-key-0123456789"
ORDER = {"order_id": "ORD-{n}", "amount": "697.00", "currency": "UAH",
         "lines": [{"sku": "PR251010", "qty": 1, "price": "697.00"}]}


async def conversations(app: object, count: int, tag: str) -> tuple[int, float]:
    messages = [str(m) for m in yaml.safe_load(DEMO.read_text())["customer"]]
    headers = {"Authorization": f"Bearer {KEY}"}
    requests = 0
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        started = time.process_time()
        for n in range(count):
            base = f"/v1/funnels/puramur/sessions/{tag}-{n}"
            for text in messages:
                r = await client.post(f"{base}/messages", json={"text": text}, headers=headers)
                assert r.status_code == 200, r.text
            r = await client.get(f"{base}?explain=1", headers=headers)
            assert r.status_code == 200, r.text
            order = {**ORDER, "order_id": f"ORD-{tag}-{n}"}
            r = await client.post(f"{base}/conversions", json=order, headers=headers)
            assert r.status_code == 201, r.text
            requests += len(messages) + 2
        return requests, time.process_time() - started


async def bare(count: int) -> float:
    async def turn(request: Request) -> Response:
        data = json.loads(await request.body())
        assert isinstance(data.get("text"), str)
        return Response(json.dumps({"reply": "ok", "stage": "discovery", "handoff": False,
                                    "fallback": False, "replayed": False, "turn_id": 1}),
                        media_type="application/json")
    app = Starlette(routes=[Route("/m", turn, methods=["POST"])])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://bench") as client:
        started = time.process_time()
        for _ in range(count):
            await client.post("/m", json={"text": "I have a cat"})
        return (time.process_time() - started) / count


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    ap.add_argument("--conversations", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from engine.service.app import create_app
    from engine.service.config import ServiceConfig

    with throwaway_schema(server_url(args.db)) as url:
        config = ServiceConfig(funnels=[ROOT / "funnels" / "puramur.yaml"], db=url,
                               model=f"scripted:{DEMO}", api_keys={KEY: frozenset({"admin"})},
                               secret=b"bench-secret-0123456789abcdef", rate_limit=(10**6, 1.0))
        app = create_app(config)
        async with app.router.lifespan_context(app):
            await conversations(app, 3, "warm")
            best = min([await conversations(app, args.conversations, f"r{r}")
                        for r in range(args.rounds)], key=lambda rt: rt[1] / rt[0])
    per = best[1] / best[0]
    floor = await bare(3000)
    print(f"app:  {best[0]} requests, {per * 1e6:8.1f} us CPU per request "
          f"(best of {args.rounds} rounds of {args.conversations} conversations)")
    print(f"bare Starlette route, no engine: {floor * 1e6:8.1f} us CPU per request")


if __name__ == "__main__":
    asyncio.run(main())
