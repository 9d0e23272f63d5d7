"""``/readyz``: can this process answer turns now, and if not, exactly why.

Ready means: the database answers, and every funnel's table has every column the
running funnel declares. A table *ahead* of the running funnel (``funnel
migrate`` added a column for the next version, mid-rollout) is compatible: the
turn's statements name their columns, so the process stays ready and says so.
The body never shows the database's address: an unready probe is public. ``versions``
shows, per funnel, the version new turns run on, the versions this process holds,
the open sessions by version and the last hot reload or refused edit
(engine.service.reload).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg

from ..errors import StoreUnavailable

if TYPE_CHECKING:
    from .core import Service


def _problem(exc: BaseException) -> str:
    """An error without addresses: the server's own message, or just the error's type."""
    if isinstance(exc, psycopg.Error) and exc.diag.message_primary:
        return f"{type(exc).__name__} ({exc.sqlstate}): {exc.diag.message_primary}"[:300]
    return type(exc).__name__


async def readiness(service: Service) -> tuple[bool, dict[str, Any]]:
    """(ready, the body): ``database`` and, per funnel, ``ok`` or what is wrong."""
    funnels: dict[str, str] = {}
    notes: dict[str, str] = {}
    try:
        await service.open_engines()
        for name, engine in service.engines.items():
            missing, extra = await engine.store.check_schema(engine.spec)
            if missing:
                funnels[name] = (f"schema outdated: table {engine.spec.table!r} lacks "
                                 f"column(s) {', '.join(missing)}; run `funnel migrate`")
                continue
            funnels[name] = "ok"
            if extra:
                notes[name] = (f"table {engine.spec.table!r} has column(s) this version does not "
                               f"declare ({', '.join(extra)}): compatible, turns go on")
        database = "ok"
        service.recovered()  # the database answers again: stop refusing turns
    except StoreUnavailable:
        database = (f"unreachable: no connection to PostgreSQL; retrying every "
                    f"{service.config.retry_after} s")
    except Exception as exc:  # readiness reports a failure, it does not raise one
        database = f"error: {_problem(exc)}"
    funnels.update({n: f"schema outdated: {p}" for n, p in service.problems.items()
                    if funnels.get(n) != "ok"})
    for name in service.funnels:
        funnels.setdefault(name, "not open: the database was not reached yet")
    ready = database == "ok" and all(v == "ok" for v in funnels.values())
    body: dict[str, Any] = {"ready": ready, "database": database, "funnels": funnels,
                            "versions": await service.reloader.versions()}
    if notes:
        body["notes"] = notes
    return ready, body
