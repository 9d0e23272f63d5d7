"""Periodic jobs that one worker of many runs once per period (``funnel_jobs``).

Every worker of `funnel serve` wakes up once a period; the first to take the
job's advisory lock (``pg_try_advisory_xact_lock``, no waiting) and find it due
runs it, holding the lock meanwhile, and records when it ran in the same
transaction. The others skip: the lock is taken, or the job ran less than
``DUE_FRACTION`` of a period ago. A job that fails rolls its record back, so it
is due again at the next wake-up.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from psycopg import sql
from psycopg.types.json import Jsonb

from . import ddl
from .session import Connect

T = TypeVar("T")

# Workers wake at their own times: a job that ran 90% of a period ago is due again,
# so timers that drift a little still give one run per period.
DUE_FRACTION = 0.9


async def run_if_due(connect: Connect, job: str, period: float,
                     work: Callable[[], Awaitable[T]],
                     result: Callable[[T], Any] | None = None) -> tuple[str, T | None]:
    """Run ``work`` if no other worker runs ``job`` now and it did not run in the last
    ``DUE_FRACTION * period`` seconds; ``("done", its value)``, else ``("busy" | "not_due",
    None)``. ``work`` uses connections of its own; ``result`` makes its value the JSON
    stored with the run."""
    async with connect() as conn, conn.transaction():
        locked = await (await conn.execute(
            "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))",
            (f"funnel-job:{job}",))).fetchone()
        if not (locked and locked[0]):
            return "busy", None
        recent = await (await conn.execute(sql.SQL(
            "SELECT 1 FROM {} WHERE job = %s AND last_run_at > NOW() - %s * INTERVAL '1 s'"
        ).format(sql.Identifier(ddl.JOBS)), (job, period * DUE_FRACTION))).fetchone()
        if recent:
            return "not_due", None
        value = await work()
        await conn.execute(sql.SQL(
            "INSERT INTO {} (job, last_run_at, result) VALUES (%s, NOW(), %s) ON CONFLICT (job) "
            "DO UPDATE SET last_run_at = EXCLUDED.last_run_at, result = EXCLUDED.result"
        ).format(sql.Identifier(ddl.JOBS)),
            (job, Jsonb(result(value) if result else None)))
        return "done", value
