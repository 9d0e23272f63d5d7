"""`funnel report --advise` as text and JSON (engine.evidence.advise computes it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from .advise import Advice

__all__ = ["advice_json", "advice_text"]


def advice_json(advice: Sequence[Advice], facts: Mapping[str, Any]) -> str:
    data = {**facts, "thresholds": [a.as_json() for a in advice]}
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n"


def _n(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _pct(group: Mapping[str, Any]) -> str:
    return (f"{group['converted']}/{group['n']} {group['rate'] * 100:.1f}% "
            f"[{group['low'] * 100:.1f}%, {group['high'] * 100:.1f}%]")


def advice_text(advice: Sequence[Advice], facts: Mapping[str, Any]) -> str:
    lines = [f"funnel report {facts['funnel']} --advise: {facts['sessions']:,} session(s), "
             f"{len(advice)} threshold(s), {facts['seconds']:.2f} s", ""]
    for a in advice:
        t = a.threshold
        lines.append(f"{t.stage} -> {t.to}  `{t.when}`  (line {t.line}): {t.text}")
        lines.append(f"  entered {t.stage}: {a.entered:,}; took the exit: {a.passed:,}; "
                     f"stayed in {t.stage}: {a.stayed:,}, of them {a.just_below:,} just "
                     f"{'below' if t.up else 'above'} it ({_n(a.band[0])} to {_n(a.band[1])})"
                     + ("" if a.entered else f" (no session entered {t.stage})"))
        if a.by_score:
            lines.append(f"  conversion of those that took the exit, by {t.field}:")
            lines += [f"    {_n(b['from']):>6} to <{_n(b['to']):<6} {_pct(b)}" if t.up else
                      f"    >{_n(b['from']):>6} to {_n(b['to']):<6} {_pct(b)}"
                      for b in a.by_score]
        lines.append(f"  advice: {a.advice}")
        r = a.replay
        if r is not None:
            head = (f"  replay of `{r['condition']}` over {r['sessions']:,} session(s)"
                    + (f" (of the most recent {min(r['of'], facts['replay_cap']):,}: capped by "
                       "--advise-sessions)" if r["capped"] else "")
                    + (f"; {r['without_turns']:,} kept no turn records (generated, or "
                       "recorded before the engine kept them): not replayed"
                       if r.get("without_turns") else ""))
            if "error" in r:
                lines.append(f"{head}: {r['error']}")
            else:
                lines.append(f"{head}: {r['changed']:,} change ({r['different']:,} "
                             f"different, {r['needs_model']:,} need the model), "
                             f"{r['same']:,} same, {r['not_reproduced']:,} not reproduced, "
                             f"{r['skipped']:,} skipped")
                moved = [f"{s} {b * 100:.1f}% -> {x * 100:.1f}%"
                         for s, (b, x) in r["reach"].items() if b != x]
                if moved:
                    lines.append("    reach (like-for-like sessions): " + ", ".join(moved))
        lines.append("")
    return "\n".join(lines)
