"""`funnel knowledge FUNNEL reindex|search QUERY`: the funnel's knowledge base, for authors."""

from __future__ import annotations

import argparse
import asyncio

from .. import knowledge
from ..errors import InvalidInput
from ..funnel.compiled import load_funnel
from ..store import open_store


def cmd_knowledge(args: argparse.Namespace) -> int:
    funnel = load_funnel(args.funnel)
    spec = funnel.spec
    if spec.knowledge is None:
        raise InvalidInput(f"funnel '{spec.name}' declares no `knowledge:` folder; add "
                           "`knowledge: {folder: <name>/knowledge}` (docs/knowledge.md)")
    if args.action == "search" and not args.query:
        raise InvalidInput("`funnel knowledge FUNNEL search` needs a QUERY, e.g. "
                           "'my Sphynx has dry skin'")
    want = None
    if args.stage:
        stage = funnel.stage(args.stage).spec
        if stage.knowledge is None:
            raise InvalidInput(f"stage '{args.stage}' declares no `knowledge:`; search without "
                               "--stage, or declare `knowledge: {top_k, budget}` for it")
        want = stage.knowledge

    async def run() -> int:
        store = await open_store(args.db)
        try:
            await store.ensure_schema(spec)
            if args.action == "reindex":
                done = await knowledge.reindex(store, spec)
                assert done is not None
                print(f"indexed {done[0]} chunk(s) from {spec.knowledge.folder} "  # type: ignore[union-attr]
                      f"(text search configuration: {done[1]})")
                return 0
            await knowledge.ensure_index(store, spec)
            query = " ".join(args.query)
            found = await store.knowledge_search(spec.name, query, max(args.top_k * 4, 10))
            chosen = knowledge.fit(found, want.top_k, want.budget) if want else \
                [c for c, _ in found[:args.top_k]]
            ranks = {c.id: r for c, r in found}
            if not chosen:
                print("no chunk matches")
                return 1
            for chunk in chosen:
                first = chunk.body.splitlines()[0] if chunk.body else ""
                print(f"{ranks[chunk.id]:.3f}  {chunk.id}  ({chunk.tokens} tokens)  {chunk.title}")
                print(f"       {first[:100]}")
            return 0
        finally:
            await store.close()

    return asyncio.run(run())
