"""`funnel report --format html`: one self-contained page for a manager.

Inline CSS and inline SVG charts only: no scripts, no fonts, no network. The
input is the report of :func:`engine.report.build_report`.

Given a ``link`` (the studio serves the page at ``/report``), the numbers that count
sessions link to the studio's sessions list filtered to exactly those sessions: those
that reached a stage, went no further, are in a side branch, fell back, bought. The
file ``funnel report --format html`` writes has no links (no studio to open them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from html import escape
from typing import Any

from .build import TITLES, format_duration, format_value
from .follow_ups import html_follow_ups

ACCENT = "#4f46e5"
PALETTE = ["#4f46e5", "#5b54e8", "#6d63ec", "#7f74ef", "#9185f2", "#a397f5", "#b4a9f7",
           "#c4bbf9", "#d2cbfb"]
WARN = "#dc2626"
GOOD = "#16a34a"

CSS = """
*{box-sizing:border-box}
body{margin:0;background:#f4f5fa;color:#1f2433;font:15px/1.45 -apple-system,BlinkMacSystemFont,
"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1100px;margin:0 auto;padding:28px 28px 40px}
header h1{margin:0;font-size:26px;letter-spacing:-.01em}
header p{margin:4px 0 0;color:#646b80}
.kpis{display:grid;grid-template-columns:repeat(6,1fr);gap:14px;margin:22px 0 8px}
.kpi{background:#fff;border-radius:12px;padding:14px 16px;box-shadow:0 1px 2px rgba(20,24,40,.06),
0 1px 8px rgba(20,24,40,.04)}
.kpi b{display:block;font-size:24px;font-weight:650;letter-spacing:-.01em}
.kpi span{color:#646b80;font-size:13px}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:18px;margin-top:18px}
section{background:#fff;border-radius:14px;padding:18px 20px 16px;margin-top:18px;
box-shadow:0 1px 2px rgba(20,24,40,.06),0 1px 8px rgba(20,24,40,.04)}
.grid section{margin-top:0}
section h2{margin:0 0 2px;font-size:17px}
section .sub{margin:0 0 12px;color:#646b80;font-size:13px}
svg{display:block;width:100%;height:auto}
svg text{font-family:inherit;font-size:13px;fill:#1f2433}
svg .muted{fill:#646b80}
svg .on{fill:#fff;font-weight:600}
table{width:100%;border-collapse:collapse;font-size:13.5px}
th{text-align:left;font-weight:600;color:#646b80;border-bottom:1px solid #e3e5ee;padding:6px 8px}
td{border-bottom:1px solid #f0f1f6;padding:6px 8px}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.bar{display:inline-block;height:8px;border-radius:4px;background:#22a06b;vertical-align:middle;
margin-right:6px}
.callout{margin:12px 0 0;padding:10px 14px;border-radius:10px;background:#fef2f2;color:#7f1d1d;
border:1px solid #fecaca}
.bad{color:#dc2626;font-weight:600}
.good{color:#16a34a;font-weight:600}
.muted{color:#646b80}
a.drill{color:inherit;text-decoration:underline dotted;text-underline-offset:3px}
svg a.drill tspan{text-decoration:underline dotted}
.empty{color:#8a90a3;font-style:italic;margin:6px 0}
.note{margin:14px 0 0;padding:10px 14px;border-radius:10px;background:#fffbeb;border:1px solid #fde68a}
footer{margin-top:22px;color:#8a90a3;font-size:12.5px}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
"""


# The studio's sessions list filtered: its query parameters -> the address of the list.
Link = Callable[[Mapping[str, str]], str]


class _Links:
    """The numbers as links into the sessions list, or as plain text without a ``link``."""

    def __init__(self, link: Link | None, since_seconds: float) -> None:
        self.link = link
        self.since = f"{int(since_seconds)}s"

    def __call__(self, text: str, testid: str, **params: str) -> str:
        if self.link is None:
            return text
        href = self.link(params)
        return (f'<a href="{_e(href)}" data-testid="{_e(testid)}" class="drill">{text}</a>')

    def started(self, text: str, testid: str, **params: str) -> str:
        """Among the sessions started in the report's window."""
        return self(text, testid, started=self.since, **params)


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _n(value: Any, kind: str = "") -> str:
    # The page rounds money to whole units and marks a missing value with an en dash.
    return format_value(value, kind, missing="–", cents=False)


def _section(key: str, sub: str, body: str) -> str:
    return (f'<section id="{key}"><h2>{_e(TITLES[key])}</h2><p class="sub">{_e(sub)}</p>'
            f"{body}</section>")


def _table(headers: list[str], rows: list[list[str]], numeric: set[int]) -> str:
    head = "".join(f'<th class="n">{_e(h)}</th>' if i in numeric else f"<th>{_e(h)}</th>"
                   for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def hbars(rows: list[tuple[str, float, str]], *, color: str = ACCENT, width: int = 480,
          label_w: int = 150, text_w: int = 70, row_h: int = 26) -> str:
    """Horizontal bars: (label, value, text shown after the bar)."""
    if not rows:
        return '<p class="empty">No data in this period.</p>'
    top = max((v for _, v, _ in rows), default=0) or 1
    area = width - label_w - text_w
    parts = []
    for i, (label, value, text) in enumerate(rows):
        y = i * row_h
        w = max(2.0, area * value / top) if value else 0
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 17}" text-anchor="end">{_e(label)}</text>'
            f'<rect x="{label_w}" y="{y + 5}" width="{w:.1f}" height="{row_h - 10}" rx="4" '
            f'fill="{color}"/><text x="{label_w + w + 6:.1f}" y="{y + 17}" class="muted">'
            f"{_e(text)}</text>")
    h = len(rows) * row_h
    return (f'<svg viewBox="0 0 {width} {h}" role="img" aria-label="bar chart">'
            + "".join(parts) + "</svg>")


def funnel_chart(stages: list[dict[str, Any]], drop_stage: str | None, width: int = 1040,
                 links: _Links | None = None) -> str:
    """Centred bars, one per main-path stage, widths in proportion to the sessions that
    reached it; the side branches apart below (``data-testid="report-branches"``)."""
    links = links or _Links(None, 0)
    if not stages or not any(s["sessions"] for s in stages):
        return '<p class="empty">No sessions started in this period.</p>'
    main = [s for s in stages if not s.get("branch")]
    side = [s for s in stages if s.get("branch")]
    top = max(s["sessions"] for s in stages) or 1
    label_w, right_w, row_h, gap = 170, 250, 32, 8
    area = width - label_w - right_w
    cx = label_w + area / 2
    parts = []
    prev: tuple[float, float] | None = None
    for i, s in enumerate(main):
        y = i * (row_h + gap)
        w = max(4.0, area * s["sessions"] / top) if s["sessions"] else 4.0
        x = cx - w / 2
        color = GOOD if s["final"] else PALETTE[min(i, len(PALETTE) - 1)]
        if prev is not None:  # the trapezoid from the previous bar: what was kept
            px, pw = prev
            parts.append(f'<polygon points="{px:.1f},{y - gap} {px + pw:.1f},{y - gap} '
                         f'{x + w:.1f},{y} {x:.1f},{y}" fill="#e6e4fb"/>')
        parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h}" rx="5" '
                     f'fill="{color}"/>')
        parts.append(f'<text x="{label_w - 12}" y="{y + 22}" text-anchor="end">'
                     f'{_e(s["stage"].replace("_", " "))}</text>')
        pct = "" if s["pct_of_first"] is None else f'  ·  {s["pct_of_first"]:.1f}%'
        reached = links.started(f'<tspan font-weight="600">{s["sessions"]:,}</tspan>',
                                f"report-reached-{s['stage']}", reached=s["stage"])
        stopped = ""
        if not s["final"] and s["stopped_here"]:
            warn = s["stage"] == drop_stage
            style = f' fill="{WARN}" font-weight="600"' if warn else ' class="muted"'
            stopped = links.started(f'<tspan{style}>  {"▼ " if warn else ""}'
                                    f'{s["stopped_here"]:,} stopped</tspan>',
                                    f"report-stopped-{s['stage']}", stopped=s["stage"])
        parts.append(f'<text x="{label_w + area + 12}" y="{y + 22}">{reached}'
                     f'<tspan class="muted">{_e(pct)}</tspan>{stopped}</text>')
        prev = (x, w)
    h = len(main) * (row_h + gap) - gap
    out = (f'<svg viewBox="0 0 {width} {h}" role="img" aria-label="funnel chart" '
           'data-testid="report-funnel">' + "".join(parts) + "</svg>")
    return out + (_branches(side, top, width, area, label_w, links) if side else "")


def _branches(side: list[dict[str, Any]], top: int, width: int, area: float, label_w: int,
              links: _Links) -> str:
    """The side branches: outlined bars off the main path, each with where it leaves it."""
    row_h, gap = 26, 8
    parts = ['<text x="0" y="16" class="muted">Side branches, off the main path '
             '(objection handling, a not-a-fit stage): not steps of the funnel</text>']
    for i, s in enumerate(side):
        y = 28 + i * (row_h + gap)
        w = max(4.0, area * s["sessions"] / top) if s["sessions"] else 4.0
        x = label_w
        src = (s.get("branch_from") or "any stage").replace("_", " ")
        reached = links.started(f'<tspan font-weight="600">{s["sessions"]:,}</tspan>',
                                f"report-branch-{s['stage']}", reached=s["stage"])
        now = links.started(f'{s["ended_here"]:,} in it now', f"report-branch-now-{s['stage']}",
                            stage=s["stage"])
        parts.append(
            f'<g class="branch" data-stage="{_e(s["stage"])}">'
            f'<text x="{label_w - 12}" y="{y + 18}" text-anchor="end">'
            f'{_e(s["stage"].replace("_", " "))}</text>'
            f'<rect x="{x}" y="{y}" width="{w:.1f}" height="{row_h}" rx="5" fill="#eef0f6" '
            f'stroke="#9aa1b5" stroke-dasharray="4 3"/>'
            f'<text x="{x + w + 10:.1f}" y="{y + 18}">{reached}<tspan class="muted">'
            f'  ·  from {_e(src)}  ·  </tspan><tspan class="muted">{now}</tspan></text></g>')
    h = 28 + len(side) * (row_h + gap)
    return (f'<svg viewBox="0 0 {width} {h}" role="img" aria-label="side branches" '
            f'class="branches" data-testid="report-branches">' + "".join(parts) + "</svg>")


def trend_chart(t: dict[str, Any], width: int = 1040, height: int = 170) -> str:
    """Sessions a day as bars, conversions a day as dots on a line, over the period."""
    days = t["days"]
    if not days:
        return '<p class="empty">No data in this period.</p>'
    left, bottom, top_pad = 40, 24, 12
    plot_h = height - bottom - top_pad
    top = max(max(d["sessions"] for d in days), max(d["conversions"] for d in days), 1)
    step = (width - left) / len(days)
    bar = max(3.0, min(40.0, step * 0.6))
    parts = [f'<line x1="{left}" y1="{top_pad + plot_h}" x2="{width}" y2="{top_pad + plot_h}" '
             'stroke="#e3e5ee"/>',
             f'<text x="{left - 6}" y="{top_pad + 10}" text-anchor="end" class="muted">'
             f'{top:,}</text>']
    points = []
    label_every = max(1, len(days) // 10)
    for i, d in enumerate(days):
        cx = left + step * i + step / 2
        h = plot_h * d["sessions"] / top
        cy = top_pad + plot_h - plot_h * d["conversions"] / top
        points.append(f"{cx:.1f},{cy:.1f}")
        label = (f'<text x="{cx:.1f}" y="{height - 6}" text-anchor="middle" class="muted">'
                 f'{_e(d["day"][5:])}</text>') if i % label_every == 0 else ""
        parts.append(
            f'<g class="day" data-day="{_e(d["day"])}" data-sessions="{d["sessions"]}" '
            f'data-conversions="{d["conversions"]}"><title>{_e(d["day"])}: {d["sessions"]:,} '
            f'sessions, {d["conversions"]:,} conversions</title>'
            f'<rect x="{cx - bar / 2:.1f}" y="{top_pad + plot_h - h:.1f}" width="{bar:.1f}" '
            f'height="{h:.1f}" rx="3" fill="{ACCENT}" opacity=".75"/>'
            f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" fill="{GOOD}"/>{label}</g>')
    parts.insert(2, f'<polyline points="{" ".join(points)}" fill="none" stroke="{GOOD}" '
                 'stroke-width="2"/>')
    return (f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="trend chart" '
            'data-testid="report-trend">' + "".join(parts) + "</svg>")


def _change(now: int, before: int, pct: float | None) -> str:
    if pct is None:
        return "new" if now and not before else "no change" if not now else "–"
    cls = "good" if pct > 0 else "bad" if pct < 0 else "muted"
    return f'<span class="{cls}">{pct:+.1f}%</span>'


def _trends(r: dict[str, Any]) -> str:
    t = r["trends"]
    rows = [[label, _n(t[key]), _n(t[f"previous_{key}"]),
             _change(t[key], t[f"previous_{key}"], t[f"{key}_change_pct"])]
            for label, key in (("sessions started", "sessions"), ("conversions (orders)",
                                                                  "conversions"))]
    body = (trend_chart(t) + '<p class="sub">▮ sessions started · ● conversions (orders '
            'placed), per calendar day (UTC)</p>'
            + _table(["", "this period", "previous period", "change"], rows, {1, 2, 3}))
    return _section("trends", f"the last {r['since']} against the {r['since']} before", body)


def _kpis(r: dict[str, Any], links: _Links) -> str:
    f, c = r["stage_funnel"], r["costs"]["conversations"]
    handed = sum(h["handoffs"] for h in r["handoff_reasons"] or [])
    rate = f" ({100.0 * handed / f['sessions']:.0f}%)" if f["sessions"] else ""
    turns = sum(s["turns"] for s in r["costs"]["stages"])
    fallbacks = sum(s["fallback_turns"] for s in r["costs"]["stages"])
    fell = c.get("fallback_sessions") or 0
    cards = [
        (links.started(f"{f['sessions']:,}", "report-sessions"),
         f"sessions started, last {r['since']}"),
        (f"{r['active_by_stage']['total']:,}", "active in the last 24 h"),
        (f"{handed:,}{rate}" if r["handoff_reasons"] is not None else "–", "handed off"),
        (links.started(f"{r['purchases']['buyers']:,}", "report-buyers", bought="true")
         + (f" ({r['purchases']['purchase_pct']:.0f}%)"
            if r["purchases"]["purchase_pct"] is not None else ""), "bought (orders recorded)"),
        (_e(_n(c["avg_cost"], "cost")), "cost per conversation"),
        (f"{100.0 * fallbacks / turns:.1f}%" if turns else "–",
         "turns that fell back, in "
         + links(f"{fell:,} conversation{'' if fell == 1 else 's'}", "report-fallbacks",
                 fell_back=links.since)),
    ]
    # The values are escaped where they are made (a link is markup).
    return '<div class="kpis">' + "".join(
        f'<div class="kpi"><b>{v}</b><span>{t}</span></div>' for v, t in cards) + "</div>"


def _purchases(r: dict[str, Any]) -> list[str]:
    """The sections from funnel_conversions: orders and revenue, presented vs bought."""
    p = r["purchases"]
    rows = [[_e(x["currency"]), _n(x["orders"]), _n(x["buyers"]), _n(x["revenue"], "money"),
             _n(x["avg_order"], "money"), _n(x["revenue_per_session"], "money")]
            for x in p["revenue"]]
    body = (_table(["currency", "orders", "buyers", "revenue", "average order",
                    "revenue per session"], rows, {1, 2, 3, 4, 5}) if rows else
            '<p class="empty">No order recorded yet (POST …/conversions or '
            'Engine.record_conversion).</p>')
    out = [_section("purchases", f"{p['orders']:,} orders from {p['buyers']:,} of "
                    f"{p['sessions']:,} sessions ({_n(p['purchase_pct'], 'pct')} bought); "
                    "revenue per currency", body)]
    if r["presented_vs_bought"] is not None:
        rows = [[f"<code>{_e(x['sku'])}</code>", _e(x["name"] or "–"), _n(x["presented"]),
                 _n(x["bought_when_presented"]), _n(x["bought"]), _n(x["units"]),
                 _n(x["bought_pct"], "pct")] for x in r["presented_vs_bought"]]
        body = (_table(["SKU", "product", "presented", "bought when presented", "bought",
                        "units", "rate"], rows, {2, 3, 4, 5, 6}) if rows else
                '<p class="empty">No product was presented or bought.</p>')
        out.append(_section("presented_vs_bought", "sessions a product was presented in, "
                            "and which of them bought it", body))
    return out


def render_html(report: dict[str, Any], *, link: Link | None = None) -> str:
    """The page. ``link``: the address of the sessions list for its filters (the studio's);
    without it, the numbers are plain text."""
    r = report
    links = _Links(link, r["since_seconds"])
    when = str(r["generated_at"])[:16].replace("T", " ")
    out = [f"<header><h1>{_e(r['funnel'])} · funnel report</h1><p>Sessions started in the last "
           f"{_e(r['since'])} · generated {_e(when)} UTC · funnel v{r['version']}, table "
           f"<code>{_e(r['table'])}</code></p></header>", _kpis(r, links)]
    out += [f'<p class="note">{_e(n)}</p>' for n in r["notes"]]

    f = r["stage_funnel"]
    d = f["biggest_drop_off"]
    body = funnel_chart(f["stages"], d["stage"] if d else None, links=links)
    if d:
        body += (f'<p class="callout"><b>Biggest drop-off: {_e(d["stage"])}.</b> '
                 f'{d["stopped"]:,} of {d["reached"]:,} sessions that reached it '
                 f'({d["pct"]:.0f}%) went no further.</p>')
    out.append(_section("stage_funnel", f"{f['sessions']:,} sessions started in the last "
                        f"{r['since']}; the percentage is of the first stage", body))
    out.append(_trends(r))

    a = r["active_by_stage"]
    active = hbars([(x["stage"].replace("_", " "), x["sessions"], f"{x['sessions']:,}")
                    for x in a["rows"]], width=500)
    times = [t for t in r["stage_time"] if t["samples"]]
    timing = hbars([(t["stage"].replace("_", " "), float(t["avg_seconds"]),
                     f"{format_duration(t['avg_seconds'])} (median "
                     f"{format_duration(t['median_seconds'])})") for t in times],
                   color="#0ea5e9", width=500, label_w=140, text_w=150)
    out.append('<div class="grid">'
               + _section("active_by_stage", "last message in the last 24 h, not handed off",
                          active)
               + _section("stage_time", "average of completed visits; median in brackets",
                          timing) + "</div>")

    if r["products"] is not None:
        rows = [[f"<code>{_e(p['sku'])}</code>", _e(p["name"] or "–"), _n(p["presented"]),
                 _n(p["converted"]),
                 f'<span class="bar" style="width:{0.6 * (p["conversion_pct"] or 0):.0f}px">'
                 f'</span>{_n(p["conversion_pct"], "pct")}'] for p in r["products"]]
        body = (_table(["SKU", "product", "presented", "handed off", "conversion"], rows,
                       {2, 3, 4}) if rows else '<p class="empty">No product was presented.</p>')
        out.append(_section("products", "sessions it was presented in, and how many of them "
                            "were handed to a manager", body))
    out += _purchases(r)
    if r["handoff_reasons"] is not None:
        cur = f" ({r['currency']})" if r.get("currency") else ""
        rows = [[_e(h["reason"] or "–"), _n(h["handoffs"]), _n(h["avg_cart_total"], "money"),
                 _n(h["avg_seconds_to_handoff"], "dur")] for h in r["handoff_reasons"]]
        body = (_table(["reason", "hand-offs", f"average cart{cur}", "average time to hand-off"],
                       rows, {1, 2, 3}) if rows else '<p class="empty">No hand-off yet.</p>')
        out.append(_section("handoff_reasons", "hand-offs in the period, by reason", body))
    if r.get("approvals") is not None:  # only a funnel with an `approval:` gate
        rows = [[_e(a["stage"] or "–"), _n(a["asked"]), _n(a["approved"]), _n(a["rejected"]),
                 _n(a["timeouts"]), _n(a["taken_over"]), _n(a["waiting"]),
                 _n(a["median_wait_seconds"], "dur"),
                 _n(a["p90_wait_seconds"], "dur")] for a in r["approvals"]]
        body = (_table(["stage", "asked", "approved", "rejected", "timed out", "taken over",
                        "waiting now", "median wait", "p90 wait"], rows, set(range(1, 9)))
                if rows else '<p class="empty">No move waited for an approval.</p>')
        out.append(_section("approvals", "moves into a gated stage decided in the period, "
                            "and the wait until the decision", body))
    if r.get("follow_ups") is not None:  # only a funnel with follow-ups (docs/follow-ups.md)
        out.append(html_follow_ups(r["follow_ups"]))

    c, stages = r["costs"]["conversations"], r["costs"]["stages"]
    summary = (f"{c['conversations']:,} conversations · {c['turns']:,} turns · "
               f"{c['prompt_tokens'] + c['completion_tokens']:,} tokens · total "
               f"{_n(c['cost'], 'cost')} · per conversation {_n(c['avg_cost'], 'cost')} "
               f"(median {_n(c['median_cost'], 'cost')}), {_n(c['avg_tokens'])} tokens, "
               f"{_n(c['avg_turns'])} turns"
               + (f" · {_n(c['cached_prompt_pct'], 'pct')} of the prompt tokens cached"
                  if c.get("cached_prompt_tokens") else "")
               + (f" · {_n(c['cache_write_pct'], 'pct')} written to the cache"
                  if c.get("cache_write_tokens") else ""))
    priced = any(s["cost"] for s in stages)  # a model without prices: tokens instead
    chart = hbars([(s["stage"].replace("_", " "),
                    float(s["cost"] or 0) if priced else s["prompt_tokens"] + s["completion_tokens"],
                    (_n(s["cost"], "cost") if priced else
                     f"{s['prompt_tokens'] + s['completion_tokens']:,} tokens")
                    + f"  ·  {_n(s['turns'])} turn{'' if s['turns'] == 1 else 's'}")
                   for s in stages],
                  color="#f59e0b", width=1040, label_w=170, text_w=170)

    def rate(v: Any) -> str:
        return f'<span class="bad">{_n(v, "pct")}</span>' if v and v >= 10 else _n(v, "pct")

    rows = [[_e(s["stage"]), _n(s["turns"]), _n(s["sessions"]),
             _n(s["prompt_tokens"] + s["completion_tokens"]), _n(s["cached_prompt_pct"], "pct"),
             _n(s["cache_write_pct"], "pct"),
             _n(s["cost"], "cost"), _n(s["cost_per_conversation"], "cost"),
             rate(s["validation_failure_pct"]), rate(s["fallback_pct"]),
             links(_n(s.get("fallback_sessions") or 0), f"report-fallbacks-{s['stage']}",
                   fell_back=links.since, fallback_stage=s["stage"])
             if s.get("fallback_sessions") else _n(0)] for s in stages]
    table = _table(["stage", "turns", "conversations", "tokens", "cached", "written", "cost",
                    "cost / conversation", "validation failed", "fallback",
                    "conversations that fell back"], rows,
                   {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) if rows else ""
    out.append(_section("costs", summary if c["conversations"] else "No turn in this period.",
                        chart + table))
    claims = r.get("claims") or []
    rows = [[_e(x["stage"]), _e(x["kind"]), _n(x["refused"]), _n(x["turns"]),
             _n(x["fallback_turns"]), _n(x["sessions"])] for x in claims]
    out.append(_section(
        "claims", "what the model's replies said that the catalog and the state do not back, "
        "per stage: each was sent back to the model once, then the stage's fallback was sent",
        _table(["stage", "kind", "refused", "turns", "fell back", "conversations"], rows,
               {2, 3, 4, 5}) if rows else '<p class="empty">No claim was refused.</p>'))
    out.append(f"<footer>Computed in SQL by <code>funnel report</code>. The same queries are "
               f"views for analysts: <code>{_e(r['table'])}_v_*</code> (see docs/analytics.md)."
               "</footer>")
    # The empty icon: a browser asks no /favicon.ico of the studio that serves the page.
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<link rel=\"icon\" href=\"data:,\">"
            f"<title>{_e(r['funnel'])} funnel report</title>"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<style>{CSS}</style></head><body><main>" + "".join(out) + "</main></body></html>\n")


__all__ = ["Link", "funnel_chart", "hbars", "render_html", "trend_chart"]
