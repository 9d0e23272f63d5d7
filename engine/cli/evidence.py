"""`funnel replay` and `funnel simulate`: evidence for a change (docs/evidence.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import InvalidInput
from ..evidence import render
from ..evidence.base import load_base
from ..evidence.continuation import continue_sessions
from ..evidence.gates import Verdict, check_floor, parse_floor, parse_gate
from ..evidence.measured import judge, parse_share
from ..evidence.mining import mine, write_personas
from ..evidence.personas import load_personas
from ..evidence.records import read_bundle, read_copy, read_population
from ..evidence.replay import Replay, base_from, copies_from, replay
from ..evidence.simulate import MAX_CONVERSATIONS, against, simulate
from ..funnel.compiled import CompiledFunnel, load_funnel
from ..llm.models import make_model
from ..versions.bundle import bundle_of


def cmd_replay(args: argparse.Namespace) -> int:
    edited = load_funnel(args.funnel)
    try:
        fixed = load_base(args.base, edited) if args.base else None
        share = parse_share(args.max_needs_model) if args.max_needs_model else None
    except InvalidInput as exc:
        print(f"funnel replay: error: {exc}", file=sys.stderr)
        return 2
    population = read_population(args.db, edited.name, since=args.since,
                                 sessions=args.sessions, variant=args.variant,
                                 include_playground=args.include_playground)
    resolve, loaded, where = base_from(lambda v: read_bundle(args.db, edited.name, v),
                                       edited.name, fixed)
    # Without --base each session is played on the copy its turns ran on (docs/evidence.md).
    copy, copies = (None, {}) if fixed is not None else copies_from(
        lambda v, h: read_copy(args.db, edited.name, v, h), edited.name, loaded)
    known: list[str] = []
    try:
        result = replay(edited, population, resolve, jobs=max(1, args.jobs), copy=copy)
        result.versions = _where(where, copies, result.legacy)
        if args.model:
            model = make_model(args.model, api_base=args.api_base,
                               structured_output=args.structured_output)
            continue_sessions(result, edited, population.sessions, model, label=args.model,
                              db=args.db)
        known = list(result.metrics())
        try:
            gates = [parse_gate(g, known) for g in args.fail_if]
        except InvalidInput as exc:
            print(f"funnel replay: error: {exc}", file=sys.stderr)
            return 2
        _, verdicts = judge(gates, result, allow_unmeasured=args.allow_unmeasured,
                            max_needs_model=share, warn_needs_model=args.warn_needs_model)
        text = _render(args.format, result, verdicts, edited, fixed, args.db)
    finally:
        for version in loaded:
            if version.folder is not None:
                version.folder.cleanup()
    if result.legacy:
        print(f"funnel replay: warning: {result.legacy} session(s) were recorded before turn "
              "records kept the copy of the funnel they ran on: replayed on the copy of their "
              "version deployed last, which may not be the one they ran on", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(text, "utf-8")
        print(f"{args.out}: {result.counts()['changed']} of {len(result.diffs)} sessions "
              "change", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 1 if any(v.failed for v in verdicts) else 0


def _where(where: dict[int, str], copies: dict[int, list[str]], legacy: int) -> dict[int, str]:
    """Per version, what its sessions were replayed on: the copies they ran on, and (for
    records older than that) the version's deployed copy."""
    out: dict[int, str] = {}
    for version in sorted({*where, *copies}):
        parts = []
        if version in copies:
            hashes = ", ".join(h[:12] for h in copies[version])
            parts.append(f"version {version} as each session ran on it ({hashes})")
        if version in where:
            parts.append(where[version] + (" (the sessions recorded before turns kept their "
                                           "copy)" if legacy and version in copies else ""))
        out[version] = "; ".join(parts)
    return out


def _render(fmt: str, result: Replay, verdicts: list[Verdict], edited: CompiledFunnel,
            fixed: CompiledFunnel | None, db: str | None) -> str:
    if fmt == "json":
        return render.as_json(result, verdicts)
    if fmt == "html":
        return render.as_html(result, verdicts)
    if fmt == "github":
        return render.as_github(result, _edited_files(edited, fixed, db), verdicts)
    return render.as_text(result, verdicts)


def _edited_files(edited: CompiledFunnel, fixed: CompiledFunnel | None, db: str | None
                  ) -> dict[Path, tuple[str, str]]:
    """Each file of the edited funnel that differs from the version it is compared with:
    path -> (text then, text now). Then is ``--base``'s files, else the newest recorded
    version's bundle in the version store."""
    now = bundle_of(edited.spec)
    if fixed is not None:
        then = bundle_of(fixed.spec).files
    else:
        found = read_bundle(db, edited.name, edited.spec.version)
        then = found[2] if found else {}
    root = Path(edited.spec.path).resolve().parents[len(Path(now.entry).parts) - 1]
    names = {Path(k).name: k for k in then}
    out: dict[Path, tuple[str, str]] = {}
    for rel, text in now.files.items():
        if rel.endswith("/"):
            continue
        # The same file, or the one of the same name (the bundles' bases may differ).
        old = then.get(rel, then.get(names.get(Path(rel).name, ""), ""))
        if rel == now.entry and rel not in then:
            old = then.get(_entry_of(then, edited), old)
        if old != text:
            out[root / rel] = (old, text)
    return out


def _entry_of(files: dict[str, str], edited: CompiledFunnel) -> str:
    """The funnel file of a bundle: the YAML file that declares ``funnel: NAME``."""
    for rel, text in files.items():
        if rel.endswith((".yaml", ".yml")) and f"funnel: {edited.name}" in text:
            return rel
    return ""


def cmd_simulate(args: argparse.Namespace) -> int:
    if not 1 <= args.n <= MAX_CONVERSATIONS:
        print(f"funnel simulate: error: argument -n: from 1 to {MAX_CONVERSATIONS:,} "
              f"conversations; got {args.n} (run several seeds for more)", file=sys.stderr)
        return 2
    if (args.personas is None) == (not args.personas_from_db):
        print("funnel simulate: error: give --personas FILE or --personas-from-db (one of "
              "the two)", file=sys.stderr)
        return 2
    funnel = load_funnel(args.funnel)
    if args.personas_from_db:
        try:
            mined = mine(args.db, funnel.spec, since=args.since, k=args.k)
        except InvalidInput as exc:
            print(f"funnel simulate: error: {exc}", file=sys.stderr)
            return 2
        if args.write:
            write_personas(mined, args.write)
            sys.stdout.write(json.dumps(mined.as_json(), indent=2, ensure_ascii=False) + "\n"
                             if args.format == "json" else mined.as_text()
                             + f"wrote {args.write}\n")
            return 0
        personas = mined.personas
    else:
        personas = load_personas(args.personas)
    model = make_model(args.model or funnel.spec.model.name, api_base=args.api_base)
    customer = make_model(args.customer_model, api_base=args.customer_api_base) \
        if args.customer_model else None
    try:
        floors = [parse_floor(f, [*METRICS, *(f"reach.{s}" for s in funnel.spec.stages)])
                  for f in args.fail_under]
    except InvalidInput as exc:
        print(f"funnel simulate: error: {exc}", file=sys.stderr)
        return 2
    try:
        max_degenerate = parse_share(args.max_degenerate, "--max-degenerate")
    except InvalidInput as exc:
        print(f"funnel simulate: error: {exc}", file=sys.stderr)
        return 2
    earlier = None
    if args.compare:
        try:
            earlier = json.loads(Path(args.compare).read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"--compare {args.compare}: not a `funnel simulate --format "
                               f"json` output ({exc})") from None
    run = simulate(funnel, personas, model, n=args.n, seed=args.seed, db=args.db,
                   customer=customer, variant=args.variant, max_degenerate=max_degenerate)
    metrics = run.metrics()
    verdicts = [check_floor(m, v, metrics) if run.valid else
                Verdict(f"{m}={v:g}", True, "nothing: the run is invalid") for m, v in floors]
    against_ = against(run, earlier) if isinstance(earlier, dict) else []
    if args.format == "json":
        text = render.simulation_json(run, against_, verdicts)
    elif args.format == "github":
        text = render.simulation_github(run, verdicts)
    else:
        text = render.simulation_text(run, against_, verdicts)
    if args.out:
        Path(args.out).write_text(text, "utf-8")
    else:
        sys.stdout.write(text)
    return 1 if any(v.failed for v in verdicts) or (args.gate and not run.valid) else 0


# The metrics a simulated run gates on, besides reach.<stage>.
METRICS = ["handoff_rate", "turns", "cart_total", "tokens", "cost", "fallback_rate",
           "repair_rate"]
