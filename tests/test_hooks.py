"""Hooks cannot freeze a worker, end a process, or outlive their turn's deadline.

Puramur with a hook in its greeting's ``on_enter`` (it runs on a session's first
turn), in a ``pet_hooks.py`` beside the funnel. Everything here is behaviour:
which turn finishes while which hook is still blocked, what the customer and the
turn record get, what a reload runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, puramur_data, said

from engine import Engine, ScriptedModel
from engine.errors import FunnelInvalid
from engine.funnel.compiled import load_funnel
from engine.turn import notify

pytestmark = pytest.mark.postgres

HELLO = {"reply": "Hello! Is your pet a cat or a dog?"}
TAGGED = ["tagged"]


def hooked(tmp: Path, hook_source: str, *, deadline: float | None = None,
           target: str = "pet_hooks:tag") -> Path:
    """Puramur whose greeting runs the action ``tag`` (``target``) on enter."""
    data = puramur_data()
    data["actions"]["tag"] = {"hook": target, "writes": ["objections_raised"]}
    data["stages"]["greeting"]["on_enter"] = [{"type": "tag"}]
    data["handoff"]["notify"] = {"hook": "pet_hooks:alert"}
    if deadline is not None:
        data["model"]["deadline"] = deadline
    (tmp / "pet_hooks.py").write_text(
        hook_source + "\n\ndef alert(payload):\n    return None\n", "utf-8")
    path = tmp / "puramur.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    return path


async def test_a_blocking_hook_holds_up_its_own_turn_only(tmp_path: Path, db_url: str) -> None:
    started, release = tmp_path / "started", tmp_path / "release"
    path = hooked(tmp_path, f"""
import pathlib, time
def tag(call):
    if call.session_id == "slow":
        pathlib.Path({str(started)!r}).write_text("1")
        for _ in range(3000):  # until the test releases it (30 s at most)
            if pathlib.Path({str(release)!r}).exists():
                break
            time.sleep(0.01)
    return {{"objections_raised": {TAGGED!r}}}
""")
    model = ScriptedModel.from_data({"default": HELLO})
    async with await Engine.open(path, db=db_url, model=model) as engine:
        slow = asyncio.create_task(engine.handle("slow", "Hi"))
        while not started.exists():
            await asyncio.sleep(0.01)
        fast = await engine.handle("fast", "Hi")  # its own hook returns at once
        assert fast.reply == HELLO["reply"] and not fast.fallback
        assert not slow.done()  # the other session's turn finished while the hook blocks
        release.write_text("1")
        done = await slow
        assert not done.fallback and done.state["objections_raised"] == TAGGED


@pytest.mark.parametrize("raised", ["SystemExit(3)", "KeyboardInterrupt()",
                                    "asyncio.CancelledError()", "GeneratorExit()"])
async def test_a_hook_that_raises_a_base_exception_fails_only_its_turn(
        tmp_path: Path, db_url: str, sql: Any, raised: str) -> None:
    path = hooked(tmp_path, f"""
import asyncio
def tag(call):
    if call.args.get("boom", True):
        raise {raised}
""")
    model = ScriptedModel.from_data({"default": HELLO})
    async with await Engine.open(path, db=db_url, model=model) as engine:
        first = await engine.handle("s1", "Hi, I am Olena")
        assert first.fallback and first.reply == said(engine.funnel.stage("greeting").spec.fallback,
                                                      first.state)
        assert first.error is not None and "HookFailed" in first.error
        assert raised.split("(")[0].split(".")[-1] in first.error
        second = await engine.handle("s1", "Hello again")  # the row exists: no on_enter
        assert second.reply == HELLO["reply"] and not second.fallback
    records = sql("SELECT fallback FROM funnel_turns WHERE session_id = 's1' ORDER BY id")
    assert records == [(True,), (False,)]


async def test_a_hook_past_the_deadline_fails_the_turn(tmp_path: Path, db_url: str) -> None:
    path = hooked(tmp_path, """
import time
def tag(call):
    time.sleep(30)
""", deadline=1)
    model = ScriptedModel.from_data({"default": HELLO})
    async with await Engine.open(path, db=db_url, model=model) as engine:
        result = await engine.handle("late", "Hi")
        assert result.fallback and "HookTimeout" in (result.error or "")
        assert "did not return within 1 s" in (result.error or "")


def test_a_standard_library_hook_is_refused_at_load(tmp_path: Path) -> None:
    path = hooked(tmp_path, "def tag(call):\n    return None\n", target="sys:exit")
    with pytest.raises(FunnelInvalid) as caught:
        load_funnel(path)
    assert any(d.code == "F506" and d.line > 0 for d in caught.value.diagnostics)


def test_a_reload_runs_the_edited_hook(tmp_path: Path) -> None:
    path = hooked(tmp_path, "def tag(call):\n    return {'objections_raised': ['one']}\n")
    first = load_funnel(path)
    (tmp_path / "pet_hooks.py").write_text(
        "def tag(call):\n    return {'objections_raised': ['two']}\n\n"
        "def alert(payload):\n    return None\n", "utf-8")
    os.utime(tmp_path / "pet_hooks.py", ns=(1, 1))  # a changed file, whatever the clock
    second = load_funnel(path)
    assert first.actions.hooks["tag"](None) == {"objections_raised": ["one"]}  # type: ignore[arg-type]
    assert second.actions.hooks["tag"](None) == {"objections_raised": ["two"]}  # type: ignore[arg-type]
    assert load_funnel(path).actions.hooks["tag"] is second.actions.hooks["tag"]  # unchanged


def test_sighup_reloads_an_edited_hook_file(tmp_path: Path, db_url: str) -> None:
    """The service's SIGHUP reload (docs/service.md) with only the hook file edited, to a
    file of the same size and mtime: new turns run the new hook."""
    from starlette.testclient import TestClient

    from engine.service.app import create_app
    from engine.service.config import ServiceConfig

    hook = tmp_path / "pet_hooks.py"
    path = hooked(tmp_path, "def tag(call):\n    return {'objections_raised': ['one']}\n")
    config = ServiceConfig(funnels=[path], db=db_url, model=ScriptedModel.from_data(
        {"default": HELLO}), api_keys={"k-0123456789abcdef": frozenset({"converse"})},
        secret=b"s" * 32, reload=False)
    with TestClient(create_app(config)) as client:
        def tags(session: str) -> Any:
            r = client.post(f"/v1/funnels/puramur/sessions/{session}/messages",
                            json={"text": "Hi"},
                            headers={"Authorization": "Bearer k-0123456789abcdef"})
            assert r.status_code == 200 and not r.json()["fallback"], r.text
            service = client.app.state.service  # type: ignore[attr-defined]
            return client.portal.call(service.engines["puramur"].state, session)[  # type: ignore[union-attr]
                "objections_raised"]

        assert tags("h1") == ["one"]
        stat = hook.stat()
        hook.write_text(hook.read_text("utf-8").replace("['one']", "['two']"), "utf-8")
        os.utime(hook, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # size and mtime as before
        service = client.app.state.service  # type: ignore[attr-defined]
        done = client.portal.call(service.reloader.reload_all, "SIGHUP")  # type: ignore[union-attr]
        assert done == {"puramur": "applied"}
        assert tags("h2") == ["two"]


async def test_a_notify_hook_that_never_returns_fails_its_delivery(
        tmp_path: Path, db_url: str, sql: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = hooked(tmp_path, "def tag(call):\n    return None\n")
    (tmp_path / "pet_hooks.py").write_text(
        "import time\n\ndef tag(call):\n    return None\n\n"
        "def alert(payload):\n    time.sleep(3600)\n", "utf-8")
    monkeypatch.setattr(notify, "HOOK_SECONDS", 0.5)
    handoff = {"reply": "A manager will write to you.",
               "actions": [{"type": "request_handoff", "reason": "complaint"}]}
    model = ScriptedModel.from_data({"turns": [HELLO, handoff]})
    engine = await Engine.open(path, db=db_url, model=model)
    await engine.handle("h1", "Hi")
    result = await engine.handle("h1", "I want to complain")
    assert result.handoff
    await engine.close()  # waits for the background dispatch: bounded by the hook's limit
    [(error,)] = sql("SELECT last_error FROM funnel_outbox WHERE kind = 'handoff'")
    assert "did not return within 0.5 s" in error


def test_chat_survives_a_hook_that_exits(tmp_path: Path, db_url: str) -> None:
    path = hooked(tmp_path, "import sys\n\ndef tag(call):\n    sys.exit('bye')\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"default": {"reply": "Got it."}}))
    env = {**os.environ, "FUNNEL_DB": db_url, "PYTHONPATH": str(ROOT)}
    env.pop("FUNNEL_MODEL", None)
    done = subprocess.run([sys.executable, "-m", "engine.cli", "chat", str(path), "--session",
                           "c1", "--model", f"scripted:{script}"], cwd=ROOT, env=env,
                          input=b"Hi, I am Olena Kovalenko\nStill there?\n", capture_output=True,
                          timeout=180)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, err
    fallback = said(load_funnel(path).stage("greeting").spec.fallback)  # a new session: uk
    assert out.splitlines() == [fallback, "Got it."]
    assert "Traceback" not in err and "Kovalenko" not in err
