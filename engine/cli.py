"""The `funnel` command. Exit codes: 0 success, 1 invalid input or a failed check, 2 usage.

Expected errors print one clear message, never a traceback. Heavy imports
(psycopg, litellm) happen inside the subcommands that need them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import FunnelError, FunnelInvalid

DEMO_FUNNEL = Path(__file__).resolve().parent.parent / "funnels" / "puramur.yaml"
DEMO_SCRIPT = DEMO_FUNNEL.parent / "puramur" / "demo.yaml"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="funnel", description="Run LLM sales funnels declared in "
                                "YAML as finite-state machines.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    v = sub.add_parser("validate", help="check funnel files (and their templates and schemas)")
    v.add_argument("paths", nargs="+", metavar="PATH", help="funnel files or folders")
    v.add_argument("--format", choices=["text", "json", "github"], default="text")
    v.add_argument("--strict", action="store_true", help="warnings fail too")

    g = sub.add_parser("graph", help="print the stage diagram")
    g.add_argument("funnel", metavar="FUNNEL")
    g.add_argument("--format", choices=["mermaid", "dot"], default="mermaid")

    s = sub.add_parser("sql", help="print the DDL of the funnel's session table")
    s.add_argument("funnel", metavar="FUNNEL")

    def structured_opt(q: argparse.ArgumentParser) -> None:
        from .llm.strategy import CHOICES

        q.add_argument("--structured-output", default=None, choices=CHOICES,
                       help="how the stage schema is sent (default: the funnel's "
                       "model.structured_output, auto)")

    def db_opts(q: argparse.ArgumentParser) -> None:
        q.add_argument("--db", default=os.environ.get("FUNNEL_DB"), metavar="URL",
                       help="PostgreSQL URL (default: $FUNNEL_DB, else the embedded server)")

    c = sub.add_parser("chat", help="talk to a funnel in the terminal")
    c.add_argument("funnel", metavar="FUNNEL")
    c.add_argument("--session", default=None, help="session id (default: a new one)")
    c.add_argument("--model", default=os.environ.get("FUNNEL_MODEL"),
                   help="litellm model string, or scripted:PATH (default: $FUNNEL_MODEL, "
                   "else the funnel's model)")
    c.add_argument("--api-base", default=None, metavar="URL")
    structured_opt(c)
    db_opts(c)

    dr = sub.add_parser("doctor", help="probe a model endpoint: what structured output it "
                        "accepts, latency, cost, whether each stage schema compiles")
    dr.add_argument("funnel", metavar="FUNNEL")
    dr.add_argument("--model", default=os.environ.get("FUNNEL_MODEL"),
                    help="litellm model string (default: $FUNNEL_MODEL, else the funnel's)")
    dr.add_argument("--api-base", default=None, metavar="URL")
    structured_opt(dr)

    st = sub.add_parser("state", help="print a session's state row as JSON")
    st.add_argument("funnel", metavar="FUNNEL")
    st.add_argument("session", metavar="SESSION")
    st.add_argument("--history", action="store_true", help="add the last messages")
    db_opts(st)

    d = sub.add_parser("demo", help="play a scripted Puramur conversation, offline")
    db_opts(d)

    pu = sub.add_parser("purge", help="delete or anonymize sessions idle for longer than a period")
    pu.add_argument("funnel", metavar="FUNNEL")
    pu.add_argument("--older-than", default=None, metavar="PERIOD",
                    help="e.g. 90d (default: the funnel's `retention`)")
    pu.add_argument("--anonymize", action="store_true",
                    help="clear personal fields and message text instead of deleting")
    pu.add_argument("--batch", type=int, default=1000)
    db_opts(pu)

    t = sub.add_parser("test", help="play conversation scenarios against funnels and check them")
    t.add_argument("paths", nargs="+", metavar="PATH",
                   help="scenario files or folders (YAML files with a top-level `scenario:`)")
    t.add_argument("--format", choices=["text", "junit", "github"], default="text")
    t.add_argument("--out", default=None, metavar="FILE",
                   help="write the --format report to FILE (stdout gets the text report)")
    db_opts(t)

    m = sub.add_parser("migrate", help="bring the funnel's table up to its declaration")
    m.add_argument("funnel", metavar="FUNNEL")
    m.add_argument("--check", action="store_true", help="report, change nothing")
    m.add_argument("--drop", action="store_true", help="drop columns no longer declared")
    db_opts(m)

    sv = sub.add_parser("serve", help="serve funnels over HTTP: API, web widget, Telegram webhook")
    sv.add_argument("funnels", nargs="+", metavar="FUNNEL", help="each served under its name")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--workers", type=int, default=1, metavar="N",
                    help="uvicorn worker processes, all on the same database")
    sv.add_argument("--model", default=os.environ.get("FUNNEL_MODEL"),
                    help="litellm model string, or scripted:PATH (default: each funnel's model)")
    sv.add_argument("--api-base", default=None, metavar="URL")
    structured_opt(sv)
    db_opts(sv)

    rp = sub.add_parser("report", help="funnel analytics: stages, drop-off, time, products, "
                        "hand-offs, cost (computed in SQL)")
    rp.add_argument("funnel", metavar="FUNNEL")
    rp.add_argument("--since", default="7d", type=_period, metavar="PERIOD",
                    help="sessions started (turns recorded) in this period, e.g. 30d (default 7d)")
    rp.add_argument("--format", choices=["table", "json", "html"], default="table")
    rp.add_argument("--out", default=None, metavar="FILE", help="write to FILE instead of stdout")
    db_opts(rp)
    return p


def _period(text: str) -> float:
    from .spec import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError("the period must be longer than zero")
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(_COMMANDS[args.command](args))
    except FunnelInvalid as exc:
        from .diagnostics import render

        print(render(exc.diagnostics, "text"), file=sys.stderr)
        return 1
    except FunnelError as exc:
        print(f"funnel: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def cmd_validate(args: argparse.Namespace) -> int:
    from .diagnostics import render
    from .validate import validate_paths

    diagnostics = validate_paths(args.paths)
    if diagnostics:
        print(render(diagnostics, args.format))
    errors = sum(d.severity == "error" for d in diagnostics)
    warnings = len(diagnostics) - errors
    if args.format == "text":
        print(f"{errors} error(s), {warnings} warning(s)", file=sys.stderr)
    return 1 if errors or (args.strict and warnings) else 0


def cmd_graph(args: argparse.Namespace) -> int:
    from .funnel import load_funnel
    from .machine import dot, mermaid

    funnel = load_funnel(args.funnel)
    print((dot if args.format == "dot" else mermaid)(funnel.machine), end="")
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    from .funnel import load_funnel
    from .store.ddl import render

    print(render(load_funnel(args.funnel).spec), end="")
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    import uuid

    from .funnel import load_funnel
    from .sync import SyncEngine

    funnel = load_funnel(args.funnel)
    model = args.model or funnel.spec.model.name
    session = args.session or f"chat-{uuid.uuid4().hex[:12]}"
    interactive = sys.stdin.isatty()
    if args.structured_output and not model.startswith("scripted"):
        from .models import make_model

        model = make_model(model, api_base=args.api_base,
                           structured_output=args.structured_output)
    with SyncEngine(funnel, db=args.db, model=model, api_base=args.api_base) as engine:
        if interactive:
            print(f"funnel {funnel.name} v{funnel.spec.version}, session {session}. "
                  "Ctrl-D to quit.")
        while True:
            try:
                line = input("you> " if interactive else "")
            except EOFError:
                break
            if not line.strip():
                continue
            result = engine.handle(session, line, channel="cli")
            if interactive:
                print(f"bot> {result.reply}")
                _describe(result)
            else:
                print(result.reply.replace("\n", " "), flush=True)
                if result.fallback:  # stdout stays one reply per line; say why on stderr
                    print(f"funnel: warning: fallback reply ({result.error})", file=sys.stderr)
    return 0


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
    from .funnel import load_funnel
    from .store import open_store

    funnel = load_funnel(args.funnel)

    async def run() -> dict[str, Any] | None:
        store = await open_store(args.db)
        try:
            row = await store.load(funnel.spec, args.session)
            if row is None:
                return None
            from .state import plain

            out: dict[str, Any] = plain(dict(row))
            if args.history:
                out["messages"] = plain(await store.history(funnel.spec, args.session, 20))
            return out
        finally:
            await store.close()

    row = asyncio.run(run())
    if row is None:
        raise FunnelError(f"no session {args.session!r} in funnel '{funnel.name}' "
                          f"(table {funnel.spec.table})")
    print(json.dumps(row, indent=2, ensure_ascii=False))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import uuid

    from .sync import SyncEngine

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
    from .funnel import load_funnel
    from .store import open_store

    spec = load_funnel(path).spec

    async def run() -> None:
        store = await open_store(db)
        try:
            await store.migrate(spec)
        finally:
            await store.close()

    asyncio.run(run())


def _demo_script() -> list[str]:
    from . import _yaml

    data = _yaml.load(DEMO_SCRIPT.read_text("utf-8")).data
    return [str(m) for m in data.get("customer", [])]


def cmd_migrate(args: argparse.Namespace) -> int:
    from .funnel import load_funnel
    from .store import open_store

    funnel = load_funnel(args.funnel)

    async def run() -> list[str]:
        store = await open_store(args.db)
        try:
            return await store.migrate(funnel.spec, drop=args.drop, check=args.check)
        finally:
            await store.close()

    changes = asyncio.run(run())
    for line in changes:
        print(line)
    if not changes:
        print(f"table {funnel.spec.table} is up to date")
    # Informational lines ("column x is no longer declared; kept") are not pending work.
    pending = args.check and any(c.startswith("would ") or " will move to " in c
                                 for c in changes)
    return 1 if pending or any(c.startswith("error:") for c in changes) else 0


def cmd_test(args: argparse.Namespace) -> int:
    from .scenarios import run_command

    return run_command(args.paths, args.db, args.format, args.out)


def cmd_purge(args: argparse.Namespace) -> int:
    from .funnel import load_funnel
    from .spec import parse_duration
    from .store import open_store

    funnel = load_funnel(args.funnel)
    if args.older_than:
        try:
            period = parse_duration(args.older_than)
        except ValueError as exc:
            raise FunnelError(f"--older-than: {exc}") from None
    elif funnel.spec.retention:
        period = funnel.spec.retention
    else:
        raise FunnelError(f"funnel '{funnel.name}' declares no `retention`; give --older-than "
                          "(e.g. 90d)")

    async def run() -> dict[str, int]:
        store = await open_store(args.db)
        try:
            await store.ensure_schema(funnel.spec)
            return await store.purge(funnel.spec, period, anonymize=args.anonymize,
                                     batch=args.batch)
        finally:
            await store.close()

    counts = asyncio.run(run())
    verb = "anonymized" if args.anonymize else "deleted"
    print(f"{verb} {counts['sessions']} session(s) idle for more than {period / 86400:g} day(s): "
          f"{counts['messages']} message(s)" + ("" if args.anonymize else
                                                 f", {counts['turns']} turn record(s)"))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .service.server import serve

    return serve(args.funnels, db=args.db, host=args.host, port=args.port, workers=args.workers,
                 model=args.model, api_base=args.api_base,
                 structured_output=args.structured_output)


def cmd_doctor(args: argparse.Namespace) -> int:
    from .funnel import load_funnel
    from .llm.doctor import diagnose, healthy, render

    funnel = load_funnel(args.funnel)
    model = args.model or funnel.spec.model.name
    if model.startswith("scripted"):
        print("funnel: error: the scripted model has no endpoint to probe; give --model",
              file=sys.stderr)
        return 2
    report = asyncio.run(diagnose(funnel, model, api_base=args.api_base,
                                  structured_output=args.structured_output))
    sys.stdout.write(render(report))
    return 0 if healthy(report) else 1


def cmd_report(args: argparse.Namespace) -> int:
    from .analytics import build_report, render_json, render_table
    from .funnel import load_funnel

    funnel = load_funnel(args.funnel)
    report = asyncio.run(build_report(funnel, db=args.db, since=args.since))
    if args.format == "html":
        from .report_html import render_html

        text = render_html(report)
    else:
        text = render_json(report) if args.format == "json" else render_table(report)
    if args.out:
        Path(args.out).write_text(text, "utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


_COMMANDS = {
    "validate": cmd_validate,
    "graph": cmd_graph,
    "sql": cmd_sql,
    "chat": cmd_chat,
    "state": cmd_state,
    "demo": cmd_demo,
    "migrate": cmd_migrate,
    "purge": cmd_purge,
    "test": cmd_test,
    "serve": cmd_serve,
    "report": cmd_report,
    "doctor": cmd_doctor,
}

if __name__ == "__main__":
    sys.exit(main())
