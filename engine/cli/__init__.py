"""The `funnel` command. Exit codes: 0 success, 1 invalid input or a failed check, 2 usage.

Expected errors print one clear message, never a traceback. The parser is
here; each command lives in a module of this package, imported only when the
command runs, so that heavy imports (psycopg, transitions, litellm) are paid
by the commands that need them.

May import: everything below it (it is the top layer); nothing imports it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib import metadata

from ..errors import FunnelError, FunnelInvalid
from ..format.settings import CHOICES
from ..format.spec import parse_duration
from ..validation import render


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="funnel", description="Run LLM sales funnels declared in "
                                "YAML as finite-state machines.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    v = sub.add_parser("validate", help="check funnel files (and their templates and schemas)")
    v.add_argument("paths", nargs="+", metavar="PATH", help="funnel files or folders")
    v.add_argument("--format", choices=["text", "json", "github"], default="text")
    v.add_argument("--strict", action="store_true", help="warnings fail too")

    n = sub.add_parser("new", help="create a funnel folder (funnel, prompts, generated schemas, "
                       "scenarios) that validates and passes its scenarios")
    n.add_argument("name", metavar="NAME", help="the funnel's name (lowercase letters, digits, _; "
                   "a - becomes _: pet-shop is pet_shop)")
    n.add_argument("--from", dest="template", default="minimal",
                   choices=["minimal", "puramur", "b2b_demo"], help="the template (default "
                   "minimal)")
    n.add_argument("--catalog", action="store_true",
                   help="with --from minimal: add a product catalog and present_products")
    n.add_argument("--dir", default=None, metavar="FOLDER",
                   help="where to write it (default: ./NAME; must not exist)")

    sc = sub.add_parser("schema", help="print each stage's output contract (derived from the "
                        "funnel), or write them to its schemas folder")
    sc.add_argument("funnel", metavar="FUNNEL")
    sc.add_argument("--stage", default=None, metavar="S", help="only this stage's")
    sc.add_argument("--write", action="store_true", help="write <stage>.json files into the "
                    "funnel's schemas folder (for review; the funnel stays the source)")

    g = sub.add_parser("graph", help="print the stage diagram")
    g.add_argument("funnel", metavar="FUNNEL")
    g.add_argument("--format", choices=["mermaid", "dot"], default="mermaid")

    s = sub.add_parser("sql", help="print the DDL of the funnel's session table")
    s.add_argument("funnel", metavar="FUNNEL")

    def structured_opt(q: argparse.ArgumentParser) -> None:
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
    c.add_argument("--explain", action="store_true", help="after each reply, every exit of the "
                   "stage: its condition, the values it read, whether it held (always on at a "
                   "terminal; on stderr otherwise)")
    c.add_argument("--variant", default=None, metavar="NAME", help="run a new session on this "
                   "variant of the funnel's experiment (QA; docs/experiments.md)")
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
    st.add_argument("--explain", action="store_true",
                    help="add why the last turn moved or stayed (`explain`)")
    db_opts(st)

    cs = sub.add_parser("check-state", help="check the invariants of every session: valid "
                        "rows, replies paired with turn records, bounded notices")
    cs.add_argument("funnel", metavar="FUNNEL")
    cs.add_argument("--format", choices=["text", "json"], default="text")
    db_opts(cs)

    fu = sub.add_parser("follow-up", help="send the follow-ups that are due (one pass of "
                        "the scheduler `funnel serve` runs; for cron)")
    fu.add_argument("funnel", metavar="FUNNEL")
    fu.add_argument("--dry-run", action="store_true", help="list what is due; send nothing")
    fu.add_argument("--now", default=None, metavar="TIME",
                    help="ISO 8601 time to run at (default: now)")
    fu.add_argument("--limit", type=int, default=500, help="at most this many sessions")
    db_opts(fu)

    d = sub.add_parser("demo", help="play a scripted Puramur conversation, offline")
    db_opts(d)

    pu = sub.add_parser("purge", help="delete or anonymize sessions idle for longer than a period")
    pu.add_argument("funnel", metavar="FUNNEL")
    pu.add_argument("--older-than", default=None, metavar="PERIOD",
                    help="e.g. 90d (default: the funnel's `retention`)")
    pu.add_argument("--anonymize", action="store_true",
                    help="clear personal fields and message text instead of deleting")
    pu.add_argument("--batch", type=int, default=1000)
    pu.add_argument("--dry-run", action="store_true",
                    help="count what would be deleted or anonymized; change nothing")
    db_opts(pu)

    fg = sub.add_parser("forget", help="erase every copy of one customer's sessions (a GDPR "
                        "erasure request); print a receipt per session")
    fg.add_argument("funnel", metavar="FUNNEL")
    fg.add_argument("sessions", nargs="+", metavar="SESSION")
    fg.add_argument("--format", choices=["text", "json"], default="text")
    fg.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                    help="how long to wait for a session's turn to end (default: 60)")
    db_opts(fg)

    ex = sub.add_parser("export", help="everything stored of one session as one JSON document "
                        "(a GDPR access request)")
    ex.add_argument("funnel", metavar="FUNNEL")
    ex.add_argument("session", metavar="SESSION")
    ex.add_argument("-o", "--output", default=None, metavar="FILE",
                    help="write the document there (default: stdout)")
    db_opts(ex)

    t = sub.add_parser("test", help="play conversation scenarios against funnels and check them")
    t.add_argument("paths", nargs="+", metavar="PATH",
                   help="scenario files or folders (YAML files with a top-level `scenario:`)")
    t.add_argument("--format", choices=["text", "junit", "github", "json"], default="text")
    t.add_argument("--out", default=None, metavar="FILE",
                   help="write the --format report to FILE (stdout gets the text report)")
    t.add_argument("--coverage", action="store_true", help="report the stages, exits, actions, "
                   "fallbacks, gates, caps, idle returns and hand-off reasons the scenarios "
                   "exercised, and those they did not (docs/evidence.md#coverage)")
    t.add_argument("--fail-under", default=None, metavar="NAME=PCT,...",
                   help="exit 1 when a coverage share is below, e.g. stages=100,exits=90 "
                   "(implies --coverage)")
    t.add_argument("--snapshots", action="store_true", help="fail when a stage's prompt or "
                   "contract differs from its stored snapshot (docs/evidence.md#snapshots)")
    db_opts(t)

    sn = sub.add_parser("snapshot", help="store each stage's prompt and contract at the "
                        "funnel's fixture states (FUNNEL/snapshots/)")
    sn.add_argument("funnel", metavar="FUNNEL")
    sn.add_argument("--update", action="store_true",
                    help="overwrite the stored snapshots with what the funnel renders now")
    sn.add_argument("--format", choices=["text", "json", "github"], default="text")
    db_opts(sn)

    rc = sub.add_parser("record", help="turn a session's conversation into a scenario (its "
                        "messages, the model outputs received, expectations from what happened)")
    rc.add_argument("funnel", metavar="FUNNEL")
    rc.add_argument("session", metavar="SESSION")
    rc.add_argument("--out", default=None, metavar="FILE", help="write the scenario to FILE "
                    "(default: stdout)")
    rc.add_argument("--force", action="store_true", help="replace FILE if it exists")
    db_opts(rc)

    m = sub.add_parser("migrate", help="bring the funnel's table up to its declaration")
    m.add_argument("funnel", metavar="FUNNEL")
    m.add_argument("--check", action="store_true", help="report, change nothing")
    m.add_argument("--drop", action="store_true", help="drop columns no longer declared")
    m.add_argument("--sessions", action="store_true", help="move the sessions that would move "
                   "at their next turn (ended, or `pin: false`) to this version now, through "
                   "its `migrations:`")
    db_opts(m)

    dp = sub.add_parser("deploy", help="make the funnel the newest version: migrate its table "
                        "and store it in the version store (docs/versions.md)")
    dp.add_argument("funnel", metavar="FUNNEL")
    dp.add_argument("--drop", action="store_true", help="drop columns no longer declared")
    dp.add_argument("--sessions", action="store_true", help="as `funnel migrate --sessions`")
    db_opts(dp)

    vs = sub.add_parser("versions", help="the funnel's versions in the version store, with "
                        "their sessions")
    vs.add_argument("funnel", metavar="FUNNEL")
    db_opts(vs)

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

    so = sub.add_parser("studio", help="the browser playground: chat beside the graph, state and "
                        "why; play the model; rewind; live edits; scenarios; sessions")
    so.add_argument("funnels", nargs="*", metavar="FUNNEL",
                    help="funnel files, and a folder whose `funnel new` folders it opens and "
                    "where New funnel writes (default: the current folder; it may be empty)")
    so.add_argument("--host", default="127.0.0.1",
                    help="loopback needs no key; any other address needs FUNNEL_STUDIO_KEY")
    so.add_argument("--port", type=int, default=8700)
    so.add_argument("--model", default=os.environ.get("FUNNEL_MODEL"),
                    help="the page's first model choice: human (\"I am the model\", the default), "
                         "scripted:PATH or a litellm model string")
    so.add_argument("--api-base", default=None, metavar="URL")
    so.add_argument("--what-if-days", type=_days, default=7.0, metavar="DAYS",
                    help="each clean save replays the sessions with a turn in the last DAYS "
                    "on the edit (default 7; docs/studio.md, What-if)")
    so.add_argument("--what-if-max", type=_count, default=200, metavar="N",
                    help="the what-if replays the N most recent of them at most (default "
                    "200; 0: no what-if)")
    db_opts(so)

    rp = sub.add_parser("report", help="funnel analytics: stages, drop-off, time, products, "
                        "hand-offs, cost (computed in SQL)")
    rp.add_argument("funnel", metavar="FUNNEL")
    rp.add_argument("--since", default="7d", type=_period, metavar="PERIOD",
                    help="sessions started (turns recorded) in this period, e.g. 30d (default 7d)")
    rp.add_argument("--format", choices=["table", "json", "html"], default="table")
    rp.add_argument("--out", default=None, metavar="FILE", help="write to FILE instead of stdout")
    rp.add_argument("--by", choices=["variant"], default=None,
                    help="variant: the experiment's variants side by side, with the goal's "
                    "rate, its 95%% interval and the p-value against the control "
                    "(docs/experiments.md)")
    rp.add_argument("--include-playground", action="store_true",
                    help="count the studio's playground sessions too (left out by default)")
    rp.add_argument("--coverage", action="store_true", help="what real sessions exercised of "
                    "the declared machine, beside the funnel's scenarios: what traffic "
                    "exercised that no scenario does (docs/evidence.md#coverage)")
    rp.add_argument("--scenarios", nargs="+", default=(), metavar="PATH",
                    help="with --coverage: the scenarios to compare with (default: the "
                    "funnel's folder)")
    rp.add_argument("--advise", action="store_true",
                    help="advise on each numeric threshold of the exit conditions: who stopped "
                    "just below it, how those above converted, the value the data suggests "
                    "and what replaying it changes (docs/evidence.md)")
    rp.add_argument("--advise-sessions", type=int, default=500, metavar="N",
                    help="--advise: replay the suggestion over the N most recent sessions "
                    "(default 500; 0: no replay)")
    db_opts(rp)
    rl = sub.add_parser("replay", help="replay recorded sessions against an edited funnel: "
                        "what the edit changes, session by session and in all")
    rl.add_argument("funnel", metavar="EDITED_FUNNEL")
    rl.add_argument("--since", default=None, type=_period, metavar="PERIOD",
                    help="sessions with a turn in this period, e.g. 30d (default: all)")
    rl.add_argument("--sessions", nargs="+", default=(), metavar="ID",
                    help="only these sessions")
    rl.add_argument("--variant", default=None, help="only the sessions of this variant")
    rl.add_argument("--include-playground", action="store_true",
                    help="replay the studio's playground sessions too (left out by default, "
                    "unless named in --sessions)")
    rl.add_argument("--base", default=None, metavar="FILE", help="the funnel the sessions ran "
                    "on (default: the copy each session's turns ran on, from the version "
                    "store)")
    rl.add_argument("--format", choices=["text", "json", "github", "html"], default="text")
    rl.add_argument("--out", default=None, metavar="FILE", help="write to FILE, not stdout")
    rl.add_argument("--fail-if", action="append", default=[], metavar="GATE",
                    help="exit 1 when the change matches, e.g. 'handoff_rate < -5%%' "
                    "(repeatable; docs/evidence.md)")
    rl.add_argument("--allow-unmeasured", action="store_true",
                    help="a --fail-if whose figure no session measured passes (default: fails)")
    rl.add_argument("--max-needs-model", default=None, metavar="SHARE",
                    help="exit 1 when more than this share of the sessions need the model to "
                    "know (their outcome is left out of the figures), e.g. 20%%")
    rl.add_argument("--warn-needs-model", action="store_true",
                    help="with --max-needs-model: warn instead of failing")
    rl.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), metavar="N",
                    help="processes to replay in (default: 2, or 1 on one core)")
    rl.add_argument("--model", default=None, metavar="M",
                    help="continue the sessions that need the model with M (litellm model "
                    "string or scripted:PATH), from the turn the recording cannot answer; "
                    "counted apart (default: marked, not continued)")
    rl.add_argument("--api-base", default=None, metavar="URL")
    structured_opt(rl)
    db_opts(rl)

    sm = sub.add_parser("simulate", help="walk the funnel with simulated customers (personas) "
                        "on a temporary schema, scored by the funnel's outcomes")
    sm.add_argument("funnel", metavar="FUNNEL")
    sm.add_argument("--personas", default=None, metavar="FILE", help="the personas (YAML; "
                    "docs/evidence.md)")
    sm.add_argument("--personas-from-db", action="store_true",
                    help="mine weighted personas from the recorded sessions of --since "
                    "instead (anonymized; docs/evidence.md)")
    sm.add_argument("--since", default=30 * 86400.0, type=_period, metavar="PERIOD",
                    help="--personas-from-db: the sessions with a message in this period "
                    "(default 30d)")
    sm.add_argument("--k", type=int, default=8, metavar="N",
                    help="--personas-from-db: at most N personas (default 8)")
    sm.add_argument("--write", default=None, metavar="FILE",
                    help="--personas-from-db: write the personas file and stop")
    sm.add_argument("-n", type=int, default=20, metavar="N",
                    help="conversations, 1 to 10,000 (default 20)")
    sm.add_argument("--model", default=os.environ.get("FUNNEL_MODEL"),
                    help="the funnel's model: litellm model string or scripted:PATH "
                    "(default: $FUNNEL_MODEL, else the funnel's)")
    sm.add_argument("--api-base", default=None, metavar="URL")
    sm.add_argument("--customer-model", default=None, metavar="M", help="a litellm model "
                    "that plays the personas (default: each persona's script)")
    sm.add_argument("--customer-api-base", default=None, metavar="URL")
    sm.add_argument("--seed", type=int, default=1, help="which personas come in which order")
    sm.add_argument("--variant", default=None, metavar="NAME",
                    help="run the conversations on this variant of the funnel's experiment")
    sm.add_argument("--compare", default=None, metavar="FILE",
                    help="an earlier run's --format json output, to compare the rates with")
    sm.add_argument("--format", choices=["text", "json", "github"], default="text")
    sm.add_argument("--out", default=None, metavar="FILE", help="write to FILE, not stdout")
    sm.add_argument("--fail-under", action="append", default=[], metavar="METRIC=VALUE",
                    help="exit 1 when the run's metric is below VALUE, e.g. handoff_rate=0.4 "
                    "(repeatable)")
    sm.add_argument("--max-degenerate", default="20%", metavar="SHARE",
                    help="a run where more of the customer messages are degenerate (empty, "
                    "placeholders, echoes, the brief) is invalid and gives no rates "
                    "(default 20%%)")
    sm.add_argument("--gate", action="store_true",
                    help="exit 1 when the run is invalid (CI)")
    db_opts(sm)

    kn = sub.add_parser("knowledge", help="the funnel's knowledge base: reindex it, or search "
                        "it as a stage would")
    kn.add_argument("funnel", metavar="FUNNEL")
    kn.add_argument("action", choices=["reindex", "search"])
    kn.add_argument("query", nargs="*", metavar="QUERY", help="search: the customer's words")
    kn.add_argument("--stage", default=None, help="search: apply this stage's top_k and budget")
    kn.add_argument("--top-k", type=int, default=5, metavar="N",
                    help="search: at most N chunks without --stage (default 5)")
    db_opts(kn)
    return p


def _version() -> str:
    try:
        return metadata.version("funnel-engine")
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


def _period(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError("the period must be longer than zero")
    return seconds


def _days(text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of days, such as 7 or 0.5; got {text!r}"
                                         ) from None
    if not 0 < days <= 3650:
        raise argparse.ArgumentTypeError(f"from more than 0 to 3650 days; got {text}")
    return days


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of sessions; got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"0 or more sessions; got {text}")
    return n


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        module, function = _COMMANDS[args.command]
        command = getattr(importlib.import_module(f"{__name__}.{module}"), function)
        code = int(command(args))
        sys.stdout.flush()  # a closed pipe shows here, not as Python's shutdown traceback
        return code
    except FunnelInvalid as exc:
        print(render(exc.diagnostics, "text"), file=sys.stderr)
        return 1
    except FunnelError as exc:
        print(f"funnel: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        # SIGTERM in a temporary schema (engine.store.connect.Terminated): dropped on the way out.
        signum = getattr(exc, "signum", None)
        if isinstance(signum, int):
            print(f"funnel {args.command}: terminated; its temporary schema was dropped",
                  file=sys.stderr)
            return 128 + signum
        return 130
    except BrokenPipeError:
        # `funnel ... | head`: the reader left. Python would report the broken pipe again
        # when it flushes stdout at exit; point stdout at /dev/null so that it does not.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1


# Each command's module is imported when the command runs, so that `funnel validate`
# does not pay for the store, the machine or litellm: (module, function) by command.
_COMMANDS = {
    "validate": ("validate", "cmd_validate"),
    "new": ("new", "cmd_new"),
    "schema": ("schema", "cmd_schema"),
    "graph": ("show", "cmd_graph"),
    "sql": ("show", "cmd_sql"),
    "chat": ("conversation", "cmd_chat"),
    "state": ("conversation", "cmd_state"),
    "demo": ("conversation", "cmd_demo"),
    "follow-up": ("follow_up", "cmd_follow_up"),
    "migrate": ("database", "cmd_migrate"),
    "deploy": ("deploy", "cmd_deploy"),
    "versions": ("deploy", "cmd_versions"),
    "purge": ("database", "cmd_purge"),
    "forget": ("privacy", "cmd_forget"),
    "export": ("privacy", "cmd_export"),
    "test": ("scenario", "cmd_test"),
    "snapshot": ("scenario", "cmd_snapshot"),
    "record": ("record", "cmd_record"),
    "serve": ("serve", "cmd_serve"),
    "studio": ("studio", "cmd_studio"),
    "doctor": ("doctor", "cmd_doctor"),
    "report": ("report", "cmd_report"),
    "check-state": ("check", "cmd_check_state"),
    "knowledge": ("knowledge", "cmd_knowledge"),
    "replay": ("evidence", "cmd_replay"),
    "simulate": ("evidence", "cmd_simulate"),
}
