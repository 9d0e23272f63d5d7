"""The studio's Simulate tab: `funnel simulate` (engine.evidence.simulate) with the funnel's
personas against a chosen model, one run at a time per studio, cancellable, its progress
polled by the page.

A run plays in a temporary schema (``funnel_tmp_simulate_...``) dropped when it ends,
cancelled or not: it never writes into the studio's sessions, customers' or playground,
and its hand-offs reach no one (the run's notifier is silent).

The funnel's personas: the YAML files with a top-level ``personas:`` key in the
funnel's folder (``personas.yaml`` beside the funnel, or in its own folder). The
scripted models offered: the YAML files there with a top-level ``match:``,
``default:`` or ``turns:`` key that are not scenarios (engine.llm.models.ScriptedModel).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FunnelError, InvalidInput
from ..evidence.personas import load_personas
from ..evidence.simulate import Conversation, Simulation, SimulationCancelled, simulate
from ..format.paths import funnel_roots, is_confined
from ..format.spec import FunnelSpec
from ..funnel.compiled import CompiledFunnel
from ..llm.models import make_model

__all__ = ["Busy", "Simulator", "choices"]

log = logging.getLogger("funnel.studio")
MAX_FILES = 400  # YAML files looked at for personas and scripts (a funnel's folder)
_PERSONAS = re.compile(r"^personas\s*:", re.MULTILINE)
_SCRIPT = re.compile(r"^(match|default|turns)\s*:", re.MULTILINE)
_NOT_SCRIPT = re.compile(r"^(scenario|funnel|personas)\s*:", re.MULTILINE)


class Busy(FunnelError):
    """A simulation is running already (409): one at a time per studio."""


def _yaml_files(spec: FunnelSpec) -> list[Path]:
    """The YAML files beside the funnel file and, three levels deep at most, in the
    folder of its name; hidden ones skipped, :data:`MAX_FILES` at most (a funnel at the
    top of a big project is not walked whole)."""
    parent, stem = spec.path.parent, spec.path.stem
    found: list[Path] = []

    def walk(folder: Path, depth: int) -> None:
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            return
        for path in entries:
            if len(found) >= MAX_FILES or path.name.startswith("."):
                continue
            if path.is_dir():
                if depth > 1:
                    walk(path, depth - 1)
            elif path.suffix in (".yaml", ".yml") and path != spec.path:
                found.append(path)

    walk(parent, 1)
    if (parent / stem).is_dir():
        walk(parent / stem, 3)
    return found


def choices(spec: FunnelSpec) -> dict[str, Any]:
    """The personas files and scripted models of the funnel's folder, and its own model."""
    personas, scripts = [], []
    for path in _yaml_files(spec):
        try:
            head = path.read_text("utf-8")[:65536]
        except (OSError, UnicodeDecodeError):
            continue
        if _PERSONAS.search(head):
            personas.append(str(path))
        elif _SCRIPT.search(head) and not _NOT_SCRIPT.search(head):
            scripts.append(f"scripted:{path}")
    return {"personas": personas, "scripts": scripts, "model": spec.model.name}


@dataclass
class _Run:
    funnel: str
    model: str
    personas: str
    n: int
    seed: int
    stages: list[str]
    started: float = field(default_factory=time.time)
    state: str = "running"  # running, done, cancelled, failed
    done: int = 0
    error: str | None = None
    conversations: list[Conversation] = field(default_factory=list)
    result: Simulation | None = None
    cancel: threading.Event = field(default_factory=threading.Event)

    def view(self) -> dict[str, Any]:
        run = self.result or Simulation(self.funnel, self.model, "script", self.seed,
                                        self.stages, list(self.conversations))
        state = "cancelling" if self.state == "running" and self.cancel.is_set() \
            else self.state
        return {"state": state, "funnel": self.funnel, "model": self.model,
                "personas": self.personas, "n": self.n, "seed": self.seed, "done": self.done,
                "seconds": round(time.time() - self.started, 2), "error": self.error,
                "stages": self.stages, "table": _table(run) if run.conversations else [],
                "metrics": run.metrics() if run.conversations else {},
                "conversations": [
                    {"persona": c.persona, "session": c.session_id, "turns": c.turns,
                     "stage": c.stage, "handoff": c.handoff, "ended": c.ended,
                     "cart_total": c.cart_total} for c in run.conversations]}


def _table(run: Simulation) -> list[dict[str, Any]]:
    """One row per persona and one for all: conversations, hand-off rate and reach of each
    stage (each with its count and Wilson 95% interval), average turns."""
    rows = []
    for group, rates in run.rates().items():
        convs = run.conversations if group == "all" else \
            [c for c in run.conversations if c.persona == group]
        rows.append({"group": group, "conversations": len(convs),
                     "turns": sum(c.turns for c in convs) / (len(convs) or 1),
                     "handoff_rate": rates["handoff_rate"],
                     "reach": {s: rates[f"reach.{s}"] for s in run.stages}})
    return rows


class Simulator:
    """The studio's one simulation at a time: :meth:`start`, :meth:`status`, :meth:`cancel`."""

    def __init__(self, db: str | None, api_base: str | None = None) -> None:
        self.db, self.api_base = db, api_base
        self.run: _Run | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, funnel: CompiledFunnel, *, personas: str, model: str, n: int,
              seed: int) -> dict[str, Any]:
        """Start a run in a thread.

        Raises:
            Busy: a run is going on.
            InvalidInput: a personas file or script outside the funnel's project.
            ConfigError: a personas file or a model that cannot be read or built.
        """
        if self.run is not None and self.run.state == "running":
            raise Busy(f"a simulation of funnel '{self.run.funnel}' is running "
                       f"({self.run.done} of {self.run.n} done); cancel it first")
        roots = funnel_roots(funnel.spec.path)
        script = model.removeprefix("scripted:") if model.startswith("scripted:") else None
        for what, path in (("personas", personas), ("model", script)):
            if path is not None and not is_confined(Path(path), roots):
                raise InvalidInput(f"{what}: {path!r:.200} is outside funnel "
                                   f"'{funnel.name}''s project or hidden; the studio reads "
                                   "the files of the funnel's own project only")
        loaded = load_personas(personas)
        built = make_model(model or funnel.spec.model.name, api_base=self.api_base)
        run = self.run = _Run(funnel.name, model, personas, n, seed, list(funnel.spec.stages))

        def progress(done: int, conversation: Conversation) -> None:
            run.done = done
            run.conversations.append(conversation)

        def play() -> None:
            try:
                run.result = simulate(funnel, loaded, built, n=n, seed=seed, db=self.db,
                                      progress=progress, cancelled=run.cancel.is_set)
                run.state = "done"
            except SimulationCancelled:
                run.state = "cancelled"
            except FunnelError as exc:
                run.state, run.error = "failed", str(exc)
            except Exception as exc:  # a bug: logged, the page gets a sentence
                log.exception("studio: the simulation of %s failed", funnel.name)
                run.state, run.error = "failed", f"the simulation failed ({type(exc).__name__})"

        self._task = asyncio.get_running_loop().create_task(asyncio.to_thread(play))
        return run.view()

    def status(self) -> dict[str, Any] | None:
        return None if self.run is None else self.run.view()

    def cancel(self) -> dict[str, Any] | None:
        """Ask the run to stop before its next turn (its schema is dropped)."""
        if self.run is not None and self.run.state == "running":
            self.run.cancel.set()
        return self.status()

    async def close(self) -> None:
        """Cancel a run and wait for it to end (its temporary schema dropped)."""
        self.cancel()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
