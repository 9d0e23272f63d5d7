"""`funnel chat`, `funnel demo` and `funnel state`: conversations in the terminal."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InvalidInput
from ..format import _yaml
from ..funnel.compiled import load_funnel
from ..funnel.state import plain
from ..llm.models import Model, make_model
from ..store import open_store
from ..sync import SyncEngine
from ..turn.explain import describe

DEMO_FUNNEL = Path(__file__).resolve().parent.parent.parent / "funnels" / "puramur.yaml"
DEMO_SCRIPT = DEMO_FUNNEL.parent / "puramur" / "demo.yaml"

def cmd_chat(args: argparse.Namespace) -> int:
    """Talk to a funnel; without a terminal, one message a line on stdin, one reply a line.

    A line the engine refuses (a NUL, too long) is reported on stderr and the next
    line is read; a line that is not UTF-8 is decoded with replacement characters,
    with a warning. Exit code 1 when any line was refused.
    """
    funnel = load_funnel(args.funnel)
    model: str | Model = args.model or funnel.spec.model.name
    if args.structured_output and isinstance(model, str) and not model.startswith("scripted"):
        model = make_model(model, api_base=args.api_base,
                           structured_output=args.structured_output)
    session = args.session or f"chat-{uuid.uuid4().hex[:12]}"
    interactive = sys.stdin.isatty()
    refused = 0
    explain = args.explain or interactive  # a person at a terminal always sees why
    with SyncEngine(funnel, db=args.db, model=model, api_base=args.api_base) as engine:
        if args.variant:  # QA: a session that has no row yet starts on this variant
            engine.engine.variants.force(session, args.variant)
            row = engine.state(session)
            if row is not None and row.get("variant") != args.variant:
                print(f"funnel: warning: session {session} already runs on variant "
                      f"{row.get('variant') or '(none)'}; --variant applies to new sessions",
                      file=sys.stderr)
        if interactive:
            print(f"funnel {funnel.name} v{funnel.spec.version}, session {session}. "
                  "Ctrl-D to quit.")
        for number, line in enumerate(_lines(interactive), start=1):
            if not line.strip():
                continue
            try:
                result = engine.handle(session, line, channel="cli")
            except InvalidInput as exc:
                refused += 1
                print(f"funnel: line {number} refused: {exc}", file=sys.stderr)
                continue
            if interactive:
                print(f"bot> {result.reply}")
                _describe(result)
            else:
                print(result.reply.replace("\n", " "), flush=True)
                if result.fallback:  # stdout stays one reply per line; say why on stderr
                    print(f"funnel: warning: fallback reply ({result.error})", file=sys.stderr)
            if explain:
                for text in describe(result.explain):
                    print(f"  [why] {text}", file=sys.stdout if interactive else sys.stderr,
                          flush=True)
    return 1 if refused else 0


def _lines(interactive: bool) -> Iterator[str]:
    """The customer's lines: ``input()`` on a terminal, else stdin's bytes decoded line by
    line (a line that is not UTF-8 is decoded with replacement, with a warning)."""
    if interactive:
        while True:
            try:
                yield input("you> ")
            except EOFError:
                return
    for number, raw in enumerate(sys.stdin.buffer, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            print(f"funnel: warning: line {number} is not UTF-8 ({exc.reason} at byte "
                  f"{exc.start}); undecodable bytes were replaced with U+FFFD", file=sys.stderr)
            text = raw.decode("utf-8", "replace")
        yield text.rstrip("\r\n")


def _describe(result: Any) -> None:
    for t in result.transitions:
        print(f"  [stage] {t['from']} -> {t['to']}" + (f"  ({t['when']})" if t["when"] else ""))
    if not result.transitions:
        print(f"  [stage] {result.stage_after}")
    for o in result.actions:
        print(f"  [action] {o.type} " + ("ok" if o.accepted else f"REFUSED: {o.reason}"))
    for name in result.updated:
        value = json.dumps(result.state.get(name), ensure_ascii=False, default=str)
        print(f"  [state] {name} = {value if len(value) <= 120 else value[:117] + '...'}")
    if result.fallback:
        print(f"  [model] fallback reply ({result.error})")
    if result.handoff:
        print("  [handoff] the manager was notified")


def cmd_state(args: argparse.Namespace) -> int:
    funnel = load_funnel(args.funnel)

    async def run() -> dict[str, Any] | None:
        store = await open_store(args.db)
        try:
            row = await store.load(funnel.spec, args.session)
            if row is None:
                return None
            out: dict[str, Any] = plain(dict(row))
            if args.history:
                out["messages"] = plain(await store.history(funnel.spec, args.session, 20))
            if args.explain:
                last = await store.turn_records(funnel.spec, args.session, 1)
                out["explain"] = plain(last[-1]["explain"]) if last else None
            return out
        finally:
            await store.close()

    row = asyncio.run(run())
    if row is None:
        raise InvalidInput(f"no session {args.session!r} in funnel '{funnel.name}' "
                          f"(table {funnel.spec.table})")
    print(json.dumps(row, indent=2, ensure_ascii=False))
    if args.explain:  # the JSON on stdout carries it too; the lines are for people
        for text in describe(row.get("explain")) or ["no turn recorded an explanation"]:
            print(f"  [why] {text}", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:

    script = _demo_script()
    session = f"demo-{uuid.uuid4().hex[:8]}"
    _migrate_quietly(DEMO_FUNNEL, args.db)  # the demo's table follows the shipped funnel
    print(f"Puramur demo: session {session}, scripted model (no API key needed)\n")
    with SyncEngine(DEMO_FUNNEL, db=args.db, model=f"scripted:{DEMO_SCRIPT}") as engine:
        for text in script:
            result = engine.handle(session, text, channel="demo")
            print(f"customer> {text}")
            print(f"bot     > {result.reply}")
            _describe(result)
            print()
        state = engine.state(session) or {}
    print(f"final stage: {state.get('stage')}, cart total {state.get('cart_total')} UAH, "
          f"gift: {state.get('cart_gift_eligible')}, handoff: {state.get('handoff_reason')}")
    return 0


def _migrate_quietly(path: Path, db: str | None) -> None:
    spec = load_funnel(path).spec

    async def run() -> None:
        store = await open_store(db)
        try:
            await store.migrate(spec)
        finally:
            await store.close()

    asyncio.run(run())


def _demo_script() -> list[str]:
    data = _yaml.load(DEMO_SCRIPT.read_text("utf-8")).data
    return [str(m) for m in data.get("customer", [])]
