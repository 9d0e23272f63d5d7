"""The knowledge base in PostgreSQL: shared tables, full-text search.

``funnel_knowledge`` keeps every funnel's chunks with a ``tsvector`` built under
the text search configuration of the funnel's knowledge language (``english``,
``russian``, ...; ``simple`` for languages PostgreSQL has none for, such as
Ukrainian and Polish) and a GIN index; ``funnel_knowledge_sets`` one row per
funnel (configuration, digest, chunk count); ``funnel_knowledge_terms`` how many
chunks each lexeme is in. The tables come from the shared migrations
(`engine.store.ddl`).

A search takes the query's lexemes under the funnel's configuration and keeps
the eight rarest that occur at all. The candidates are the chunks with any of
the rarest lexemes, added rarest first while they reach at most a tenth of the
chunks (at least 200; the rarest always counts): the GIN index finds them, and
only they are read. They are ranked (``ts_rank``, the heading weighted over the
body) by all kept lexemes but those in more than a fifth of the chunks (at least
50), ORed: a customer's message is not a conjunction. So "my Sphynx has dry
skin" reads the Sphynx chunks and ranks those about dry skin first. Both
tsqueries are computed once (a materialized CTE read by initplans).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from ..format.names import KNOWLEDGE, KNOWLEDGE_SETS, KNOWLEDGE_TERMS
from ..records.chunks import Chunk
from .wire import Prepared, encode, positional, run

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

_CHUNKS = sql.Identifier(KNOWLEDGE)
_SETS = sql.Identifier(KNOWLEDGE_SETS)
_TERMS = sql.Identifier(KNOWLEDGE_TERMS)


async def text_config(conn: psycopg.AsyncConnection[Any], language: str | None) -> str:
    """The text search configuration for a language that this server has, else ``simple``."""
    name = CONFIGS.get(language or "", "simple")
    row = await (await conn.execute("SELECT 1 FROM pg_ts_config WHERE cfgname = %s",
                                    (name,))).fetchone()
    return name if row else "simple"


async def digest_of(conn: psycopg.AsyncConnection[Any], funnel: str) -> str | None:
    row = await (await conn.execute(
        sql.SQL("SELECT digest FROM {} WHERE funnel = %s").format(_SETS), (funnel,)
    )).fetchone()
    return str(row[0]) if row else None


async def replace(conn: psycopg.AsyncConnection[Any], funnel: str, chunks: Sequence[Chunk],
                  digest: str, config: str) -> None:
    """Replace a funnel's chunks in one transaction (searches see the old or the new set)."""
    insert = sql.SQL(
        "INSERT INTO {} (funnel, id, source, title, body, tokens, tsv) "
        "VALUES (%s, %s, %s, %s, %s, %s, setweight(to_tsvector(%s::regconfig, %s), 'A') || "
        "to_tsvector(%s::regconfig, %s))").format(_CHUNKS)
    # ts_stat takes a query text: the funnel's name goes in as a quoted literal.
    stats = sql.SQL("INSERT INTO {} (funnel, lexeme, ndoc) SELECT %s, word, ndoc FROM "
                    "ts_stat({})").format(_TERMS, sql.Literal(
                        sql.SQL("SELECT tsv FROM {} WHERE funnel = {}").format(
                            _CHUNKS, sql.Literal(funnel)).as_string(conn)))
    async with conn.transaction():
        # Workers starting together each reindex a changed folder: one at a time, or
        # their inserts would collide on the primary key.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                           (f"{KNOWLEDGE}:{funnel}",))
        for table in (_CHUNKS, _TERMS, _SETS):
            await conn.execute(sql.SQL("DELETE FROM {} WHERE funnel = %s").format(table),
                               (funnel,))
        async with conn.cursor() as cur:
            await cur.executemany(insert, [
                (funnel, c.id, c.source, c.title, c.body, c.tokens,
                 config, c.title, config, c.body) for c in chunks])
        await conn.execute(stats, (funnel,))
        await conn.execute(sql.SQL(
            "INSERT INTO {} (funnel, config, digest, chunks) VALUES (%s, %s::regconfig, %s, %s)"
        ).format(_SETS), (funnel, config, digest, len(chunks)))


# quote_literal makes each lexeme a tsquery operand that is not parsed again, so
# customer text brings no tsquery operators.
SEARCH = sql.SQL(
    "WITH s AS MATERIALIZED (SELECT config, chunks FROM {sets} WHERE funnel = %(funnel)s), "
    "kept AS MATERIALIZED (SELECT lexeme, ndoc, "
    "row_number() OVER (ORDER BY ndoc, lexeme) AS rn, "
    "sum(ndoc) OVER (ORDER BY ndoc, lexeme) AS reach FROM (SELECT t.lexeme, t.ndoc FROM s, "
    "unnest(tsvector_to_array(to_tsvector(s.config, %(query)s))) AS l(lexeme) "
    "JOIN {terms} t ON t.funnel = %(funnel)s AND t.lexeme = l.lexeme "
    "ORDER BY t.ndoc, t.lexeme LIMIT 8) r), "
    "q AS MATERIALIZED (SELECT "
    "string_agg(quote_literal(lexeme), ' | ') FILTER (WHERE rn = 1 OR "
    "reach <= greatest(200, s.chunks / 10))::tsquery AS find, "
    "string_agg(quote_literal(lexeme), ' | ') FILTER (WHERE rn = 1 OR "
    "ndoc <= greatest(50, s.chunks / 5))::tsquery AS score FROM kept, s) "
    "SELECT k.id, k.source, k.title, k.body, k.tokens, "
    "ts_rank(k.tsv, (SELECT score FROM q)) AS rank "
    "FROM {chunks} k WHERE k.funnel = %(funnel)s AND k.tsv @@ (SELECT find FROM q) "
    "ORDER BY rank DESC, k.id LIMIT %(limit)s").format(sets=_SETS, terms=_TERMS, chunks=_CHUNKS)


# A turn's third round trip in a stage with knowledge: on libpq directly, like the
# other two (engine.store.wire).
_SEARCH, _SEARCH_NAMES = positional(SEARCH.as_string())
_SEARCH_TURN = Prepared(_SEARCH, [{"funnel": 25, "query": 25, "limit": 20}[n]
                                  for n in _SEARCH_NAMES])


async def search(conn: psycopg.AsyncConnection[Any], funnel: str, query: str, limit: int
                 ) -> list[tuple[Chunk, float]]:
    """The best chunks of a funnel for a query, best first, with their ranks."""
    values = {"query": query[:MAX_QUERY_CHARS], "funnel": funnel, "limit": limit}
    found = await run(conn, _SEARCH_TURN, [encode(values[n]) for n in _SEARCH_NAMES])
    rows = ([found.get_value(r, c) or b"" for c in range(6)] for r in range(found.ntuples))
    return [(Chunk(i.decode(), source.decode(), title.decode(), body.decode(), int(tokens)),
             float(rank)) for i, source, title, body, tokens, rank in rows]
