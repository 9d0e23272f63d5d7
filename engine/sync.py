"""A blocking wrapper for scripts and the CLI: one private event loop, the same engine."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

from .funnel.compiled import CompiledFunnel
from .turn.engine import Engine, TurnResult


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when it is installed (``uvicorn[standard]`` brings it), else
    asyncio's. A turn waits on PostgreSQL twice, and each wait goes through the loop:
    on uvloop the same turn costs about 10% less client CPU (``bench/realistic_turn.py
    --uvloop``). `funnel serve` gets it from uvicorn."""
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class SyncEngine:
    """A blocking wrapper around :class:`Engine` for scripts and the CLI."""

    def __init__(self, funnel: str | Path | CompiledFunnel, **options: Any) -> None:
        self._loop = new_event_loop()
        self.engine: Engine = self._loop.run_until_complete(Engine.open(funnel, **options))

    def handle(self, session_id: str, text: str, *, channel: str = "api") -> TurnResult:
        return self._loop.run_until_complete(self.engine.handle(session_id, text,
                                                                channel=channel))

    def state(self, session_id: str) -> dict[str, Any] | None:
        return self._loop.run_until_complete(self.engine.state(session_id))

    def close(self) -> None:
        try:
            self._loop.run_until_complete(self.engine.close())
        finally:
            self._loop.close()

    def __enter__(self) -> SyncEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
