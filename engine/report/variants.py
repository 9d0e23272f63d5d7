"""`funnel report --by variant`: an experiment's variants side by side.

Per variant: sessions, the share that reached each stage, the goal's rate with its
95% Wilson interval, the difference to the control (the experiment's first
variant) with the p-value of a two-sided two-proportion z-test (pooled
variance), the average cart and the cost per conversion. With more than two
variants each one is compared with the control, without a correction for
multiple comparisons (docs/experiments.md says how to read that).
"""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from html import escape
from pathlib import Path
from typing import Any

from ..experiments.router import load_experiment
from ..experiments.stats import compare, wilson
from ..format.experiment import Experiment, Goal
from ..funnel.compiled import CompiledFunnel, load_funnel
from ..store.experiment_sql import fetch_variants
from .build import format_value, since_text, table
from .html import CSS, funnel_chart

__all__ = ["TEST", "build_variant_report", "render_variant_html", "render_variant_json",
           "render_variant_table", "shape_variants"]

TEST = ("two-sided two-proportion z-test with pooled variance (p from the normal CDF); "
        "95% intervals: Wilson score for each rate, unpooled normal for the difference; "
        "each variant compared with the control (the first), no multiple-comparison "
        "correction")
ALPHA = 0.05


def _f(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def shape_variants(funnel: CompiledFunnel, experiment: Experiment | None, goal: Goal,
                   data: dict[str, Any], since: float) -> dict[str, Any]:
    """The report as plain data (the JSON output) from the aggregated rows."""
    spec = funnel.spec
    summary = {r["variant"]: r for r in data["summary"]}
    costs = {r["variant"]: r for r in data["costs"]}
    declared = experiment.names if experiment else []
    names = declared + sorted(n for n in summary if n not in declared)
    notes: list[str] = []
    if not data["table"]:
        notes.append(f"table {spec.table} has no sessions with a variant yet "
                     f"(`funnel migrate {spec.path}` adds the column)")
    if experiment is None:
        notes.append("the funnel declares no `experiment:`: variants found in the table are "
                     "shown, the goal is the hand-off")
    elif experiment.winner:
        notes.append(f"the experiment is stopped: new sessions all run on `{experiment.winner}`")
    weights = {v.name: v.weight for v in experiment.variants} if experiment else {}
    total_weight = sum(weights.values()) or 1.0
    control = names[0] if names else None
    rows: list[dict[str, Any]] = []
    for name in names:
        s = summary.get(name, {"sessions": 0, "conversions": 0, "avg_cart": None})
        n, k = int(s["sessions"]), int(s["conversions"])
        low, high = wilson(k, n)
        stages = [{"stage": r["stage"], "sessions": int(r["sessions"]),
                   "pct": round(100.0 * int(r["sessions"]) / n, 1) if n else None}
                  for r in data["stages"] if r["variant"] == name]
        if not stages:
            stages = [{"stage": st, "sessions": 0, "pct": None} for st in spec.stages]
        c = costs.get(name, {})
        cost = _f(c.get("cost"))
        row: dict[str, Any] = {
            "variant": name, "control": name == control,
            "weight_pct": round(100 * weights[name] / total_weight, 1) if name in weights
            else None,
            "sessions": n, "conversions": k, "rate": k / n if n else None,
            "ci_low": low if n else None, "ci_high": high if n else None,
            "avg_cart": _f(s.get("avg_cart")), "cost": cost,
            "turns_without_cost": int(c.get("turns_without_cost") or 0),
            "cost_per_conversion": round(cost / k, 6) if cost is not None and k else None,
            "stages": stages, "vs_control": None}
        if name != control and control is not None:
            base = summary.get(control, {"sessions": 0, "conversions": 0})
            cmp = compare(int(base["conversions"]), int(base["sessions"]), k, n)
            if cmp is not None:
                row["vs_control"] = {"difference": cmp.difference, "ci_low": cmp.low,
                                     "ci_high": cmp.high, "z": cmp.z, "p_value": cmp.p_value,
                                     "significant": cmp.significant(ALPHA)}
        rows.append(row)
    return {"funnel": spec.name, "table": spec.table,
            "experiment": experiment.name if experiment else None,
            "winner": experiment.winner if experiment else None,
            "goal": goal.describe(), "test": TEST, "alpha": ALPHA,
            "since": since_text(since), "generated_at": _f(data["now"]),
            "notes": notes, "variants": rows}


async def build_variant_report(funnel: str | Path | CompiledFunnel, *, db: str | None = None,
                               since: float = 7 * 86400, include_playground: bool = False
                               ) -> dict[str, Any]:
    """The report by variant of a funnel's experiment, on the database at ``db`` (the
    studio's playground sessions left out unless ``include_playground``).

    Raises:
        ConfigError: the experiment is invalid, or the funnel lacks what its goal reads.
        StoreUnavailable: the database cannot be reached.
    """
    compiled = funnel if isinstance(funnel, CompiledFunnel) else load_funnel(funnel)
    experiment = load_experiment(compiled.spec.path, set(compiled.spec.stages))
    goal = experiment.goal if experiment else Goal("handoff")
    data = await fetch_variants(db, compiled.spec, goal.kind, goal.cart_at_least, since,
                                include_playground=include_playground)
    return shape_variants(compiled, experiment, goal, data, since)


# -- rendering -------------------------------------------------------------------------
def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def _p(value: float) -> str:
    return f"{value:.2g}" if value < 0.001 else f"{value:.3f}"


def render_variant_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False) + "\n"


def render_variant_table(report: dict[str, Any]) -> str:
    r = report
    out = [f"Funnel {r['funnel']} (table {r['table']}), experiment "
           f"{r['experiment'] or '-'}: sessions started in the last {r['since']}, as of "
           f"{str(r['generated_at'])[:19].replace('T', ' ')} UTC",
           f"goal: {r['goal']}"]
    out += [f"note: {n}" for n in r["notes"]]
    rows = []
    for v in r["variants"]:
        cmp = v["vs_control"]
        rows.append([
            v["variant"] + (" (control)" if v["control"] else ""),
            format_value(v["sessions"]), format_value(v["conversions"]), _pct(v["rate"]),
            "-" if v["rate"] is None else f"{_pct(v['ci_low'])} - {_pct(v['ci_high'])}",
            "-" if cmp is None else f"{100 * cmp['difference']:+.1f} pts",
            "-" if cmp is None else _p(cmp["p_value"]),
            "-" if cmp is None else ("yes" if cmp["significant"] else "no"),
            format_value(v["avg_cart"], "money"),
            format_value(v["cost_per_conversion"], "cost")])
    out += ["", "Variants", table(["variant", "sessions", "conversions", "rate", "95% CI",
                                   "vs control", "p-value", "significant", "avg cart",
                                   "cost/conversion"], rows)]
    names = [v["variant"] for v in r["variants"]]
    if names:
        stage_rows = []
        for i, st in enumerate(r["variants"][0]["stages"]):
            stage_rows.append([st["stage"]] + [
                f"{format_value(v['stages'][i]['sessions'])} ({v['stages'][i]['pct']:.1f}%)"
                if i < len(v["stages"]) and v["stages"][i]["pct"] is not None else "-"
                for v in r["variants"]])
        out += ["", "Stages reached, per variant (share of the variant's sessions)",
                table(["stage", *names], stage_rows)]
    out += ["", f"test: {r['test']}; significant at p < {r['alpha']}"]
    return "\n".join(out) + "\n"


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def render_variant_html(report: dict[str, Any]) -> str:
    """One self-contained page: the variants' statistics, then their funnels side by side."""
    r = report
    headers = ["variant", "sessions", "conversions", "rate", "95% CI", "vs control",
               "p-value", "significant", "avg cart", "cost/conversion"]
    rows = []
    for v in r["variants"]:
        cmp = v["vs_control"]
        ci = "–" if v["rate"] is None else f"{_pct(v['ci_low'])} – {_pct(v['ci_high'])}"
        diff = "–" if cmp is None else f"{100 * cmp['difference']:+.1f} pts"
        p_value = "–" if cmp is None else _p(cmp["p_value"])
        sig = "–" if cmp is None else (
            '<b style="color:#16a34a">yes</b>' if cmp["significant"] else "no")
        cells = [_e(v["variant"]) + (" (control)" if v["control"] else ""),
                 f"{v['sessions']:,}", f"{v['conversions']:,}", _pct(v["rate"]), ci, diff,
                 p_value, sig, _e(format_value(v["avg_cart"], "money", missing="–")),
                 _e(format_value(v["cost_per_conversion"], "cost", missing="–"))]
        rows.append("<tr>" + "".join(
            f"<td>{c}</td>" if i in (0, 7) else f'<td class="n">{c}</td>'
            for i, c in enumerate(cells)) + "</tr>")
    head = "".join(f"<th>{h}</th>" if i in (0, 7) else f'<th class="n">{h}</th>'
                   for i, h in enumerate(headers))
    charts = []
    for v in r["variants"]:
        stages = [{"stage": s["stage"], "sessions": s["sessions"], "final": False,
                   "pct_of_first": s["pct"], "stopped_here": 0} for s in v["stages"]]
        charts.append(f'<section style="margin-top:0"><h2>{_e(v["variant"])}</h2>'
                      f'<p class="sub">{v["sessions"]:,} sessions · goal rate '
                      f'{_pct(v["rate"])}</p>{funnel_chart(stages, None, width=620)}</section>')
    cols = max(1, len(charts))
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in r["notes"])
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{_e(r['funnel'])}: experiment {_e(r['experiment'] or '')}</title>"
        f"<style>{CSS}</style></head><body><main><header>"
        f"<h1>{_e(r['funnel'])}: experiment {_e(r['experiment'] or '–')}</h1>"
        f"<p>Goal: {_e(r['goal'])}. Sessions started in the last {_e(r['since'])}.</p>"
        f"</header>{notes}<section id=\"variants\"><h2>Variants</h2>"
        f"<p class=\"sub\">{_e(r['test'])}; significant at p &lt; {r['alpha']}</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></section>"
        f'<div class="grid" style="grid-template-columns:repeat({cols},1fr);margin-top:18px"'
        f' id="funnels">{"".join(charts)}</div>'
        f"<footer>Generated {_e(r['generated_at'])} by funnel report --by variant</footer>"
        "</main></body></html>\n")
