"""`funnel purge --anonymize`: a session's rows stay, its personal data goes, everywhere.

What is personal is declared per state field (engine.format.personal): a whole
field (``retention: personal``), or a part of one (``personal: true`` on a
property, or on the items of an array). Each copy the engine keeps is cleared
by the same declaration:

- the state row: personal fields reset to their defaults, marked parts removed,
  the rolling summary (or the observations) emptied, ``notices`` set to
  ``["anonymized"]``; ``row_version`` moves on, so a turn that read the row before
  (and lost its lease) can no longer save over it;
- the message log: every message's text (the customer's and the replies, which
  may quote them), and the messages' embeddings (semantic recall), deleted;
- the turn records: the model's raw output, the explanation (the values its
  conditions read), an error's text, the refusals' reasons;
- the outbox: the hand-off alert's copy of the customer and of the state, a
  channel reply's text, a delivery error's text;
- the control events: a manager's note on an approval's decision (a rejection's
  reason may quote the customer);
- the delivery keys (idempotency records), which replay the reply: deleted.

Kept: the session id, the stages and their times, counts, the cart and the other
undeclared fields, orders (engine.records.orders), which is what `funnel report`
reads. See docs/persistence.md.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from ..format.spec import FieldSpec, FunnelSpec
from . import ddl
from .statements import default_literal, dumps

ANONYMIZED = "[anonymized]"


def _jsonb(value: Any) -> Jsonb:
    return Jsonb(value, dumps=dumps)


def _personal(funnel: FunnelSpec) -> list[FieldSpec]:
    return [f for f in funnel.state.values() if f.personal_paths]


async def anonymize_sessions(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                             ids: list[str], counts: dict[str, int]) -> int:
    """Anonymize the sessions ``ids`` (leased and locked by the caller); how many."""
    fields = _personal(funnel)
    await _state_rows(conn, funnel, fields, ids)
    await _outbox(conn, funnel, ids)
    cur = await conn.execute(sql.SQL(
        "UPDATE {} SET content = %s WHERE funnel = %s AND session_id = ANY(%s)").format(
            sql.Identifier(ddl.MESSAGES)), (ANONYMIZED, funnel.name, ids))
    counts["messages"] += cur.rowcount
    # Embeddings are a copy of the messages (semantic recall): after the text, so that
    # an embedding being saved meanwhile either lands before this or not at all
    # (engine.store.recall).
    await forget_embeddings(conn, funnel, ids)
    # Delivery keys replay the reply they stored: gone with the text.
    await conn.execute(sql.SQL("DELETE FROM {} WHERE funnel = %s AND session_id = ANY(%s)")
                       .format(sql.Identifier(ddl.INBOUND)), (funnel.name, ids))
    # A manager's note on an approval's decision (``funnel_control_events.detail``): the
    # decision, the manager, the stages and the wait stay (`funnel report` counts them).
    await conn.execute(sql.SQL(
        "UPDATE {} SET detail = jsonb_set(detail, '{{note}}', to_jsonb(%s::text)) "
        "WHERE funnel = %s AND session_id = ANY(%s) AND jsonb_typeof(detail->'note') "
        "= 'string'").format(sql.Identifier(ddl.CONTROL_EVENTS)),
        (ANONYMIZED, funnel.name, ids))
    # A turn's error and raw output may quote the model's output, and so the customer;
    # its explanation, the values of the fields its conditions read; a refusal's reason,
    # the value refused; a refused claim, the reply's words. What the turn did (stages,
    # actions, counts, cost, the kinds of claims refused) stays.
    await conn.execute(sql.SQL(
        "UPDATE {} SET error = CASE WHEN error IS NULL THEN NULL ELSE %s END, "
        "explain = NULL, raw_output = NULL, refused = COALESCE((SELECT jsonb_agg("
        "jsonb_build_object('type', r->'type')) FROM jsonb_array_elements(refused) r), "
        "'[]'), claims = COALESCE((SELECT jsonb_agg(jsonb_build_object('kind', c->'kind', "
        "'name', c->'name', 'attempt', c->'attempt')) FROM jsonb_array_elements(claims) c), "
        "'[]') WHERE funnel = %s AND session_id = ANY(%s)"
    ).format(sql.Identifier(ddl.TURNS)), (ANONYMIZED, funnel.name, ids))
    return len(ids)


async def forget_embeddings(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                            ids: list[str]) -> None:
    """Delete the sessions' message embeddings (semantic recall's copy of the text)."""
    await conn.execute(sql.SQL("DELETE FROM {} WHERE funnel = %s AND session_id = ANY(%s)")
                       .format(sql.Identifier(ddl.EMBEDDINGS)), (funnel.name, ids))


async def _state_rows(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                      fields: list[FieldSpec], ids: list[str]) -> None:
    whole = [f for f in fields if f.personal]
    sets: list[sql.Composable] = [
        sql.SQL("{} = {}").format(sql.Identifier(f.name), default_literal(f)) for f in whole]
    # The rolling summary (or the observations) retells the messages cleared below.
    summary = funnel.state.get(funnel.memory.summary or "")
    if summary is not None and not summary.personal:
        sets.append(sql.SQL("{} = {}").format(sql.Identifier(summary.name),
                                              default_literal(summary)))
    # A summary being folded meanwhile (in the background, compare-and-set on
    # summary_upto) must not land: every message so far counts as folded, into nothing.
    sets.append(sql.SQL(
        "summary_upto = GREATEST(summary_upto, COALESCE((SELECT max(m.id) FROM {m} m WHERE "
        "m.funnel = %(f)s AND m.session_id = {t}.session_id), 0))").format(
            m=sql.Identifier(ddl.MESSAGES), t=sql.Identifier(funnel.table)))
    sets.append(sql.SQL("notices = '[\"anonymized\"]'::jsonb"))
    sets.append(sql.SQL("row_version = row_version + 1"))
    await conn.execute(sql.SQL("UPDATE {} SET {} WHERE session_id = ANY(%(ids)s)").format(
        sql.Identifier(funnel.table), sql.SQL(", ").join(sets)), {"ids": ids, "f": funnel.name})
    parts = [f for f in fields if not f.personal]  # marked parts of a field
    if not parts:
        return
    names = [sql.Identifier(f.name) for f in parts]
    rows = await (await conn.execute(sql.SQL("SELECT session_id, {} FROM {} WHERE "
                                             "session_id = ANY(%s)").format(
        sql.SQL(", ").join(names), sql.Identifier(funnel.table)), (ids,))).fetchall()
    update = sql.SQL("UPDATE {} SET {} WHERE session_id = %s").format(
        sql.Identifier(funnel.table),
        sql.SQL(", ").join(sql.SQL("{} = %s").format(n) for n in names))
    async with conn.cursor() as cur:
        await cur.executemany(update, [
            [*(_jsonb(f.scrubbed(value)) for f, value in zip(parts, row[1:], strict=True)),
             row[0]] for row in rows])


def scrub_payload(funnel: FunnelSpec, payload: Any) -> Any:
    """An outbox payload without the personal data the funnel declares: the hand-off's
    ``customer`` and its copy of the state, a reply's ``text``."""
    if not isinstance(payload, dict):
        return payload
    out = dict(payload)
    if "customer" in out:
        out["customer"] = None
    if isinstance(out.get("text"), str):
        out["text"] = ANONYMIZED
    summary = funnel.memory.summary
    for key in ("state", None):
        target = out.get(key) if key else out
        if not isinstance(target, dict):
            continue
        target = dict(target)
        for f in funnel.state.values():
            if f.name in target and f.personal_paths:
                target[f.name] = f.scrubbed(target[f.name])
        if summary and summary in target:
            target[summary] = None
        if key:
            out[key] = target
        else:
            out = target
    return out


async def _outbox(conn: psycopg.AsyncConnection[Any], funnel: FunnelSpec,
                  ids: list[str]) -> None:
    rows = await (await conn.execute(sql.SQL(
        "SELECT id, payload FROM {} WHERE funnel = %s AND session_id = ANY(%s)").format(
            sql.Identifier(ddl.OUTBOX)), (funnel.name, ids))).fetchall()
    if not rows:
        return
    async with conn.cursor() as cur:
        await cur.executemany(sql.SQL(
            "UPDATE {} SET payload = %s, last_error = CASE WHEN last_error IS NULL THEN NULL "
            "ELSE %s END WHERE id = %s").format(sql.Identifier(ddl.OUTBOX)),
            [(_jsonb(scrub_payload(funnel, payload)), ANONYMIZED, id_)
             for id_, payload in rows])
