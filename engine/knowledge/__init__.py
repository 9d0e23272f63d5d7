"""A funnel's knowledge base: Markdown chunks, indexed in PostgreSQL, cited by turns.

- `chunks`: a folder of ``*.md`` files cut by heading within a token cap (no database);
- `engine.store.knowledge`: the shared ``funnel_knowledge`` table's statements, full-text
  search (in the store, which runs them);
- this module: keeping the index current (`ensure_index`) and a stage's retrieval
  (`retrieve`): the best chunks for the customer's message and the known facts,
  within the stage's ``knowledge: {top_k, budget}``.

Importing this package imports no database driver (the store seam).

May import: `engine.store`, `engine.records`, `engine.format` and below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..format.spec import FunnelSpec, StageKnowledge
from ..records.chunks import Chunk
from .chunks import chunk_folder

if TYPE_CHECKING:
    from ..store.base import Store

__all__ = ["Chunk", "Retrieved", "ensure_index", "facts_text", "fit", "reindex", "retrieve"]


@dataclass(frozen=True)
class Retrieved:
    """What a stage's prompt gets: the chunks (as template values) and their ids."""

    chunks: list[dict[str, Any]]
    ids: list[str]


async def reindex(store: Store, spec: FunnelSpec, *, force: bool = True) -> tuple[int, str] | None:
    """Index the funnel's knowledge folder; return (chunks, text search configuration),
    or ``None`` when the index was current already (and not ``force``).

    Raises:
        ConfigError: a file cannot be read (a link out of the folder, not UTF-8, too large).
    """
    k = spec.knowledge
    if k is None:
        return None
    chunks, digest = chunk_folder(k.folder, k.chunk_tokens)
    if not force and await store.knowledge_digest(spec.name) == digest:
        return None
    config = await store.knowledge_replace(spec.name, chunks, digest, k.language)
    return len(chunks), config


async def ensure_index(store: Store, spec: FunnelSpec, *, replace: bool = True) -> None:
    """Reindex when the folder changed since the last index (at engine start). Not
    ``replace`` (the studio's engine): a funnel with no index yet is indexed, but an
    index there is, the one production retrieves from, is never replaced by a draft."""
    if not replace and spec.knowledge is not None \
            and await store.knowledge_digest(spec.name) is not None:
        return
    await reindex(store, spec, force=False)


def _leaves(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value.replace("_", " ")]  # enum values: dry_skin -> dry skin
    if isinstance(value, list):
        return [s for v in value for s in _leaves(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _leaves(v)]
    return []


def facts_text(state: Mapping[str, Any], paths: Sequence[str]) -> str:
    """The known facts a stage searches with: the string values at dotted ``paths``."""
    out: list[str] = []
    for path in paths:
        value: Any = state
        for key in path.split("."):
            value = value.get(key) if isinstance(value, Mapping) else None
        out += _leaves(value)
    return " ".join(out)


def fit(found: Sequence[tuple[Chunk, float]], top_k: int, budget: int) -> list[Chunk]:
    """The best chunks, at most ``top_k``, whose tokens add up to at most ``budget``
    (a chunk that does not fit is skipped; a smaller one after it may still fit)."""
    out: list[Chunk] = []
    used = 0
    for chunk, _ in found:
        if len(out) == top_k:
            break
        if used + chunk.tokens <= budget:
            out.append(chunk)
            used += chunk.tokens
    return out


async def retrieve(store: Store, spec: FunnelSpec, want: StageKnowledge, message: str,
                   state: Mapping[str, Any]) -> Retrieved:
    """The stage's chunks for this turn: searched with the message and the facts."""
    query = f"{message} {facts_text(state, want.facts)}".strip()
    if not query:
        return Retrieved([], [])
    found = await store.knowledge_search(spec.name, query, max(want.top_k * 4, 10))
    chunks = fit(found, want.top_k, want.budget)
    return Retrieved([{"id": c.id, "title": c.title, "text": c.body} for c in chunks],
                     [c.id for c in chunks])
