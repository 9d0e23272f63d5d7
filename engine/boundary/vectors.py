"""Embedding vectors from an embedder: checked at one place before anything uses them.

An embedder's answer crosses a trust boundary like a model's: a server may answer
strings, ``NaN``, infinities, a vector of another dimension than the model's, or
200,000 values. :func:`unit_vectors` takes only what semantic recall can use:

- one vector per text, each a list of 1 to :data:`MAX_DIMS` numbers (``int`` or
  ``float``, never ``bool`` or a string), every one finite;
- one dimension: every vector of an answer has the first's, and that is the model's
  when it is known (``dims``: the vectors it answered before, or those in the store);
- not all zeros (a zero vector says nothing of its text, and its cosine similarity is
  undefined: pgvector makes it ``NaN``, which sorts above every match).

The vectors come back scaled to length 1 (a dot product is then their cosine
similarity). Anything else is :class:`~engine.boundary.sanitize.Rejected`, with a
sentence that says what was wrong; the caller turns it into a failed embedding call
(a warning, never a failed turn: docs/memory.md).
"""

from __future__ import annotations

import math
from typing import Any

from .sanitize import Rejected, excerpt

__all__ = ["MAX_DIMS", "checked", "unit_vectors"]

#: The most values one embedding may hold: above every embedding model's (3,072 for
#: OpenAI's text-embedding-3-large, 4,096 for the largest open ones).
MAX_DIMS = 8192


def unit_vectors(answer: Any, count: int, dims: int | None = None) -> list[list[float]]:
    """``answer`` (one vector per text, ``count`` texts) as unit vectors of one dimension.

    Raises:
        Rejected: the answer is not ``count`` vectors of finite numbers of the model's
            dimension (``dims``, when known), at most :data:`MAX_DIMS` long.
    """
    if not isinstance(answer, list | tuple):
        raise Rejected(f"the answer is {_kind(answer)}, not a list of vectors")
    if len(answer) != count:
        raise Rejected(f"{len(answer)} vector(s) for {count} text(s)")
    out: list[list[float]] = []
    for i, vector in enumerate(answer):
        where = f"vector {i}" if count > 1 else "the vector"
        numbers = checked(vector, dims, where)
        dims = len(numbers)
        norm = math.hypot(*numbers)
        if norm == 0.0:
            raise Rejected(f"{where} is all zeros")
        out.append([x / norm for x in numbers])
    return out


def checked(vector: Any, dims: int | None = None, where: str = "the vector") -> list[float]:
    """``vector`` as a list of finite floats of ``dims`` values (any, when None).

    Raises:
        Rejected: says what was wrong with it.
    """
    if not isinstance(vector, list | tuple):
        raise Rejected(f"{where} is {_kind(vector)}, not a list of numbers")
    if not vector:
        raise Rejected(f"{where} is empty")
    if len(vector) > MAX_DIMS:
        raise Rejected(f"{where} has {len(vector):,} values, more than the {MAX_DIMS:,} an "
                       "embedding may hold")
    if dims is not None and len(vector) != dims:
        raise Rejected(f"{where} has {len(vector):,} values where this model's vectors have "
                       f"{dims:,}")
    numbers: list[float] = []
    for x in vector:
        if type(x) is not float and type(x) is not int:
            raise Rejected(f"{where} holds {excerpt(x)}, not a number")
        try:
            value = float(x)
        except OverflowError:  # an integer past any float
            raise Rejected(f"{where} holds a number too large to be a float") from None
        numbers.append(value)
    if not all(map(math.isfinite, numbers)):
        bad = next(x for x in numbers if not math.isfinite(x))
        raise Rejected(f"{where} holds {bad!r}: its values must be finite numbers")
    return numbers


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return f"a string ({excerpt(value)})"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"

