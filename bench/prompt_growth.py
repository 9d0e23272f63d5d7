"""Prompt tokens per turn: the engine's explicit state vs. a window-buffer baseline.

Plays Puramur conversations of 5, 15, 30 and 60 turns with the scripted model
(token counts are the documented estimate, `engine.turn.prompts.estimate_tokens`:
4 characters a token plus framing) and prints, from the same run:

* ``engine``   -- what this engine sends: the stage prompt rendered from compact
  state, a window of recent messages and the rolling summary, under the
  stage's ``prompt_budget``;
* ``baseline`` -- the seed's v1 shape: one fixed system prompt (every stage's
  instructions and the whole catalog, as a single-prompt bot needs) plus the
  last 10 messages.

Targets: every engine turn under 1,000 tokens; the mean of turns 51-60 at
most 1.15 x the mean of turns 6-15.

It also prints how much of each prompt a provider's prefix cache can reuse:
for consecutive turns in the same stage, the characters the two chats share
from their start (the chat serialized as role and content, message after
message, as providers see it) as a share of the later prompt. The 60-turn
conversation stays in ``presentation`` for its middle turns; a second
conversation of 12 turns spends its middle in ``objection_handling``.
Target: at least 70 % on both (docs/funnel-format.md, "Prompt layout"), with
the summary a real model gets: the observer and reflector (observational
memory), their model played by the loopback fake OpenAI server through
litellm. The shares are also printed with the offline extractive summary of
the scripted model, which no provider ever sees (it rewrites its start on
every fold once full, a clipped transcript), and with a bench summarizer
that only appends and never condenses (what the layout gives once the
summary never changes at its start). Last, for Claude, which reads only up to a
marked breakpoint: the share read with the static prefix marked alone, and with
the second breakpoint at the end of the conversation too (engine.llm.cache).

    python bench/prompt_growth.py [--db URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the loopback fake model server

from _db import server_url, throwaway_schema  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402
from observations import model as observer_fake  # noqa: E402  (bench/observations.py)

from engine import Engine, ModelRequest, ScriptedModel, load_funnel  # noqa: E402
from engine.llm.models import Completion, LiteLLMModel  # noqa: E402
from engine.memory.observations import ModelSummarizer  # noqa: E402
from engine.records.messages import estimate_tokens  # noqa: E402

QUESTIONS = [
    "How often should I use the shampoo on a cat with such dry skin?",
    "Is it safe if she licks her fur right after the bath?",
    "Does the lotion have a strong smell? She hates perfumes.",
    "Can I use it together with the medicine the vet gave us last month?",
    "How long does one bottle last for a small cat like mine?",
    "What are the main ingredients, anything natural in there?",
    "Will it help with the dandruff on her back too?",
    "Should I dry her with a towel or a hair dryer afterwards?",
]
ANSWER = ("Good question. For a Sphynx with dry skin, bathe once a week with lukewarm water, "
          "rinse well and dry with a soft towel; the formula is gentle, fragrance-free and safe "
          "if she licks a little. One bottle lasts about two months at that pace.")


DOUBTS = [
    ("Hmm, 420 UAH for a lotion is a lot.", "price"),
    ("And what is in it exactly? She reacts to almost everything.", "composition"),
    ("I'm not sure it suits an old cat like her.", "fit"),
    ("Still pricey, to be honest.", "price"),
    ("Does it smell? My husband is allergic to perfume.", "composition"),
    ("Is it really better than a baby shampoo?", "fit"),
]
DOUBT_ANSWER = ("I understand. The lotion is fragrance-free and hypoallergenic, and one bottle "
                "lasts two months of daily care; if you prefer, the Calm Skin shampoo (310 UAH) "
                "is a gentler start.")


def objection_conversation(n: int) -> list[tuple[str, dict[str, Any]]]:
    """(customer message, model output): to presentation, then doubt after doubt."""
    turns = conversation(3)
    for i in range(n - len(turns)):
        text, kind = DOUBTS[i % len(DOUBTS)]
        turns.append((text, {"reply": DOUBT_ANSWER, "actions": [
            {"type": "record_objection", "objection": kind}]}))
    return turns


def conversation(n: int) -> list[tuple[str, dict[str, Any]]]:
    """(customer message, model output) for an n-turn conversation that ends in a handoff."""
    turns: list[tuple[str, dict[str, Any]]] = [
        ("Hi! I need some advice for my cat.",
         {"reply": "Hello! I'm the Puramur consultant. Is your pet a cat or a dog?"}),
        ("A cat, a Sphynx. Her skin is very dry and flaky lately.",
         {"reply": "Sphynx skin needs gentle care. How old is she, and what's her name?",
          "updates": {"pet": {"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"]}}}),
        ("She is three, her name is Murka. What would you recommend?",
         {"reply": "For Murka I recommend Exotic Spa shampoo (277 UAH) and the Exotic Spa "
                   "moisturising lotion (420 UAH) for daily care.",
          "updates": {"pet": {"age_years": 3, "name": "Murka"}},
          "actions": [{"type": "present_products", "skus": ["PR251010", "PR251020"]}]}),
    ]
    closing = [
        ("OK, I'll take the shampoo and two bottles of the lotion.",
         {"reply": "Done: the shampoo and two lotions; with a total over 1000 UAH the Brilliant "
                   "Gloss is our gift. Is that everything?",
          "actions": [{"type": "add_to_cart", "sku": "PR251010"},
                      {"type": "add_to_cart", "sku": "PR251020", "qty": 2}]}),
        ("Yes, that's all.",
         {"reply": "Great! May I have your name and phone number for the manager?",
          "actions": [{"type": "confirm_cart"}]}),
        ("Anna, 066 123 45 67",
         {"reply": "Thank you, Anna! A manager will call you shortly.",
          "updates": {"customer": {"name": "Anna", "phone": "066 123 45 67"}}}),
    ]
    middle = max(0, n - len(turns) - len(closing))
    for i in range(middle):
        turns.append((QUESTIONS[i % len(QUESTIONS)], {"reply": ANSWER}))
    return (turns + closing)[:n]


class Recorder:
    """The scripted model, remembering the prompt tokens of every call."""

    name = "scripted"

    def __init__(self, script: list[tuple[str, dict[str, Any]]]) -> None:
        self.inner = ScriptedModel.from_data({"turns": [out for _, out in script]})
        self.tokens: list[int] = []
        self.prompts: list[tuple[str, str]] = []  # (stage, the chat as one text)
        # (stage, the chat, how many leading messages the next turn repeats)
        self.requests: list[tuple[str, list[dict[str, str]], int]] = []

    async def complete(self, request: ModelRequest) -> Completion:
        completion = await self.inner.complete(request)
        self.tokens.append(completion.prompt_tokens)
        self.prompts.append((request.stage, serialized(request.messages)))
        self.requests.append((request.stage, request.messages, request.stable))
        return completion


def serialized(messages: list[dict[str, str]]) -> str:
    """The chat as one text, in the order a provider reads (and caches) it."""
    return "".join(f"<{m['role']}>\n{m['content']}\n" for m in messages)


def shared_prefix(a: str, b: str) -> int:
    """How many characters ``a`` and ``b`` share from their start."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefix_shares(prompts: list[tuple[str, str]]) -> dict[str, list[float]]:
    """Per stage: for each turn after the first in a run of the same stage, the share of
    its prompt that the previous turn's prompt starts with too."""
    out: dict[str, list[float]] = {}
    for (stage_a, a), (stage_b, b) in zip(prompts, prompts[1:], strict=False):
        if stage_a == stage_b:
            out.setdefault(stage_b, []).append(shared_prefix(a, b) / len(b))
    return out


def claude_reads(requests: list[tuple[str, list[dict[str, str]], int]]
                 ) -> dict[str, tuple[list[float], list[float]]]:
    """Per stage, for each turn after the first in a run of the same stage: the share of
    its prompt Claude reads from its cache with the static prefix marked alone, and with
    the second breakpoint too (engine.llm.cache: the previous turn's last stable message).
    A breakpoint of the previous request is read when the later chat starts with
    everything up to it (the provider's minimum cacheable length aside)."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for (stage_a, a, stable_a), (stage_b, b, _) in zip(requests, requests[1:], strict=False):
        if stage_a != stage_b:
            continue
        later = serialized(b)
        static = serialized(a[:1]) if later.startswith(serialized(a[:1])) else ""
        end = serialized(a[:stable_a]) if stable_a > 1 else ""
        two = end if end and later.startswith(end) else static
        one_list, two_list = out.setdefault(stage_b, ([], []))
        one_list.append(len(static) / len(later))
        two_list.append(len(two) / len(later))
    return out


class AppendOnly:
    """A summarizer that only appends (one line per folded message) until the budget is
    full, then keeps what it has: earlier lines never change."""

    inline = True

    async def summarize(self, previous: str, messages: Any, budget: int) -> str:
        text = previous
        for m in messages:
            line = f"{'Customer' if m.role == 'user' else 'You'}: {' '.join(m.content.split())}"
            if len(text) + len(line) + 3 > budget * 4:
                break
            text = f"{text} | {line}" if text else line
        return text


def baseline_system_prompt() -> str:
    """What a single-prompt (v1) bot sends on every turn: all instructions and the catalog."""
    funnel = load_funnel(ROOT / "funnels" / "puramur.yaml")
    parts = [p.read_text("utf-8") for p in sorted((ROOT / "prompts" / "puramur").glob("*.j2"))]
    assert funnel.catalog is not None
    parts += [f"{p.sku} {p.name}: {p.price} UAH. {p.attributes}" for p in funnel.catalog.products]
    return "\n".join(parts)


async def run(url: str, n: int, system: str, script: list[tuple[str, dict[str, Any]]] | None
              = None, summarizer: Any = None) -> tuple[list[int], list[int], Recorder]:
    script = script or conversation(n)
    model = Recorder(script)
    engine = await Engine.open(ROOT / "funnels" / "puramur.yaml", db=url, model=model,
                               summarizer=summarizer)
    session = f"growth-{n}-{uuid.uuid4().hex[:6]}"
    history: list[dict[str, str]] = []
    baseline: list[int] = []
    try:
        for text, _ in script:
            window = history[-10:]
            baseline.append(estimate_tokens([{"role": "system", "content": system}, *window,
                                             {"role": "user", "content": text}]))
            result = await engine.handle(session, text)
            await engine.drain()  # the summary is written before the next message arrives
            history += [{"role": "user", "content": text},
                        {"role": "assistant", "content": result.reply}]
    finally:
        await engine.close()
    return model.tokens, baseline, model


def mean(values: list[int] | list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest run (tests/test_bench_smoke.py): 12 turns, not 60")
    args = ap.parse_args()
    long = 12 if args.smoke else 60  # the long conversation's turns
    system = baseline_system_prompt()
    with throwaway_schema(server_url(args.db)) as url:
        runs = {n: await run(url, n, system) for n in ((long,) if args.smoke
                                                        else (5, 15, 30, 60))}
        objections = await run(url, 12, system, objection_conversation(12))
        appended = [await run(url, long, system, summarizer=AppendOnly()),
                    await run(url, 12, system, objection_conversation(12), AppendOnly())]
        # What a real model gets: the engine's own observer and reflector, their model
        # played by the loopback fake OpenAI server of tests/ (through litellm).
        os.environ.setdefault("OPENAI_API_KEY", "sk-bench-dummy")
        fake = FakeOpenAI().respond_with(observer_fake).start()
        try:
            observer = ModelSummarizer(LiteLLMModel("openai/fake-model",
                                                    api_base=fake.api_base))
            observed = [await run(url, long, system, summarizer=observer),
                        await run(url, 12, system, objection_conversation(12), observer)]
        finally:
            fake.stop()
    results = {n: (eng, base) for n, (eng, base, _) in runs.items()}
    engine60, base60 = results[long]
    print(f"Prompt tokens per turn, {long}-turn conversation (engine | window-buffer baseline):")
    print(f"{'turn':>5} {'engine':>7} {'baseline':>9}")
    for t in (t for t in (1, 2, 3, 4, 5, 6, 10, 15, 20, 25, 30, 40, 50, 55, 58, 59, 60)
              if t <= long):
        print(f"{t:5d} {engine60[t - 1]:7d} {base60[t - 1]:9d}")
    print(f"\n{'turns':>5} {'engine max':>10} {'engine mean':>11} {'baseline max':>12} "
          f"{'baseline mean':>13}")
    for n, (eng, base) in results.items():
        print(f"{n:5d} {max(eng):10d} {mean(eng):11.0f} {max(base):12d} {mean(base):13.0f}")
    last = slice(max(long - 10, 0), long)  # turns 51-60 of the 60-turn conversation
    early, late = mean(engine60[5:15]), mean(engine60[last])
    b_early, b_late = mean(base60[5:15]), mean(base60[last])
    worst = max(max(e) for e, _ in results.values())
    print(f"\nengine:   turns 6-15 mean {early:.0f}, turns 51-60 mean {late:.0f}, ratio "
          f"{late / early:.2f} (target <= 1.15); largest prompt {worst} (target < 1000)")
    print(f"baseline: turns 6-15 mean {b_early:.0f}, turns 51-60 mean {b_late:.0f}, ratio "
          f"{b_late / b_early:.2f}; first turn {base60[0]}, largest {max(base60)}")
    print("\nShared prefix of consecutive prompts in the same stage (share of the later prompt; "
          "target >= 70% on presentation and objection_handling with the observer):")
    print(f"{'stage':>20} {'pairs':>5} {'mean':>6} {'min':>6}   summary")
    for label, pair in (("extractive (scripted model: offline, never cached)",
                         (runs[max(runs)], objections)),
                        ("bench append-only", appended),
                        ("observer (real-model default)", observed)):
        shares = prefix_shares(pair[0][2].prompts)
        for stage, values in prefix_shares(pair[1][2].prompts).items():
            shares.setdefault(stage, []).extend(values)
        for stage, values in shares.items():
            print(f"{stage:>20} {len(values):5d} {mean(values):6.0%} {min(values):6.0%}   {label}")
    print("\nWhat Claude reads from its cache, consecutive prompts in the same stage (share of "
          "the later prompt, mean; observer runs): static prefix marked alone | with the "
          "second breakpoint (the conversation's end)")
    reads = claude_reads(observed[0][2].requests)
    for stage, (one, two) in claude_reads(observed[1][2].requests).items():
        reads.setdefault(stage, ([], []))[0].extend(one)
        reads[stage][1].extend(two)
    print(f"{'stage':>20} {'pairs':>5} {'static':>7} {'two':>6}")
    for stage, (one, two) in reads.items():
        print(f"{stage:>20} {len(one):5d} {mean(one):7.0%} {mean(two):6.0%}")


if __name__ == "__main__":
    asyncio.run(main())
