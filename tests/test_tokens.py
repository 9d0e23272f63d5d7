"""Token counts by the model's own tokenizer (engine.llm.tokens), through the real litellm
path against tests/fake_openai.py: the fake server reports, as a provider does, the prompt
tokens it received counted by gpt-4o-mini's tokenizer (tiktoken o200k_base, OpenAI's chat
framing), and the engine's prompt budget must agree with it in Ukrainian and Russian, where
the 4-characters estimate under-counts about twice.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from conftest import PURAMUR

from engine.llm.models import ScriptedModel, make_model
from engine.llm.tokens import MessageCounts, token_counter
from engine.records.messages import estimate_tokens

pytestmark = pytest.mark.postgres

MODEL = "openai/gpt-4o-mini"

CONVERSATIONS = {
    "uk": [("Привіт! Мені потрібна порада для моєї кішки.",
            "Вітаю! Я консультант Puramur. У вас кішка чи собака?"),
           ("Кішка, сфінкс. Останнім часом у неї дуже суха шкіра, лущиться.",
            "Шкіра сфінкса потребує делікатного догляду. Скільки їй років і як її звати?"),
           ("Їй три роки, звати Мурка. Що порадите?",
            "Для Мурки раджу шампунь Exotic Spa і зволожувальний лосьйон для догляду."),
           ("А як часто її купати? Боюся пересушити шкіру ще більше.",
            "Раз на тиждень теплою водою, після купання — лосьйон на ще вологу шкіру.")],
    "ru": [("Здравствуйте! Мне нужен совет для моей кошки.",
            "Здравствуйте! Я консультант Puramur. У вас кошка или собака?"),
           ("Кошка, сфинкс. В последнее время у неё очень сухая кожа, шелушится.",
            "Коже сфинкса нужен деликатный уход. Сколько ей лет и как её зовут?"),
           ("Ей три года, зовут Мурка. Что посоветуете?",
            "Для Мурки советую шампунь Exotic Spa и увлажняющий лосьон для ухода."),
           ("А как часто её купать? Боюсь ещё больше пересушить кожу.",
            "Раз в неделю тёплой водой, после купания — лосьон на ещё влажную кожу.")],
}

@functools.cache
def _o200k() -> tiktoken.Encoding:
    # litellm's first count points tiktoken at the tokenizer files it ships
    # (TIKTOKEN_CACHE_DIR); without it tiktoken would download them.
    import litellm

    litellm.token_counter(model="gpt-4o-mini", text="x")
    return tiktoken.get_encoding("o200k_base")


def provider_count(messages: list[dict[str, Any]]) -> int:
    """The prompt tokens as OpenAI counts a chat for gpt-4o: 3 per message, its role and
    content, 3 for the reply's priming (the cookbook's num_tokens_from_messages)."""
    o200k = _o200k()
    return 3 + sum(3 + len(o200k.encode(m["role"])) + len(o200k.encode(m["content"]))
                   for m in messages)


class Counted:
    """What the engine's budget counted, turn by turn: the model's count_tokens, seen."""

    def __init__(self, model: Any) -> None:
        self.model, self.counts = model, []
        self.inner = model.count_tokens
        model.count_tokens = self

    def __call__(self, messages: Any) -> int:
        tokens = int(self.inner(messages))
        self.counts.append(([dict(m) for m in messages], tokens))
        return tokens


@pytest.mark.parametrize("language", ["uk", "ru"])
async def test_the_budget_counts_prompts_as_the_provider_does(
        language: str, db_url: str, fake_llm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import litellm

    from engine.llm.models import LiteLLMModel
    from engine.turn.engine import Engine

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-dummy")
    script = CONVERSATIONS[language]
    replies = iter(reply for _, reply in script)
    fake_llm.respond_with(lambda body: json.dumps({"reply": next(replies),
                                                   "language": language}))
    fake_llm.count_prompts(provider_count)
    model = LiteLLMModel(MODEL, api_base=fake_llm.api_base)
    seen = Counted(model)
    engine = await Engine.open(PURAMUR, db=db_url, model=model)
    results = []
    try:
        for text, _ in script:
            results.append(await engine.handle(f"tokens-{language}", text))
            await engine.drain()
    finally:
        await engine.close()
    assert len(fake_llm.requests) == len(script)
    for body, result in zip(fake_llm.requests, results, strict=True):
        sent = [{"role": m["role"], "content": m["content"]} for m in body["messages"]]
        provider = provider_count(sent)
        [counted] = [tokens for messages, tokens in seen.counts if messages == sent]
        # The budget's figure, within 5% of the provider's tokenizer.
        assert abs(counted - provider) <= 0.05 * provider, (counted, provider)
        # Each message counted once and kept: the same as litellm counting the whole prompt.
        assert counted == litellm.token_counter(model=MODEL, messages=sent)
        # The turn record keeps the provider's usage, not the engine's count.
        assert result.prompt_tokens == provider
    # The conversation's own words: the 4-characters estimate says 0.64 (uk) and 0.80 (ru)
    # of what o200k counts (the stage prompt, in English, it counts about right).
    words = [w for pair in script for w in pair]
    assert sum(-(-len(w) // 4) for w in words) < 0.85 * sum(len(_o200k().encode(w))
                                                            for w in words)
    # Offline: litellm's own copy of the tokenizer files, no download.
    assert Path(os.environ["TIKTOKEN_CACHE_DIR"]).is_relative_to(Path(litellm.__file__).parent)


def test_a_model_without_a_tokenizer_is_counted_by_the_estimate() -> None:
    model = ScriptedModel.from_data({"default": {"reply": "ok"}})
    assert token_counter(model) is estimate_tokens


def test_a_tokenizer_that_fails_falls_back_to_the_estimate_for_good(
        caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def broken(messages: Any) -> int:
        calls.append(messages)
        raise KeyError("no tokenizer for this model")

    count = MessageCounts(broken, "unknown/model")
    messages = [{"role": "user", "content": "Привіт, у мене кіт"}]
    assert count(messages) == estimate_tokens(messages) and count.fallback
    assert count(messages) == estimate_tokens(messages) and len(calls) == 1  # not asked again
    assert "unknown/model" in caplog.text and "estimate" in caplog.text


def test_each_message_is_counted_once() -> None:
    calls: list[int] = []

    def exact(messages: Any) -> int:
        return 3 + sum(4 + len(m["content"]) for m in messages)

    def count_all(messages: Any) -> int:
        calls.append(len(messages))
        return exact(messages)

    count = MessageCounts(count_all, "m", size=2)
    a, b, c = ({"role": "user", "content": x} for x in ("a", "bb", "ccc"))
    assert count([a, b]) == exact([a, b]) and count([a, b, c]) == exact([a, b, c])
    assert calls == [1, 2, 1, 1, 1]  # the probe (twice), then a, b, c once each
    count([a])  # size 2: a was the oldest kept, so it is counted again
    assert calls[-1] == 1 and len(calls) == 6


_PRELOAD_THEN_FORK = """
import multiprocessing, sys, tiktoken
from engine.llm.models import make_model
from engine.service.server import preload

MODEL, BASE, TEXT = sys.argv[1], "http://127.0.0.1:9/v1", [{"role": "user", "content": "Привіт, котику"}]
assert "o200k_base" not in tiktoken.registry.ENCODINGS
preload([], MODEL, BASE)
print("loaded before the fork:", "o200k_base" in tiktoken.registry.ENCODINGS)

def child(queue):
    queue.put(make_model(MODEL, api_base=BASE).count_tokens(TEXT))

context = multiprocessing.get_context("fork")
queue = context.Queue()
process = context.Process(target=child, args=(queue,))
process.start()
process.join(60)
print("child:", process.exitcode, queue.get(timeout=5))
"""


def test_serve_loads_the_tokenizer_before_it_forks_and_the_workers_count_with_it() -> None:
    """`funnel serve --workers N` loads each model's tokenizer in the master (about 110 MB
    that the workers then share, bench/start.py): a forked worker counts with it, as
    many tokens as the tokenizer itself makes of the message (a fresh process: nothing
    loaded before the preload)."""
    out = subprocess.run([sys.executable, "-c", _PRELOAD_THEN_FORK, MODEL], capture_output=True,
                         text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent,
                         env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert out.returncode == 0, out.stderr[-2000:]
    unforked = make_model(MODEL, api_base="http://127.0.0.1:9/v1")
    expected = unforked.count_tokens([{"role": "user", "content": "Привіт, котику"}])  # type: ignore[attr-defined]
    assert expected > len(_o200k().encode("Привіт, котику"))  # the framing counted too
    assert out.stdout.splitlines() == ["loaded before the fork: True", f"child: 0 {expected}"]
