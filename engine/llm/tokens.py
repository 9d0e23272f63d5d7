"""Token counts by the model's own tokenizer, for the prompt budget and the studio.

A model may have ``count_tokens(messages) -> int`` (:class:`engine.llm.models.LiteLLMModel`
has: ``litellm.token_counter``, offline, with the tokenizer files litellm ships);
:func:`token_counter` gives it, or, for a model without one (the scripted model, the
studio's "I am the model"), the documented estimate
:func:`engine.records.messages.estimate_tokens` (4 characters a token, which under-counts
Cyrillic text about twice: docs/memory.md).

:class:`MessageCounts` makes a whole-prompt counter cheap: a prompt's count is its
framing plus the sum of its messages' counts (how OpenAI-style chat framing works, and
what ``litellm.token_counter`` computes), and each message's count is kept, so a turn
counts only the messages it has not counted before (the stage prompt and the window
repeat from turn to turn).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import orjson

from ..records.messages import estimate_tokens

log = logging.getLogger("funnel.llm.tokens")

TokenCount = Callable[[Sequence[Mapping[str, str]]], int]

_PROBE = {"role": "user", "content": "x"}


def token_counter(model: object) -> TokenCount:
    """``model.count_tokens`` when the model has one, else :func:`estimate_tokens`."""
    count = getattr(model, "count_tokens", None)
    return count if callable(count) else estimate_tokens


class MessageCounts:
    """A prompt counter over ``count`` (a whole-prompt tokenizer), each message's count
    kept (the last ``size`` messages). If ``count`` fails (a model litellm has no
    tokenizer for, a tokenizer file missing), it falls back to :func:`estimate_tokens`
    for good, said once in the log.

    Args:
        count: counts a list of chat messages, framing included.
        name: the model, for the log line.
        size: messages whose counts are kept.
    """

    def __init__(self, count: TokenCount, name: str, size: int = 4096) -> None:
        self._count = count
        self._name = name
        self._size = size
        self._kept: OrderedDict[bytes, int] = OrderedDict()
        self._frame: int | None = None  # the prompt's own tokens (the reply's priming)
        self.fallback = False

    def __call__(self, messages: Sequence[Mapping[str, str]]) -> int:
        if self.fallback:
            return estimate_tokens(messages)
        try:
            if self._frame is None:
                one, two = self._count([_PROBE]), self._count([_PROBE, _PROBE])
                self._frame = one - (two - one)
            return self._frame + sum(self._message(m) for m in messages)
        except Exception as exc:  # no tokenizer for this model: the estimate, not a failure
            log.warning("token counts for %s: the model's tokenizer failed (%s); using the "
                        "4-characters-a-token estimate", self._name, exc)
            self.fallback = True
            return estimate_tokens(messages)

    def _message(self, message: Mapping[str, str]) -> int:
        key = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
        found = self._kept.get(key)
        if found is not None:
            self._kept.move_to_end(key)
            return found
        assert self._frame is not None
        tokens = self._count([message]) - self._frame
        self._kept[key] = tokens
        if len(self._kept) > self._size:
            self._kept.popitem(last=False)
        return tokens
