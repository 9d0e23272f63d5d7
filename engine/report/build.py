"""`funnel report`: where conversations go, how long they take, what they cost.

The numbers are computed on the database (``engine.store.analytics_sql``, one
aggregating query per section, in one read-only snapshot); this module only
shapes the aggregated rows into a report and renders it as aligned tables or
JSON (`html` renders the HTML page).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from ..format.main_path import stage_paths
from ..format.spec import FunnelSpec
from ..funnel.compiled import CompiledFunnel, load_funnel
from ..store.analytics_sql import fetch_report
from .follow_ups import follow_up_section, render_follow_ups

# (key, title) in report order; the HTML page and the tables use the same titles.
SECTIONS: tuple[tuple[str, str], ...] = (
    ("active_by_stage", "Active sessions by stage"),
    ("stage_funnel", "Funnel: sessions that reached each stage"),
    ("stage_time", "Time in each stage"),
    ("products", "Most presented products"),
    ("handoff_reasons", "Hand-off reasons"),
    ("costs", "Cost, tokens and quality"),
    ("claims", "Claims refused: what replies said that nothing backs"),
    ("purchases", "Purchases and revenue"),
    ("presented_vs_bought", "Presented vs bought"),
    ("trends", "Trends: sessions and conversions a day"),
)
TITLES = dict(SECTIONS)
# Only for a funnel with approval gates (a stage's `approval:`): after the others.
TITLES["approvals"] = "Approvals: moves that waited for a manager"


def _num(value: Any) -> Any:
    """Decimals as int or float, timestamps as ISO text: JSON-friendly values."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _rows(rows: list[dict[str, Any]], drop: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    return [{k: _num(v) for k, v in r.items() if k not in drop} for r in rows]


def format_duration(seconds: float) -> str:
    """``95`` -> ``"1m 35s"``, ``7200`` -> ``"2h"``, ``7.5`` -> ``"7.5s"``."""
    s = float(seconds)
    if s < 60:
        return f"{s:.1f}".removesuffix(".0") + "s"
    whole = int(round(s))
    for big, small, bs, ss in (("d", "h", 86400, 3600), ("h", "m", 3600, 60), ("m", "s", 60, 1)):
        if whole >= bs:
            rest = (whole % bs) // ss
            return f"{whole // bs}{big}" + (f" {rest}{small}" if rest else "")
    return f"{whole}s"  # pragma: no cover


def since_text(seconds: float) -> str:
    """``604800`` -> ``"7d"``: the window as the command line takes it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def shape(spec: FunnelSpec, data: dict[str, Any], since: float,
          catalog_names: dict[str, str] | None = None, currency: str | None = None
          ) -> dict[str, Any]:
    """The report as plain data (the JSON output) from the store's aggregated rows."""
    sec = data["sections"]
    notes: list[str] = []
    if not data["sessions_table"]:
        notes.append(f"table {spec.table} does not exist yet: no session was recorded "
                     f"(`funnel migrate {spec.path}` creates it)")
    if not data["turns_table"]:
        notes.append("table funnel_turns does not exist yet: no turn was recorded")

    active = _rows(sec["active_by_stage"], ("pos",))
    stages = _rows(sec["stage_funnel"], ("pos", "total_sessions"))
    if not stages:  # no table: every stage with zero sessions, main path first
        paths = stage_paths(spec)
        stages = [{"stage": n, "final": spec.stages[n].final, "sessions": 0, "pct_of_first": None,
                   "stopped_here": 0, "branch": n in paths.branches,
                   "branch_from": paths.branches.get(n), "ended_here": 0}
                  for n in (*paths.main, *paths.branches)]
    total = int(sec["stage_funnel"][0]["total_sessions"]) if sec["stage_funnel"] else 0
    drop = None
    candidates = [s for s in stages if not s["final"] and not s["branch"]
                  and s["stopped_here"] > 0]
    if candidates:
        worst = max(candidates, key=lambda s: (s["stopped_here"], -stages.index(s)))
        drop = {"stage": worst["stage"], "stopped": worst["stopped_here"],
                "reached": worst["sessions"],
                "pct": round(100.0 * worst["stopped_here"] / worst["sessions"], 1)}
    times = _rows(sec["stage_time"], ("pos",))
    if not times:
        times = [{"stage": s, "samples": 0, "avg_seconds": None, "median_seconds": None}
                 for s in spec.stages]

    products = None
    if spec.presented_field:
        products = _rows(sec.get("products", []))
        for p in products:
            p["name"] = (catalog_names or {}).get(p["sku"])
    handoffs = _rows(sec["handoff_reasons"]) if spec.handoff else None

    conv = _rows(sec["conversation_costs"])
    conversations = conv[0] if conv else {
        "conversations": 0, "turns": 0, "prompt_tokens": 0, "completion_tokens": 0,
        "cost": None, "avg_turns": None, "avg_tokens": None, "avg_cost": None,
        "median_cost": None, "turns_without_cost": 0, "cached_prompt_tokens": 0,
        "cached_prompt_pct": None, "cache_write_tokens": 0, "cache_write_pct": None,
        "fallback_sessions": 0}
    report = {
        "funnel": spec.name, "version": spec.version, "table": spec.table,
        "generated_at": _num(data["now"]), "since": since_text(since),
        "since_seconds": int(since) if float(since).is_integer() else since,
        "currency": currency, "notes": notes,
        "active_by_stage": {"window_hours": 24, "total": sum(r["sessions"] for r in active),
                            "rows": active},
        "stage_funnel": {"sessions": total, "stages": stages, "biggest_drop_off": drop},
        "stage_time": times,
        "products": products,
        "handoff_reasons": handoffs,
        "costs": {"conversations": conversations,
                  "stages": _rows(sec["stage_costs"], ("pos",))},
        "claims": _rows(sec.get("reply_claims", [])),
    }
    report.update(purchase_sections(spec, sec, total, catalog_names))
    gated = any(s.approval for s in spec.stages.values())
    report["approvals"] = _rows(sec.get("approvals", [])) if gated else None
    report["trends"] = trends(sec)
    return report


def trends(sec: dict[str, Any]) -> dict[str, Any]:
    """Per calendar day (UTC) of the period, new sessions and conversions (orders placed);
    the period's totals against the previous period of the same length, with the change."""
    totals = _rows(sec.get("trend_totals", []))
    head = totals[0] if totals else {
        "sessions": 0, "previous_sessions": 0, "conversions": 0, "previous_conversions": 0,
        "sessions_change_pct": None, "conversions_change_pct": None}
    days = [{**d, "day": str(d["day"])} for d in _rows(sec.get("trend_days", []))]
    return {**head, "days": days}


def purchase_sections(spec: FunnelSpec, sec: dict[str, Any], sessions: int,
                      catalog_names: dict[str, str] | None = None) -> dict[str, Any]:
    """``purchases`` (orders, buyers, revenue per currency) and ``presented_vs_bought``
    (per SKU; None without a presented-products field), from funnel_conversions."""
    bought = _rows(sec.get("purchases", []))
    head = bought[0] if bought else {"sessions": sessions, "orders": 0, "buyers": 0,
                                     "purchase_pct": None}
    versus = None
    if spec.presented_field:
        versus = _rows(sec.get("presented_vs_bought", []))
        for p in versus:
            p["name"] = (catalog_names or {}).get(p["sku"])
    return {"purchases": {**head, "revenue": _rows(sec.get("revenue", []))},
            "presented_vs_bought": versus}


async def build_report(funnel: str | Path | CompiledFunnel, *, db: str | None = None,
                       since: float = 7 * 86400, limit: int = 20,
                       include_playground: bool = False) -> dict[str, Any]:
    """Compute the report of a funnel on the database at ``db`` (the embedded one if None):
    its customers' sessions, and the studio's playground sessions too with
    ``include_playground``.

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    compiled = funnel if isinstance(funnel, CompiledFunnel) else load_funnel(funnel)
    data = await fetch_report(db, compiled.spec, since, limit=limit,
                              include_playground=include_playground)
    catalog = compiled.catalog
    names = {p.sku: p.name for p in catalog.products} if catalog else {}
    report = shape(compiled.spec, data, since, names, catalog.currency if catalog else None)
    report["follow_ups"] = await follow_up_section(db, compiled.spec, since)
    return report


# -- rendering -------------------------------------------------------------------------
def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False) + "\n"


def format_value(value: Any, kind: str = "", *, missing: str = "-", cents: bool = True) -> str:
    """One report value as text: ``kind`` is ``dur``, ``pct``, ``money``, ``cost`` or ``""``."""
    if value is None:
        return missing
    if kind == "dur":
        return format_duration(value)
    if kind == "pct":
        return f"{value:.1f}%"
    if kind == "money":
        return f"{value:,.2f}" if cents else f"{value:,.0f}"
    if kind == "cost":
        return f"${value:,.4f}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _fmt(value: Any, kind: str = "") -> str:
    return format_value(value, kind)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Aligned columns: text left, numbers right."""
    if not rows:
        return "  (no data)"
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    numeric = [all(_numeric(r[i]) for r in rows) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        return "  " + "  ".join(c.rjust(w) if n else c.ljust(w)
                                for c, w, n in zip(cells, widths, numeric, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


_NUMERIC = re.compile(r"^(-|\$?[0-9][0-9,]*(\.[0-9]+)?%?|[0-9.]+[dhms]( [0-9]+[hms])?)$")


def _numeric(text: str) -> bool:
    """A number, an amount, a percentage, a duration or "-": right-aligned."""
    return bool(_NUMERIC.match(text))


def render_table(report: dict[str, Any]) -> str:
    r = report
    out = [f"Funnel {r['funnel']} v{r['version']} (table {r['table']}): sessions started in the "
           f"last {r['since']}, as of {r['generated_at'][:19].replace('T', ' ')} UTC"]
    out += [f"note: {n}" for n in r["notes"]]

    def section(key: str, sub: str, body: str) -> None:
        out.extend(["", f"{TITLES[key]} ({sub})" if sub else TITLES[key], body])

    a = r["active_by_stage"]
    section("active_by_stage", "last 24 h, not handed off",
            table(["stage", "sessions"], [[x["stage"], _fmt(x["sessions"])] for x in a["rows"]]))
    f = r["stage_funnel"]
    main = [s for s in f["stages"] if not s.get("branch")]
    side = [s for s in f["stages"] if s.get("branch")]
    body = table(["stage", "sessions", "% of first", "went no further"],
                 [[s["stage"], _fmt(s["sessions"]), _fmt(s["pct_of_first"], "pct"),
                   "-" if s["final"] else _fmt(s["stopped_here"])] for s in main])
    d = f["biggest_drop_off"]
    if d:
        body += (f"\n  biggest drop-off: {d['stage']}: {d['stopped']} of {d['reached']} sessions "
                 f"({d['pct']:.1f}%) went no further")
    if side:
        body += "\n\n  side branches (off the main path):\n" + table(
            ["branch", "from", "sessions", "% of first", "in it now"],
            [[s["stage"], s["branch_from"] or "any stage", _fmt(s["sessions"]),
              _fmt(s["pct_of_first"], "pct"), _fmt(s["ended_here"])] for s in side])
    section("stage_funnel", f"{f['sessions']} sessions", body)
    section("stage_time", "completed visits",
            table(["stage", "visits", "average", "median"],
                  [[t["stage"], _fmt(t["samples"]), _fmt(t["avg_seconds"], "dur"),
                    _fmt(t["median_seconds"], "dur")] for t in r["stage_time"]]))
    if r["products"] is not None:
        section("products", "converted = handed off",
                table(["sku", "name", "presented", "converted", "conversion"],
                      [[p["sku"], p["name"] or "-", _fmt(p["presented"]), _fmt(p["converted"]),
                        _fmt(p["conversion_pct"], "pct")] for p in r["products"]]))
    if r["handoff_reasons"] is not None:
        section("handoff_reasons", "",
                table(["reason", "hand-offs", "avg cart", "avg time to hand-off"],
                      [[h["reason"] or "-", _fmt(h["handoffs"]), _fmt(h["avg_cart_total"], "money"),
                        _fmt(h["avg_seconds_to_handoff"], "dur")] for h in r["handoff_reasons"]]))
    c = r["costs"]["conversations"]
    body = table(["conversations", "turns", "tokens", "cached", "cost", "avg turns",
                  "avg tokens", "avg cost", "median cost"],
                 [[_fmt(c["conversations"]), _fmt(c["turns"]),
                   _fmt(c["prompt_tokens"] + c["completion_tokens"]),
                   _fmt(c["cached_prompt_pct"], "pct"), _fmt(c["cost"], "cost"),
                   _fmt(c["avg_turns"]), _fmt(c["avg_tokens"]), _fmt(c["avg_cost"], "cost"),
                   _fmt(c["median_cost"], "cost")]]) if c["conversations"] else "  (no data)"
    if c.get("cached_prompt_tokens"):
        body += (f"\n  {_fmt(c['cached_prompt_tokens'])} of {_fmt(c['prompt_tokens'])} prompt "
                 "tokens were read from the provider's prompt cache (billed at its lower rate)")
    if c.get("cache_write_tokens"):
        body += (f"\n  {_fmt(c['cache_write_tokens'])} of {_fmt(c['prompt_tokens'])} prompt "
                 f"tokens ({_fmt(c['cache_write_pct'], 'pct')}) were written to the provider's "
                 "prompt cache (billed above the input rate: 1.25x by Anthropic)")
    if c.get("turns_without_cost"):
        body += (f"\n  {_fmt(c['turns_without_cost'])} of {_fmt(c['turns'])} turns had no cost "
                 "(a model without prices in litellm's map): the cost above leaves them out")
    body += "\n\n" + table(
        ["stage", "turns", "sessions", "tokens", "cached", "written", "cost", "cost/conv",
         "validation failed", "fallback"],
        [[s["stage"], _fmt(s["turns"]), _fmt(s["sessions"]),
          _fmt(s["prompt_tokens"] + s["completion_tokens"]),
          _fmt(s["cached_prompt_pct"], "pct"), _fmt(s["cache_write_pct"], "pct"),
          _fmt(s["cost"], "cost"),
          _fmt(s["cost_per_conversation"], "cost"), _fmt(s["validation_failure_pct"], "pct"),
          _fmt(s["fallback_pct"], "pct")] for s in r["costs"]["stages"]])
    section("costs", "turns in the window, per conversation and per stage", body)
    claims = r.get("claims") or []
    section("claims", "per stage and kind; each refused reply went back to the model once, "
            "then the stage's fallback was sent",
            table(["stage", "kind", "refused", "turns", "fell back", "sessions"],
                  [[c["stage"], c["kind"], _fmt(c["refused"]), _fmt(c["turns"]),
                    _fmt(c["fallback_turns"]), _fmt(c["sessions"])] for c in claims])
            if claims else "  (none)")
    out += _purchase_tables(r)
    if r.get("approvals") is not None:
        section("approvals", "decided in the window; waits until the decision",
                table(["stage", "asked", "approved", "rejected", "timed out", "taken over",
                       "waiting",
                       "median wait", "p90 wait"],
                      [[a["stage"] or "-", _fmt(a["asked"]), _fmt(a["approved"]),
                        _fmt(a["rejected"]), _fmt(a["timeouts"]), _fmt(a["taken_over"]),
                        _fmt(a["waiting"]),
                        _fmt(a["median_wait_seconds"], "dur"),
                        _fmt(a["p90_wait_seconds"], "dur")] for a in r["approvals"]])
                if r["approvals"] else "  (no data)")
    if r.get("follow_ups") is not None:
        out.append(render_follow_ups(r["follow_ups"]))
    out += _trend_tables(r["trends"])
    return "\n".join(out) + "\n"


def _change(now: int, before: int, pct: float | None) -> str:
    if pct is None:
        return "new" if now and not before else "-"
    return f"{pct:+.1f}%"


def _trend_tables(t: dict[str, Any]) -> list[str]:
    body = table(["", "this period", "previous period", "change"],
                 [["sessions", _fmt(t["sessions"]), _fmt(t["previous_sessions"]),
                   _change(t["sessions"], t["previous_sessions"], t["sessions_change_pct"])],
                  ["conversions", _fmt(t["conversions"]), _fmt(t["previous_conversions"]),
                   _change(t["conversions"], t["previous_conversions"],
                           t["conversions_change_pct"])]])
    body += "\n\n" + table(["day (UTC)", "sessions", "conversions"],
                            [[d["day"], _fmt(d["sessions"]), _fmt(d["conversions"])]
                             for d in t["days"]])
    return ["", f"{TITLES['trends']} (conversions: orders placed that day)", body]


def _purchase_tables(r: dict[str, Any]) -> list[str]:
    p = r["purchases"]
    body = (f"  {_fmt(p['orders'])} orders from {_fmt(p['buyers'])} of {_fmt(p['sessions'])} "
            f"sessions ({_fmt(p['purchase_pct'], 'pct')} bought)")
    if p["revenue"]:
        body += "\n\n" + table(
            ["currency", "orders", "buyers", "revenue", "avg order", "revenue/session"],
            [[x["currency"], _fmt(x["orders"]), _fmt(x["buyers"]), _fmt(x["revenue"], "money"),
              _fmt(x["avg_order"], "money"), _fmt(x["revenue_per_session"], "money")]
             for x in p["revenue"]])
    out = ["", f"{TITLES['purchases']} (orders recorded for these sessions)", body]
    if r["presented_vs_bought"] is not None:
        out += ["", f"{TITLES['presented_vs_bought']} (sessions)", table(
            ["sku", "name", "presented", "bought when presented", "bought", "units", "rate"],
            [[x["sku"], x["name"] or "-", _fmt(x["presented"]), _fmt(x["bought_when_presented"]),
              _fmt(x["bought"]), _fmt(x["units"]), _fmt(x["bought_pct"], "pct")]
             for x in r["presented_vs_bought"]])]
    return out


__all__ = ["SECTIONS", "build_report", "format_duration", "render_json", "render_table",
           "shape", "since_text"]
