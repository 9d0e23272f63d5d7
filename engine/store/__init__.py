"""Session storage in PostgreSQL, behind the small interface of `engine.store.base`.

There is one SQL dialect, PostgreSQL: a server given by URL, or the embedded
one (`embedded`) when no URL is given. The modules:

- `base`: the interface (:class:`Store`, :class:`TurnWrite`, ...), no psycopg;
- `postgres`: the store itself (one pool), `health`: its connections' set-up and checks;
  `session`: a turn's lease and save;
- `ddl`, `statements`, `functions`: the SQL, built once per funnel;
- `migrate` (tables, append-only migrations), `retention` (purge), `erasure` (one
  customer's erasure and export, over the same tables as the purge),
  `analytics_sql` (the report's queries; `analytics_shared`, the sections over the shared
  tables; `analytics_base`, what they bind), `analytics_views` (the analysts' views);
- `connect`: connection helpers shared by the others (URLs in messages, temporary schemas);
- `embedded`: the zero-set-up server.

May import: `engine.records`, `engine.sandbox`, `engine.format`, `engine.boundary`,
`engine.errors`; never the turn, the compiled funnel or a model.
"""

from __future__ import annotations

from typing import Any

from ..records.messages import Message
from .base import Control, Held, Inbound, OutboxItem, SessionAccess, Store, TurnWrite

__all__ = ["Control", "Held", "Inbound", "Message", "OutboxItem", "SessionAccess", "Store", "TurnWrite",
           "open_store"]


async def open_store(url: str | None = None, **options: Any) -> Store:
    """Open the store at ``url`` (``postgresql://...``), or the embedded PostgreSQL.

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    # Imported here so that the engine core's types load without psycopg (the store seam).
    from .embedded import embedded_url
    from .postgres import PostgresStore

    if url is None:
        url = embedded_url()
    return await PostgresStore.open(url, **options)
