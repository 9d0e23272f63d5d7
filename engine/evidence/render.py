"""`funnel replay`'s report as text, JSON, GitHub annotations or an HTML page.

Every format says the same: how many sessions changed and how, the whole before and
after (over the sessions replayed completely on both sides), the conditions that
hold on other sessions now, the stages reached earlier, and each changed session's
first difference. ``github`` prints workflow commands (``::notice file=F,line=L::``)
on the lines the edit changed, so that the pull request shows the effect beside the
change.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

import orjson

from ..report.html import CSS
from .compare import SessionDiff
from .copies import ran_on
from .gates import Verdict
from .measured import Measured
from .replay import Replay, sessions_behind
from .simulate import Simulation

__all__ = ["as_github", "as_html", "as_json", "as_text", "changed_lines", "simulation_github",
           "simulation_json", "simulation_text"]

_LABELS = {"handoff_rate": "hand-off rate", "handoffs": "hand-offs",
           "cart_total": "cart total (average)", "revenue": "revenue of recorded orders"}


def _label(metric: str) -> str:
    if metric.startswith("reach."):
        return f"reach {metric[6:]}"
    return _LABELS.get(metric, metric)


def _value(metric: str, v: float) -> str:
    if metric == "handoff_rate" or metric.startswith("reach."):
        return f"{v * 100:.1f}%"
    if metric == "handoffs":
        return f"{v:.0f}"
    return f"{v:,.2f}"


def _change(metric: str, before: float, after: float) -> str:
    if metric == "handoff_rate" or metric.startswith("reach."):
        return f"{(after - before) * 100:+.1f}pp"
    if before:
        return f"{(after - before) / before * 100:+.1f}%"
    return f"{after - before:+,.2f}"


def _behind(r: Replay, metric: str, continued: bool = False) -> list[str]:
    """The sessions behind a metric's change (with ``continued``, among
    :attr:`Replay.with_continued`)."""
    rows = r.with_continued if continued else r.comparable
    if metric in ("handoff_rate", "handoffs"):
        return [d.session_id for d in rows if d.before and d.after
                and d.before.handoff != d.after.handoff]
    if metric.startswith("reach."):
        gained, lost, _ = r.reach(metric[6:], continued=continued)
        return gained + lost
    if metric == "cart_total":
        return [d.session_id for d in rows if d.before and d.after
                and d.before.cart_total != d.after.cart_total]
    return [d.session_id for d in rows if d.revenue_after is not None
            and d.revenue_after != d.revenue]


def _rows(r: Replay, continued: bool = False) -> list[tuple[str, float, float, list[str]]]:
    return [(m, b, a, _behind(r, m, continued))
            for m, (b, a) in r.metrics(continued=continued).items()]


def _continued(r: Replay) -> str:
    """The heading of the whole with the continued sessions: what it rests on."""
    n = len(r.of("continued"))
    return (f"With the {n} session(s) continued with {r.model}, over "
            f"{len(r.with_continued)} sessions (their after rests on new model outputs, "
            "played from the turn the recording could not answer):")


def _conditions(r: Replay) -> list[tuple[str, int, int, list[str], int]]:
    """Exit conditions that hold on another set of sessions now: (the condition in
    backticks, with its text then when the edit rewrote it; sessions now; sessions then;
    the sessions that differ; how many of them hold it at another turn)."""
    out = []
    for (stage, to, _), h in sorted(r.conditions.items()):
        if h.then != h.now or h.moved:
            text = f"`{h.when_now or h.when_then}`"
            if h.when_now is None:
                text += f" (gone now, {stage} -> {to})"
            elif h.when_then not in (None, h.when_now):
                text += f" (then `{h.when_then}`)"
            out.append((text, len(h.now), len(h.then), sorted((h.now ^ h.then) | h.moved),
                        len(h.moved)))
    return out


def _earlier(r: Replay) -> list[tuple[str, list[str]]]:
    return [(s, e) for s in r.stages if (e := r.reach(s)[2])]


def _first(d: SessionDiff) -> str:
    parts = [*d.changes, *(e.describe() for e in d.exits)]
    where = f"turn {d.turn} in {d.stage}" if d.turn else "at the end"
    text = f"{where}: {'; '.join(parts) or 'the outcome differs'}"
    if d.needs_model is not None:
        text += f"; needs the model from turn {d.needs_model} ({d.reason})"
    elif d.reason:
        text += f"; {d.reason}"
    if d.continued:
        text += f"; {d.continued.describe()}"
    if d.copies:
        text += f"; {ran_on(d.copies)}"
    if d.before and d.after:
        text += (f" [end: {d.before.stage} -> {d.after.stage}, cart {d.before.cart_total} -> "
                 f"{d.after.cart_total}, hand-off {_yes(d.before.handoff)} -> "
                 f"{_yes(d.after.handoff)}]")
    return text


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def as_text(r: Replay, verdicts: Sequence[Verdict] = (), limit: int = 20) -> str:
    c = r.counts()
    turns = sum(d.turns for d in r.diffs)
    lines = [f"funnel replay: {r.funnel}, {c['sessions']} sessions ({turns} turns) on "
             f"{r.edited} against {_versions(r)}, {r.seconds:.2f} s",
             f"  same {c['same']} · different {c['different']} · needs the model "
             f"{c['needs_model']}{_share(r)}"
             + (f" · continued with {r.model} {c['continued']}" if "continued" in c else "")
             + f" · not reproduced {c['not_reproduced']} · skipped {c['skipped']}", "",
             f"The whole, over the {len(r.comparable)} sessions replayed completely "
             "(the recording decides):", *_table(_rows(r))]
    if c.get("continued"):
        lines += ["", _continued(r), *_table(_rows(r, continued=True))]
    cond = _conditions(r)
    if cond:
        lines += ["", "Conditions that hold on other sessions now:"]
        lines += [f"  {w} holds on {now} of {c['sessions']} sessions ({then} then), at "
                  f"another turn on {moved}: {sessions_behind(ids, 5)}"
                  for w, now, then, ids, moved in cond]
    earlier = _earlier(r)
    if earlier:
        lines += ["", "Stages reached earlier now:"]
        lines += [f"  {s}: {len(ids)} sessions: {sessions_behind(ids, 5)}" for s, ids in earlier]
    changed = r.of("different", "needs_model", "continued")
    if changed:
        lines += ["", f"Sessions that differ ({len(changed)}), at their first difference:"]
        lines += [f"  {d.session_id}: {_first(d)}" for d in changed[:limit]]
        if len(changed) > limit:
            lines.append(f"  ... and {len(changed) - limit} more (--format json lists all)")
    odd = r.of("not_reproduced", "skipped")
    if odd:
        lines += ["", f"Not replayed ({len(odd)}):"]
        lines += [f"  {d.session_id}: {d.status.replace('_', ' ')}: {d.reason}"
                  + (f" ({ran_on(d.copies)})" if d.copies else "") for d in odd[:limit]]
    if verdicts:
        lines += ["", "Gates:", *(f"  {v.line()}" for v in verdicts)]
    return "\n".join(lines) + "\n"


def _share(r: Replay) -> str:
    """The share of the sessions that need the model to know (the continued ones too)."""
    n = len(r.of("needs_model", "continued"))
    return f" ({n / len(r.diffs) * 100:.1f}% of the sessions)" if n and r.diffs else ""


def _table(rows: list[tuple[str, float, float, list[str]]]) -> list[str]:
    lines = [f"  {'':28} {'before':>10} {'after':>10} {'change':>9}  sessions"]
    for m, b, a, ids in rows:
        lines.append(f"  {_label(m):28} {_value(m, b):>10} {_value(m, a):>10} "
                     f"{_change(m, b, a):>9}  {len(ids)}"
                     + (f": {sessions_behind(ids, 5)}" if ids else ""))
    return lines


def _versions(r: Replay) -> str:
    return "; ".join(r.versions.values()) or "no recorded version"


def as_json(r: Replay, verdicts: Sequence[Verdict] = ()) -> str:
    data: dict[str, Any] = {
        "funnel": r.funnel, "edited": r.edited, "versions": {str(k): v for k, v in r.versions.items()},
        "seconds": round(r.seconds, 3), "counts": r.counts(),
        "metrics": {m: {"before": b, "after": a, "sessions": ids} for m, b, a, ids in _rows(r)},
        # The same over the sessions a model continued as well (--model): apart, since
        # their after rests on new model outputs.
        "continued_with": r.model,
        "metrics_with_continued": None if r.model is None else {
            m: {"before": b, "after": a, "sessions": ids}
            for m, b, a, ids in _rows(r, continued=True)},
        "conditions": [{"when": w, "sessions_now": now, "sessions_then": then,
                        "another_turn": moved, "changed": ids}
                       for w, now, then, ids, moved in _conditions(r)],
        "earlier": {s: ids for s, ids in _earlier(r)},
        "sessions": [d.as_json() for d in r.diffs],
        # What the figures were measured over, and what they left out (the gates' ground).
        "measured": Measured.of(r).as_json(),
        "gates": [v.as_json() for v in verdicts]}
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n"


def changed_lines(before: str, after: str) -> list[int]:
    """The lines (1-based, of ``after``) an edit changed; a deletion marks the line after."""
    a, b = before.splitlines(), after.splitlines()
    out: list[int] = []
    for tag, _i1, _i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            out += range(j1 + 1, j2 + 1)
        elif tag == "delete":
            out.append(min(j1 + 1, max(len(b), 1)))
    return sorted(set(out))


def _escape(text: str) -> str:
    # Workflow command data: %, CR and LF are escaped (GitHub's toolkit does the same).
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(text: str) -> str:
    return _escape(text).replace(":", "%3A").replace(",", "%2C")


def as_github(r: Replay, files: Mapping[Path, tuple[str, str]],
              verdicts: Sequence[Verdict] = ()) -> str:
    """Workflow commands: a notice on every changed line of the edited files (``files``:
    path -> (text then, text now)) with its effect, then one per gate."""
    c = r.counts()
    summary = (f"replayed {c['sessions']} sessions: {c['changed']} change "
               f"({c['different']} different, {c['needs_model']} need the model"
               + (f", {c['continued']} continued with {r.model}" if "continued" in c else "")
               + f"); measured over {Measured.of(r).note()}")
    whole = [f"{_label(m)} {_value(m, b)} -> {_value(m, a)} ({_change(m, b, a)})"
             for m, b, a, ids in _rows(r) if ids]
    if c.get("continued"):
        whole += [f"with the {c['continued']} continued with {r.model} (new model "
                  f"outputs): {_label(m)} {_value(m, b)} -> {_value(m, a)} "
                  f"({_change(m, b, a)})" for m, b, a, ids in _rows(r, continued=True) if ids]
    earlier = [f"{len(ids)} reach {s} earlier" for s, ids in _earlier(r)]
    cond = _conditions(r)
    out: list[str] = []
    for path, (then, now) in files.items():
        name = _relative(path)
        lines = now.splitlines()
        for number in changed_lines(then, now):
            text = lines[number - 1] if number <= len(lines) else ""
            specific = [f"this condition now holds on {n} of {c['sessions']} sessions "
                        f"({t} then), at another turn on {moved}"
                        for w, n, t, _, moved in cond if w.split("`")[1] in text]
            message = "; ".join([*specific, summary, *earlier, *whole])
            out.append(f"::notice file={_prop(name)},line={number},title="
                       f"{_prop('funnel replay')}::{_escape(message)}")
    for v in verdicts:
        kind = "error" if v.failed else "warning" if v.warning else "notice"
        out.append(f"::{kind} title={_prop('funnel replay gate')}::"
                   f"{_escape(v.line())}")
    if not out:
        out.append(f"::notice title={_prop('funnel replay')}::{_escape(summary)}")
    return "\n".join(out) + "\n"


def _relative(path: Path) -> str:
    try:
        return Path(os.path.relpath(path)).as_posix()
    except ValueError:  # another drive (Windows)
        return path.as_posix()


def as_html(r: Replay, verdicts: Sequence[Verdict] = ()) -> str:
    """One self-contained page (inline CSS, no script), with ``data-testid``s."""
    c = r.counts()

    def e(v: Any) -> str:
        return escape(str(v), quote=True)

    kpis = "".join(f'<div class="kpi" data-testid="count-{k}"><b>{c[k]}</b><span>'
                   f'{e(k.replace("_", " "))}</span></div>'
                   for k in ("sessions", "same", "different", "needs_model", "continued",
                             "not_reproduced", "skipped") if k in c)

    def table(rows: list[tuple[str, float, float, list[str]]], prefix: str) -> str:
        body = "".join(
            f'<tr data-testid="{prefix}-{e(m)}"><td>{e(_label(m))}</td><td class="n">'
            f'{e(_value(m, b))}</td><td class="n">{e(_value(m, a))}</td><td class="n">'
            f'{e(_change(m, b, a))}</td><td>{e(sessions_behind(ids, 8))}</td></tr>'
            for m, b, a, ids in rows)
        return (f'<table><thead><tr><th></th><th class="n">before</th><th class="n">after'
                f'</th><th class="n">change</th><th>sessions behind it</th></tr></thead>'
                f'<tbody>{body}</tbody></table>')

    rows = table(_rows(r), "metric")
    extra = (f'<section data-testid="metrics-with-continued"><h2>With the sessions '
             f'continued with {e(r.model)}</h2><p class="sub">{e(_continued(r))}</p>'
             f'{table(_rows(r, continued=True), "continued-metric")}</section>'
             if c.get("continued") else "")
    cond = "".join(f'<li data-testid="condition">{e(w)} holds on {now} of '
                   f'{c["sessions"]} sessions ({then} then), at another turn on {moved}</li>'
                   for w, now, then, _, moved in _conditions(r))
    changed = "".join(f'<tr data-testid="session"><td><code>{e(d.session_id)}</code></td>'
                      f'<td>{e(d.status.replace("_", " "))}</td><td>{e(_first(d))}</td></tr>'
                      for d in r.of("different", "needs_model", "continued")[:500])
    gates = "".join(f'<li data-testid="gate" class="{"bad" if v.failed else ""}">'
                    f'{e(v.line())}</li>' for v in verdicts)
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Replay of '
        f'{e(r.funnel)}</title><style>{CSS}</style></head><body><main data-testid="replay">'
        f'<header><h1>What the edit does to {c["sessions"]} recorded sessions</h1>'
        f'<p>{e(r.edited)} against {e(_versions(r))}</p></header>'
        f'<div class="kpis">{kpis}</div>'
        f'<section data-testid="metrics"><h2>Before and after</h2><p class="sub">Over the '
        f'{len(r.comparable)} sessions replayed completely on both sides (the recording '
        f'decides)</p>{rows}</section>{extra}'
        + (f'<section data-testid="conditions"><h2>Conditions that hold on other sessions '
           f'now</h2><ul>{cond}</ul></section>' if cond else "")
        + (f'<section data-testid="sessions"><h2>Sessions that differ</h2><p class="sub">At '
           f'their first difference</p><table><tbody>{changed}</tbody></table></section>'
           if changed else '<p class="empty" data-testid="no-difference">No session '
           'differs.</p>')
        + (f'<section data-testid="gates"><h2>Gates</h2><ul>{gates}</ul></section>'
           if gates else "")
        + "<footer>funnel replay: the decided parts played again with the model outputs the "
          "sessions recorded (docs/evidence.md)</footer></main></body></html>\n")


def simulation_text(run: Simulation, earlier: Sequence[Mapping[str, Any]] = (),
                    verdicts: Sequence[Verdict] = ()) -> str:
    """`funnel simulate`'s report: rates with their intervals, overall and per persona,
    beside an earlier run's when given, then every conversation."""
    lines = [f"funnel simulate: {run.funnel}, {len(run.conversations)} conversations, model "
             f"{run.model}, customers {run.customer}, seed {run.seed}",
             *_measured(run), ""]
    rates = run.rates() if run.valid else {}
    for group, row in rates.items():
        lines.append(f"{'All' if group == 'all' else 'Persona ' + group} "
                     f"({row['handoff_rate']['n']} conversations):")
        for name, r in row.items():
            if group != "all" and not r["k"] and name != "handoff_rate":
                continue
            lines.append(f"  {_label(name):28} {r['k']:>4}/{r['n']:<4} {r['rate'] * 100:5.1f}%"
                         f"  [{r['low'] * 100:.1f}%, {r['high'] * 100:.1f}%]")
    m = run.metrics()
    lines += [] if run.valid else [f"INVALID: {run.invalid_reason()}; no rates are given"]
    lines += ["", f"Per conversation: {m['turns']:.1f} turns, cart {m['cart_total']:.2f}, "
              f"{m['tokens']:.0f} tokens, cost {m['cost']:.4f}; fallbacks "
              f"{m['fallback_rate'] * 100:.1f}% and repairs {m['repair_rate'] * 100:.1f}% of "
              "turns"]
    if earlier:
        lines += ["", "Against the earlier run:"]
        lines += [f"  {_label(e['metric']):28} {e['then'] * 100:5.1f}% -> {e['now'] * 100:5.1f}%"
                  + (f"  (p = {e['p_value']:.3f})" if e["p_value"] is not None else "")
                  for e in earlier]
    lines += ["", "Conversations:"]
    lines += [f"  {c.session_id}: {c.turns} turns, ended in {c.stage} ({c.ended}); cart "
              f"{c.cart_total}, completeness {c.completeness}, hand-off "
              f"{_yes(c.handoff)}{' (' + str(c.handoff_reason) + ')' if c.handoff else ''}, "
              f"{c.fallbacks} fallback(s), {c.repairs} repair(s)"
              + (f", {sum(c.degenerate.values())} degenerate message(s)" if c.degenerate else "")
              + ("; never started" if not c.started else "") for c in run.conversations]
    if verdicts:
        lines += ["", "Gates:", *(f"  {v.line()}" for v in verdicts)]
    return "\n".join(lines) + "\n"


def simulation_json(run: Simulation, earlier: Sequence[Mapping[str, Any]] = (),
                    verdicts: Sequence[Verdict] = ()) -> str:
    data = run.as_json()
    data["against"] = list(earlier)
    data["gates"] = [{"gate": v.gate, "failed": v.failed, "measured": v.measured}
                     for v in verdicts]
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n"


def simulation_github(run: Simulation, verdicts: Sequence[Verdict] = ()) -> str:
    m = run.metrics()
    summary = (f"{len(run.conversations)} simulated conversations: hand-off rate "
               f"{m['handoff_rate'] * 100:.1f}%, {m['turns']:.1f} turns each; "
               + "; ".join(_measured(run)))
    out = [f"::notice title={_prop('funnel simulate')}::{_escape(summary)}"
           if run.valid else f"::error title={_prop('funnel simulate: invalid run')}::"
           f"{_escape(str(run.invalid_reason()))}; {_escape('; '.join(_measured(run)))}"]
    out += [f"::{'error' if v.failed else 'notice'} title={_prop('funnel simulate gate')}::"
            f"{_escape(v.line())}" for v in verdicts]
    return "\n".join(out) + "\n"


def _measured(run: Simulation) -> list[str]:
    """What the run measured: the conversations that started, the degenerate messages."""
    d = run.degenerate()
    kinds = ", ".join(f"{k} {n}" for k, n in d["kinds"].items())
    return [f"{len(run.measured)} conversation(s) started, {run.never_started} never started "
            "(left out of the rates)",
            f"{d['messages']} of {d['sent']} customer messages degenerate "
            f"({d['share'] * 100:.1f}%, at most {d['max'] * 100:g}% for a valid run"
            + (f": {kinds})" if kinds else ")")]
