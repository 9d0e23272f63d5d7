"""The format's settings objects: model, memory, language policy and knowledge.

Kept apart from `engine.format.spec` (the funnel and its stages) so that the model
layer (`engine.llm`), memory, language and knowledge can import their settings
without the whole format; `engine.format.spec` re-exports every name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .texts import TOO_LONG, Localized

DURATION = re.compile(r"^([0-9]+)(s|m|h|d)$")
# The longest period anything takes (a retention, a report's window, a replay's `--since`):
# ten years. Past it a period is a typo, and a date that far back overflows.
MAX_DURATION_SECONDS = 3650 * 86400

# The structured-output strategies a funnel or the command line may name (what each one
# sends: engine.llm.strategy). Here, with the setting, so that reading the format (and
# `funnel validate`) does not import the model layer.
STRATEGIES = ("json_schema", "json_object_schema", "tool", "json_object", "prompt")
CHOICES = ("auto", *STRATEGIES)


def parse_duration(text: str) -> float:
    """``"6h"`` -> 21600.0 seconds; at most ten years (``3650d``).

    The one place a period is read (funnel files, query parameters, the command line).

    Raises:
        ValueError: not a number and s, m, h or d, or longer than ten years.
    """
    m = DURATION.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"not a duration: {text!r:.60} (expected a number and s, m, h or d: "
                         "'6h')")
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    digits = m.group(1).lstrip("0") or "0"
    if len(digits) > 12 or int(digits) * unit > MAX_DURATION_SECONDS:
        raise ValueError(f"the duration {text.strip():.30} is longer than ten years (3650d); "
                         "give a shorter period")
    return int(digits) * unit


@dataclass(frozen=True)
class FallbackModel:
    """One of ``model.fallbacks``: a litellm model string and, optionally, its endpoint."""

    name: str
    api_base: str | None = None

    @classmethod
    def of(cls, raw: Any) -> FallbackModel:
        if isinstance(raw, FallbackModel):
            return raw
        if isinstance(raw, dict):
            return cls(str(raw.get("name") or ""), raw.get("api_base"))
        return cls(str(raw))


@dataclass(frozen=True)
class ModelSettings:
    name: str = "scripted"
    temperature: float | None = None
    max_tokens: int | None = None
    timeout: float = 30.0
    retries: int = 2
    api_base: str | None = None
    structured_output: str = "auto"  # engine.llm.strategy: auto or one strategy
    deadline: float = 20.0  # seconds for a turn's model calls: first, repair, retries
    # Models tried in order when this one fails or runs past its share of the deadline.
    fallbacks: tuple[FallbackModel, ...] = ()

    def merged(self, override: dict[str, Any] | None) -> ModelSettings:
        if not override:
            return self
        values = dict(override)
        if "fallbacks" in values:
            values["fallbacks"] = tuple(FallbackModel.of(x) for x in values["fallbacks"] or ())
        return ModelSettings(**{**self.__dict__, **values})


@dataclass(frozen=True)
class RecallSettings:
    """``memory.recall``: seed 002's tier 4, past messages of the session similar to the
    customer's message (engine.memory.recall, docs/memory.md#semantic-recall)."""

    embedder: str  # a litellm embedding model string
    api_base: str | None = None  # default: the funnel's model endpoint
    top_k: int = 5  # matches, each shown with its neighbours
    before: int = 2  # messages shown before each match
    after: int = 1  # and after it
    # The query's embedding is on the turn's path: past this many seconds the turn goes
    # on without recall (its message is embedded again after the reply).
    deadline: float = 1.0
    min_similarity: float = 0.0  # cosine similarity a match must exceed
    budget: int = 400  # tokens of recalled messages in the prompt, at most
    message_chars: int = 600  # a recalled message is clipped to this many characters

    @classmethod
    def of(cls, raw: Any) -> RecallSettings | None:
        """The settings a (schema-valid) ``memory.recall`` declares; ``None`` when off."""
        if isinstance(raw, RecallSettings) or raw is None:
            return raw
        values = dict(raw)
        if not values.get("embedder"):
            return None  # off unless an embedder is set
        return cls(**{k: v for k, v in values.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class MemorySettings:
    window: int = 6
    idle_return_after: float | None = None
    idle_return_stage: str | None = None
    prompt_budget: int | None = None
    summary_budget: int = 200
    summarizer_model: str | None = None
    summarizer_api_base: str | None = None  # default: the funnel's model endpoint
    summary: str | None = None  # the state field that holds the rolling summary
    # Observational memory (a model summarizer, engine.memory.summary): the observer folds the
    # messages not yet observed once they pass this many tokens; the reflector condenses
    # the observation list when it would pass its budget.
    observe_after: int = 300
    observation_budget: int = 400
    # The reply to a message too long for the stage's prompt budget, by language.
    too_long_reply: Localized = TOO_LONG
    recall: RecallSettings | None = None  # semantic recall (tier 4); off by default

    def merged(self, override: dict[str, Any] | None) -> MemorySettings:
        if not override:
            return self
        values = dict(override)
        if "idle_return_after" in values:
            values["idle_return_after"] = parse_duration(values["idle_return_after"])
        if "recall" in values:
            values["recall"] = RecallSettings.of(values["recall"])
        if "too_long_reply" in values:
            values["too_long_reply"] = Localized.of(values["too_long_reply"])
        return MemorySettings(**{**self.__dict__, **values})


# Always among a language detector's candidates, whatever the funnel declares: a
# detector restricted to one language would call every message that language.
BASE_LANGUAGES: tuple[str, ...] = ("uk", "ru", "en", "pl", "de")


@dataclass(frozen=True)
class LanguagePolicy:
    """A funnel's ``language:`` section, parsed (see docs/language.md)."""

    mode: str = "model"  # "model" | "fixed" | "follow_customer"
    languages: tuple[str, ...] = ()  # the languages a reply may be in
    default: str | None = None
    reply_min_length: int = 20

    @property
    def candidates(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.languages, *BASE_LANGUAGES)))


def language_policy(data: dict[str, Any]) -> LanguagePolicy:
    """The policy a (schema-valid) ``language:`` section declares."""
    min_length = int(data.get("reply_min_length", 20))
    if data.get("fixed"):
        return LanguagePolicy("fixed", (str(data["fixed"]),), str(data["fixed"]), min_length)
    if data.get("follow_customer"):
        langs = tuple(str(x) for x in data["follow_customer"])
        return LanguagePolicy("follow_customer", langs, str(data.get("default") or langs[0]),
                              min_length)
    return LanguagePolicy(reply_min_length=min_length)


@dataclass(frozen=True)
class StageKnowledge:
    """A stage's ``knowledge: {top_k, budget}``: how many chunks, within how many tokens."""

    top_k: int = 3
    budget: int = 300
    facts: tuple[str, ...] = ()  # dotted state paths searched with the message: pet.breed


@dataclass(frozen=True)
class KnowledgeSpec:
    """The funnel's ``knowledge:``: a folder of Markdown files, chunked by heading."""

    folder: Path
    chunk_tokens: int = 200
    language: str | None = None  # the text search configuration's language; None: simple


@dataclass(frozen=True)
class MigrationStep:
    """One of ``migrations:``: how a session's state moves from version ``source`` to
    ``target`` (docs/versions.md). Paths are state fields, or dotted paths into an
    object field (``pet.breed``); applied in the order rename, move, stages, defaults, drop.
    """

    source: int
    target: int
    rename: tuple[tuple[str, str], ...] = ()  # (old field, new field)
    move: tuple[tuple[str, str], ...] = ()  # (from path, to path)
    defaults: tuple[tuple[str, Any], ...] = ()  # (path, value) set when missing or null
    drop: tuple[str, ...] = ()  # paths removed
    stages: tuple[tuple[str, str], ...] = ()  # (old stage, new stage)
    line: int = 0


def migration_steps(raw: Any, line_of: Any = None) -> tuple[MigrationStep, ...]:
    """The ``migrations:`` list (schema-valid) as steps, in the order declared."""
    steps = []
    for i, item in enumerate(raw or []):
        steps.append(MigrationStep(
            source=int(item["from"]), target=int(item["to"]),
            rename=tuple((str(k), str(v)) for k, v in (item.get("rename") or {}).items()),
            move=tuple((str(k), str(v)) for k, v in (item.get("move") or {}).items()),
            defaults=tuple((str(k), v) for k, v in (item.get("defaults") or {}).items()),
            drop=tuple(str(p) for p in item.get("drop") or ()),
            stages=tuple((str(k), str(v)) for k, v in (item.get("stages") or {}).items()),
            line=line_of(i) if line_of else 0))
    return tuple(steps)
