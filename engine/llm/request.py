"""What a model call takes and gives: the request, the completion, and the model protocol.

In a module of their own so that the model implementations (`engine.llm.models`)
and the client that drives litellm (`engine.llm.client`) share them without
importing each other. `engine.llm.models` re-exports them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..format.settings import ModelSettings
from ..records.calls import Call

__all__ = ["Completion", "Model", "ModelRequest"]


@dataclass(frozen=True)
class ModelRequest:
    """One call: the chat, the stage's output schema, and who it is for."""

    messages: list[dict[str, str]]
    schema: Mapping[str, Any]
    stage: str
    settings: ModelSettings
    session_id: str
    turn: int
    user_text: str
    attempt: int = 0  # 0 the first call, 1 the repair call
    # When the whole turn's model calls must end (time.monotonic()); None: now + deadline.
    deadline: float | None = None
    # How many leading messages the next turn repeats (engine.turn.budget.Fitted.stable): a
    # prompt cache's second breakpoint goes on the last of them. 0: not said.
    stable: int = 0
    # What the prompt budget cut from this chat, as sentences (engine.turn.budget.Fitted
    # .trimmed): the studio's prompt panel shows them. Empty: nothing was cut.
    trimmed: tuple[str, ...] = ()
    # Streaming: called with each piece the answer grows by, in order ("" when an attempt
    # begins: what an earlier attempt sent is void). None: no streaming.
    on_text: Callable[[str], None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    model: str
    latency_ms: float
    cost: float | None = None  # None: unknown (a model litellm has no prices for)
    attempts: int = 1  # HTTP calls made for this completion, retries included
    # Of prompt_tokens, those the provider read from its prompt cache (0: none or not said).
    cached_prompt_tokens: int = 0
    # Of prompt_tokens, those the provider wrote to its prompt cache (billed higher).
    cache_write_tokens: int = 0
    # The provider returned no usage: the tokens were counted by the engine (the model's
    # tokenizer, else the 4-characters estimate), never recorded as 0.
    tokens_counted: bool = False
    # Every HTTP call made for this completion, the answered one last: those that timed
    # out, failed or were refused before it spent time and tokens too. Empty: one call,
    # this completion's (a model that says no more, the scripted one).
    calls: tuple[Call, ...] = ()


class Model(Protocol):
    """What the engine calls. Implementations raise :class:`ModelError` on failure.

    A model with a tokenizer also has ``count_tokens(messages) -> int``, the prompt's
    tokens as the provider counts them; the prompt budget uses it, else the 4-characters
    estimate (:func:`engine.llm.tokens.token_counter`).
    """

    name: str

    async def complete(self, request: ModelRequest) -> Completion: ...
