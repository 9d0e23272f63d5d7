"""One model call through litellm: strategy, retries, deadline, fallback models, cost.

:class:`Caller` is what :class:`engine.llm.models.LiteLLMModel` delegates to. For
a request it tries the primary model and then each of ``model.fallbacks``;
each gets an equal share of what is left of the turn's deadline. Within a
model, a refused structured-output strategy steps down its chain
(:mod:`engine.llm.strategy`), and a transient failure is retried with backoff
(:mod:`engine.llm.retry`). The schema goes in the form the provider enforces, when it
has one (:mod:`engine.llm.strict`). Every HTTP call counts as an attempt, and the
:class:`~engine.llm.models.Completion` (or the :class:`~engine.errors.ModelError`)
carries the count, each call (:class:`~engine.records.calls.Call`: its time, tokens and
cost, a timed-out or failed one's too) and the model that answered. A provider that
returns no usage has its tokens counted by the engine (the model's tokenizer, else the
documented estimate), and the call says so.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..boundary.sanitize import token_count
from ..errors import ModelError, ResponseRefused, first_line
from ..records.calls import Call
from ..records.messages import estimate_tokens
from . import cache as _cache
from . import retry as _retry
from . import strategy as _strategy
from . import stream as _stream
from . import strict as _strict
from .request import Completion, ModelRequest

# Providers that speak OpenAI's protocol and usually run without keys when
# self-hosted: given an api_base and no key, they get a placeholder key, so the
# server (not the client library) says whether a key is needed.
_KEYLESS_OK = frozenset({"openai", "hosted_vllm", "lm_studio", "llamafile", "openai_like"})


@dataclass
class _Count:
    attempts: int = 0
    calls: list[Call] = field(default_factory=list)  # every call, in order


class _Failed(Exception):
    """One model gave up; the message says why."""


class Caller:
    """Calls ``name`` (then its fallbacks) through ``litellm`` for a :class:`ModelRequest`.

    Args:
        litellm: the imported litellm module.
        name: the primary litellm model string.
        api_base: the endpoint (overrides the funnel's ``model.api_base``).
        structured_output: a strategy or ``auto``; overrides the funnel's setting.
    """

    def __init__(self, litellm: Any, name: str, *, api_base: str | None = None,
                 structured_output: str | None = None, api_key: str | None = None) -> None:
        self._litellm = litellm
        self.name = name
        self.api_base = api_base
        self.structured_output = structured_output
        # Given per call (the studio's pasted key), never put in os.environ: the
        # environment is the whole process's, children's and /proc's.
        self._api_key = api_key

    async def complete(self, request: ModelRequest) -> Completion:
        s = request.settings
        deadline = (_retry.Deadline(request.deadline) if request.deadline is not None
                    else _retry.Deadline.after(s.deadline))
        primary_base = self.api_base or s.api_base
        candidates = [(self.name, primary_base)]
        for other in s.fallbacks:
            # A fallback of the primary's provider shares its endpoint unless it names one.
            base = other.api_base or (primary_base if _prefix(other.name) == _prefix(self.name)
                                      else None)
            if (other.name, base) not in candidates:
                candidates.append((other.name, base))
        count = _Count()
        problems: list[str] = []
        for i, (model, base) in enumerate(candidates):
            share = deadline.share(len(candidates) - i)
            try:
                completion = await self._one_model(model, base, request, share, count)
            except _Failed as exc:
                problems.append(str(exc))
                continue
            return replace(completion, attempts=count.attempts, calls=tuple(count.calls))
        raise ModelError("; then ".join(problems), attempts=count.attempts,
                         spent_ms=sum(c.ms for c in count.calls),
                         prompt_tokens=sum(c.prompt_tokens for c in count.calls),
                         calls=count.calls)

    def describe(self, model: str, api_base: str | None, setting: str) -> tuple[str, ...]:
        """The strategy chain ``setting`` means for ``model`` (for ``funnel doctor``)."""
        return _strategy.chain_for(model, api_base, setting, self._litellm)

    async def _one_model(self, model: str, api_base: str | None, request: ModelRequest,
                         deadline: _retry.Deadline, count: _Count) -> Completion:
        s = request.settings
        setting = self.structured_output or s.structured_output
        chain = _strategy.chain_for(model, api_base, setting, self._litellm)
        retries = 0
        while True:
            strategy = _strategy.current(model, api_base, chain)
            remaining = deadline.remaining()
            if remaining < _retry.MIN_CALL_SECONDS:
                raise _Failed(f"model {model!r}: no time left in the turn's deadline "
                              f"({s.deadline:g} s)")
            kwargs = self.request_kwargs(model, api_base, request, strategy,
                                         min(s.timeout, remaining))
            strict = self.contract(model, api_base, strategy, request.schema)[1]
            streamed = request.on_text is not None and _stream.streams(
                self._litellm, model, api_base, self._provider(model, api_base))
            count.attempts += 1
            started = time.perf_counter()
            try:
                # litellm's timeout is per HTTP read; the deadline bounds the whole call.
                response = await asyncio.wait_for(self._call(kwargs, request, streamed),
                                                  timeout=remaining)
            except Exception as exc:
                refused = _refusal(exc)
                status = _retry.status_of(exc)
                no_stream = streamed and _stream.refused(exc, status, _strategy.error_text(exc))
                said_no = _strategy.is_refusal(exc, status)
                no_strict = strict and said_no
                no_strategy = len(chain) > 1 and said_no
                self._failed(count, started, model, kwargs, exc, refused=bool(
                    refused is not None or no_stream or no_strict or no_strategy))
                if refused is not None:  # the same provider would send it again: no retry
                    raise _Failed(f"model {model!r} failed (ResponseRefused): {refused}"
                                  ) from None
                if no_stream:
                    _stream.stop_streaming(model, api_base, error_detail(exc))
                    continue
                if no_strict:  # the schema, not enforced, before a strategy without one
                    _strict.refuse(model, api_base, error_detail(exc))
                    continue
                if no_strategy:
                    if _strategy.step_down(model, api_base, chain, strategy, error_detail(exc)):
                        continue
                if _retry.is_retryable(exc) and retries < s.retries:
                    wait = _retry.backoff(retries + 1, exc)
                    if wait + _retry.MIN_CALL_SECONDS <= deadline.remaining():
                        retries += 1
                        await asyncio.sleep(wait)
                        continue
                raise _Failed(self._explain(model, api_base, exc, retries)) from None
            latency = (time.perf_counter() - started) * 1000
            try:
                completion = self._completion(model, response, latency, kwargs["messages"])
            except _Failed:
                count.calls.append(Call(model, "error", latency, cost=self.price(model, 0, 0)))
                raise
            count.calls.append(Call(model, "ok", latency, completion.prompt_tokens,
                                    completion.completion_tokens, completion.tokens_counted,
                                    completion.cost))
            return completion

    def _failed(self, count: _Count, started: float, model: str, kwargs: dict[str, Any],
                exc: BaseException, *, refused: bool) -> None:
        """Record a call that gave no answer: its time, and for one cut by a timeout (sent,
        and read by the server, which bills it) its prompt tokens, counted by the engine.
        A call the server answered with an error sent nothing it bills."""
        ms = (time.perf_counter() - started) * 1000
        timeout = isinstance(exc, asyncio.TimeoutError | TimeoutError) or "Timeout" in type(
            exc).__name__
        outcome = "refused" if refused else "timeout" if timeout else "error"
        prompt = self.count_prompt(model, kwargs["messages"]) if timeout else 0
        count.calls.append(Call(model, outcome, ms, prompt, 0, tokens_counted=timeout,
                                cost=self.price(model, prompt, 0)))

    def count_prompt(self, model: str, messages: list[dict[str, Any]]) -> int:
        """The prompt's tokens by ``model``'s tokenizer (``litellm.token_counter``: offline,
        cl100k for a model litellm has no tokenizer for), else the documented estimate."""
        try:
            return token_count(self._litellm.token_counter(model=model, messages=messages))
        except Exception:
            return estimate_tokens([{"content": str(m.get("content") or "")}
                                    for m in messages])

    def count_answer(self, model: str, text: str) -> int:
        """The answer's tokens, counted like :meth:`count_prompt` (no chat framing)."""
        try:
            return token_count(self._litellm.token_counter(model=model, text=text,
                                                           count_response_tokens=True))
        except Exception:
            return max(1, (len(text) + 3) // 4)

    def price(self, model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
        """litellm's price of these tokens, or None when its price map lacks the model."""
        if not self.cost_known(model):
            return None
        if not prompt_tokens and not completion_tokens:
            return 0.0
        try:
            prompt, answer = self._litellm.cost_per_token(
                model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
            return float(prompt) + float(answer)
        except Exception:
            return None
    async def _call(self, kwargs: dict[str, Any], request: ModelRequest, streamed: bool
                    ) -> Any:
        """One HTTP call; streamed, it tells ``request.on_text`` the answer as it grows."""
        if not streamed or request.on_text is None:
            return await self._litellm.acompletion(**kwargs)
        request.on_text("")  # a new attempt: what an earlier one streamed is void
        stream = await self._litellm.acompletion(
            **kwargs, stream=True, stream_options={"include_usage": True})
        return await _stream.consume(self._litellm, stream, kwargs["messages"],
                                     request.on_text, kwargs["model"])

    def contract(self, model: str, api_base: str | None, strategy: str,
                 schema: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """The form of the stage ``schema`` sent to ``model`` with ``strategy``, and whether
        the provider is asked to enforce it (:mod:`engine.llm.strict`)."""
        forms = _strict.forms(schema)
        mode = _strict.mode(model, api_base, strategy, self._litellm)
        sent = forms.get(mode.form)
        if sent is None:  # this stage's contract has no strict form: the portable one
            return forms.portable, False
        return sent, mode.strict

    def request_kwargs(self, model: str, api_base: str | None, request: ModelRequest,
                       strategy: str, timeout: float) -> dict[str, Any]:
        """The ``litellm.acompletion`` arguments of one call (no retries of litellm's own)."""
        s = request.settings
        schema, strict = self.contract(model, api_base, strategy, request.schema)
        messages: list[dict[str, Any]] = list(request.messages)
        if _cache.marks_prefix(self._litellm, model, api_base):
            messages = _cache.mark_static_prefix(messages, request.stable)
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "timeout": timeout,
            # The engine retries; litellm and the OpenAI SDK must not (their counts lie).
            "num_retries": 0,
            "max_retries": 0,
            **_strategy.request_fields(strategy, schema, request.stage, strict=strict),
        }
        if s.temperature is not None:
            kwargs["temperature"] = s.temperature
        if s.max_tokens is not None:
            kwargs["max_tokens"] = s.max_tokens
        if api_base:
            kwargs["api_base"] = api_base
            if self._provider(model, api_base) in _KEYLESS_OK and not self._has_key(model):
                kwargs["api_key"] = "no-key"
        if self._api_key and model == self.name:  # the primary's key, not a fallback's
            kwargs["api_key"] = self._api_key
        return kwargs

    def _provider(self, model: str, api_base: str | None) -> str:
        try:
            return str(self._litellm.get_llm_provider(model=model, api_base=api_base)[1])
        except Exception:
            return _prefix(model)

    def _has_key(self, model: str) -> bool:
        return not self._missing_keys(model)

    def _missing_keys(self, model: str) -> list[str]:
        try:
            env = self._litellm.validate_environment(model=model)
        except Exception:
            return []
        return [str(k) for k in env.get("missing_keys") or []]

    def _explain(self, model: str, api_base: str | None, exc: BaseException,
                 retries: int) -> str:
        kind = type(exc).__name__
        if isinstance(exc, asyncio.TimeoutError | TimeoutError):
            kind, text = "Timeout", "the turn's deadline passed during the call"
        else:
            text = error_detail(exc)
        message = f"model {model!r} failed ({kind}): {text}"
        if retries:
            message += f" (after {retries} {'retry' if retries == 1 else 'retries'})"
        if ("Authentication" in kind or _retry.status_of(exc) in (401, 403)
                or "api key" in text.lower() or "api_key" in text.lower()):
            missing = [] if self._api_key else self._missing_keys(model)
            if missing:
                message += f"; set {' or '.join(missing)} in the environment"
            elif self._api_key:
                message += "; the key given for it was refused: give another"
        if self._api_key:  # a provider that echoes the key never gets it into a log
            message = message.replace(self._api_key, "<the key given>")
        return message

    def _completion(self, model: str, response: Any, latency: float,
                    messages: list[dict[str, Any]]) -> Completion:
        try:
            message = response.choices[0].message
        except (AttributeError, IndexError):
            raise _Failed(f"model {model!r} returned no message") from None
        usage = getattr(response, "usage", None)
        text = _strategy.answer_text(message)
        # The provider's counts cross the sanitizing boundary: bounded, never negative.
        prompt = token_count(getattr(usage, "prompt_tokens", 0))
        answer = token_count(getattr(usage, "completion_tokens", 0))
        # No usage (litellm then reports zeros): counted, and said so, never recorded as 0.
        # A usage that says anything at all is the provider's, however odd.
        counted = prompt == 0 and answer == 0
        if counted:
            prompt = self.count_prompt(model, messages)
            answer = self.count_answer(model, text) if text else 0
        return Completion(
            text=text,
            prompt_tokens=prompt,
            completion_tokens=answer,
            cached_prompt_tokens=token_count(_cache.cached_tokens(usage)),
            cache_write_tokens=token_count(_cache.cache_write_tokens(usage)),
            model=model,
            latency_ms=latency,
            cost=self.price(model, prompt, answer) if counted else self.cost(model, response),
            tokens_counted=counted,
        )

    def cost(self, model: str, response: Any) -> float | None:
        """What the call cost, or None when litellm's price map does not know the model.

        litellm prices an unmapped model at 0; a turn of unknown cost must say so.
        """
        if not self.cost_known(model):
            return None
        try:
            return float(self._litellm.completion_cost(completion_response=response,
                                                       model=model))
        except Exception:
            return None

    def cost_known(self, model: str) -> bool:
        """Whether litellm's price map has prices for ``model``."""
        try:
            info = self._litellm.get_model_info(model=model)
        except Exception:
            return False
        return (info.get("input_cost_per_token") is not None
                or info.get("output_cost_per_token") is not None)


async def close_clients(litellm: Any) -> None:
    """Close litellm's cached HTTP clients, on the loop that opened them.

    A command that runs its own event loop (``funnel doctor``) calls it before the loop
    ends: the clients would otherwise be closed by the garbage collector, with warnings.
    """
    try:
        from litellm.llms.custom_httpx.async_client_cleanup import close_litellm_async_clients

        await close_litellm_async_clients()  # type: ignore[no-untyped-call]
        litellm.in_memory_llm_clients_cache.flush_cache()
    except Exception:  # a litellm without this helper: nothing to close the engine knows of
        return


_PREFIX = re.compile(r"^(?:litellm\.\w+: |\w+Error: |\w+Exception - )+")


def _refusal(exc: BaseException) -> ResponseRefused | None:
    """The :class:`ResponseRefused` behind ``exc`` (the SDK and litellm wrap it), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ResponseRefused):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _prefix(model: str) -> str:
    return model.split("/", 1)[0] if "/" in model else ""


def error_detail(exc: BaseException) -> str:
    """The exception's first line, with the server's error body when the line lacks it."""
    # litellm prefixes its class and the provider's ("litellm.BadRequestError:
    # AnthropicException - "); the kind is said once by the caller already.
    first = _PREFIX.sub("", first_line(exc)[:300])
    full = _strategy.error_text(exc)
    body = full[len(str(exc)):].strip()
    if body and body[:40] not in first:
        first = f"{first}: {' '.join(body.split())[:300]}"
    return first
