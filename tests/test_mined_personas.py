"""`funnel simulate --personas-from-db`: personas mined from a recorded population
reproduce its stage reach within the simulation's Wilson intervals, and copy no name,
phone or address. The population is the engine's own: the shipped personas' scripts
(some cut short) played through the real engine with the scripted model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from replay_population import PURAMUR

from engine.cli import main
from engine.evidence.mining import Profile, cluster
from engine.evidence.personas import load_personas
from engine.funnel.compiled import load_funnel
from engine.llm.models import make_model
from engine.store import open_store
from engine.store.connect import temporary_schema
from engine.turn.engine import Engine

EVIDENCE = Path(__file__).with_name("evidence")
PERSONAS = EVIDENCE / "personas.yaml"
MODEL = f"scripted:{EVIDENCE / 'mined_model.yaml'}"
# persona -> (sessions, messages of its script said; None: all of them)
MIX: dict[str, list[tuple[int, int | None]]] = {
    "sphynx_owner": [(3, None), (2, 3)], "price_sensitive": [(2, None)],
    "wants_manager": [(2, None)], "vague": [(2, None), (1, 1)]}


async def _record(url: str) -> dict[str, list[str]]:
    """Play the mix through the engine; each session's stages reached."""
    funnel = load_funnel(PURAMUR)
    store = await open_store(url)
    engine = await Engine.open(funnel, store=store,
                               model=make_model(f"scripted:{EVIDENCE / 'funnel_model.yaml'}"))
    personas = {p.name: p for p in load_personas(PERSONAS)}
    reached: dict[str, list[str]] = {}
    try:
        for name, parts in MIX.items():
            for count, said in parts:
                for i in range(count):
                    sid = f"web-{name}-{said}-{i}"
                    for text in personas[name].script[:said]:
                        if text is None:  # a silent turn (follow-ups): nothing to say
                            continue
                        result = await engine.handle(sid, text, channel="web")
                        if funnel.stage(result.stage_after).spec.final:
                            break
                    state = await engine.state(sid) or {}
                    reached[sid] = [h["stage"] for h in state["stage_history"]]
        await engine.drain()
    finally:
        await engine.close()
        await store.close()
    return reached


@pytest.fixture(scope="module")
def recorded(server_dsn: str) -> Iterator[tuple[str, dict[str, list[str]]]]:
    with temporary_schema(server_dsn, prefix="funnel_mined") as url:
        yield url, asyncio.run(_record(url))


def _run(capsys: Any, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["simulate", str(PURAMUR), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_mined_personas_reproduce_the_populations_stage_reach(recorded, capsys, tmp_path
                                                               ) -> None:
    url, reached = recorded
    written = tmp_path / "mined.yaml"
    code, out, _ = _run(capsys, "--personas-from-db", "--db", url, "--since", "30d",
                        "--write", str(written), "--format", "json")
    assert code == 0
    mined = json.loads(out)
    assert mined["sessions"] == len(reached) == 12
    personas = load_personas(written)  # the personas format, through its guarded loader
    assert len(personas) == 6 and sum(p.weight for p in personas) == 12
    text = written.read_text("utf-8")
    for secret in ("Anna", "066 123 45 67", "123 45 67"):
        assert secret not in text
    assert "Sam, 050 123 4567" in text  # the stand-ins, where the customer gave them
    top = {p.name: p for p in personas}["reached_handoff_1"]
    assert top.weight == 3 and top.knows == {
        "pet": {"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"]},
        "name": "Sam", "phone": "050 123 4567"}
    code, out, _ = _run(capsys, "--personas", str(written), "--model", MODEL, "--db", url,
                        "-n", "12", "--format", "json")
    assert code == 0
    run = json.loads(out)
    rates = run["rates"]["all"]
    for stage in load_funnel(PURAMUR).spec.stages:
        share = sum(stage in r for r in reached.values()) / len(reached)
        rate = rates[f"reach.{stage}"]
        assert rate["low"] <= share <= rate["high"], (stage, share, rate)
        assert rate["rate"] == pytest.approx(share), stage  # an exact mix: the same shares


def test_mining_an_empty_database_is_a_one_line_error(server_dsn, capsys) -> None:
    with temporary_schema(server_dsn, prefix="funnel_mined_empty") as url:
        code, _, err = _run(capsys, "--personas-from-db", "--db", url, "--model", MODEL)
    assert code == 2 and err.count("\n") == 1
    assert "no recorded session of funnel 'puramur'" in err
    code, _, err = _run(capsys, "--model", MODEL)
    assert code == 2 and "--personas FILE or --personas-from-db" in err


def test_past_k_the_smallest_cluster_joins_its_nearest() -> None:
    def p(sid: str, path: str, objections: tuple[str, ...] = (), language: str = "en"
          ) -> Profile:
        return Profile(sid, tuple(path.split()), objections, language, (), 4)

    full = "greeting discovery presentation cart_building contact_collection handoff"
    profiles = [p(f"a{i}", full) for i in range(5)]
    profiles += [p(f"b{i}", "greeting discovery") for i in range(4)]
    profiles += [p("c0", "greeting discovery presentation objection_handling", ("price",))]
    profiles += [p("d0", "greeting discovery", language="uk")]
    assert [len(c.profiles) for c in cluster(profiles, 8)] == [5, 4, 1, 1]
    two = cluster(profiles, 2)
    assert [len(c.profiles) for c in two] == [6, 5]
    # The Ukrainian browser joins the other browsers, and so does the objector, who never
    # reached the cart: by the stages reached, nearer the browsers than the buyers.
    assert {x.session_id for x in two[0].profiles} == {"b0", "b1", "b2", "b3", "d0", "c0"}
    assert two[0].key == (("greeting", "discovery"), (), "en")
    assert {x.session_id for x in two[1].profiles} == {f"a{i}" for i in range(5)}
