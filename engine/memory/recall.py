"""Semantic recall (seed 002's tier 4): past messages of the session like the current one.

Off unless the funnel sets ``memory.recall.embedder``. Then:

- **Indexing, off the hot path.** After a turn's save, a background job embeds the
  session's messages that have no embedding yet (the reply, and any an earlier job
  missed: a failed call is simply retried by the next turn's job), newest first, at
  most :data:`INDEX_BATCH` a job; the customer's message reuses the vector the turn
  computed for its query. A failure logs a warning; the turn has already succeeded.
- **What is stored.** Every answer crosses :func:`engine.boundary.vectors.unit_vectors`
  here, whatever the embedder: finite numbers, at most
  :data:`~engine.boundary.vectors.MAX_DIMS`, of the model's dimension (that of its
  vectors in the store, else of the first answer accepted since the start). An answer
  that is not is a failed call: a warning, nothing stored, the turn unharmed.
- **The query, on the turn's path.** The customer's message is embedded when the turn
  starts (beside loading and routing); the prompt waits for it at most
  ``memory.recall.deadline`` seconds, and that wait comes out of the model's deadline.
  Without a vector in time the turn goes on without recall.
- **The search.** The ``top_k`` most similar messages of this session (never another's)
  older than the prompt's window, each with ``before`` messages before it and ``after``
  after it; stretches that overlap are merged, each message shown once. They reach the model in the
  turn's ``<data>`` message (engine.turn.budget), within ``memory.recall.budget``
  tokens, the best first; the prompt budget cuts them before anything else.

Storage and its pgvector / ``real[]`` fallback: `engine.store.recall`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..boundary.sanitize import Rejected, printable
from ..boundary.vectors import unit_vectors
from ..errors import FunnelError, ModelError, first_line
from ..format.spec import FunnelSpec, RecallSettings
from ..llm.embed import Embedder, LiteLLMEmbedder
from ..store import Store
from ..store.base import Match, VectorSupport

__all__ = ["INDEX_BATCH", "Recall", "Snippet", "make_embedder", "snippets", "waited"]

log = logging.getLogger("funnel.memory")

INDEX_BATCH = 32  # messages one background job embeds, at most
INDEX_TIMEOUT = 30.0  # seconds a background job's embedding call may take
_ROLES = {"user": "Customer", "assistant": "You", "manager": "Manager"}


@dataclass(frozen=True)
class Snippet:
    """A recalled stretch: consecutive messages of the session, as the prompt shows them.

    ``position`` is its first message's place in the session (the prompt shows the
    stretches in the conversation's order), ``similarity`` its best match's."""

    position: int
    similarity: float
    text: str
    tokens: int
    ids: tuple[int, ...]


def make_embedder(settings: RecallSettings, api_base: str | None = None) -> Embedder:
    """The funnel's embedder: its ``api_base``, else the funnel's model endpoint."""
    return LiteLLMEmbedder(settings.embedder, api_base=settings.api_base or api_base)


def snippets(matches: Sequence[Match], settings: RecallSettings) -> list[Snippet]:
    """The stretches around the matches, merged where they overlap, best first,
    as many as fit in ``settings.budget`` tokens (one that does not fit is skipped)."""
    rows: dict[int, Match] = {}
    score: dict[int, float] = {}  # a message's best match (a neighbour of several hits)
    for m in matches:
        rows[m.n] = m
        score[m.n] = max(score.get(m.n, -math.inf), m.similarity)
    stretches: list[tuple[int, int, float]] = []  # (first n, last n, best similarity)
    # A hit's stretch is a run of the session's messages, so two runs that overlap in
    # the log's order share messages: merged, each message once.
    groups = sorted(sorted(m.n for m in matches if m.hit == hit)
                    for hit in {m.hit for m in matches})
    for group in groups:
        if stretches and group[0] <= stretches[-1][1]:
            first, last, sim = stretches[-1]
            stretches[-1] = (first, max(last, group[-1]),
                             max([sim, *(score[n] for n in group)]))
        else:
            stretches.append((group[0], group[-1], max(score[n] for n in group)))
    out: list[Snippet] = []
    for first, last, sim in stretches:
        shown = [rows[n] for n in sorted(rows) if first <= n <= last]
        lines = [f"{_ROLES.get(m.role, m.role)}: "
                 f"{printable(' '.join(m.content.split()), settings.message_chars)}"
                 for m in shown]
        text = "\n".join(lines)
        out.append(Snippet(first, sim, text, math.ceil(len(text) / 4) + 1,
                           tuple(m.id for m in shown)))
    out.sort(key=lambda s: (-s.similarity, s.position))
    kept, used = [], 0
    for s in out:
        if used + s.tokens <= settings.budget:
            kept.append(s)
            used += s.tokens
    return kept


class Recall:
    """A funnel's semantic recall: the query of a turn and the indexing after it."""

    def __init__(self, spec: FunnelSpec, store: Store, embedder: Embedder,
                 settings: RecallSettings) -> None:
        self.spec = spec
        self.store = store
        self.embedder = embedder
        self.settings = settings
        self.vectors: VectorSupport | None = None
        self.dims: int | None = None  # the embedder's dimension (the store's, or accepted)
        self._indexing: set[str] = set()  # sessions with a job in flight in this engine

    async def start(self) -> VectorSupport:
        """Ready the store (pgvector, else the fallback) and say which, at start."""
        self.vectors = await self.store.recall_prepare()
        self.dims = await self.store.recall_dimension(self.embedder.name)
        if self.vectors.missing:
            log.warning(
                "funnel '%s': memory.recall: %s. Recall runs on the real[] fallback (an "
                "exact scan of the session's embeddings in SQL: fine for sessions of some "
                "hundreds of messages, bench/recall.py); to turn recall off, remove "
                "memory.recall from the funnel", self.spec.name, self.vectors.missing)
        return self.vectors

    async def embed_query(self, text: str) -> list[float] | None:
        """The customer message's vector, or None when the embedder fails (the turn goes
        on without recall; the caller bounds the wait by ``deadline``)."""
        try:
            vectors = await self._embed([text], self.settings.deadline)
        except FunnelError as exc:
            log.warning("funnel '%s': recall goes without this turn's query: %s",
                        self.spec.name, exc)
            return None
        return vectors[0]

    async def _embed(self, texts: list[str], timeout: float) -> list[list[float]]:
        """The embedder's vectors for ``texts``, checked (engine.boundary.vectors).

        Raises:
            ModelError: the call failed, or answered something that is not vectors of
                the model's dimension (any embedder's failure is one)."""
        name = getattr(self.embedder, "name", "?")
        try:
            answer = await self.embedder.embed(texts, timeout=timeout)
        except FunnelError:
            raise
        except Exception as exc:  # an embedder's bug: a failed call, never a failed turn
            raise ModelError(f"embedder {name!r} failed ({type(exc).__name__}): "
                             f"{first_line(exc)}") from None
        try:
            vectors = unit_vectors(answer, len(texts), self.dims)
        except Rejected as exc:
            raise ModelError(f"embedder {name!r} answered no usable vectors: {exc}"
                             ) from None
        self.dims = len(vectors[0]) if vectors else self.dims
        return vectors

    async def find(self, session_id: str, query: Sequence[float], upto: int
                   ) -> list[Snippet]:
        """The stretches of ``session_id`` before message ``upto`` like ``query``."""
        s = self.settings
        found = await self.store.recall_search(
            self.spec.name, session_id, self.embedder.name, query, upto=upto,
            top_k=s.top_k, before=s.before, after=s.after, min_similarity=s.min_similarity)
        return snippets(found, s)

    async def index(self, session_id: str, known: dict[int, list[float]] | None = None
                    ) -> int:
        """Embed the session's messages not embedded yet (``known``: vectors computed
        already, by message id); how many were stored. Never raises a FunnelError:
        what fails is logged and left to the next job."""
        if session_id in self._indexing:
            return 0  # the job in flight, or the next one, takes these too
        self._indexing.add(session_id)
        try:
            todo = await self.store.recall_pending(self.spec.name, session_id,
                                                   self.embedder.name, INDEX_BATCH)
            have = {i: v for i, v in (known or {}).items() if any(i == t for t, _ in todo)}
            rest = [(i, text) for i, text in todo if i not in have]
            if rest:
                vectors = await self._embed([t for _, t in rest], INDEX_TIMEOUT)
                have.update({i: v for (i, _), v in zip(rest, vectors, strict=True)})
            if have:
                await self.store.recall_save(self.spec.name, self.embedder.name,
                                             sorted(have.items()))
            return len(have)
        except FunnelError as exc:
            log.warning("session %r: messages not embedded yet (the next turn's job tries "
                        "again): %s", session_id, exc)
            return 0
        finally:
            self._indexing.discard(session_id)


async def waited(task: asyncio.Task[list[float] | None] | None, timeout: float
                 ) -> list[float] | None:
    """The query's vector if it is there within ``timeout`` seconds, else None (the task
    is cancelled: its turn goes on without recall)."""
    if task is None:
        return None
    done, _ = await asyncio.wait({task}, timeout=max(0.0, timeout))
    if not done:
        task.cancel()
        return None
    return task.result()
