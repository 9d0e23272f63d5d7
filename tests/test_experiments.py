"""A/B experiments: the `experiment:` spec and its errors, sticky weighted assignment,
forcing for QA, stopping on a winner, the statistics, and `funnel report --by variant`
on a real PostgreSQL."""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PURAMUR, ROOT, run_funnel
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import ConfigError
from engine.experiments import compare, normal_two_sided_p, wilson
from engine.experiments.router import Variants, assign, bucket, load_experiment
from engine.format.experiment import Experiment, Goal, Variant
from engine.funnel.compiled import load_funnel
from engine.llm.models import Completion, ModelRequest, ScriptedModel
from engine.turn.engine import Engine
from engine.validation import check_file

MARKER = "VARIANT-B-GREETING"


def experiment(**extra: Any) -> dict[str, Any]:
    return {"name": "greeting-test", "goal": "handoff",
            "variants": [{"name": "A", "weight": 50},
                         {"name": "B", "weight": 50,
                          "prompts": {"greeting": "prompts/greeting_b.j2"},
                          "thresholds": {"gift": 500}}], **extra}


def funnel_copy(tmp: Path, exp: dict[str, Any] | None) -> Path:
    """Puramur with its prompts beside it, and ``exp`` as its experiment."""
    shutil.copytree(ROOT / "prompts" / "puramur", tmp / "prompts", dirs_exist_ok=True)
    greeting = (tmp / "prompts" / "greeting.j2").read_text("utf-8")
    (tmp / "prompts" / "greeting_b.j2").write_text(f"{MARKER}\n{greeting}", "utf-8")
    data = yaml.safe_load(PURAMUR.read_text("utf-8"))
    data.update(prompts="prompts",
                catalog=str(ROOT / "funnels" / "puramur" / "catalog.yaml"))
    data["knowledge"]["folder"] = str(ROOT / "funnels" / "puramur" / "knowledge")
    if exp is not None:
        data["experiment"] = exp
    path = tmp / "puramur.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    return path


# -- assignment -------------------------------------------------------------------------
def test_bucket_is_a_fixed_function_of_name_and_session() -> None:
    # Pinned: a salted hash() would differ between processes and break stickiness.
    assert bucket("exp", "s1") == pytest.approx(0.8994363126089885)
    assert bucket("exp", "s1") != bucket("exp2", "s1")


@settings(max_examples=25, deadline=None)
@given(name=st.text(min_size=1, max_size=20),
       weights=st.lists(st.integers(1, 100), min_size=2, max_size=4),
       sessions=st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=20))
def test_assignment_is_sticky(name: str, weights: list[int], sessions: list[str]) -> None:
    exp = Experiment(name, Goal("handoff"),
                     tuple(Variant(f"v{i}", float(w)) for i, w in enumerate(weights)))
    for sid in sessions:
        first = assign(exp, sid)
        assert first in exp.names
        assert all(assign(exp, sid) == first for _ in range(3))


@settings(max_examples=8, deadline=None)
@given(weights=st.lists(st.integers(1, 9), min_size=2, max_size=3),
       name=st.text(min_size=1, max_size=12))
def test_assignment_follows_the_weights(weights: list[int], name: str) -> None:
    exp = Experiment(name, Goal("handoff"),
                     tuple(Variant(f"v{i}", float(w)) for i, w in enumerate(weights)))
    n = 40_000
    counts = Counter(assign(exp, f"session-{i}") for i in range(n))
    for i, w in enumerate(weights):
        # 40,000 draws: the share's standard error is at most 0.25%; 1% is 4 of them.
        assert abs(counts[f"v{i}"] / n - w / sum(weights)) < 0.01


# -- the spec and its errors ------------------------------------------------------------
def test_validator_names_file_line_and_field(tmp_path: Path) -> None:
    path = funnel_copy(tmp_path, None)
    text = path.read_text("utf-8") + (
        "experiment:\n"
        "  name: broken\n"
        "  goal: sales\n"
        "  variants:\n"
        "    - {name: A, weight: 50}\n"
        "    - name: B\n"
        "      weight: -1\n"
        "      prompts: {nowhere: prompts/greeting_b.j2}\n"
        "  winner: C\n"
        "  force: {qa-*: D}\n")
    path.write_text(text, "utf-8")
    lines = text.splitlines()
    spec, diagnostics = check_file(path)
    assert spec is None
    found = {(d.code, d.line) for d in diagnostics}

    def line_of(token: str) -> int:
        return next(i for i, t in enumerate(lines, 1) if token in t and i > len(lines) - 10)

    assert ("F813", line_of("goal: sales")) in found
    assert ("F815", line_of("weight: -1")) in found
    assert ("F816", line_of("prompts: {nowhere")) in found
    assert ("F817", line_of("winner: C")) in found
    assert ("F818", line_of("force:")) in found
    assert all(d.file == str(path) for d in diagnostics)
    messages = " ".join(d.message for d in diagnostics)
    assert "`winner: C` is not a variant" in messages and "stage `nowhere`" in messages
    result = run_funnel("validate", str(path))
    assert result.returncode == 1 and f"{path}:{line_of('winner: C')}:" in result.stdout


def test_experiment_file_and_its_errors(tmp_path: Path) -> None:
    path = funnel_copy(tmp_path, None)
    (tmp_path / "exp.yaml").write_text(
        "name: small\ngoal: {cart_at_least: 1500}\nvariants:\n  - {name: A, weight: 1}\n"
        "  - {name: B, weight: 1, thresholds: {gift: 800}}\n", "utf-8")
    data = yaml.safe_load(path.read_text("utf-8"))
    data["experiment"] = "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    spec, diagnostics = check_file(path)
    assert spec is not None and not diagnostics
    exp = load_experiment(path)
    assert exp is not None and exp.goal == Goal("cart_at_least", 1500.0)
    assert exp.variant("B").thresholds == {"gift": 800.0}
    (tmp_path / "exp.yaml").write_text("name: small\ngoal: handoff\nvariants:\n"
                                       "  - {name: A, weight: 1}\n", "utf-8")
    _, diagnostics = check_file(path)
    assert [(d.file, d.line, d.code) for d in diagnostics] == [
        (str(tmp_path / "exp.yaml"), 4, "F814")]
    with pytest.raises(ConfigError, match="two or more variants"):
        load_experiment(path)


def test_variants_compile_once_with_their_overrides(tmp_path: Path) -> None:
    funnel = load_funnel(funnel_copy(tmp_path, experiment()))
    variants = Variants.for_funnel(funnel)
    a, b = variants.funnels["A"], variants.funnels["B"]
    assert (a.variant, b.variant) == ("A", "B")
    assert a.stages is funnel.stages  # the control shares the compiled funnel's parts
    assert b.spec.cart is not None and b.spec.cart.gift_threshold == 500
    assert funnel.spec.cart is not None and funnel.spec.cart.gift_threshold == 1000
    assert b.stages["greeting"].spec.prompt.name == "greeting_b.j2"
    assert b.stages["discovery"].spec.prompt == funnel.stages["discovery"].spec.prompt
    with pytest.raises(ConfigError, match="no variant 'C'"):
        variants.force("s", "C")


def test_a_variant_funnel_must_share_the_sessions_table(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    data = yaml.safe_load(funnel_copy(other, None).read_text("utf-8"))
    data["table"] = "elsewhere"
    (other / "puramur.yaml").write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
    exp = {"name": "files", "goal": "handoff",
           "variants": [{"name": "A", "weight": 1},
                        {"name": "B", "weight": 1, "funnel": "other/puramur.yaml"}]}
    funnel = load_funnel(funnel_copy(tmp_path, exp))
    with pytest.raises(ConfigError, match="same `funnel` \\(puramur\\), `table`"):
        Variants.for_funnel(funnel)


# -- the engine on a real PostgreSQL ----------------------------------------------------
class Recording:
    """The scripted model, keeping each request's system prompt."""

    def __init__(self) -> None:
        self.inner = ScriptedModel.from_data({"default": {"reply": "Hello!"}})
        self.name = "scripted"
        self.prompts: dict[str, list[str]] = {}

    async def complete(self, request: ModelRequest) -> Completion:
        self.prompts.setdefault(request.session_id, []).append(
            str(request.messages[0]["content"]))
        return await self.inner.complete(request)


def _session_for(exp: Experiment, variant: str) -> str:
    return next(f"s{i}" for i in range(1000) if assign(exp, f"s{i}") == variant)


@pytest.mark.postgres
async def test_sessions_run_on_their_variant_recorded_in_row_and_turns(
        tmp_path: Path, db_url: str, sql: Any) -> None:
    path = funnel_copy(tmp_path, experiment(force={"qa-b-*": "B"}))
    model = Recording()
    engine = await Engine.open(path, db=db_url, model=model)
    exp = engine.variants.experiment
    assert exp is not None
    on_a, on_b = _session_for(exp, "A"), _session_for(exp, "B")
    try:
        for sid in (on_a, on_b, "qa-b-1", "forced-a"):
            if sid == "forced-a":
                engine.variants.force(sid, "A")
            await engine.handle(sid, "Hi")
            await engine.handle(sid, "I have a cat")
    finally:
        await engine.close()
    rows = dict(sql("SELECT session_id, variant FROM puramur_sessions_state"))
    assert rows == {on_a: "A", on_b: "B", "qa-b-1": "B", "forced-a": "A"}
    turns = sql("SELECT session_id, array_agg(variant) FROM funnel_turns GROUP BY 1")
    assert {s: v for s, v in turns} == {on_a: ["A", "A"], on_b: ["B", "B"],
                                        "qa-b-1": ["B", "B"], "forced-a": ["A", "A"]}
    assert MARKER in model.prompts[on_b][0] and MARKER in model.prompts["qa-b-1"][0]
    assert MARKER not in model.prompts[on_a][0] and MARKER not in model.prompts["forced-a"][0]


@pytest.mark.postgres
async def test_stopping_pins_new_sessions_to_the_winner(tmp_path: Path, db_url: str,
                                                        sql: Any) -> None:
    path = funnel_copy(tmp_path, experiment())
    model = ScriptedModel.from_data({"default": {"reply": "Hello!"}})
    engine = await Engine.open(path, db=db_url, model=model)
    exp = engine.variants.experiment
    assert exp is not None
    old_a = _session_for(exp, "A")
    try:
        await engine.handle(old_a, "Hi")
    finally:
        await engine.close()
    funnel_copy(tmp_path, experiment(winner="B"))  # the product owner stops it
    engine = await Engine.open(path, db=db_url, model=model)
    new = [f"n{i}" for i in range(40)]
    try:
        assert engine.variants.experiment is not None
        assert engine.variants.experiment.winner == "B"
        await engine.handle(old_a, "Still me")
        for sid in new:
            await engine.handle(sid, "Hi")
    finally:
        await engine.close()
    rows = dict(sql("SELECT session_id, variant FROM puramur_sessions_state"))
    assert rows[old_a] == "A"  # an assigned session keeps its variant
    assert {rows[s] for s in new} == {"B"}
    assert [v for (v,) in sql("SELECT variant FROM funnel_turns WHERE session_id = %s "
                              "ORDER BY id", (old_a,))] == ["A", "A"]


# -- statistics -------------------------------------------------------------------------
def test_wilson_interval_known_values() -> None:
    # 20 of 100: the Wilson 95% interval is 13.34% - 28.88% (textbook value).
    low, high = wilson(20, 100)
    assert (round(low, 4), round(high, 4)) == (0.1334, 0.2888)
    assert wilson(0, 10)[0] == 0.0 and wilson(0, 10)[1] == pytest.approx(0.2775, abs=1e-4)
    assert wilson(10, 10)[1] == pytest.approx(1.0) and wilson(0, 0) == (0.0, 0.0)


def test_two_proportion_z_test_by_hand() -> None:
    # 200/1000 vs 240/1000: pooled p = 0.22, se = sqrt(.22 * .78 * (2/1000)) = 0.018526,
    # z = 0.04 / 0.018526 = 2.1592, two-sided p = erfc(2.1592 / sqrt 2) = 0.0308.
    c = compare(200, 1000, 240, 1000)
    assert c is not None
    assert c.difference == pytest.approx(0.04)
    assert c.z == pytest.approx(2.1592, abs=1e-4)
    assert c.p_value == pytest.approx(0.0308, abs=1e-4) and c.significant()
    assert compare(240, 1000, 200, 1000).z == pytest.approx(-2.1592, abs=1e-4)  # type: ignore[union-attr]
    assert normal_two_sided_p(1.959963984540054) == pytest.approx(0.05)
    assert normal_two_sided_p(0) == 1.0
    assert compare(0, 10, 0, 10) is None and compare(1, 0, 1, 10) is None
    assert math.isclose(c.high - c.difference, c.difference - c.low)


# -- the report -------------------------------------------------------------------------
@pytest.mark.postgres
async def test_report_by_variant_on_seeded_rows(tmp_path: Path, db_url: str,
                                                sql: Any) -> None:
    path = funnel_copy(tmp_path, experiment())
    engine = await Engine.open(path, db=db_url,
                               model=ScriptedModel.from_data({"default": {"reply": "Hi"}}))
    await engine.close()  # the table and the shared tables exist now
    history = json.dumps([{"stage": "greeting", "entered_at": "2026-01-01T00:00:00+00:00"},
                          {"stage": "discovery", "entered_at": "2026-01-01T00:01:00+00:00"}])
    # A: 100 sessions, 20 handed off, carts of 1000; B: 100 sessions, 35 handed off.
    for variant, handed in (("A", 20), ("B", 35)):
        for i in range(100):
            sql("INSERT INTO puramur_sessions_state (session_id, variant, stage_history, "
                "cart_total, handoff_triggered_at) VALUES (%s, %s, %s, %s, %s)",
                (f"{variant}{i}", variant, history if i < 50 else "[]",
                 1000 if variant == "A" else 0, "2026-01-01" if i < handed else None))
            sql("INSERT INTO funnel_turns (funnel, funnel_version, session_id, stage_before, "
                "stage_after, cost, variant) VALUES ('puramur', 1, %s, 'greeting', "
                "'greeting', 0.01, %s)", (f"{variant}{i}", variant))
    sql("INSERT INTO puramur_sessions_state (session_id) VALUES ('outside')")
    result = run_funnel("report", str(path), "--by", "variant", "--format", "json",
                        "--db", db_url)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    a, b = report["variants"]
    assert (a["variant"], a["control"], a["sessions"], a["conversions"]) == ("A", True, 100, 20)
    assert (b["variant"], b["sessions"], b["conversions"]) == ("B", 100, 35)
    assert a["avg_cart"] == 1000 and b["avg_cart"] == 0
    assert a["cost_per_conversion"] == pytest.approx(1.0 / 20, abs=1e-6)
    assert b["cost_per_conversion"] == pytest.approx(1.0 / 35, abs=1e-6)
    assert (a["ci_low"], a["ci_high"]) == pytest.approx(wilson(20, 100))
    expected = compare(20, 100, 35, 100)
    assert expected is not None and a["vs_control"] is None
    assert b["vs_control"]["p_value"] == pytest.approx(expected.p_value)
    assert b["vs_control"]["significant"] is True  # z = 2.36, p = 0.018
    assert [(s["stage"], s["sessions"], s["pct"]) for s in b["stages"][:3]] == [
        ("greeting", 50, 50.0), ("discovery", 50, 50.0), ("presentation", 0, 0.0)]
    assert "two-proportion z-test with pooled variance" in report["test"]
    text = run_funnel("report", str(path), "--by", "variant", "--db", db_url).stdout
    assert "A (control)" in text and "p-value" in text and "Wilson" in text
    page = run_funnel("report", str(path), "--by", "variant", "--format", "html",
                      "--db", db_url).stdout
    assert page.count('aria-label="funnel chart"') == 2 and "B</h2>" in page


@pytest.mark.postgres
async def test_report_goals_purchase_and_cart(tmp_path: Path, db_url: str, sql: Any) -> None:
    exp = experiment(goal="purchase")
    path = funnel_copy(tmp_path, exp)
    engine = await Engine.open(path, db=db_url,
                               model=ScriptedModel.from_data({"default": {"reply": "Hi"}}))
    await engine.close()
    for i, variant in enumerate("AABB"):
        sql("INSERT INTO puramur_sessions_state (session_id, variant, cart_total) "
            "VALUES (%s, %s, %s)", (f"s{i}", variant, 500 * i))
    sql("INSERT INTO funnel_conversions (funnel, order_id, session_id, amount, currency, "
        "ordered_at) VALUES ('puramur', 'o1', 's2', 10, 'UAH', NOW()), "
        "('puramur', 'o2', 's2', 10, 'UAH', NOW()), ('other', 'o3', 's0', 1, 'UAH', NOW())")
    report = json.loads(run_funnel("report", str(path), "--by", "variant", "--format",
                                   "json", "--db", db_url).stdout)
    assert [(v["variant"], v["conversions"]) for v in report["variants"]] == [("A", 0),
                                                                              ("B", 1)]
    funnel_copy(tmp_path, experiment(goal={"cart_at_least": 1000}))
    report = json.loads(run_funnel("report", str(path), "--by", "variant", "--format",
                                   "json", "--db", db_url).stdout)
    assert report["goal"] == "cart total >= 1000"
    assert [(v["variant"], v["conversions"]) for v in report["variants"]] == [("A", 0),
                                                                              ("B", 2)]


def test_variant_templates_are_checked_like_the_stages(tmp_path: Path) -> None:
    path = funnel_copy(tmp_path, experiment())
    (tmp_path / "prompts" / "greeting_b.j2").write_text("Hello {{ no_such_field }\n", "utf-8")
    spec, diagnostics = check_file(path)
    assert spec is None
    assert [(d.file, d.code) for d in diagnostics] == [
        (str(tmp_path / "prompts" / "greeting_b.j2"), "F202")]


def test_variant_files_outside_the_project_are_refused(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("", "utf-8")
    (tmp_path / "catalog_b.yaml").write_text("products: []\n", "utf-8")
    exp = experiment()
    exp["variants"][1]["catalog"] = "../catalog_b.yaml"
    path = funnel_copy(project, exp)
    _, diagnostics = check_file(path)
    assert any(d.code == "F816" and "outside the funnel's project" in d.message
               for d in diagnostics)


@pytest.mark.postgres
def test_chat_variant_flag_forces_a_new_session(tmp_path: Path, db_url: str, sql: Any) -> None:
    path = funnel_copy(tmp_path, experiment())
    script = tmp_path / "script.yaml"
    script.write_text("default: {reply: Hello}\n", "utf-8")
    exp = load_experiment(path)
    assert exp is not None
    sid = _session_for(exp, "A")  # the hash would give it A
    args = ("chat", str(path), "--session", sid, "--model", f"scripted:{script}",
            "--db", db_url)
    result = run_funnel(*args, "--variant", "B", stdin="Hi\n")
    assert result.returncode == 0, result.stderr
    assert sql("SELECT variant FROM puramur_sessions_state WHERE session_id = %s",
               (sid,)) == [("B",)]
    again = run_funnel(*args, "--variant", "A", stdin="Hi again\n")
    assert again.returncode == 0 and "already runs on variant B" in again.stderr
    assert sql("SELECT variant FROM puramur_sessions_state WHERE session_id = %s",
               (sid,)) == [("B",)]
    bad = run_funnel(*args, "--variant", "Z", stdin="Hi\n")
    assert bad.returncode == 1 and "no variant 'Z'" in bad.stderr
