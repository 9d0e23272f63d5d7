"""The knowledge base in PostgreSQL: one shared table, full-text search.

``funnel_knowledge`` (created by the shared migrations, `engine.store.ddl`) keeps
every funnel's chunks with a ``tsvector`` built under the text search
configuration of the funnel's knowledge language (``english``, ``russian``, ...;
``simple`` for languages PostgreSQL has none for, such as Ukrainian and Polish),
and a GIN index on it. A search ORs the query's lexemes (a customer's message
is not a conjunction) and ranks with ``ts_rank_cd``, the heading weighted over
the body.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from ..names import KNOWLEDGE
from .chunks import Chunk

# ISO 639-1 -> the configuration PostgreSQL ships; others fall back to `simple`.
CONFIGS = {
    "ar": "arabic", "ca": "catalan", "da": "danish", "de": "german", "el": "greek",
    "en": "english", "es": "spanish", "eu": "basque", "fi": "finnish", "fr": "french",
    "ga": "irish", "hi": "hindi", "hu": "hungarian", "hy": "armenian", "id": "indonesian",
    "it": "italian", "lt": "lithuanian", "ne": "nepali", "nl": "dutch", "no": "norwegian",
    "pt": "portuguese", "ro": "romanian", "ru": "russian", "sr": "serbian", "sv": "swedish",
    "ta": "tamil", "tr": "turkish", "yi": "yiddish",
}
MAX_QUERY_CHARS = 2000

_T = sql.Identifier(KNOWLEDGE)


async def text_config(conn: psycopg.AsyncConnection[Any], language: str | None) -> str:
    """The text search configuration for a language that this server has, else ``simple``."""
    name = CONFIGS.get(language or "", "simple")
    row = await (await conn.execute("SELECT 1 FROM pg_ts_config WHERE cfgname = %s",
                                    (name,))).fetchone()
    return name if row else "simple"


async def digest_of(conn: psycopg.AsyncConnection[Any], funnel: str) -> str | None:
    row = await (await conn.execute(
        sql.SQL("SELECT digest FROM {} WHERE funnel = %s LIMIT 1").format(_T), (funnel,)
    )).fetchone()
    return str(row[0]) if row else None


async def replace(conn: psycopg.AsyncConnection[Any], funnel: str, chunks: Sequence[Chunk],
                  digest: str, config: str) -> None:
    """Replace a funnel's chunks in one transaction (searches see the old or the new set)."""
    insert = sql.SQL(
        "INSERT INTO {} (funnel, id, source, title, body, tokens, config, digest, tsv) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s::regconfig, %s, "
        "setweight(to_tsvector(%s::regconfig, %s), 'A') || "
        "to_tsvector(%s::regconfig, %s))").format(_T)
    async with conn.transaction():
        await conn.execute(sql.SQL("DELETE FROM {} WHERE funnel = %s").format(_T), (funnel,))
        async with conn.cursor() as cur:
            await cur.executemany(insert, [
                (funnel, c.id, c.source, c.title, c.body, c.tokens, config, digest,
                 config, c.title, config, c.body) for c in chunks])


# The query's lexemes under the configuration the funnel's chunks were indexed with,
# ORed (a customer's message is not a conjunction): quote_literal makes each lexeme a
# tsquery operand that is not parsed again, so customer text brings no operators.
SEARCH = sql.SQL(
    "WITH c AS (SELECT config FROM {t} WHERE funnel = %(funnel)s LIMIT 1), "
    "q AS (SELECT (SELECT string_agg(quote_literal(lexeme), ' | ') "
    "FROM unnest(to_tsvector(c.config, %(query)s)))::tsquery AS tsq FROM c) "
    "SELECT k.id, k.source, k.title, k.body, k.tokens, ts_rank_cd(k.tsv, q.tsq) AS rank "
    "FROM {t} k, q WHERE k.funnel = %(funnel)s AND k.tsv @@ q.tsq "
    "ORDER BY rank DESC, k.id LIMIT %(limit)s").format(t=_T)


async def search(conn: psycopg.AsyncConnection[Any], funnel: str, query: str, limit: int
                 ) -> list[tuple[Chunk, float]]:
    """The best chunks of a funnel for a query, best first, with their ranks."""
    cur = await conn.execute(SEARCH, {"query": query[:MAX_QUERY_CHARS], "funnel": funnel,
                                      "limit": limit})
    return [(Chunk(r[0], r[1], r[2], r[3], int(r[4])), float(r[5]))
            for r in await cur.fetchall()]
