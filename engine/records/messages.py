"""The chat the model sees: messages, and how many tokens they are estimated to cost.

A small module of its own because three layers share it: the store reads and
writes :class:`Message`, prompts and memory assemble them, and the models
estimate their tokens. It imports nothing from the engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Message:
    """One message of a conversation, as logged (``role`` is ``user`` or ``assistant``)."""

    role: str
    content: str
    id: int = 0  # the message log's id, when it came from the log


def chat_messages(system: str, history: Sequence[Message], text: str) -> list[dict[str, str]]:
    """The chat the model receives: the stage prompt, recent messages, the customer's message."""
    out = [{"role": "system", "content": system}]
    out.extend({"role": m.role, "content": m.content} for m in history)
    out.append({"role": "user", "content": text})
    return out


def estimate_tokens(messages: Sequence[Mapping[str, str]]) -> int:
    """A documented estimate for models without a tokenizer: 4 characters a token,
    plus 4 tokens of framing per message and 2 for the reply's priming."""
    return sum(math.ceil(len(m["content"]) / 4) + 4 for m in messages) + 2
