"""Semantic recall's storage: one embedding per logged message, searched per session.

``funnel_embeddings`` (a shared migration, `engine.store.ddl`) keeps a unit vector
per message of the log, with the embedding model that made it; its rows reference
the message (``ON DELETE CASCADE``), so deleting a session's messages (`funnel purge`,
the orphan purge) deletes its embeddings too; anonymizing deletes them explicitly
(engine.store.anonymize).

Two ways to search, chosen once per store by :func:`prepare`:

- ``pgvector``: the server has the extension (the embedded server does): the column
  is turned into ``vector`` (once, under the migration lock) and ranked with ``<=>``;
- ``array``: no pgvector: the column stays ``real[]`` and the dot product of unit
  vectors is computed in SQL (``unnest``). Recall never crosses sessions, so each
  search reads one session's embeddings either way: an exact scan, no index needed
  (bench/recall.py measures both).

A search takes the session's best matches older than the prompt's window and their
neighbours in the session's order (``before`` and ``after`` messages, older than the
window too), in one statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from ..boundary.vectors import checked
from ..errors import first_line
from ..format.names import EMBEDDINGS, MESSAGES
from .anonymize import ANONYMIZED
from .base import Match, VectorSupport

__all__ = ["Match", "VectorSupport", "dimension", "pending", "prepare", "save", "search"]

_E = sql.Identifier(EMBEDDINGS)
_M = sql.Identifier(MESSAGES)
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('funnel-migrations', 0))"

INSTALL_HINT = ("install pgvector on the server (Debian/Ubuntu with the PGDG repository: "
                "`apt-get install postgresql-<version>-pgvector`; or build it from "
                "https://github.com/pgvector/pgvector), then `CREATE EXTENSION vector` as a "
                "superuser")


async def support(conn: psycopg.AsyncConnection[Any]) -> tuple[str | None, bool]:
    """(the schema of the installed ``vector`` extension or None, whether it is available)."""
    row = await (await conn.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
        "WHERE e.extname = 'vector'")).fetchone()
    if row:
        return str(row[0]), True
    row = await (await conn.execute(
        "SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")).fetchone()
    return None, row is not None


async def prepare(conn: psycopg.AsyncConnection[Any]) -> VectorSupport:
    """Use pgvector when the server has it (creating the extension when it is available
    and this role may), else the ``real[]`` fallback; say which, and why."""
    schema, available = await support(conn)
    if schema is None and available:
        try:
            async with conn.transaction():
                await conn.execute(_LOCK)
                await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except psycopg.Error as exc:
            return VectorSupport("array", missing=(
                f"pgvector is available on the server but this role cannot create it "
                f"({first_line(exc)}): run `CREATE EXTENSION vector` as a superuser"))
        schema, _ = await support(conn)
    if schema is None:
        return VectorSupport("array", missing=f"this PostgreSQL server has no pgvector: "
                             f"{INSTALL_HINT}")
    kind = await (await conn.execute(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
        "to_regclass(%s) AND attname = 'embedding'", (EMBEDDINGS,))).fetchone()
    if kind and kind[0].endswith("[]"):  # made before pgvector was there: convert, once
        async with conn.transaction():
            await conn.execute(_LOCK)
            await conn.execute(sql.SQL(
                "ALTER TABLE {e} ALTER COLUMN embedding TYPE {s}.vector USING "
                "embedding::{s}.vector").format(e=_E, s=sql.Identifier(schema)))
    return VectorSupport("pgvector", schema)


_PENDING = sql.SQL(
    "SELECT m.id, m.content FROM {m} m WHERE m.funnel = %(f)s AND m.session_id = %(s)s "
    "AND m.role <> 'system' AND m.content <> %(anon)s AND NOT EXISTS (SELECT 1 FROM {e} e "
    "WHERE e.message_id = m.id AND e.model = %(model)s) ORDER BY m.id DESC LIMIT %(n)s"
).format(m=_M, e=_E)


async def pending(conn: psycopg.AsyncConnection[Any], funnel: str, session_id: str,
                  model: str, limit: int) -> list[tuple[int, str]]:
    """The session's newest messages without an embedding by ``model``: (id, text)."""
    rows = await (await conn.execute(_PENDING, {
        "f": funnel, "s": session_id, "anon": ANONYMIZED, "model": model, "n": limit,
    })).fetchall()
    return [(int(i), str(c)) for i, c in rows]


# FOR SHARE: an anonymization (which rewrites the message, then deletes its embeddings)
# either waits for this insert and deletes what it wrote, or goes first, and then the
# message reads as anonymized here and nothing is written.
_SAVE = sql.SQL(
    "WITH m AS (SELECT id, session_id FROM {m} WHERE id = %(id)s AND funnel = %(f)s AND "
    "content <> %(anon)s FOR SHARE) INSERT INTO {e} (message_id, funnel, session_id, model, "
    "embedding) SELECT m.id, %(f)s, m.session_id, %(model)s, %(v)s::real[] FROM m "
    "ON CONFLICT (message_id) DO UPDATE SET model = EXCLUDED.model, "
    "embedding = EXCLUDED.embedding, created_at = NOW()").format(m=_M, e=_E)


async def save(conn: psycopg.AsyncConnection[Any], funnel: str, model: str,
               vectors: Sequence[tuple[int, Sequence[float]]]) -> None:
    """Store messages' embeddings (unit vectors), replacing another model's.

    Raises:
        Rejected: a vector is not finite numbers, at most MAX_DIMS of them, of one
            dimension (engine.boundary.vectors; engine.memory.recall checked them
            already: this is the last guard before the table)."""
    rows = []
    dims: int | None = None
    for i, v in vectors:
        numbers = checked(v, dims, f"the embedding of message {i}")
        dims = len(numbers)
        rows.append({"id": i, "f": funnel, "anon": ANONYMIZED, "model": model, "v": numbers})
    async with conn.transaction(), conn.cursor() as cur:
        await cur.executemany(_SAVE, rows)


async def dimension(conn: psycopg.AsyncConnection[Any], vs: VectorSupport, model: str
                    ) -> int | None:
    """The dimension of ``model``'s stored embeddings (None when it has none)."""
    row = await (await conn.execute(sql.SQL(
        "SELECT {dims} FROM {e} e WHERE e.model = %(model)s LIMIT 1").format(
            dims=_dims(vs), e=_E), {"model": model})).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def _similarity(vs: VectorSupport) -> sql.Composable:
    if vs.mode == "pgvector":
        s = sql.Identifier(vs.schema or "public")
        return sql.SQL("1 - (e.embedding OPERATOR({s}.<=>) %(q)s::real[]::{s}.vector)"
                       ).format(s=s)
    # Unit vectors: their dot product is the cosine similarity.
    return sql.SQL("(SELECT sum(a * b) FROM unnest(e.embedding, %(q)s::real[]) AS t(a, b))")


def _dims(vs: VectorSupport) -> sql.Composable:
    if vs.mode == "pgvector":
        return sql.SQL("{}.vector_dims(e.embedding)").format(sql.Identifier(vs.schema or "public"))
    return sql.SQL("cardinality(e.embedding)")


# The session's embeddings are ranked (an exact scan of one session: recall never
# crosses sessions), then each of the best few gets its neighbours by the message log's
# index (funnel, session_id, id DESC): only they are read, however long the session.
_NEAR = ("SELECT id, role, content FROM {m} WHERE funnel = %(f)s AND session_id = %(s)s "
         "AND role <> 'system' AND ")
_SEARCH = (
    "WITH hits AS MATERIALIZED (SELECT e.message_id AS id, {sim} AS similarity FROM {e} e "
    "WHERE e.funnel = %(f)s AND e.session_id = %(s)s AND e.model = %(model)s AND "
    "e.message_id < %(upto)s AND {dims} = %(d)s ORDER BY similarity DESC, e.message_id DESC "
    "LIMIT %(k)s) "
    "SELECT m.id, m.role, m.content, m.id, h.id, h.similarity FROM hits h CROSS JOIN LATERAL ("
    "(" + _NEAR + "id < h.id ORDER BY id DESC LIMIT %(before)s) UNION ALL "
    "(" + _NEAR + "id = h.id) UNION ALL "
    "(" + _NEAR + "id > h.id AND id < %(upto)s ORDER BY id LIMIT %(after)s)) m "
    "WHERE h.similarity > %(min)s ORDER BY h.similarity DESC, h.id, m.id")


def search_statement(vs: VectorSupport) -> sql.Composed:
    return sql.SQL(_SEARCH).format(m=_M, e=_E, sim=_similarity(vs), dims=_dims(vs))


async def search(conn: psycopg.AsyncConnection[Any], vs: VectorSupport, funnel: str,
                 session_id: str, model: str, query: Sequence[float], *, upto: int,
                 top_k: int, before: int, after: int, min_similarity: float
                 ) -> list[Match]:
    """The session's ``top_k`` messages most similar to ``query`` among those older than
    message ``upto``, each with its neighbours, best match first. Only this session's."""
    rows = await (await conn.execute(search_statement(vs), {
        "f": funnel, "s": session_id, "upto": upto, "model": model, "q": list(query),
        "d": len(query), "k": top_k, "before": before, "after": after,
        "min": min_similarity,
    })).fetchall()
    return [Match(int(i), str(role), str(content), int(n), int(hit), float(sim))
            for i, role, content, n, hit, sim in rows]
