"""The studio's core: its funnels, their engine, and what the page asks of them.

One :class:`Studio` holds, per funnel, an :class:`engine.turn.engine.Engine` of its own
whose model is the :class:`~engine.studio.model.StudioModel`, on the store given (the
service's, when mounted in ``funnel serve``), and the :class:`~engine.studio.watch.Watched`
state of its files. Playground turns are real turns of that engine: they are logged,
recorded in ``funnel_turns`` and saved like any other, which is what lets the studio
rewind them, save them as scenarios, and show them in the sessions list.

Isolation: the studio runs turns only on sessions it made, registered as playground
sessions (engine.store.playground) before their first turn. A turn typed on any other
session (a customer's) runs on a new branch of it, replayed from its turn records;
the customer's session is only ever read. Its engine is a playground engine
(engine.turn.playground): nothing a turn would send (a hand-off alert, an approval
request, a channel's reply) is queued; the page shows it as "would send" instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import FunnelInvalid, InvalidInput, SchemaOutdated
from ..format.paths import funnel_roots, is_confined
from ..funnel.compiled import CompiledFunnel, load_funnel
from ..llm.models import ScriptEntry
from ..memory.summary import ExtractiveSummarizer
from ..store import Store, open_store, playground
from ..turn.engine import Engine, TurnResult
from ..turn.output import parse_output
from . import scenarios, sql, views
from .broken import Broken, guess_name, outdated
from .graph import svg
from .model import HUMAN, StudioModel
from .plain import refusal
from .turn_out import turn_result, would_send
from .watch import POLL, Watched
from .whatif import WhatIf, WhatIfSettings

__all__ = ["CHANNEL", "Studio"]

log = logging.getLogger("funnel.studio")
CHANNEL = "studio"
RETIRED_POLL = 5.0  # seconds between looks for purged or anonymized sessions' prompts
_REPAIR = ("Your last answer was rejected: {problem}. Answer again with one JSON object that "
           "satisfies the output schema; keep the same meaning.")  # as engine.turn.output says


class Studio:
    """The funnels a studio shows. Build with :meth:`open`; :meth:`close` when done."""

    def __init__(self, store: Store, model: StudioModel, *, owns_store: bool) -> None:
        self.store = store
        self.model = model
        self.engines: dict[str, Engine] = {}
        self.watched: dict[str, Watched] = {}
        # Funnels given that do not validate: listed and edited, run once a save fixes them.
        self.broken: dict[str, Broken] = {}
        self._owns_store = owns_store
        self.home: Path | None = None  # where New funnel writes (engine.studio.make.workspace)
        self._watcher: asyncio.Task[None] | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self.whatif = WhatIf(store)
        # What else ends with the studio (a running simulation, engine.studio.simulation).
        self.closing: list[Callable[[], Awaitable[None]]] = []

    @classmethod
    async def open(cls, paths: list[str | Path], *, db: str | None = None,
                   model: str | None = None, api_base: str | None = None,
                   store: Store | None = None, what_if: WhatIfSettings | None = None,
                   home: Path | None = None) -> Studio:
        """Load the funnels, open the store, start watching; each clean save starts a
        what-if (``what_if``: how much it replays). ``home``: the folder the page's new
        funnels go into (engine.studio.home); with it, ``paths`` may be empty: the page
        starts with **New funnel**. A funnel that does not validate is held in
        :attr:`broken` with its problems (engine.studio.broken), opened once fixed.

        Raises:
            StoreUnavailable: the database cannot be reached.
        """
        studio_model = StudioModel(api_base=api_base, default=model or HUMAN)
        if model and model != HUMAN:
            studio_model.choose("", model)  # built now: a bad model string fails the start
        owns = store is None
        store = store or await open_store(db)
        studio = cls(store, studio_model, owns_store=owns)
        studio.whatif = WhatIf(store, what_if)
        studio.home = home
        try:
            for path in paths:
                try:
                    await studio.add(path)
                except FunnelInvalid as exc:  # the editor fixes it; the rest runs
                    studio.hold(Path(path), [d.as_dict() for d in exc.diagnostics])
                except SchemaOutdated as exc:  # saved, never migrated: the Editor migrates
                    studio.hold(Path(path), [outdated(Path(path), exc)])
        except BaseException:
            await studio.close()
            raise
        studio._watcher = asyncio.get_running_loop().create_task(studio._watch())
        return studio

    async def add(self, path: str | Path) -> CompiledFunnel:
        """Load the funnel at ``path`` (it must validate) and show it too, on an engine
        of its own (a funnel the page made: engine.studio.make)."""
        funnel = load_funnel(path)
        if funnel.name in self.engines:
            raise InvalidInput(f"the studio shows a funnel '{funnel.name}' already "
                               f"({self.watched[funnel.name].path})")
        engine = await Engine.open(funnel, store=self.store, model=self.model,
                                   summarizer=ExtractiveSummarizer(), playground=True)
        self.engines[funnel.name] = engine
        self.watched[funnel.name] = Watched(Path(path), funnel, engine.deploy,
                                            saved=self.whatif.start)
        return funnel

    def hold(self, path: Path, diagnostics: list[dict[str, Any]]) -> Broken:
        """Show the funnel at ``path``, which does not validate, without running it."""
        name = guess_name(path)
        taken = set(self.engines) | set(self.broken)
        while name in taken:  # two broken files saying one name: both are listed
            name += "_"
        held = self.broken[name] = Broken(path, name, diagnostics, self._promote)
        log.info("studio: %s has %d problem(s); fix it in the Editor", path, len(diagnostics))
        return held

    async def _promote(self, held: Broken) -> str:
        """Open a held funnel a save has made valid (engine.studio.broken); its name."""
        funnel = await self.add(held.path)
        self.broken.pop(held.name, None)
        self.watched[funnel.name].generation = held.generation + 1  # the page redraws
        return funnel.name

    async def close(self) -> None:
        for hook in self.closing:
            await hook()
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await self.whatif.close()
        for engine in self.engines.values():
            await engine.close()
        if self._owns_store:
            await self.store.close()

    async def _watch(self) -> None:
        retired_at = 0.0
        while True:
            every: list[Watched | Broken] = [*self.watched.values(), *self.broken.values()]
            for watched in every:
                try:
                    await watched.poll()
                except Exception:  # never let one bad poll stop the watching
                    log.exception("studio: watching %s failed", watched.path)
            now = time.monotonic()
            if now - retired_at >= RETIRED_POLL:
                retired_at = now
                try:
                    await self.forget_retired()
                except Exception as exc:  # the database away: the next look tries again
                    log.warning("studio: checking the kept prompts' sessions failed: %s",
                                str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            await asyncio.sleep(POLL)

    async def forget_retired(self, sessions: list[str] | None = None) -> list[str]:
        """Drop the prompts kept in memory (the prompt panel's) of ``sessions`` (default:
        all those kept) that no funnel of the studio has any more, or has anonymized:
        `funnel purge` in any process reaches this copy too. The sessions dropped."""
        # A turn in flight has sent its prompt and not yet saved its session's row.
        busy = {key.split("/", 1)[1] for key, lock in self._locks.items() if lock.locked()}
        held = [s for s in (self.model.kept() if sessions is None else sessions)
                if s not in busy]
        if not held:
            return []
        live: set[str] = set()
        for engine in self.engines.values():
            live |= await sql.live_sessions(self.store, engine.spec, held)
        gone = [s for s in held if s not in live]
        for session in gone:
            self.model.forget(session)
        return gone

    # -- reading -----------------------------------------------------------------------
    def engine(self, name: str) -> Engine:
        try:
            return self.engines[name]
        except KeyError:
            if name in self.broken:
                raise self.broken[name].error() from None
            has = ", ".join(sorted(self.engines)) or "none yet: New funnel makes one"
            raise InvalidInput(f"the studio has no funnel '{name}'; it has {has}") from None

    def funnel(self, name: str) -> CompiledFunnel:
        return self.engine(name).funnel

    def funnels(self) -> list[dict[str, Any]]:
        out = []
        for name, engine in self.engines.items():
            spec = engine.spec
            out.append({"name": name, "path": str(self.watched[name].path),
                        "version": spec.version, "initial": spec.initial,
                        "description": spec.description,
                        "stages": list(spec.stages), "svg": svg(spec),
                        "status": self.watched[name].status()})
        return out + [b.listing() for b in self.broken.values()]

    def statuses(self) -> dict[str, dict[str, Any]]:
        """Each funnel's status (``/api/status``), the broken ones' too."""
        return {**{n: w.status() for n, w in self.watched.items()},
                **{n: b.status() for n, b in self.broken.items()}}

    async def view(self, name: str, session: str, result: TurnResult | None = None,
                   before: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Everything the panels show of a session now (after ``result``, when given).
        ``playground``: a session the studio made (``origin``: what it was branched
        from); ``real``: someone else's (a customer's), which a turn typed on branches."""
        engine = self.engine(name)
        funnel = engine.funnel
        row = await engine.state(session)
        if result is None and (row is None or "anonymized" in (row.get("notices") or [])):
            await self.forget_retired([session])
        origin = await playground.origin(self.store, name, session)
        state = row or {}
        stage = state.get("stage") or funnel.spec.initial
        last = await sql.transcript(self.store, funnel.spec, session, last=True)
        record = last["turns"][-1] if last["turns"] else None
        explain = result.explain if result is not None else (record or {}).get("explain")
        turn_no = int(state.get("turns") or 0)
        sent = [s.view() for s in self.model.sent(session) if s.turn == turn_no]
        return {
            "funnel": name, "session": session, "exists": row is not None, "stage": stage,
            "state": state,
            "changed": views.changed(before or views.fresh(funnel), state) if result else [],
            "completeness": views.completeness(funnel, state) if row else
            views.completeness(funnel, {}),
            "why": views.why(explain, returning=bool(result and result.returning),
                             notices=result.notices if result else [], funnel=funnel,
                             claims=result.reply_claims if result is not None
                             else (record or {}).get("claims") or []),
            "history": [h.get("stage") for h in state.get("stage_history") or []],
            "record": record, "prompt": sent, "turns": turn_no,
            "result": turn_result(result) if result else None,
            "form": views.form_schema(funnel, stage) if stage in funnel.stages or
            stage in funnel.spec.removed_stages else None,
            "model": self.model.choice.get(session, self.model.default),
            "status": self.watched[name].status(),
            "playground": origin is not None, "origin": origin,
            "real": row is not None and origin is None,
            "would_send": would_send(engine, result.withheld) if result else [],
        }

    # -- playing -----------------------------------------------------------------------
    def _lock(self, name: str, session: str) -> asyncio.Lock:
        return self._locks.setdefault(f"{name}/{session}", asyncio.Lock())

    def _model_choice(self, name: str, model: str) -> str:
        """The page's model choice; a ``scripted:PATH`` must be a file of the funnel's own
        project (engine.format.paths), as every file a funnel reads: the page must not
        make the studio read ``/proc/self/environ`` or a key file.

        Raises:
            InvalidInput: a script outside the funnel's roots, or hidden.
        """
        if not model.startswith("scripted:"):
            return model
        path = model.removeprefix("scripted:")
        roots = funnel_roots(self.watched[name].path)
        if not path or not is_confined(Path(path), roots):
            raise InvalidInput(f"model: the script {path!r:.200} is outside funnel '{name}''s "
                               f"project ({', '.join(map(str, roots))}) or hidden; a "
                               "funnel's studio reads scripts of its own project only: "
                               "move the script there (or list its folder in FUNNEL_ROOT)")
        return model

    async def turn(self, name: str, session: str, text: str, *, model: str | None = None,
                   answer: Any = None, force: bool = False) -> dict[str, Any]:
        """One turn of a playground session. With ``answer`` (the form's, "I am the
        model"), it is the model's output: checked first as the turn will check it, and
        refused with the problem the repair call would quote unless ``force``. On a
        session the studio did not make (a customer's), the turn runs on a new branch of
        it (``branched_from`` in the view); that session is left as it was.

        Raises:
            InvalidInput: a bad message or session id, an unknown funnel, or a customer's
                session with no recorded turns to branch from.
            ConfigError: a model that cannot be built.
        """
        engine = self.engine(name)
        output = None if answer is None else answer if isinstance(answer, str) \
            else json.dumps(answer, ensure_ascii=False)
        branched: dict[str, Any] | None = None
        if not await self._ours(name, session):
            # Someone else's session (a customer's): never written; the turn goes to a
            # new branch of it, in the state its recorded turns lead to. An answer the
            # turn would refuse is refused first: no branch is made for nothing.
            row = await engine.state(session) or {}
            refused = None if output is None or force else _refused(engine, row, output)
            if refused is not None:
                return refused
            records = await engine.store.turn_records(engine.spec, session, limit=1000)
            if not records:
                raise InvalidInput(f"session {session!r} is not a playground session and has "
                                   "no recorded turns to branch from; start a new session")
            branched = await self.rewind(name, session, len(records))
            session = branched["session"]
        if model:
            self.model.choose(session, self._model_choice(name, model))
        async with self._lock(name, session):
            before = await engine.state(session)
            if output is not None:
                refused = None if force else _refused(engine, before or {}, output)
                if refused is not None:
                    return refused
                self.model.queue(session, ScriptEntry(output=output))
            try:
                result = await engine.handle(session, text, channel=CHANNEL)
            finally:
                self.model.clear(session)
            view = await self.view(name, session, result, before)
        if branched is not None:
            view.update(branched_from=branched["branched_from"], diverged=branched["diverged"])
        return view

    async def _ours(self, name: str, session: str) -> bool:
        """Whether the studio may write into ``session``: a playground session, or a new
        one (registered as such now, before its first turn)."""
        if await playground.origin(self.store, name, session) is not None:
            return True
        if await self.engine(name).state(session) is not None:
            return False
        await playground.mark(self.store, name, session)
        return True

    async def rewind(self, name: str, session: str, upto: int, *, answer: Any = None,
                     text: str | None = None, replay_after: bool = False) -> dict[str, Any]:
        """A new session that replays ``session``'s turns 1..``upto`` with the outputs
        recorded (so its state is the state after turn ``upto``, on the funnel as it is
        now); with ``answer`` (and ``text``), turn ``upto`` is played with that answer
        instead, and ``replay_after`` replays the turns after it as recorded. The
        original session is left as it was. Turns whose stage now differs from the
        recording are listed in ``diverged``.

        Raises:
            InvalidInput: no such turn, or a turn that cannot be replayed (anonymized).
        """
        engine = self.engine(name)
        records = await engine.store.turn_records(engine.spec, session, limit=1000)
        if not 1 <= upto <= len(records):
            raise InvalidInput(f"session {session!r} has {len(records)} turn(s); there is no "
                               f"turn {upto} to go back to")
        branch = f"{session[:100]}.b{secrets.token_hex(3)}"
        plan = records[:upto] if not (answer is not None and replay_after) else records
        diverged = []
        await playground.mark(self.store, name, branch, branched_from=session, turn=upto)
        async with self._lock(name, branch):
            for number, rec in enumerate(plan, start=1):
                customer = rec.get("customer")
                if not customer:
                    raise InvalidInput(f"turn {number} of session {session!r} has no customer "
                                       "message (anonymized or purged); it cannot be replayed")
                if number == upto and answer is not None:
                    output = answer if isinstance(answer, str) else json.dumps(
                        answer, ensure_ascii=False)
                    self.model.queue(branch, ScriptEntry(output=output))
                    customer = text or customer
                else:
                    self.model.queue(branch, _recorded(rec), origin="studio:replay")
                try:
                    result = await engine.handle(branch, customer, channel=CHANNEL)
                finally:
                    self.model.clear(branch)
                if number != upto and result.stage_after != rec["stage_after"]:
                    diverged.append({"turn": number, "recorded": rec["stage_after"],
                                     "now": result.stage_after})
        view = await self.view(name, branch)
        view.update(branched_from={"session": session, "turn": upto}, diverged=diverged)
        return view

    async def save_scenario(self, name: str, session: str, file_name: str | None = None,
                            *, overwrite: bool = False) -> dict[str, Any]:
        """Write the session as a scenario into the funnel's scenarios folder
        (engine.studio.scenarios.save: the personal data the funnel declares replaced by
        placeholders, docs/studio.md); an existing file only with ``overwrite``.

        Raises:
            InvalidInput: nothing to save, or a file name that is not a plain name.
            ScenarioExists: the file is there and ``overwrite`` is not set.
        """
        return await scenarios.save(self.engine(name), session, file_name,
                                    overwrite=overwrite)

    async def run_scenarios(self, name: str) -> dict[str, Any]:
        """Play the funnel's scenarios (``funnel test`` on its scenarios folder), in a
        temporary schema of the studio's database."""
        return await scenarios.run_folder(self.engine(name).spec, self.store)


def _refused(engine: Engine, row: Mapping[str, Any], output: str) -> dict[str, Any] | None:
    """An answer the turn would refuse in the session's stage: the problem, and what the
    repair call would tell a model; None when it passes."""
    stage = row.get("stage") or engine.spec.initial
    envelope, problem = parse_output(engine.funnel.stage(stage), output)
    if envelope is not None:
        return None
    return {"rejected": problem, "stage": stage, "repair": _REPAIR.format(problem=problem),
            "plain": refusal(engine.funnel.stage(stage), output, problem)}


def _recorded(rec: Mapping[str, Any]) -> ScriptEntry:
    raw = rec.get("raw_output")
    if raw is None:
        raise InvalidInput(f"turn {rec.get('id')} has no raw model output (recorded before "
                           "the engine kept them, or anonymized); it cannot be replayed")
    if not raw:
        return ScriptEntry(output=None, error=str(rec.get("error") or "the model call failed"))
    return ScriptEntry(output=str(raw[0]), repair=str(raw[1]) if len(raw) > 1 else None)
