"""A chunk of the knowledge base: what the store indexes and a stage's prompt shows."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Chunk"]


@dataclass(frozen=True)
class Chunk:
    """One piece of the knowledge base, as the prompt shows it."""

    id: str
    source: str  # the file, relative to the knowledge folder
    title: str  # the heading path: "Sphynx > Dry skin"
    body: str
    tokens: int
