"""`funnel simulate` says what it did not measure: conversations that never started are
counted apart and left out of the rates; degenerate customer messages (empty,
placeholders, echoes of the funnel's reply, the brief said back) are counted; a run
with too many is invalid, prints no intervals, and fails under --gate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from replay_population import PURAMUR

from engine.cli import main
from engine.errors import ModelError
from engine.evidence import render
from engine.evidence.degenerate import degenerate
from engine.evidence.personas import load_personas
from engine.evidence.simulate import simulate
from engine.funnel.compiled import load_funnel
from engine.llm.models import ScriptedModel, make_model
from engine.llm.request import Completion, ModelRequest

EVIDENCE = Path(__file__).with_name("evidence")
PERSONAS = EVIDENCE / "personas.yaml"
FUNNEL_MODEL = f"scripted:{EVIDENCE / 'funnel_model.yaml'}"


def _simulate(capsys: Any, dsn: str, customer: str, *extra: str, n: int = 2
              ) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["simulate", str(PURAMUR), "--personas", str(PERSONAS), "--model",
                 FUNNEL_MODEL, "--customer-model", f"scripted:{EVIDENCE / customer}",
                 "-n", str(n), "--seed", "3", "--db", dsn, *extra])
    return code, capsys.readouterr().out


def test_what_makes_a_message_no_customers() -> None:
    reply = "Hello! I'm the Puramur consultant. Is your pet a cat or a dog?"
    brief = load_personas(PERSONAS)[0].brief()
    assert degenerate("  ", reply) == "empty" and degenerate("?!", reply) == "empty"
    assert degenerate("What you write", reply) == "placeholder"
    assert degenerate('"What you write"') == "placeholder"
    assert degenerate(reply, reply) == "echo"
    assert degenerate("I'm the Puramur consultant. Is your pet a cat or a dog", reply) == "echo"
    assert degenerate("You are a customer talking to a shop's sales assistant", None,
                      brief) == "brief"
    for fine in ("Hi!", "A cat", "I have a Sphynx cat, her skin is very dry",
                 "Is it for cats or dogs?", "something for her cat's dry skin"):
        assert degenerate(fine, reply, brief) is None, fine


def test_an_echoing_customer_model_makes_the_run_invalid(server_dsn, capsys) -> None:
    run = simulate(load_funnel(PURAMUR), load_personas(PERSONAS), make_model(FUNNEL_MODEL),
                   n=2, seed=3, db=server_dsn,
                   customer=make_model(f"scripted:{EVIDENCE / 'customer_echo.yaml'}"))
    data = json.loads(render.simulation_json(run))
    assert data["valid"] is False and data["rates"] is None
    d = data["degenerate"]
    assert d["kinds"]["echo"] > 0 and d["share"] > 0.2
    assert d["messages"] == sum(sum(c["degenerate"].values()) for c in data["conversations"])
    assert "the run measures the customer model" in data["invalid"]
    text = render.simulation_text(run)
    assert "INVALID:" in text and "%]" not in text  # no interval
    # The limit is the user's: at 100% the same run is valid and prints its intervals.
    run.max_degenerate = 1.0
    assert run.valid and "%]" in render.simulation_text(run)
    # The command: invalid under --gate is exit 1, and an error annotation.
    code, out = _simulate(capsys, server_dsn, "customer_echo.yaml", "--gate", "--format",
                          "github", n=1)
    assert code == 1 and out.startswith("::error title=funnel simulate%3A invalid run::")
    capsys.readouterr()
    assert main(["simulate", str(PURAMUR), "--personas", str(PERSONAS), "--model",
                 FUNNEL_MODEL, "--max-degenerate", "lots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-degenerate 'lots'" in err


def test_a_customer_model_that_fails_before_speaking_starts_nothing(server_dsn, capsys
                                                                     ) -> None:
    code, out = _simulate(capsys, server_dsn, "customer_fails.yaml", "--format", "json",
                          "--gate")
    run = json.loads(out)
    assert code == 1 and run["valid"] is False and run["rates"] is None
    assert run["never_started"] == 2 and all(not c["started"] for c in run["conversations"])
    assert "no conversation started" in run["invalid"]


class _SomeFail:
    """Fails before the first message of the persona 'vague'; the others speak their
    script (a model that is flaky for one kind of customer)."""

    name = "some-fail"

    def __init__(self) -> None:
        self.scripts = {p.brief(): list(p.script) for p in load_personas(PERSONAS)}

    async def complete(self, request: ModelRequest) -> Completion:
        brief = request.messages[0]["content"]
        if "someone browsing" in brief:
            raise ModelError("the customer model timed out")
        script = self.scripts[brief]
        said = sum(m["role"] == "assistant" for m in request.messages)
        text = json.dumps({"message": script[said] if said < len(script) else "bye",
                           "leave": said >= len(script)})
        return Completion(text, 0, 0, self.name, 0.0)


def test_conversations_that_never_started_are_left_out_of_the_rates(server_dsn) -> None:
    funnel = load_funnel(PURAMUR)
    model = make_model(FUNNEL_MODEL)
    assert isinstance(model, ScriptedModel)
    run = simulate(funnel, load_personas(PERSONAS), model, n=5, seed=3, db=server_dsn,
                   customer=_SomeFail())
    vague = [c for c in run.conversations if c.persona == "vague"]
    assert vague and all(not c.started and c.turns == 0 for c in vague)
    started = len(run.conversations) - len(vague)
    assert run.never_started == len(vague) and run.valid
    rates = run.rates()
    assert rates["all"]["reach.greeting"]["n"] == started
    assert rates["all"]["reach.greeting"]["k"] == started  # every started one greeted
    assert "vague" not in rates
    assert run.metrics()["reach.greeting"] == 1.0
