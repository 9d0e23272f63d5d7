"""The same work's floor behind the same HTTP stack: the baseline of bench/serve_load.py's
latency, run with ``--floor-service``.

A uvicorn app (uvloop, httptools, starlette, the engine service's stack) whose
``POST /v1/funnels/puramur/sessions/{session}/messages`` runs, on plain psycopg from a
pool of ``FLOOR_DB_POOL`` connections, the statements the engine's turn sends
(bench/floor.py's recording: the message logged with the row and the window read, then
the save), sleeps the model's ``FLOOR_DELAY`` seconds before the save, and answers a
small JSON reply. Under the same load as the engine, what its latency adds over the
model's delay is what the machine (its cores shared by the client, the workers and
PostgreSQL), HTTP and the database add without the engine.

    FLOOR_RECORDING=rec.pickle FLOOR_DB=postgresql://... FLOOR_DELAY=0.3 \\
        python -m uvicorn floor_service:app --app-dir bench --workers 2 --loop uvloop

The turn's index in the recording is the message's place in bench/serve_load.py's
``MESSAGES`` (the client sends them in order, a new session every few).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import floor
import orjson
from psycopg_pool import AsyncConnectionPool
from serve_load import MESSAGES  # what the load client sends, in this order
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_STATE: dict[str, Any] = {}


async def message(request: Request) -> Response:
    body = orjson.loads(await request.body())
    recording: floor.Recording = _STATE["recording"]
    text = body.get("text", "")
    t = (MESSAGES.index(text) if text in MESSAGES else 0) % len(recording.turns)
    delay = _STATE["delay"]

    async def model() -> None:
        await asyncio.sleep(delay)

    # The engine holds no connection while the model thinks: neither does the floor.
    await floor.replay_split(_STATE["pool"].connection, recording, t,
                             request.path_params["session"], model)
    return Response(orjson.dumps({"reply": "Thank you! Tell me more about your pet."}),
                    media_type="application/json")


async def ready(request: Request) -> Response:
    return Response(b'{"ready": true}', media_type="application/json")


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    _STATE["recording"] = pickle.loads(Path(os.environ["FLOOR_RECORDING"]).read_bytes())
    _STATE["delay"] = float(os.environ.get("FLOOR_DELAY", "0.3"))
    size = int(os.environ.get("FLOOR_DB_POOL", "8"))
    pool = AsyncConnectionPool(os.environ["FLOOR_DB"], min_size=size, max_size=size,
                               kwargs={"autocommit": True}, open=False)
    await pool.open(wait=True)
    _STATE["pool"] = pool
    try:
        yield
    finally:
        await pool.close()


app = Starlette(routes=[Route("/v1/funnels/puramur/sessions/{session}/messages", message,
                              methods=["POST"]),
                        Route("/readyz", ready), Route("/healthz", ready)],
                lifespan=lifespan)
