"""The studio's model: the product owner's answer, a replayed one, or a real model.

:class:`StudioModel` is a :class:`engine.llm.request.Model`, so whatever it answers
goes through exactly the path a model's output takes in a turn (sanitizing, the
stage schema, the repair call, the fallback, allowed updates, actions, derived
fields, exits): the studio never applies an answer itself.

- "I am the model": the page's answer is queued for the session (:meth:`StudioModel.queue`)
  and is the completion of the turn's first call; a repair call gets the same answer
  again (the product owner gave one), so an invalid answer ends in the stage's fallback
  exactly as a model that repeats itself would.
- Replay (rewind and branch): the recorded outputs of a turn are queued the same way.
- Otherwise the call goes to the model chosen in the page (``scripted:PATH`` or any
  litellm model string), built by :func:`engine.llm.models.make_model`.

It keeps the last turns' requests per session (the prompt as sent, with the repair
call), bounded, for the page's prompt panel: a copy of the customer's words and of the
state, so it follows retention too. :meth:`StudioModel.forget` drops a session's, which
the studio does once the session is purged or anonymized
(:meth:`engine.studio.playground.Studio.forget_retired`). It serves only the studio's own engine:
the service's turns never pass through it.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelError
from ..llm.models import Completion, Model, ModelRequest, ScriptEntry, make_model
from ..llm.tokens import TokenCount, token_counter
from ..records.messages import estimate_tokens

__all__ = ["HUMAN", "Sent", "StudioModel"]

HUMAN = "human"  # the model picker's "I am the model"
_SESSIONS = 200  # sessions whose prompts are kept
_TURNS = 200  # turns kept per session (a 200-turn session keeps all of them)


@dataclass
class Sent:
    """One model call as the turn made it: the messages, the attempt, the cache mark."""

    turn: int
    attempt: int
    stage: str
    messages: list[dict[str, str]]
    stable: int
    # The chosen model's tokenizer (engine.llm.tokens), else the 4-characters estimate.
    count: TokenCount = estimate_tokens
    trimmed: tuple[str, ...] = ()

    def view(self) -> dict[str, Any]:
        """The call as the prompt panel shows it: each message with its tokens, by the
        model's tokenizer when it has one; ``breakpoint`` marks the last message the next
        turn repeats (the prompt cache)."""
        return {"turn": self.turn, "attempt": self.attempt, "stage": self.stage,
                "messages": [{"role": m.get("role"), "content": m.get("content", ""),
                              "tokens": self.count([m]),
                              "breakpoint": self.stable > 0 and i == self.stable - 1}
                             for i, m in enumerate(self.messages)],
                "tokens": self.count(self.messages), "trimmed": list(self.trimmed)}


@dataclass
class StudioModel:
    """Answers queued per session first; else the chosen model; records what was sent."""

    name: str = "studio"
    models: dict[str, Model] = field(default_factory=dict)  # chosen models, by name
    choice: dict[str, str] = field(default_factory=dict)  # session -> model name
    default: str = HUMAN
    api_base: str | None = None
    _queued: dict[str, ScriptEntry] = field(default_factory=dict)
    label: dict[str, str] = field(default_factory=dict)  # session -> the queued answer's origin
    _sent: OrderedDict[str, deque[Sent]] = field(default_factory=OrderedDict)
    # Model keys pasted in the page (engine.studio.keys), by model: memory only, no repr.
    keys: dict[str, str] = field(default_factory=dict, repr=False)

    def queue(self, session_id: str, entry: ScriptEntry, origin: str = f"studio:{HUMAN}"
              ) -> None:
        """The answer to the session's next turn: its first call, and its repair call.
        The studio runs one turn of a session at a time and clears it after the turn."""
        self._queued[session_id] = entry
        self.label[session_id] = origin

    def clear(self, session_id: str) -> None:
        self._queued.pop(session_id, None)
        self.label.pop(session_id, None)

    def choose(self, session_id: str, name: str) -> None:
        """The model the session's turns call when no answer is queued.

        Raises:
            ConfigError: a ``scripted:PATH`` that cannot be read, an unknown strategy.
        """
        if name != HUMAN and name not in self.models:
            self.models[name] = make_model(name, api_base=self.api_base,
                                           api_key=self.keys.get(name))
        self.choice[session_id] = name

    def kept(self) -> list[str]:
        """The sessions whose prompts are kept."""
        return list(self._sent)

    def forget(self, session_id: str) -> int:
        """Drop what is kept of the session (its prompts, a queued answer, its model
        choice): the session was erased (engine.store.erasure), purged or anonymized.
        The calls dropped."""
        self.clear(session_id)
        self.choice.pop(session_id, None)
        calls = self._sent.pop(session_id, None)
        return len(calls) if calls is not None else 0

    def sent(self, session_id: str) -> list[Sent]:
        return list(self._sent.get(session_id) or ())

    def _record(self, request: ModelRequest) -> None:
        calls = self._sent.pop(request.session_id, None) or deque(maxlen=2 * _TURNS)
        chosen = self.models.get(self.choice.get(request.session_id, self.default))
        calls.append(Sent(request.turn, request.attempt, request.stage,
                          [dict(m) for m in request.messages], request.stable,
                          token_counter(chosen), request.trimmed))
        self._sent[request.session_id] = calls
        while len(self._sent) > _SESSIONS:
            self._sent.popitem(last=False)

    async def complete(self, request: ModelRequest) -> Completion:
        self._record(request)
        started = time.perf_counter()
        entry = self._queued.get(request.session_id)
        if entry is not None:
            if entry.error:
                raise ModelError(entry.error)
            text = entry.text(bool(request.attempt))  # the repair: the same answer, or its own
            return Completion(text=text, prompt_tokens=estimate_tokens(request.messages),
                              completion_tokens=max(1, estimate_tokens([{"content": text}]) - 6),
                              model=self.label.get(request.session_id, f"studio:{HUMAN}"),
                              latency_ms=(time.perf_counter() - started) * 1000)
        name = self.choice.get(request.session_id, self.default)
        if name == HUMAN:
            raise ModelError("no answer was given for this turn: fill in the model form "
                             "(\"I am the model\") or pick a model in the page")
        return await self.models[name].complete(request)
