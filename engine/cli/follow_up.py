"""`funnel follow-up FUNNEL [--dry-run]`: one pass of the follow-up scheduler, for cron.

``funnel serve`` runs the same pass on every dispatch; this command is for a funnel
served elsewhere (or not served at all: its follow-ups wait in the outbox for the
service that delivers the session's channel). docs/follow-ups.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from typing import Any

from ..funnel.compiled import load_funnel
from ..llm.models import ScriptedModel
from ..store import open_store
from ..turn import follow_up_webhook
from ..turn.engine import Engine
from ..turn.follow_up import run_due


def moment(text: str) -> datetime:
    """``--now``: an ISO 8601 time (UTC when it names no zone).

    Raises:
        ValueError: not an ISO 8601 time.
    """
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not an ISO 8601 time: {text!r:.40} (e.g. "
                         "2026-12-02T09:00:00+02:00)") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _line(entry: dict[str, Any]) -> str:
    detail = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in entry.items()
              if k not in ("session_id", "outcome")}
    return f"{entry['session_id']}\t{entry['outcome']}\t{json.dumps(detail, ensure_ascii=False)}"


def cmd_follow_up(args: argparse.Namespace) -> int:
    try:
        now = moment(args.now) if args.now else None
    except ValueError as exc:
        print(f"funnel follow-up: error: --now: {exc}", file=sys.stderr)
        return 2
    if args.limit < 1:
        print(f"funnel follow-up: error: --limit must be 1 or more; got {args.limit}",
              file=sys.stderr)
        return 2
    funnel = load_funnel(args.funnel)

    async def run() -> list[dict[str, Any]]:
        store = await open_store(args.db)
        try:
            # A follow-up is a template, never a model's: no model is called.
            engine = await Engine.open(funnel, store=store, model=ScriptedModel())
            done = await run_due(engine, now=now, dry_run=args.dry_run, limit=args.limit)
            if not args.dry_run:  # no service may run to deliver them: the webhook's now
                await follow_up_webhook.deliver(store, funnel.name)
            return done
        finally:
            await store.close()

    done = asyncio.run(run())
    for entry in done:
        print(_line(entry))
    sent = sum(e["outcome"] == "sent" for e in done)
    verb = "due" if args.dry_run else "sent"
    count = len(done) if args.dry_run else sent
    print(f"{count} follow-up(s) {verb} in funnel '{funnel.name}'")
    return 0
