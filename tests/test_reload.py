"""engine.service.reload in process: what is watched, what counts as a change, what is refused.

The end-to-end cases (a running `funnel serve`, 50 conversations, SIGHUP) are in
tests/test_service_reload.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from projects import copy_puramur

from engine.format.files import watched_files
from engine.funnel.compiled import load_funnel
from engine.llm.models import make_model
from engine.service import preloaded
from engine.service.config import ServiceConfig
from engine.service.core import Service

pytestmark = pytest.mark.postgres


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    copy_puramur(root)
    return root


@pytest.fixture
async def service(project: Path, db_url: str, tmp_path: Path) -> AsyncIterator[Service]:
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"default": {"reply": "ok"}}))
    svc = Service(ServiceConfig(funnels=[project / "funnels" / "puramur.yaml"], db=db_url,
                                model=f"scripted:{script}", reload=False))
    await svc.start()
    try:
        yield svc
    finally:
        await svc.close()


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text("utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), "utf-8")


def test_the_watched_set_is_every_file_the_funnel_reads(project: Path) -> None:
    spec = load_funnel(project / "funnels" / "puramur.yaml").spec
    files = {p.relative_to(project).as_posix() for p in watched_files(spec)}
    assert {"funnels/puramur.yaml", "funnels/puramur/catalog.yaml",
            "prompts/puramur/greeting.j2", "prompts/puramur/_base.j2",  # included, not named
            "funnels/puramur/knowledge/cats.md"} <= files
    assert "pyproject.toml" not in files
    (project / "prompts" / "puramur" / ".greeting.j2.swp").write_text("x")  # an editor's
    assert not any(".swp" in str(p) for p in watched_files(spec))


async def test_a_touch_reloads_nothing_and_a_template_edit_is_taken(
        service: Service, project: Path, caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    engine = service.engines["puramur"]
    before = engine.funnel
    os.utime(project / "funnels" / "puramur.yaml")
    assert await service.reloader.reload("puramur", "test") == "unchanged"
    assert engine.funnel is before
    # An included template (not named by the funnel file) is part of the funnel.
    _replace(project / "prompts" / "puramur" / "_base.j2", "Be warm", "Be very warm")
    assert await service.reloader.reload("puramur", "test") == "applied"
    assert engine.funnel is not before and service.funnels["puramur"] is engine.funnel
    result = await engine.handle("s-1", "hello")
    assert result.fallback is False
    # An edit that keeps `version: 1` says so, with each stored edit's identity (the hash
    # `funnel versions` shows) and what changed.
    hashes = engine.loaded_versions()[1]
    line = next(r.getMessage() for r in caplog.records if "reloaded (test)" in r.getMessage())
    assert re.fullmatch(r"funnel puramur: reloaded \(test\): version 1 \([0-9a-f]{12}\) -> "
                        r"1 \([0-9a-f]{12}\), changed: prompts/puramur/_base\.j2; the same "
                        r"`version:`, so its sessions get the new files at their next turn "
                        r"\(bump `version:` to keep them on the old ones\)", line), line
    assert f"-> 1 ({hashes[:12]})" in line and line.count(hashes[:12]) == 1


async def test_a_broken_template_is_refused_naming_its_file(
        service: Service, project: Path, caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    engine = service.engines["puramur"]
    before = engine.funnel
    _replace(project / "prompts" / "puramur" / "greeting.j2", '{% include "_base.j2" %}',
             '{% include "_base.j2" %}{% if %}')
    assert await service.reloader.reload("puramur", "test") == "refused"
    assert engine.funnel is before
    assert any("edit refused" in r.getMessage() and "greeting.j2" in r.getMessage()
               for r in caplog.records)
    assert (await engine.handle("s-2", "hello")).fallback is False  # turns go on
    body = await service.reloader.versions()
    assert "refused" in body["puramur"] and "greeting.j2" not in body["puramur"]["refused"]
    assert service.metrics.value("funnel_reloads_total", funnel="puramur",
                                 result="refused") == 1


async def test_a_renamed_funnel_is_refused(service: Service, project: Path) -> None:
    _replace(project / "funnels" / "puramur.yaml", "funnel: puramur", "funnel: puramur2")
    assert await service.reloader.reload("puramur", "test") == "refused"
    assert service.funnels["puramur"].name == "puramur"


async def test_a_file_an_edit_names_is_watched_from_the_moment_it_appears(
        project: Path, db_url: str, tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"default": {"reply": "ok"}}))
    svc = Service(ServiceConfig(funnels=[project / "funnels" / "puramur.yaml"], db=db_url,
                                model=f"scripted:{script}", reload_interval=0.05))
    await svc.start()
    try:
        # The edit names a schema extension that does not exist yet: refused by the watcher.
        _replace(project / "funnels" / "puramur.yaml",
                 "    description: Say hello and ask whether the pet is a cat or a dog.\n",
                 "    description: Say hello and ask whether the pet is a cat or a dog.\n"
                 "    schema_extension: greeting_v2.json\n")
        refused = {"funnel": "puramur", "result": "refused"}
        await _until(lambda: svc.metrics.value("funnel_reloads_total", **refused) == 1)
        assert svc.funnels["puramur"].spec.stages["greeting"].schema is None
        # Writing the file it names is the change that makes the edit valid.
        (project / "funnels" / "schemas").mkdir()
        (project / "funnels" / "schemas" / "greeting_v2.json").write_text(
            '{"properties": {"reply": {"maxLength": 800}}}')
        await _until(lambda: getattr(svc.funnels["puramur"].spec.stages["greeting"].schema,
                                     "name", None) == "greeting_v2.json")
        assert svc.funnels["puramur"].stages["greeting"].schema["properties"]["reply"][
            "maxLength"] == 800
        assert svc.engines["puramur"].funnel is svc.funnels["puramur"]
        assert svc.metrics.value("funnel_reloads_total", **refused) == 1
    finally:
        await svc.close()


async def _until(check: Any, seconds: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "the watcher did not act"
        await asyncio.sleep(0.05)


class GatedModel:
    """The scripted model behind a gate: a call waits until the test opens it (a stand-in
    for a slow remote model, so that a turn is surely in flight)."""

    def __init__(self, script: Path) -> None:
        self.inner = make_model(f"scripted:{script}")
        self.name = "gated"
        self.called = asyncio.Event()
        self.gate = asyncio.Event()

    async def complete(self, request: Any) -> Any:
        self.called.set()
        await self.gate.wait()
        return await self.inner.complete(request)


async def test_a_turn_in_flight_finishes_on_the_version_it_started_with(
        project: Path, db_url: str, tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"default": {"reply": "ok"}}))
    model = GatedModel(script)
    svc = Service(ServiceConfig(funnels=[project / "funnels" / "puramur.yaml"], db=db_url,
                                model=model, reload=False))
    await svc.start()
    try:
        first = asyncio.ensure_future(svc.converse("puramur", "s-old", "hello", channel="api"))
        await asyncio.wait_for(model.called.wait(), 30)  # the turn is waiting for the model
        _replace(project / "funnels" / "puramur.yaml", "version: 1", "version: 2")
        assert await svc.reloader.reload("puramur", "test") == "applied"
        second = asyncio.ensure_future(svc.converse("puramur", "s-new", "hello", channel="api"))
        model.gate.set()
        old, new = await first, await second
        assert (old.state["funnel_version"], new.state["funnel_version"]) == (1, 2)
        assert not old.fallback and not new.fallback
    finally:
        model.gate.set()
        await svc.close()


async def test_an_edit_that_strands_sessions_in_a_removed_stage_is_refused(
        service: Service, project: Path, caplog: Any) -> None:
    """Renaming the stage a session is in, same version, strands it ("something went
    wrong" on every message): refused with the count and the mapping to add."""
    engine = service.engines["puramur"]
    await engine.handle("s-stay", "hello")
    stage = (await engine.state("s-stay") or {})["stage"]
    path = project / "funnels" / "puramur.yaml"
    data = yaml.safe_load(path.read_text("utf-8"))
    raw = data["stages"].pop(stage)
    raw.setdefault("prompt", f"{stage}.j2")
    if "schemas" in data:  # a funnel with a schemas folder names the old stage's file
        raw.setdefault("schema", f"{stage}.json")
    data["stages"]["renamed_stage"] = raw
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    text = text.replace(f"to: {stage}\n", "to: renamed_stage\n")
    if data["initial"] == stage:
        text = text.replace(f"initial: {stage}\n", "initial: renamed_stage\n")
    path.write_text(text, "utf-8")
    assert await service.reloader.reload("puramur", "test") == "refused"
    message = next(r.getMessage() for r in caplog.records if "edit refused" in r.getMessage())
    assert "1 live session(s)" in message and f"removed_stages:\n  {stage}:" in message
    data = yaml.safe_load(path.read_text("utf-8"))
    data["removed_stages"] = {stage: "renamed_stage"}
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    assert await service.reloader.reload("puramur", "test") == "applied"
    result = await engine.handle("s-stay", "still here")
    assert result.fallback is False and result.stage_after == "renamed_stage"  # moved


def test_a_worker_takes_the_masters_compiled_funnel_while_its_files_are_unchanged(
        project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`funnel serve --workers N` compiles each funnel once, in the master: a forked worker
    shares that object, unless an edit came since (then it compiles the edit)."""
    monkeypatch.setattr(preloaded, "_SHARED", {})
    path = project / "funnels" / "puramur.yaml"
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"default": {"reply": "ok"}}))

    def service() -> Service:
        return Service(ServiceConfig(funnels=[str(path)], model=f"scripted:{script}",
                                     reload=False))

    master = load_funnel(path)
    assert service().funnels["puramur"] is not master  # nothing shared: compiled afresh
    preloaded.share_compiled(master)
    assert service().funnels["puramur"] is master
    _replace(project / "prompts" / "puramur" / "_base.j2", "Be warm", "Be very warm")
    assert service().funnels["puramur"] is not master  # the edit is compiled, not shared
