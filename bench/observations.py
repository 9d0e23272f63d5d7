"""Observational memory over a long conversation, against the extractive summary.

Plays a 60-turn Puramur conversation twice, from the same messages:

* ``observed``  -- a real model (``openai/fake-model`` through litellm to the
  loopback fake OpenAI server of tests/fake_openai.py) plays both the funnel's
  model and the summarizer: the observer notes one observation per customer
  message (a fact verbatim, a question as "Asked about shampoo N."), the
  reflector keeps the facts and merges the questions into one counted line;
* ``extractive`` -- the scripted model with the offline extractive summary.

Prints, every few turns, the summary's size in tokens (4 characters a token)
and whether the fact the customer gave at turn 3 (the cat's name) is in the
prompt the model received; then the observer and reflector calls and the
folds that were appends. Figures are counts and sizes, not timings.

    python bench/observations.py [--db URL] [--turns 60] [--budget 200] [--observe-after 120]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from _db import server_url, throwaway_schema  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402

from engine import Engine, ScriptedModel  # noqa: E402
from engine.memory.observations import text_tokens  # noqa: E402
from engine.records.messages import estimate_tokens  # noqa: E402

PET = "Murka"
SHOWN = (1, 3, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 58, 59, 60)


def message(turn: int) -> str:
    if turn == 3:
        return f"My cat is called {PET} and she is 4 years old."
    return f"Question {turn}: which shampoo suits a long coat in winter, and how often?"


def role_of(body: dict[str, Any]) -> str:
    system = str(body["messages"][0]["content"])
    return next((r for r in ("observer", "reflector") if f"You are the {r}" in system), "turn")


def model(body: dict[str, Any]) -> str:
    """The fake model: the turn's envelope, the observer's and the reflector's answers."""
    role, data = role_of(body), str(body["messages"][-1]["content"])
    if role == "observer":
        out = []
        for line in data.split("New messages:", 1)[1].splitlines():
            if line.startswith("Customer: "):
                text = line.removeprefix("Customer: ")
                asked = re.match(r"Question (\d+):", text)
                out.append(f"Asked about shampoo {asked.group(1)}." if asked else f"Said: {text}")
        return json.dumps({"observations": out})
    if role == "reflector":
        lines = data.split("Observations:\n", 1)[1].split("\n</data>")[0].splitlines()
        asked = sum("Asked about shampoo" in line for line in lines) + sum(
            int(m.group(1)) for line in lines if (m := re.search(r"asked (\d+) questions", line)))
        return json.dumps({"observations": [*(x for x in lines if "Said:" in x),
                                            f"{lines[0][:10]}: The customer asked {asked} "
                                            "questions about shampoos."]})
    return json.dumps({"reply": "Noted, thanks!"})


def funnel_file(folder: Path, budget: int, observe_after: int) -> Path:
    data = yaml.safe_load((ROOT / "funnels" / "puramur.yaml").read_text("utf-8"))
    for key in ("prompts", "schemas"):
        data[key] = str(ROOT / key / "puramur")
    data["catalog"] = str(ROOT / "funnels" / "puramur" / "catalog.yaml")
    data["knowledge"]["folder"] = str(ROOT / "funnels" / "puramur" / "knowledge")
    data["memory"].update(observe_after=observe_after, observation_budget=budget)
    path = folder / "puramur.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    return path


class Scripted:
    """The scripted model, keeping the prompts it was sent."""

    name = "scripted"

    def __init__(self) -> None:
        self.inner = ScriptedModel.from_data({"default": {"reply": "Noted, thanks!"}})
        self.prompts: list[list[dict[str, str]]] = []

    async def complete(self, request: Any) -> Any:
        self.prompts.append(request.messages)
        return await self.inner.complete(request)


async def play(engine: Engine, turns: int, prompts: Any
               ) -> list[tuple[int, int, bool, int]]:
    """(turn, summary tokens, turn-3 fact in the prompt, prompt tokens) per turn."""
    out = []
    for turn in range(1, turns + 1):
        await engine.handle("bench-extractive", message(turn))
        await engine.drain()
        row = await engine.state("bench-extractive") or {}
        summary = str(row.get("conversation_summary") or "")
        sent = " ".join(m["content"] for m in prompts()[-1])
        out.append((turn, text_tokens(summary), PET in sent, estimate_tokens(prompts()[-1])))
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--budget", type=int, default=200)
    parser.add_argument("--observe-after", type=int, default=120)
    args = parser.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "sk-bench-dummy")
    os.environ.setdefault("FUNNEL_ROOT", str(ROOT))
    fake = FakeOpenAI().respond_with(model).start()
    blocks: list[str] = []
    try:
        with tempfile.TemporaryDirectory() as folder, \
                throwaway_schema(server_url(args.db)) as url:
            path = funnel_file(Path(folder), args.budget, args.observe_after)
            engine = await Engine.open(path, db=url, model="openai/fake-model",
                                       api_base=fake.api_base)
            try:
                observed = []
                for turn in range(1, args.turns + 1):
                    await engine.handle("bench", message(turn))
                    await engine.drain()
                    row = await engine.state("bench") or {}
                    blocks.append(str(row.get("conversation_summary") or ""))
                    turn_calls = [b for b in fake.requests if role_of(b) == "turn"]
                    messages = turn_calls[-1]["messages"]
                    sent = " ".join(m["content"] for m in messages)
                    observed.append((turn, text_tokens(blocks[-1]), PET in sent,
                                     estimate_tokens(messages)))
            finally:
                await engine.close()
            scripted = Scripted()
            engine = await Engine.open(path, db=url, model=scripted)
            try:
                extractive = await play(engine, args.turns, lambda: scripted.prompts)
            finally:
                await engine.close()
    finally:
        fake.stop()
    roles = [role_of(b) for b in fake.requests]
    print(f"Per turn: the summary's tokens, whether turn 3's fact ({PET!r}) reaches the "
          "model, the prompt's tokens:")
    print(" turn  observed  fact  prompt | extractive  fact  prompt")
    for (turn, size, fact, tokens), (_, esize, efact, etokens) in zip(observed, extractive,
                                                                       strict=True):
        if turn in SHOWN or turn == args.turns:
            print(f"{turn:5d}  {size:8d}  {'yes' if fact else 'no':>4}  {tokens:6d} | "
                  f"{esize:10d}  {'yes' if efact else 'no':>4}  {etokens:6d}")
    appends = sum(1 for a, b in zip(blocks, blocks[1:], strict=False) if b != a and
                  b.startswith(a))
    rewrites = sum(1 for a, b in zip(blocks, blocks[1:], strict=False) if not b.startswith(a))
    print(f"\nobserved: {roles.count('observer')} observer calls, {roles.count('reflector')} "
          f"reflector calls; {appends} folds appended, {rewrites} rewrites (reflections); "
          f"largest list {max(o[1] for o in observed)} tokens (budget {args.budget}); "
          f"largest prompt: observed {max(o[3] for o in observed)}, extractive "
          f"{max(e[3] for e in extractive)} tokens")
    print(f"turn {args.turns}: fact in the prompt: observed "
          f"{'yes' if observed[-1][2] else 'no'}, extractive "
          f"{'yes' if extractive[-1][2] else 'no'}")


if __name__ == "__main__":
    asyncio.run(main())
