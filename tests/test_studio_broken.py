"""A funnel saved with errors does not stop `funnel studio` (docs/studio.md, "A funnel
that does not validate"): the studio starts, lists it broken with its problems, answers
what would run it with "fix the funnel in the Editor first", and opens it once a save
makes it valid, without a restart."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from conftest import temporary_schema

from engine.authoring.scaffold import scaffold
from engine.errors import InvalidInput
from engine.studio import Studio
from engine.studio.broken import LooseSpec
from engine.studio.editor import editor_files, lint

pytestmark = [pytest.mark.postgres]
GOOD = "score: {type: integer, default: 0}"
BAD = "score: {type: integr, default: 0}"


def broken_project(root: Path) -> Path:
    """A `funnel new` folder whose funnel file has one mistake (a type misspelt)."""
    (root / "pyproject.toml").write_text("")
    scaffold("shop", root / "shop")
    path = root / "shop" / "funnel.yaml"
    path.write_text(path.read_text("utf-8").replace(GOOD, BAD), "utf-8")
    return path


def test_the_studio_opens_on_a_broken_funnel_and_takes_the_fix(
        server_dsn: str, tmp_path: Path) -> None:
    path = broken_project(tmp_path)
    with temporary_schema(server_dsn, "t") as db:
        async def walk() -> None:
            studio = await Studio.open([path], db=db, home=tmp_path)
            try:
                # Listed, marked broken, with the validator's problem; nothing runs it.
                (listed,) = studio.funnels()
                assert listed["name"] == "shop" and listed["broken"] is True
                problems = listed["status"]["diagnostics"]
                assert "F004" in [d["code"] for d in problems], problems
                assert any("integr" in d["message"] and d["line"] == 22 for d in problems)
                count = len(problems)
                assert studio.statuses()["shop"]["ok"] is False
                with pytest.raises(InvalidInput, match=r"fix the funnel in the Editor first: "
                                   rf"{count} problem\(s\)"):
                    await studio.turn("shop", "studio-x", "hi")
                with pytest.raises(InvalidInput, match="Editor first"):
                    await studio.run_scenarios("shop")
                # The editor has its files, and checks the funnel file as typed.
                loose = LooseSpec(path, "shop")
                ids = [f.id for f in editor_files(loose)]
                assert ids[0] == "funnel.yaml" and "prompts/greeting.j2" in ids
                assert "scenarios/happy_path.yaml" in ids
                fixed = path.read_text("utf-8").replace(BAD, GOOD)
                assert lint(loose, "funnel.yaml", fixed) == []
                # A save that makes it valid: the watcher opens it, no restart.
                path.write_text(fixed, "utf-8")
                deadline = time.monotonic() + 10
                while "shop" not in studio.engines and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert "shop" in studio.engines and not studio.broken
                assert studio.statuses()["shop"]["ok"] is True
                view = await studio.turn("shop", "studio-x", "hi", answer={
                    "reply": "Hello! What do you need?", "updates": {}})
                assert view["result"]["reply"] == "Hello! What do you need?"
            finally:
                await studio.close()

        asyncio.run(walk())


def test_a_studio_with_only_broken_funnels_and_no_home_starts(
        server_dsn: str, tmp_path: Path) -> None:
    path = broken_project(tmp_path)
    with temporary_schema(server_dsn, "t") as db:
        async def start() -> None:
            studio = await Studio.open([path], db=db)
            try:
                assert list(studio.broken) == ["shop"] and not studio.engines
            finally:
                await studio.close()

        asyncio.run(start())
