"""The report's follow-up section (docs/follow-ups.md): follow-ups sent per stage, how
many customers wrote back and how many went on to another stage within the window
(the win-back rate, with its 95% Wilson interval)."""

from __future__ import annotations

from html import escape
from typing import Any

from ..experiments.stats import wilson
from ..format.spec import FunnelSpec
from ..store.follow_up_report import WINDOW_SECONDS, fetch_follow_ups

__all__ = ["TITLE", "follow_up_section", "html_follow_ups", "render_follow_ups"]

TITLE = "Follow-ups: customers who went quiet, reached again"


def shape(rows: list[dict[str, Any]], window: float = WINDOW_SECONDS) -> dict[str, Any]:
    stages = []
    for r in rows:
        sent, moved = int(r["sent"]), int(r["moved_on"])
        low, high = wilson(moved, sent)
        stages.append({"stage": r["stage"], "sent": sent, "replied": int(r["replied"]),
                       "moved_on": moved,
                       "win_back_rate": round(moved / sent, 4) if sent else None,
                       "interval": [round(low, 4), round(high, 4)]})
    return {"window_hours": round(window / 3600, 1), "stages": stages}


async def follow_up_section(db: str | None, spec: FunnelSpec, since: float
                            ) -> dict[str, Any] | None:
    """The section for a funnel that declares follow-ups, else None."""
    if not spec.has_follow_ups:
        return None
    return shape(await fetch_follow_ups(db, spec, since))


def render_follow_ups(section: dict[str, Any]) -> str:
    """The section as an aligned table."""
    rows = section["stages"]
    head = (f"{TITLE}\n  sent in the period; replied and moved on within "
            f"{section['window_hours']:g}h of the follow-up\n")
    if not rows:
        return head + "  (none sent)\n"
    lines = [["stage", "sent", "replied", "moved on", "win-back", "95% interval"]]
    for r in rows:
        rate = "-" if r["win_back_rate"] is None else f"{100 * r['win_back_rate']:.1f}%"
        low, high = r["interval"]
        lines.append([r["stage"], str(r["sent"]), str(r["replied"]), str(r["moved_on"]),
                      rate, f"{100 * low:.1f}-{100 * high:.1f}%"])
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    body = "\n".join("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                      for i, (c, w) in enumerate(zip(row, widths, strict=True)))
                     for row in lines)
    return head + body + "\n"


def html_follow_ups(section: dict[str, Any]) -> str:
    """The section for the HTML report (engine.report.html), in its markup."""
    rows = section["stages"]
    sub = (f"follow-ups sent in the period; customers who replied, and who went on to "
           f"another stage, within {section['window_hours']:g}h of one")
    if not rows:
        body = '<p class="empty">No follow-up was sent in this period.</p>'
    else:
        head = "".join(f'<th class="n">{escape(h)}</th>' if i else f"<th>{escape(h)}</th>"
                       for i, h in enumerate(["stage", "sent", "replied", "moved on",
                                              "win-back", "95% interval"]))
        cells = []
        for r in rows:
            rate = "–" if r["win_back_rate"] is None else f"{100 * r['win_back_rate']:.1f}%"
            low, high = r["interval"]
            values = [escape(str(r["stage"])), f"{r['sent']:,}", f"{r['replied']:,}",
                      f"{r['moved_on']:,}", rate, f"{100 * low:.1f}–{100 * high:.1f}%"]
            cells.append("<tr>" + "".join(f'<td class="n">{v}</td>' if i else f"<td>{v}</td>"
                                          for i, v in enumerate(values)) + "</tr>")
        body = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(cells)}</tbody></table>"
    return (f'<section id="follow_ups"><h2>{escape(TITLE)}</h2><p class="sub">{escape(sub)}'
            f"</p>{body}</section>")
