"""What checking a reply's claims costs a turn (issue 38: < 1 ms at p95), next to the
steps every turn already runs on the same reply, measured in the same run.

    python bench/claims.py [--db URL] [--rounds 20] [--sessions 40]

1. In process, over the labelled replies of tests/data/claims_labelled.yaml (their
   states, Puramur's catalog): the check (`CompiledFunnel.claims.check`, with the
   conditions' context) and the snapshot a checked turn takes before it applies the
   answer (engine.turn.truth.Snapshot, taken and restored), per reply; beside them the
   baseline, what a turn does with the same reply today: the output's parse and schema
   validation (engine.turn.output.parse_output) and the reply's language check.
2. Whole turns on PostgreSQL: bench/realistic_turn.py's conversation (offline model, no
   refusal in it) with the check on and with `claims: false`, alternating rounds; the
   turn's wall time at p50 and p95 for each.

Without --db it uses $FUNNEL_DB, else the embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import yaml  # noqa: E402
from _db import server_url, throwaway_schema  # noqa: E402

from engine.funnel.actions import TurnScratch  # noqa: E402
from engine.funnel.compiled import CompiledFunnel, load_funnel  # noqa: E402
from engine.funnel.state import defaults  # noqa: E402


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _line(name: str, us: list[float]) -> str:
    return (f"  {name:44} p50 {statistics.median(us):8.1f} us   p95 {_pct(us, 0.95):8.1f} us"
            f"   max {max(us):8.1f} us")


def in_process(rounds: int) -> None:
    from datetime import UTC, datetime

    from engine.turn import language
    from engine.turn.advance import Mover, start_position
    from engine.turn.data import Incoming, Turn
    from engine.turn.output import parse_output
    from engine.turn.truth import Snapshot

    funnel = load_funnel(ROOT / "funnels" / "puramur.yaml")
    cases = yaml.safe_load((ROOT / "tests" / "data" / "claims_labelled.yaml").read_text(
        "utf-8"))["cases"]
    cases = [c for c in cases if c["funnel"] == "puramur"]
    policy = funnel.spec.language_policy
    language.warm(policy.candidates)
    now = datetime(2026, 12, 5, tzinfo=UTC)
    stage = funnel.stage("presentation")
    prepared = []
    for case in cases:
        state = {**defaults(funnel.spec), **copy.deepcopy(case.get("state") or {})}
        pos = start_position("presentation", now)
        mover = Mover(funnel, pos, now, TurnScratch("b", "presentation", 0, now))
        turn = Turn(Incoming("b", "hi", "api", 0.0), now, None, [], state, pos, 0, None,
                    "presentation", mover, funnel)
        envelope = json.dumps({"reply": case["reply"]}, ensure_ascii=False)
        decision = language.decide(policy, "hello", case["lang"])
        prepared.append((case, state, mover, turn, envelope, decision))
    check, snap, parse, lang = [], [], [], []
    for _ in range(rounds):
        for case, state, mover, turn, envelope, decision in prepared:
            t0 = time.perf_counter()
            funnel.claims.check(case["reply"], "presentation", state, mover.context(state))
            t1 = time.perf_counter()
            Snapshot.take(turn).restore(turn)
            t2 = time.perf_counter()
            parse_output(stage, envelope)
            t3 = time.perf_counter()
            language.reply_problem(policy, decision, case["reply"])
            t4 = time.perf_counter()
            check.append((t1 - t0) * 1e6)
            snap.append((t2 - t1) * 1e6)
            parse.append((t3 - t2) * 1e6)
            lang.append((t4 - t3) * 1e6)
    both = [a + b for a, b in zip(check, snap, strict=True)]
    print(f"in process: {len(prepared)} labelled Puramur replies x {rounds} rounds")
    print(_line("claims check", check))
    print(_line("snapshot taken and restored", snap))
    print(_line("the two: what the check adds to a turn", both))
    print("  baseline, the same replies:")
    print(_line("output parse + schema validation", parse))
    print(_line("reply language check", lang))


async def whole_turns(url: str, sessions: int, rounds: int) -> None:
    from realistic_turn import HAPPY, message

    from engine.llm.models import ScriptedModel
    from engine.turn.engine import Engine

    data = yaml.safe_load((ROOT / "funnels" / "puramur.yaml").read_text("utf-8"))
    data["prompts"] = str(ROOT / "prompts" / "puramur")
    data["catalog"] = str(ROOT / "funnels" / "puramur" / "catalog.yaml")
    data["knowledge"]["folder"] = str(ROOT / "funnels" / "puramur" / "knowledge")
    os.environ.setdefault("FUNNEL_ROOT", str(ROOT))
    funnels: dict[str, CompiledFunnel] = {}
    times: dict[str, list[float]] = {"on": [], "off": []}
    refused = 0
    with tempfile.TemporaryDirectory() as tmp, throwaway_schema(url) as db:
        for name, claims in (("on", data["claims"]), ("off", False)):
            path = Path(tmp) / f"puramur_{name}.yaml"
            path.write_text(yaml.safe_dump({**data, "claims": claims}, allow_unicode=True,
                                           sort_keys=False))
            funnels[name] = load_funnel(path)
        engines = {}
        for name, funnel in funnels.items():
            model = ScriptedModel.from_data({"turns": HAPPY, "default": {"reply": "OK."}})
            engines[name] = await Engine.open(funnel, db=db, model=model)
        try:
            for r in range(rounds):
                for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
                    for s in range(sessions):
                        sid = f"{name}-{r}-{s}"
                        for t in range(len(HAPPY)):
                            t0 = time.perf_counter()
                            result = await engines[name].handle(sid, message(t))
                            times[name].append((time.perf_counter() - t0) * 1000)
                            refused += len(result.reply_claims)
        finally:
            for engine in engines.values():
                await engine.close()
    print(f"whole turns on PostgreSQL: {sessions} sessions x {len(HAPPY)} turns x {rounds} "
          f"rounds each ({refused} claims refused)")
    for name, label in (("off", "claims: false (baseline)"), ("on", "claims checked")):
        ms = times[name]
        print(f"  {label:28} p50 {statistics.median(ms):7.3f} ms   p95 {_pct(ms, 0.95):7.3f} ms")
    on, off = times["on"], times["off"]
    print(f"  added by the check: p50 {statistics.median(on) - statistics.median(off):+.3f} ms,"
          f" p95 {_pct(on, 0.95) - _pct(off, 0.95):+.3f} ms (the database's noise is larger)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=20)
    args = parser.parse_args()
    in_process(args.rounds)
    asyncio.run(whole_turns(server_url(args.db), args.sessions, max(2, args.rounds // 5)))


if __name__ == "__main__":
    main()
