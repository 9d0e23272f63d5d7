"""Input tokens per turn, counted by the model's own tokenizer, in Ukrainian, Russian and English.

    python bench/tokens.py [--db URL] [--turns 60]

Plays the same Puramur conversation in three languages with the scripted model and
counts, with ``litellm.token_counter`` (offline: gpt-4o-mini's o200k tokenizer and
Claude's tokenizer, which litellm ships), in the same run:

* ``engine``: what the engine sends each turn (the stage prompt from compact state, the
  window, the summary, the turn's data block), captured at the model;
* ``baseline``: the seed's window-buffer shape: one system prompt with every stage's
  instructions and the whole catalog, plus the last 10 messages.

Targets (issue 32): at turn 15 the engine sends at most a quarter of the baseline's input
tokens; the mean of turns 51-60 within 15% of turns 6-15; and, on the providers' caching
rules, at least 80% of each prompt in the same stage readable from the cache. The rules
applied: OpenAI caches a prompt of 1,024 tokens or more, its longest shared prefix in
steps of 128 tokens; Claude reads up to the last cache breakpoint the later prompt starts
with (the engine marks the static prefix and the end of the stable conversation,
engine.llm.cache), when that prefix is at least 1,024 tokens (Sonnet; Haiku: 2,048).
Prompts shorter than the minimum are not cached at all, which the table shows.

A second table compares the counts the prompt budget can use, on the same prompts: the
4-characters estimate (``engine.records.messages.estimate_tokens``, what a model without
a tokenizer gets), and the engine's count with a real model (``LiteLLMModel.count_tokens``:
:class:`engine.llm.tokens.MessageCounts` over ``litellm.token_counter``, each message
counted once), with the CPU time each costs a turn (``time.process_time``, all turns of
the conversation, one counter for the conversation as a worker keeps one per model).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from _db import server_url, throwaway_schema  # noqa: E402
from prompt_growth import Recorder, baseline_system_prompt, serialized, shared_prefix  # noqa: E402

from engine import Engine  # noqa: E402
from engine.llm.tokens import MessageCounts  # noqa: E402
from engine.records.messages import estimate_tokens  # noqa: E402

OPENAI, CLAUDE = "gpt-4o-mini", "claude-3-5-sonnet-20241022"
OPENAI_MIN, OPENAI_STEP, CLAUDE_MIN = 1024, 128, 1024

# The conversation of bench/prompt_growth.py, in each language: the first three turns, the
# questions of the middle (repeated to length), and the three closing turns.
SCRIPTS: dict[str, dict[str, Any]] = {
    "uk": {
        "opening": [
            ("Привіт! Мені потрібна порада для моєї кішки.",
             "Вітаю! Я консультант Puramur. У вас кішка чи собака?"),
            ("Кішка, сфінкс. Останнім часом у неї дуже суха шкіра, лущиться.",
             "Шкіра сфінкса потребує делікатного догляду. Скільки їй років і як її звати?"),
            ("Їй три роки, звати Мурка. Що порадите?",
             "Для Мурки раджу шампунь Exotic Spa (277 грн) і зволожувальний лосьйон Exotic "
             "Spa (420 грн) для щоденного догляду."),
        ],
        "questions": [
            "Як часто можна мити шампунем кішку з такою сухою шкірою?",
            "Чи це безпечно, якщо вона оближе шерсть одразу після купання?",
            "У лосьйону сильний запах? Вона не терпить парфумів.",
            "Чи можна його використовувати разом із ліками, які ветеринар дав минулого місяця?",
            "На скільки вистачає однієї пляшки для такої маленької кішки, як моя?",
            "Які основні інгредієнти, є щось натуральне?",
            "Чи допоможе він і з лупою на спині?",
            "Сушити її рушником чи феном після купання?",
        ],
        "answer": "Гарне запитання. Для сфінкса із сухою шкірою — купання раз на тиждень теплою "
                  "водою, добре змийте й висушіть м'яким рушником; засіб делікатний, без "
                  "запаху й безпечний, якщо вона трохи оближеться. Пляшки вистачає приблизно "
                  "на два місяці.",
        "closing": [
            ("Добре, візьму шампунь і дві пляшки лосьйону.",
             "Готово: шампунь і два лосьйони; із сумою понад 1000 грн Brilliant Gloss — наш "
             "подарунок. Це все?"),
            ("Так, це все.", "Чудово! Можна ваше ім'я та номер телефону для менеджера?"),
            ("Анна, 066 123 45 67", "Дякую, Анно! Менеджер незабаром вам зателефонує."),
        ],
        "name": "Анна",
    },
    "ru": {
        "opening": [
            ("Здравствуйте! Мне нужен совет для моей кошки.",
             "Здравствуйте! Я консультант Puramur. У вас кошка или собака?"),
            ("Кошка, сфинкс. В последнее время у неё очень сухая кожа, шелушится.",
             "Коже сфинкса нужен деликатный уход. Сколько ей лет и как её зовут?"),
            ("Ей три года, зовут Мурка. Что посоветуете?",
             "Для Мурки советую шампунь Exotic Spa (277 грн) и увлажняющий лосьон Exotic Spa "
             "(420 грн) для ежедневного ухода."),
        ],
        "questions": [
            "Как часто можно мыть шампунем кошку с такой сухой кожей?",
            "Это безопасно, если она оближет шерсть сразу после купания?",
            "У лосьона сильный запах? Она не выносит духов.",
            "Можно ли его использовать вместе с лекарством, которое ветеринар дал в прошлом месяце?",
            "На сколько хватает одной бутылки для такой маленькой кошки, как моя?",
            "Какие основные ингредиенты, есть что-то натуральное?",
            "Поможет ли он и с перхотью на спине?",
            "Сушить её полотенцем или феном после купания?",
        ],
        "answer": "Хороший вопрос. Для сфинкса с сухой кожей — купание раз в неделю тёплой "
                  "водой, хорошо смойте и высушите мягким полотенцем; средство деликатное, без "
                  "запаха и безопасное, если она немного оближется. Бутылки хватает примерно на "
                  "два месяца.",
        "closing": [
            ("Хорошо, возьму шампунь и две бутылки лосьона.",
             "Готово: шампунь и два лосьона; при сумме больше 1000 грн Brilliant Gloss — наш "
             "подарок. Это всё?"),
            ("Да, это всё.", "Отлично! Можно ваше имя и номер телефона для менеджера?"),
            ("Анна, 066 123 45 67", "Спасибо, Анна! Менеджер скоро вам перезвонит."),
        ],
        "name": "Анна",
    },
    "en": {
        "opening": [
            ("Hi! I need some advice for my cat.",
             "Hello! I'm the Puramur consultant. Is your pet a cat or a dog?"),
            ("A cat, a Sphynx. Her skin is very dry and flaky lately.",
             "Sphynx skin needs gentle care. How old is she, and what's her name?"),
            ("She is three, her name is Murka. What would you recommend?",
             "For Murka I recommend Exotic Spa shampoo (277 UAH) and the Exotic Spa "
             "moisturising lotion (420 UAH) for daily care."),
        ],
        "questions": [
            "How often should I use the shampoo on a cat with such dry skin?",
            "Is it safe if she licks her fur right after the bath?",
            "Does the lotion have a strong smell? She hates perfumes.",
            "Can I use it together with the medicine the vet gave us last month?",
            "How long does one bottle last for a small cat like mine?",
            "What are the main ingredients, anything natural in there?",
            "Will it help with the dandruff on her back too?",
            "Should I dry her with a towel or a hair dryer afterwards?",
        ],
        "answer": "Good question. For a Sphynx with dry skin, bathe once a week with lukewarm "
                  "water, rinse well and dry with a soft towel; the formula is gentle, "
                  "fragrance-free and safe if she licks a little. One bottle lasts about two "
                  "months at that pace.",
        "closing": [
            ("OK, I'll take the shampoo and two bottles of the lotion.",
             "Done: the shampoo and two lotions; with a total over 1000 UAH the Brilliant "
             "Gloss is our gift. Is that everything?"),
            ("Yes, that's all.", "Great! May I have your name and phone number for the manager?"),
            ("Anna, 066 123 45 67", "Thank you, Anna! A manager will call you shortly."),
        ],
        "name": "Anna",
    },
}


def conversation(language: str, n: int) -> list[tuple[str, dict[str, Any]]]:
    """(customer message, model output) for an n-turn conversation in ``language``."""
    s = SCRIPTS[language]
    (t1, r1), (t2, r2), (t3, r3) = s["opening"]
    turns: list[tuple[str, dict[str, Any]]] = [
        (t1, {"reply": r1, "language": language}),
        (t2, {"reply": r2, "language": language,
              "updates": {"pet": {"type": "cat", "breed": "Sphynx", "problems": ["dry_skin"]}}}),
        (t3, {"reply": r3, "language": language,
              "updates": {"pet": {"age_years": 3, "name": "Murka"}},
              "actions": [{"type": "present_products", "skus": ["PR251010", "PR251020"]}]}),
    ]
    (c1, q1), (c2, q2), (c3, q3) = s["closing"]
    closing: list[tuple[str, dict[str, Any]]] = [
        (c1, {"reply": q1, "language": language,
              "actions": [{"type": "add_to_cart", "sku": "PR251010"},
                          {"type": "add_to_cart", "sku": "PR251020", "qty": 2}]}),
        (c2, {"reply": q2, "language": language, "actions": [{"type": "confirm_cart"}]}),
        (c3, {"reply": q3, "language": language,
              "updates": {"customer": {"name": s["name"], "phone": "066 123 45 67"}}}),
    ]
    for i in range(max(0, n - len(turns) - len(closing))):
        turns.append((s["questions"][i % len(s["questions"])],
                      {"reply": s["answer"], "language": language}))
    return (turns + closing)[:n]


def count(model: str, messages: list[dict[str, str]]) -> int:
    import litellm

    return int(litellm.token_counter(model=model, messages=messages))


def count_text(model: str, text: str) -> int:
    import litellm

    return int(litellm.token_counter(model=model, text=text)) if text else 0


def cached(model: str, earlier: tuple[list[dict[str, str]], int], later: list[dict[str, str]],
           later_tokens: int) -> int:
    """The tokens of ``later`` a provider reads from its cache after ``earlier``."""
    a, stable = earlier
    if model == OPENAI:
        if later_tokens < OPENAI_MIN:
            return 0
        prefix = serialized(later)[:shared_prefix(serialized(a), serialized(later))]
        tokens = min(count_text(model, prefix), later_tokens)
        return tokens // OPENAI_STEP * OPENAI_STEP if tokens >= OPENAI_MIN else 0
    text = serialized(later)
    marks = [serialized(a[:1])] + ([serialized(a[:stable])] if stable > 1 else [])
    read = [m for m in marks if text.startswith(m)]
    if not read:
        return 0
    tokens = min(count_text(model, read[-1]), later_tokens)
    return tokens if tokens >= CLAUDE_MIN else 0


def stable_prefixes(model: str, recorder: Recorder
                    ) -> dict[str, tuple[int, list[int], list[int]]]:
    """Per stage: its turns, each prompt's tokens, and for each turn after the first in a
    run of the stage the tokens of the prefix it shares byte for byte with the turn before."""
    out: dict[str, tuple[int, list[int], list[int]]] = {}
    previous: tuple[str, str] | None = None
    for stage, messages, _ in recorder.requests:
        text = serialized(messages)
        turns, prompt, prefix = out.setdefault(stage, (0, [], []))
        prompt.append(count(model, messages))
        if previous is not None and previous[0] == stage:
            prefix.append(count_text(model, text[:shared_prefix(previous[1], text)]))
        out[stage] = (turns + 1, prompt, prefix)
        previous = (stage, text)
    return out


async def play(url: str, language: str, n: int, system: str
               ) -> tuple[Recorder, list[list[dict[str, str]]]]:
    script = conversation(language, n)
    model = Recorder(script)
    engine = await Engine.open(ROOT / "funnels" / "puramur.yaml", db=url, model=model)
    session = f"tokens-{language}-{uuid.uuid4().hex[:6]}"
    history: list[dict[str, str]] = []
    baseline: list[list[dict[str, str]]] = []
    try:
        for text, _ in script:
            baseline.append([{"role": "system", "content": system}, *history[-10:],
                             {"role": "user", "content": text}])
            result = await engine.handle(session, text)
            await engine.drain()
            history += [{"role": "user", "content": text},
                        {"role": "assistant", "content": result.reply}]
    finally:
        await engine.close()
    return model, baseline


def counting(tokenizer: str, prompts: list[list[dict[str, str]]]) -> dict[str, Any]:
    """Turn 15's count and the CPU a turn's count costs: the estimate, litellm on the whole
    prompt, and the engine's counter."""
    import litellm

    whole = lambda m: int(litellm.token_counter(model=tokenizer, messages=m))  # noqa: E731
    engine = MessageCounts(whole, tokenizer)
    out: dict[str, Any] = {}
    for name, count in (("estimate", estimate_tokens), ("litellm", whole), ("engine", engine)):
        start = time.process_time()
        counts = [count(m) for m in prompts]
        out[name] = (counts[14], (time.process_time() - start) / len(prompts) * 1e6)
    return out


def mean(values: list[int] | list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    ap.add_argument("--turns", type=int, default=60)
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest run (tests/test_bench_smoke.py): English, one tokenizer")
    args = ap.parse_args()
    if args.turns < 15:
        ap.error(f"--turns {args.turns}: at least 15 (the targets read turn 15)")
    system = baseline_system_prompt()
    rows = []
    stages: list[tuple[str, str, dict[str, tuple[int, list[int], list[int]]]]] = []
    with throwaway_schema(server_url(args.db)) as url:
        for language in ("en",) if args.smoke else ("uk", "ru", "en"):
            recorder, baseline = await play(url, language, args.turns, system)
            for tokenizer in (OPENAI,) if args.smoke else (OPENAI, CLAUDE):
                engine = [count(tokenizer, m) for _, m, _ in recorder.requests]
                base = [count(tokenizer, m) for m in baseline]
                shares: list[float] = []
                for (stage_a, a, stable_a), (stage_b, b, _), tokens_b in zip(
                        recorder.requests, recorder.requests[1:], engine[1:], strict=False):
                    if stage_a == stage_b:
                        shares.append(cached(tokenizer, (a, stable_a), b, tokens_b) / tokens_b)
                estimate = [t for t in recorder.tokens]
                rows.append((language, tokenizer, engine, base, shares, estimate,
                             counting(tokenizer, [m for _, m, _ in recorder.requests])))
                stages.append((language, tokenizer, stable_prefixes(tokenizer, recorder)))
    print(f"Input tokens per turn, counted by the model's tokenizer ({args.turns}-turn "
          "conversations, the engine against the window-buffer baseline)\n")
    print("| language | tokenizer | engine t15 | baseline t15 | engine / baseline (target ≤ 0.25) "
          "| engine t6-15 | engine t51-60 | ratio (target ≤ 1.15) | the 4-chars estimate, t15 "
          "| cached, same stage (mean; min) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for language, tokenizer, engine, base, shares, estimate, _ in rows:
        early, late = mean(engine[5:15]), mean(engine[50:60])
        ratio = f"{late / early:.2f}" if len(engine) >= 60 else "-"
        print(f"| {language} | {tokenizer} | {engine[14]} | {base[14]} | {engine[14] / base[14]:.2f} "
              f"| {early:.0f} | {late:.0f} | {ratio} | {estimate[14]} "
              f"| {mean(shares):.0%}; {min(shares):.0%} |")
    print("\nThe prompt budget's count of turn 15's prompt, and its CPU per turn (µs)\n")
    print("| language | tokenizer | estimate t15 | engine t15 | litellm t15 | estimate / engine "
          "| µs: estimate | µs: litellm, whole prompt | µs: engine (each message once) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for language, tokenizer, *_, c in rows:
        (e, e_us), (w, w_us), (n, n_us) = c["estimate"], c["litellm"], c["engine"]
        print(f"| {language} | {tokenizer} | {e} | {n} | {w} | {e / n:.2f} | {e_us:.0f} "
              f"| {w_us:.0f} | {n_us:.0f} |")
    print("\nPer stage: the stable prefix, the start of a prompt byte-identical to the previous "
          "turn's prompt in the same stage (what a prefix cache could read), in tokens; the "
          f"providers read a cache only past {OPENAI_MIN} tokens (OpenAI; Claude Sonnet "
          f"{CLAUDE_MIN}, Haiku 2,048)\n")
    print("| language | tokenizer | stage | turns | prompt (mean) | stable prefix (mean; min) "
          "| share of the prompt (mean; min) | cacheable |")
    print("|---|---|---|---|---|---|---|---|")
    for language, tokenizer, per_stage in stages:
        for stage, (turns, prompt, prefix) in per_stage.items():
            share = [p / t for p, t in zip(prefix, prompt[1:], strict=False)]
            cacheable = ("-" if not prefix else f"no: prefix under {CLAUDE_MIN}"
                         if max(prefix) < CLAUDE_MIN else "yes" if min(prefix) >= CLAUDE_MIN
                         else "some turns")
            print(f"| {language} | {tokenizer} | {stage} | {turns} | {mean(prompt):.0f} "
                  + (f"| {mean(prefix):.0f}; {min(prefix)} | {mean(share):.0%}; {min(share):.0%} "
                     if prefix else "| - | - ") + f"| {cacheable} |")


if __name__ == "__main__":
    asyncio.run(main())
