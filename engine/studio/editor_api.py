"""The editor's endpoints (`/api/editor/...`): files, checks as typed, saves, a new
funnel, the migration an edit needs, and the model key kept in memory.

Each body is a strict pydantic model (bounded, extra keys refused) read through the
app's own body reader; every file goes through :mod:`engine.studio.editor`'s guard.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from . import editor, make
from .broken import Broken
from .keys import Keys
from .playground import Studio

__all__ = ["routes"]

B = TypeVar("B", bound=BaseModel)
Reader = Callable[[Request, type[B]], Awaitable[B]]
SAVED_WAIT = 10.0  # seconds a save waits for the watcher's verdict on it
_FUNNEL = Field(min_length=1, max_length=200)
_FILE = Field(min_length=1, max_length=1000)
_TEXT = Field(max_length=editor.MAX_TEXT)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class LintBody(_Body):
    """A file's text as typed (nothing written)."""

    funnel: str = _FUNNEL
    file: str = _FILE
    text: str = _TEXT


class SaveBody(LintBody):
    """Write ``text`` over ``file`` if it is still the version ``base`` (its SHA-256)."""

    base: str = Field(pattern=r"^[0-9a-f]{64}$")


class NewBody(_Body):
    """A new funnel: `funnel new`'s name and template, the language and the currency."""

    name: str = Field(min_length=1, max_length=60)
    language: str = Field(default="en", pattern=r"^[a-z]{2}$")
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    template: Literal["minimal", "minimal+catalog", "puramur", "b2b_demo"] = "minimal"


class FunnelBody(_Body):
    funnel: str = _FUNNEL


class KeyBody(_Body):
    """A litellm model and its key (``None``: forget the key)."""

    model: str = Field(pattern=r"^[A-Za-z0-9_.:/@-]{1,200}$")
    key: str | None = Field(default=None, min_length=8, max_length=500,
                            pattern=r"^[\x21-\x7e]+$")


def routes(guarded: Callable[[Callable[[Request], Awaitable[Response]]],
                             Callable[[Request], Awaitable[Response]]],
           body: Reader[Any], opened: Callable[[Request], Awaitable[Studio]],
           answer: Callable[..., Response]) -> list[Route]:
    """The editor's routes, given the app's guard, body reader, studio and JSON answer."""

    def state(request: Request) -> tuple[editor.Opened, Keys]:
        app = request.app.state
        if getattr(app, "editor_opened", None) is None:
            app.editor_opened, app.editor_keys = editor.Opened(), Keys()
        return app.editor_opened, app.editor_keys

    async def spec_of(request: Request, name: str) -> Any:
        studio = await opened(request)
        if name in studio.broken:  # not valid yet: the editor is how it gets fixed
            return studio, studio.broken[name].loose
        studio.engine(name)  # a funnel the studio has, or a 400 naming them
        return studio, studio.watched[name].funnel.spec

    async def files(request: Request) -> Response:
        _studio, spec = await spec_of(request, request.query_params.get("funnel", ""))
        return answer({"files": [f.view() for f in editor.editor_files(spec)]})

    async def read(request: Request) -> Response:
        _studio, spec = await spec_of(request, request.query_params.get("funnel", ""))
        return answer(editor.read(spec, request.query_params.get("file", ""), state(request)[0]))

    async def schema(request: Request) -> Response:
        kind = request.query_params.get("kind", "funnel")
        if kind not in ("funnel", "scenario"):
            return answer({"error": {"code": "not_found", "message": "kind: funnel or scenario"}},
                          404)
        text = resources.files("engine").joinpath(f"data/{kind}.schema.json").read_text("utf-8")
        return answer(json.loads(text))

    async def lint(request: Request) -> Response:
        b: LintBody = await body(request, LintBody)
        _studio, spec = await spec_of(request, b.funnel)
        started = time.perf_counter()
        found = await asyncio.to_thread(editor.lint, spec, b.file, b.text)
        return answer({"diagnostics": found, "ms": round((time.perf_counter() - started) * 1000, 1)})

    async def save(request: Request) -> Response:
        b: SaveBody = await body(request, SaveBody)
        studio, spec = await spec_of(request, b.funnel)
        watched = studio.broken.get(b.funnel) or studio.watched[b.funnel]
        before = watched.generation
        path, conflict = await asyncio.to_thread(editor.save, spec, b.file, b.text, b.base,
                                                 state(request)[0])
        if conflict is not None:
            return answer({"saved": False, "conflict": conflict}, 409)
        if watched.watches(path):  # the watcher validates it and takes it, or keeps the last good
            deadline = time.monotonic() + SAVED_WAIT
            while watched.generation == before and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        status = watched.status()
        name = (watched.promoted_as if isinstance(watched, Broken) else None) or b.funnel
        if name in studio.watched and name not in studio.broken:
            status = studio.watched[name].status()  # a broken one a save made valid
        return answer({"saved": True, "funnel": name, "hash": editor.digest(b.text), "status": {
            **status, "diagnostics": editor.annotate(spec, status["diagnostics"])}})

    async def migration(request: Request) -> Response:
        studio = await opened(request)
        return answer(await make.migration(studio, request.query_params.get("funnel", "")))

    async def migrate(request: Request) -> Response:
        b: FunnelBody = await body(request, FunnelBody)
        return answer(await make.migrate(await opened(request), b.funnel))

    async def new(request: Request) -> Response:
        b: NewBody = await body(request, NewBody)
        return answer(await make.new_funnel(await opened(request), b.name, b.language,
                                            b.currency, b.template))

    async def model_key(request: Request) -> Response:
        keys = state(request)[1]
        if request.method == "POST":
            b: KeyBody = await body(request, KeyBody)
            keys.set((await opened(request)).model, b.model, b.key)
        return answer({"keys": keys.view()})

    get = [("files", files), ("file", read), ("schema", schema), ("migration", migration)]
    post = [("lint", lint), ("save", save), ("migrate", migrate), ("new", new)]
    return [*(Route(f"/api/editor/{p}", guarded(fn)) for p, fn in get),
            *(Route(f"/api/editor/{p}", guarded(fn), methods=["POST"]) for p, fn in post),
            Route("/api/editor/model-key", guarded(model_key), methods=["GET", "POST"])]
