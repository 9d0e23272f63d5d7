"""`funnel replay`: a recorded population (the shipped scenarios and the engine's own turns,
tests/replay_population.py) replayed against four edits, each with exactly the
divergences the recordings predict; the unedited funnel with none; the formats and the
gates. The oracle of each edit is read from what was recorded (the turn records'
explanations, transitions and the sessions' rows), never from the replay."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from replay_population import PURAMUR, ROOT, record

from engine.cli import main
from engine.funnel.compiled import load_funnel
from engine.store import open_store
from engine.store.connect import temporary_schema

SRC = PURAMUR.read_text("utf-8")
THRESHOLD = SRC.replace("when: discovery_completeness >= 60", "when: discovery_completeness >= 50")
CONDITION = SRC.replace("when: customer.name and customer.phone", "when: customer.phone")
REMOVED = (SRC.replace("      - to: objection_handling\n        when: \"'record_objection' in "
                       "actions\"\n", "")
           .replace("stages:\n  greeting:", "removed_stages: {objection_handling: presentation}"
                    "\n\nstages:\n  greeting:")
           .split("  objection_handling:\n")[0] + "  cart_building:\n"
           + SRC.split("  cart_building:\n")[1])


@pytest.fixture(scope="module")
def population(server_dsn: str) -> Any:
    with temporary_schema(server_dsn, prefix="funnel_replay") as url:
        ids = asyncio.run(record(url, n=40, seed=11))
        yield url, ids, asyncio.run(_recorded(url, ids))


async def _recorded(url: str, ids: list[str]) -> dict[str, Any]:
    """Each session's turn records (explanations expanded) and its row."""
    spec = load_funnel(PURAMUR).spec
    store = await open_store(url)
    try:
        return {sid: (await store.turn_records(spec, sid), await store.load(spec, sid))
                for sid in ids}
    finally:
        await store.close()


@pytest.fixture(scope="module")
def edits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project (funnels, prompts, schemas) to edit."""
    root = tmp_path_factory.mktemp("edits")
    for folder in ("funnels", "prompts", "schemas"):
        shutil.copytree(ROOT / folder, root / folder)
    (root / "pyproject.toml").write_text("", "utf-8")
    return root


def _edit(edits: Path, name: str, text: str) -> Path:
    path = edits / "funnels" / f"puramur_{name}.yaml"
    path.write_text(text, "utf-8")
    return path


def _replay(capsys: pytest.CaptureFixture[str], url: str, funnel: Path, *extra: str
            ) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["replay", str(funnel), "--db", url, "--jobs", "1", *extra])
    return code, capsys.readouterr().out


def _json(capsys: pytest.CaptureFixture[str], url: str, funnel: Path) -> dict[str, Any]:
    code, out = _replay(capsys, url, funnel, "--format", "json")
    assert code == 0, out
    return json.loads(out)


def _changed(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["session_id"]: s for s in report["sessions"] if s["status"] != "same"}


def _evaluations(records: list[dict[str, Any]], when: str) -> list[tuple[int, dict[str, Any]]]:
    """(turn number, values read) of every recorded evaluation of the exit ``when``."""
    return [(n, t.get("values") or {}) for n, r in enumerate(records, 1)
            for step in r["explain"] or [] for t in step["transitions"] if t["when"] == when]


def test_the_unedited_funnel_replays_with_no_difference(population, capsys) -> None:
    url, ids, _ = population
    report = _json(capsys, url, PURAMUR)
    assert report["counts"] == {"same": len(ids), "different": 0, "needs_model": 0,
                                "not_reproduced": 0, "skipped": 0, "sessions": len(ids),
                                "changed": 0}
    assert all(m["before"] == m["after"] for m in report["metrics"].values())
    assert any(s["before"]["handoff"] for s in report["sessions"])  # a population worth it


def test_a_lower_threshold_moves_exactly_the_sessions_between_the_two(population, edits,
                                                                      capsys) -> None:
    url, ids, recorded = population
    expected = {}
    for sid, (records, _row) in recorded.items():
        hits = [n for n, v in _evaluations(records, "discovery_completeness >= 60")
                if 50 <= v["discovery_completeness"] < 60]
        if hits:
            expected[sid] = hits[0]
    assert expected, "the population has sessions between the thresholds"
    report = _json(capsys, url, _edit(edits, "threshold", THRESHOLD))
    changed = _changed(report)
    assert {sid: s["first_difference"]["turn"] for sid, s in changed.items()} == expected
    for s in changed.values():
        first = s["first_difference"]
        assert first["stage"] == "discovery"
        assert {"stage": "discovery", "to": "presentation", "when": "discovery_completeness >= 50",
                "when_then": "discovery_completeness >= 60", "then": False, "now": True
                } in first["exits"]
        # Its later turns were answered in discovery: the recording cannot say what the
        # model would have said in presentation.
        if s["turns"] > first["turn"]:
            assert s["status"] == "needs_model"
            assert s["needs_model_from_turn"] == first["turn"] + 1
    assert set(report["earlier"]["presentation"]) == set(expected)


def test_a_rewritten_condition_hands_off_the_sessions_that_gave_the_phone_first(
        population, edits, capsys) -> None:
    url, _, recorded = population
    expected = {}
    for sid, (records, _row) in recorded.items():
        hits = [n for n, v in _evaluations(records, "customer.name and customer.phone")
                if v["customer.phone"] and not v["customer.name"]]
        if hits:
            expected[sid] = hits[0]
    assert expected
    report = _json(capsys, url, _edit(edits, "condition", CONDITION))
    changed = _changed(report)
    assert {sid: s["first_difference"]["turn"] for sid, s in changed.items()} == expected
    for s in changed.values():
        assert s["first_difference"]["changes"] == [
            "moved contact_collection->handoff now, nowhere then"]
        # Handed off now: a final stage, so the outcome is known without the model.
        assert s["status"] == "different"
        assert s["after"]["handoff"] is True


def test_a_price_changes_the_carts_that_hold_the_product(population, edits, capsys) -> None:
    url, _, recorded = population
    catalog = edits / "funnels" / "puramur" / "catalog.yaml"
    original = catalog.read_text("utf-8")
    catalog.write_text(original.replace("price: 277", "price: 299"), "utf-8")
    try:
        report = _json(capsys, url, edits / "funnels" / "puramur.yaml")
    finally:
        catalog.write_text(original, "utf-8")
    holding = {sid: next(line["qty"] for line in row["cart"] if line["sku"] == "PR251010")
               for sid, (_, row) in recorded.items()
               if any(line["sku"] == "PR251010" for line in row["cart"])}
    assert holding
    changed = _changed(report)
    assert set(changed) == set(holding)
    for sid, s in changed.items():
        assert s["status"] == "different"
        before, after = s["before"]["cart_total"], s["after"]["cart_total"]
        assert after - before == 22 * holding[sid]
        assert any(c.startswith("cart total") for c in s["first_difference"]["changes"])
        if s["revenue"]["before"]:
            assert s["revenue"]["after"] == pytest.approx(
                s["revenue"]["before"] * after / before, abs=0.01)
    revenue = report["metrics"]["revenue"]
    assert revenue["after"] > revenue["before"]


def test_a_removed_stage_keeps_the_objecting_sessions_in_presentation(population, edits,
                                                                      capsys) -> None:
    url, _, recorded = population
    expected = {}
    for sid, (records, _row) in recorded.items():
        turns = [n for n, r in enumerate(records, 1) for t in r["transitions"]
                 if (t["from"], t["to"]) == ("presentation", "objection_handling")]
        if turns:
            expected[sid] = (turns[0], len(records))
    assert expected
    report = _json(capsys, url, _edit(edits, "removed", REMOVED))
    changed = _changed(report)
    assert {sid: s["first_difference"]["turn"] for sid, s in changed.items()} == \
        {sid: t for sid, (t, _) in expected.items()}
    for sid, s in changed.items():
        first = s["first_difference"]
        assert first["stage"] == "presentation"
        assert "moved nowhere now, presentation->objection_handling then" in first["changes"]
        turn, total = expected[sid]
        assert s["status"] == ("needs_model" if total > turn else "different")
    assert report["metrics"]["reach.objection_handling"]["after"] == 0


GITHUB = re.compile(r"^::(notice|error) (?:file=([^,]+),line=(\d+),)?title=[^:]+::(.+)$")


def test_the_github_format_annotates_the_changed_line(population, edits, capsys) -> None:
    url, _, _ = population
    funnel = _edit(edits, "threshold", THRESHOLD)
    code, out = _replay(capsys, url, funnel, "--format", "github", "--base", str(PURAMUR))
    assert code == 0
    lines = out.splitlines()
    parsed = [GITHUB.match(line) for line in lines]
    assert all(parsed), [line for line, m in zip(lines, parsed, strict=True) if not m]
    line = THRESHOLD.splitlines().index("        when: discovery_completeness >= 50") + 1
    on_line = [m for m in parsed if m and m.group(3) == str(line)]
    assert len(on_line) == 1
    assert Path(on_line[0].group(2)).resolve() == funnel.resolve()
    assert "this condition now holds on" in on_line[0].group(4)
    assert "reach presentation earlier" in on_line[0].group(4)


def test_the_gates_set_the_exit_code(population, edits, capsys) -> None:
    url, _, _ = population
    funnel = _edit(edits, "condition", CONDITION)
    code, out = _replay(capsys, url, funnel, "--fail-if", "handoff_rate > 0pp")
    assert code == 1 and "FAIL: handoff_rate > 0pp" in out
    code, out = _replay(capsys, url, funnel, "--fail-if", "handoff_rate < -5%",
                        "--fail-if", "not_reproduced > 0")
    assert code == 0 and "ok: handoff_rate < -5%" in out
    capsys.readouterr()
    assert main(["replay", str(funnel), "--db", url, "--fail-if", "handof_rate < 1"]) == 2
    assert "did you mean 'handoff_rate'" in capsys.readouterr().err


def test_the_html_page_names_every_changed_session(population, edits, capsys) -> None:
    url, _, _ = population
    code, out = _replay(capsys, url, _edit(edits, "condition", CONDITION), "--format", "html")
    assert code == 0

    class Ids(HTMLParser):
        found: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.found += [v or "" for k, v in attrs if k == "data-testid"]

    page = Ids()
    page.feed(out)
    assert "replay" in page.found and "metrics" in page.found
    assert page.found.count("session") == json.loads(
        _replay(capsys, url, _edit(edits, "condition", CONDITION), "--format", "json")[1]
    )["counts"]["changed"]


PERSONAS = Path(__file__).with_name("evidence") / "personas.yaml"
FUNNEL_MODEL = Path(__file__).with_name("evidence") / "funnel_model.yaml"


def _simulate(capsys: pytest.CaptureFixture[str], dsn: str, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["simulate", str(PURAMUR), "--personas", str(PERSONAS), "--model",
                 f"scripted:{FUNNEL_MODEL}", "-n", "8", "--seed", "3", "--db", dsn, *extra])
    return code, capsys.readouterr().out


def test_a_scripted_simulation_is_the_same_on_every_run(server_dsn, capsys) -> None:
    runs = []
    for _ in range(2):
        code, out = _simulate(capsys, server_dsn, "--format", "json")
        assert code == 0
        runs.append(json.loads(out))
    assert runs[0] == runs[1]
    run = runs[0]
    by = {c["persona"]: c for c in run["conversations"]}
    assert by["sphynx_owner"]["handoff"] and by["sphynx_owner"]["handoff_reason"] == \
        "cart_confirmed"
    assert by["sphynx_owner"]["cart_total"] == 277
    assert by["wants_manager"]["handoff_reason"] == "explicit_request"
    assert by["price_sensitive"]["stage"] == "objection_handling"
    assert by["vague"]["ended"] == "patience" and not by["vague"]["handoff"]
    assert run["rates"]["all"]["handoff_rate"]["k"] == sum(c["handoff"]
                                                           for c in run["conversations"])
    low, high = run["rates"]["all"]["handoff_rate"]["low"], run["rates"]["all"]["handoff_rate"]["high"]
    assert 0 < low < run["metrics"]["handoff_rate"] < high < 1


def test_the_simulation_gates_set_the_exit_code(server_dsn, capsys, tmp_path) -> None:
    code, out = _simulate(capsys, server_dsn, "--fail-under", "handoff_rate=0.99")
    assert code == 1 and "FAIL: handoff_rate=0.99" in out
    earlier = tmp_path / "earlier.json"
    code, _ = _simulate(capsys, server_dsn, "--fail-under", "handoff_rate=0.1",
                        "--out", str(earlier), "--format", "json")
    assert code == 0
    code, out = _simulate(capsys, server_dsn, "--compare", str(earlier))
    assert code == 0 and "Against the earlier run:" in out
    capsys.readouterr()
    assert main(["simulate", str(PURAMUR), "--personas", str(PERSONAS), "--model",
                 f"scripted:{FUNNEL_MODEL}", "--db", server_dsn, "--fail-under",
                 "handof_rate=1"]) == 2
    assert "did you mean 'handoff_rate'" in capsys.readouterr().err


def test_a_malformed_persona_is_named_with_its_field(tmp_path, capsys) -> None:
    bad = tmp_path / "personas.yaml"
    bad.write_text("personas:\n  - name: anna\n    patience: 0\n", "utf-8")
    assert main(["simulate", str(PURAMUR), "--personas", str(bad), "--model",
                 f"scripted:{FUNNEL_MODEL}"]) == 1
    err = capsys.readouterr().err
    assert "persona anna" in err and "`patience` must be a whole number of turns" in err


def test_a_model_plays_the_customers_through_litellm(server_dsn, fake_llm, capsys) -> None:
    """--customer-model: the persona goes to the model as the system message, the funnel's
    replies as the other side of the chat; the model's answer is the customer's message."""
    said = iter(["Hi!", "I want to talk to a manager"])

    def customer(body: dict[str, Any]) -> str:
        return json.dumps({"message": next(said), "leave": False})

    fake_llm.respond_with(customer)
    capsys.readouterr()
    code = main(["simulate", str(PURAMUR), "--personas", str(PERSONAS), "--model",
                 f"scripted:{FUNNEL_MODEL}", "--customer-model", "openai/customer",
                 "--customer-api-base", fake_llm.api_base, "-n", "1", "--seed", "3",
                 "--db", server_dsn, "--format", "json"])
    assert code == 0
    run = json.loads(capsys.readouterr().out)
    (conv,) = run["conversations"]
    assert conv["handoff_reason"] == "explicit_request" and conv["turns"] == 2, conv["ended"]
    first, second = fake_llm.requests[0]["messages"], fake_llm.requests[1]["messages"]
    assert first[0]["role"] == "system" and "You are a customer" in first[0]["content"]
    assert second[-1]["role"] == "user" and "Puramur consultant" in second[-1]["content"]
    assert all(m["role"] != "system" for m in second[1:])


def _continued(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["session_id"]: s for s in report["sessions"] if s["status"] == "continued"}


def test_a_scripted_model_continues_the_sessions_the_recording_cannot_answer(
        population, edits, capsys) -> None:
    """--model: from the first turn the recording has no output for, the session's
    recorded customer messages go to the model through the engine; the session says so,
    and the whole with such sessions is told apart from the whole the recording decides."""
    url, _, recorded = population
    funnel = _edit(edits, "threshold", THRESHOLD)
    plain = _json(capsys, url, funnel)
    needing = {s["session_id"]: s["needs_model_from_turn"] for s in plain["sessions"]
               if s["status"] == "needs_model"}
    assert needing
    label = f"scripted:{FUNNEL_MODEL}"
    code, out = _replay(capsys, url, funnel, "--format", "json", "--model", label)
    assert code == 0, out
    report = json.loads(out)
    continued = _continued(report)
    assert {sid: s["continued"]["from_turn"] for sid, s in continued.items()} == needing
    assert report["counts"]["needs_model"] == 0
    assert report["counts"]["continued"] == len(needing)
    assert report["counts"]["changed"] == plain["counts"]["changed"]
    # The recording's whole is the same set, the same figures; the continued ones apart.
    assert report["metrics"] == plain["metrics"]
    assert report["continued_with"] == label
    for sid, s in continued.items():
        records = recorded[sid][0]
        c = s["continued"]
        assert c["model"] == label and c["text"].startswith(
            f"continued with {label} from turn {needing[sid]}")
        left = len(records) - needing[sid] + 1
        # Every recorded message from that turn on, unless a final stage ended it.
        assert c["turns"] == left if c["ended"] is None else c["turns"] < left
        # The model played in presentation, where the edit moved the session.
        assert "presentation" in s["after"]["reached"]
        assert s["after"]["stage"] != "discovery"
    with_them = report["metrics_with_continued"]
    n = len(plain["sessions"]) - plain["counts"]["needs_model"] - \
        plain["counts"]["not_reproduced"] - plain["counts"]["skipped"]
    assert n + len(needing) == report["counts"]["same"] + report["counts"]["different"] + \
        report["counts"]["continued"]
    moved = set(with_them["reach.presentation"]["sessions"])
    assert moved >= {sid for sid, s in continued.items()
                     if "presentation" not in s["before"]["reached"]}
    # Every format says it.
    first = min(continued)
    code, text = _replay(capsys, url, funnel, "--model", label)
    assert code == 0
    assert f"continued with {label} {len(needing)}" in text
    assert f"With the {len(needing)} session(s) continued with {label}" in text
    assert f"continued with {label} from turn {needing[first]}" in \
        next(line for line in text.splitlines() if line.startswith(f"  {first}:"))
    code, github = _replay(capsys, url, funnel, "--model", label, "--format", "github",
                           "--base", str(PURAMUR))
    assert code == 0 and f"{len(needing)} continued with {label}" in github
    code, html = _replay(capsys, url, funnel, "--model", label, "--format", "html")
    assert code == 0 and 'data-testid="count-continued"' in html
    assert 'data-testid="metrics-with-continued"' in html
    assert f"continued with {label} from turn {needing[first]}" in html
    code, out = _replay(capsys, url, funnel, "--model", label, "--fail-if", "continued > 0")
    assert code == 1 and "FAIL: continued > 0" in out


def test_the_continuation_calls_a_real_model_through_litellm(population, edits, fake_llm,
                                                             capsys) -> None:
    """The continuation is the engine's turn: the stage prompt with the session's
    recorded history goes to the model over HTTP (loopback), its answer is validated and
    applied; here the model only talks, so every continued session stays in presentation,
    where the edit moved it, for all its recorded messages."""
    url, _, recorded = population
    funnel = _edit(edits, "threshold", THRESHOLD)
    fake_llm.respond_with(lambda body: json.dumps({"reply": "Tell me more, please."}))
    code, out = _replay(capsys, url, funnel, "--format", "json", "--model", "openai/fake",
                        "--api-base", fake_llm.api_base)
    assert code == 0, out
    report = json.loads(out)
    continued = _continued(report)
    assert continued and report["counts"]["needs_model"] == 0
    for sid, s in continued.items():
        c = s["continued"]
        assert c["turns"] == len(recorded[sid][0]) - c["from_turn"] + 1
        assert (c["fallbacks"], c["repairs"], c["ended"]) == (0, 0, None)
        assert c["tokens"] > 0
        assert s["after"]["stage"] == "presentation" and not s["after"]["handoff"]
        assert s["after"]["reached"] == ["greeting", "discovery", "presentation"]
    # One request per continued turn (no repair), each the turn's recorded message
    # with what came before it in the session.
    assert len(fake_llm.requests) == sum(s["continued"]["turns"] for s in continued.values())
    prompts = [json.dumps(b["messages"]) for b in fake_llm.requests]
    for sid, s in continued.items():
        records = recorded[sid][0]
        turn = s["continued"]["from_turn"]
        assert turn >= 2
        said = records[turn - 1]["customer"]
        earlier = (json.dumps(records[turn - 2]["customer"])[1:-1],
                   json.dumps(records[turn - 2]["reply"])[1:-1])
        # The turn before's message and reply, seeded from the recording, are in its prompt.
        assert any(json.dumps(said)[1:-1] in p and all(e in p for e in earlier)
                   for p in prompts), sid
    with_them = report["metrics_with_continued"]
    assert with_them["reach.presentation"]["after"] * report["counts"]["sessions"] >= \
        len(continued)
    assert with_them["handoffs"]["after"] == report["metrics"]["handoffs"]["after"]
