"""Model calls: any litellm model, or the offline scripted model.

litellm takes seconds of CPU to import, so it is imported only when a real
model is constructed; ``funnel validate``, ``funnel test`` and the scripted
model never import it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ModelError
from ..format import _yaml
from ..records.messages import estimate_tokens
from ..sandbox.patterns import PatternRefused, compile_linear
from .client import Caller, close_clients
from .request import Completion, Model, ModelRequest
from .strategy import CHOICES
from .tokens import MessageCounts

__all__ = ["Completion", "LiteLLMModel", "Model", "ModelRequest", "ScriptedModel", "make_model"]

# -- the scripted model ----------------------------------------------------------------

STREAM_PIECE = 8  # characters of a scripted answer per streamed piece


@dataclass
class ScriptEntry:
    output: Any
    repair: Any = None
    error: str | None = None
    # The outputs as the model would send them, serialized once.
    _texts: tuple[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        first = _as_text(self.output)
        self._texts = (first, _as_text(self.repair) if self.repair is not None else first)

    def text(self, repair: bool) -> str:
        return self._texts[1 if repair else 0]


def _as_text(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)


@dataclass
class ScriptedModel:
    """Replays model outputs from a file, offline, through the same validation path.

    The file (YAML or JSON) holds ``turns`` (the N-th customer message of a
    session gets the N-th entry), ``match`` (``{pattern, output}``, tried first,
    against the customer's text) and ``default``. An entry is an output
    envelope (``{reply, updates, actions}``), a raw string (to test bad
    output), ``{output: X, repair: Y}`` (Y answers the repair call), or
    ``{error: message}`` (the call fails). Token counts are estimated with
    :func:`engine.turn.prompts.estimate_tokens`. ``delay: SECONDS`` makes every call
    take that long, like a remote model (for load tests; none by default). A request
    that streams (``on_text``) gets the text in pieces of :data:`STREAM_PIECE` characters,
    ``chunk_delay: SECONDS`` apart (none by default), so that streaming can be tried offline.
    """

    turns: list[ScriptEntry] = field(default_factory=list)
    match: list[tuple[re.Pattern[str], ScriptEntry]] = field(default_factory=list)
    default: ScriptEntry | None = None
    name: str = "scripted"
    delay: float = 0.0
    chunk_delay: float = 0.0

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedModel:
        path = Path(path)
        try:
            data = _yaml.load(path.read_text("utf-8")).data
        except OSError as exc:
            raise ConfigError(f"cannot read the script: {exc.strerror or exc}",
                              file=str(path)) from None
        except _yaml.YamlSyntaxError as exc:
            raise ConfigError(str(exc), file=str(path), line=exc.line) from None
        if isinstance(data, list):
            data = {"turns": data}
        if not isinstance(data, dict):
            raise ConfigError("a script is a list of outputs or a mapping with `turns`, "
                              "`match` and `default`", file=str(path))
        turns = data.get("turns")
        if "scenario" in data or (isinstance(turns, list) and any(
                isinstance(t, dict) and {"customer", "llm"} <= t.keys() for t in turns)):
            # A scenario (`funnel test`) replays model outputs too: serve its `llm:` answers,
            # the N-th to the N-th customer message.
            data = {"turns": [t.get("llm") if isinstance(t, dict) else t
                              for t in (turns if isinstance(turns, list) else [])]}
        try:
            model = cls.from_data(data)
        except (TypeError, ValueError) as exc:  # serialized once, when the entry is built
            raise ConfigError(
                f"the script holds an output that cannot be sent as a model answer ({exc}): a "
                "script is a list of model outputs (`{reply: ..., updates: ..., actions: "
                "[...]}`, a raw string, `{output, repair}` or `{error}`), or a scenario file",
                file=str(path)) from None
        model.name = f"scripted:{path.name}"
        return model

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> ScriptedModel:
        match = []
        for item in data.get("match") or []:
            try:
                # RE2: customer text is matched against it (linear time, never ReDoS).
                match.append((compile_linear(str(item["pattern"])), _entry(item["output"])))
            except (KeyError, TypeError, PatternRefused) as exc:
                raise ConfigError(f"bad `match` entry {item!r}: {exc}") from None
        default = data.get("default")
        return cls(
            turns=[_entry(x) for x in data.get("turns") or []],
            match=match,
            default=_entry(default) if default is not None else None,
            delay=_seconds(data, "delay"),
            chunk_delay=_seconds(data, "chunk_delay"),
        )

    def pick(self, request: ModelRequest) -> ScriptEntry:
        for pattern, entry in self.match:
            if pattern.search(request.user_text):
                return entry
        if 1 <= request.turn <= len(self.turns):
            return self.turns[request.turn - 1]
        if self.default is not None:
            return self.default
        raise ModelError(f"the script has no output for turn {request.turn} of session "
                         f"{request.session_id!r} (and no `default`)")

    async def complete(self, request: ModelRequest) -> Completion:
        started = time.perf_counter()
        entry = self.pick(request)
        if self.delay:
            await asyncio.sleep(self.delay)
        if entry.error:
            raise ModelError(entry.error)
        text = entry.text(bool(request.attempt))
        if request.on_text is not None:
            request.on_text("")  # an attempt begins
            for start in range(0, len(text), STREAM_PIECE):
                request.on_text(text[start:start + STREAM_PIECE])
                # Each piece is its own step of the loop, as a network stream's are.
                await asyncio.sleep(self.chunk_delay)
        return Completion(
            text=text,
            prompt_tokens=estimate_tokens(request.messages),
            completion_tokens=estimate_tokens([{"content": text}]) - 6,
            model=self.name,
            latency_ms=(time.perf_counter() - started) * 1000,
        )


def _seconds(data: Mapping[str, Any], key: str) -> float:
    try:
        value = float(data.get(key) or 0)
    except (TypeError, ValueError):
        raise ConfigError(f"`{key}` must be a number of seconds; got {data.get(key)!r}"
                          ) from None
    if value < 0:
        raise ConfigError(f"`{key}` must not be negative; got {value:g}")
    return value


def _entry(raw: Any) -> ScriptEntry:
    if isinstance(raw, dict) and "error" in raw and "reply" not in raw:
        return ScriptEntry(output=None, error=str(raw["error"]))
    if isinstance(raw, dict) and "output" in raw and "reply" not in raw:
        return ScriptEntry(output=raw["output"], repair=raw.get("repair"))
    return ScriptEntry(output=raw)


log = logging.getLogger("funnel.models")

# A chat completion's shape, for the warm-up's parse (no request is made).
_SAMPLE_COMPLETION: dict[str, Any] = {
    "id": "warm-up", "object": "chat.completion", "created": 0, "model": "warm-up",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "{}"}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


# -- litellm ---------------------------------------------------------------------------


class LiteLLMModel:
    """Any model litellm can call (``gpt-4o-mini``, ``openai/...`` with an api_base, ...).

    The structured-output strategy, retries, the turn deadline and fallback
    models are :mod:`engine.llm`'s; ``structured_output`` overrides the funnel's
    ``model.structured_output``.
    """

    def __init__(self, name: str, *, api_base: str | None = None,
                 structured_output: str | None = None, api_key: str | None = None) -> None:
        # Never fetch the cost map (or Anthropic's beta headers) from the network.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        os.environ.setdefault("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True")
        import litellm  # seconds to import: only a real model pays it

        if structured_output is not None and structured_output not in CHOICES:
            raise ConfigError(f"structured output {structured_output!r} is not one of "
                              f"{', '.join(CHOICES)} (see docs/models.md)")
        # litellm print()s "Provider List: ..." and "Give Feedback / Get Help ..." to
        # stdout on failed calls and on cost look-ups of unmapped models; that would
        # corrupt `funnel chat`'s one-reply-a-line output. Errors still raise.
        litellm.suppress_debug_info = True
        # What a provider's response may decode to is bounded (a gzip bomb: the fallback).
        from . import bounded  # httpx takes half a second to import: a real model pays it

        bounded.install(litellm)
        self._litellm = litellm
        self.name = name
        self.api_base = api_base
        self.caller = Caller(litellm, name, api_base=api_base,
                             structured_output=structured_output, api_key=api_key)
        self._tokens = MessageCounts(
            lambda messages: int(litellm.token_counter(model=name, messages=list(messages))),
            name)

    def count_tokens(self, messages: Sequence[Mapping[str, str]]) -> int:
        """The prompt's tokens by the model's tokenizer (``litellm.token_counter``, offline:
        litellm ships OpenAI's and falls back to cl100k for models it has none for); each
        message's count is kept (engine.llm.tokens)."""
        return self._tokens(messages)

    async def complete(self, request: ModelRequest) -> Completion:
        return await self.caller.complete(request)

    def load_tokenizer(self) -> None:
        """Load the model's tokenizer now (over a second for o200k, ~110 MB with litellm's
        default cl100k). No thread is started: `funnel serve` calls it before it forks its
        workers, which then share it (engine.service.server.preload)."""
        self.count_tokens([])

    def warm(self) -> None:
        """Build now what litellm builds on its first call (its response types, the
        provider's modules), through its own ``mock_response``: no request leaves the
        process. Without it the first customer's turn after a start pays about a second
        (bench/start.py). Blocking: ``Engine.open`` runs it in a thread."""
        try:
            self.load_tokenizer()  # at once where the master of `funnel serve` loaded it
            self._litellm.completion(model=self.name, api_base=self.api_base,
                                     messages=[{"role": "user", "content": "warm-up"}],
                                     mock_response='{"reply": ""}')
            # The OpenAI SDK (litellm's client for OpenAI-compatible servers) builds its
            # response types on the first response it parses: build them now too.
            from openai.types.chat import ChatCompletion  # litellm has imported it

            ChatCompletion.construct(**_SAMPLE_COMPLETION)
        except Exception as exc:  # a failed warm-up costs the first turn its second, no more
            log.debug("litellm warm-up for %s failed: %s", self.name, exc)
    async def aclose(self) -> None:
        """Close litellm's HTTP clients, on the loop that used them (a service stopping)."""
        await close_clients(self._litellm)


def make_model(name: str, *, api_base: str | None = None,
               structured_output: str | None = None, api_key: str | None = None) -> Model:
    """``scripted:PATH`` for the offline model, otherwise a litellm model string (called
    with ``api_key`` when given, else the provider's key from the environment)."""
    if name.startswith("scripted:"):
        return ScriptedModel.from_file(name.removeprefix("scripted:"))
    if name == "scripted":
        raise ConfigError(
            "no model to call: the funnel names none (`model.name`) and none was given. Give "
            "`--model` a litellm model string (e.g. `gpt-4o-mini`, its API key in the "
            "environment; or set $FUNNEL_MODEL), or `scripted:PATH` for the offline model (a "
            "file of model outputs, or a scenario file); in the studio, answer as the model "
            "yourself (\"I am the model\")")
    return LiteLLMModel(name, api_base=api_base, structured_output=structured_output,
                        api_key=api_key)
