"""The claims checker (engine.claims) on the labelled replies of tests/data/claims_labelled.yaml.

Each case is a reply Puramur's model could write, the state it was written in and the
kinds of claims in it that nothing backs (labelled by the rules in the file's header,
not by this checker). Every false claim must be refused and no true one: the test
prints precision and recall per kind and language, and asserts both are 1.0.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.funnel.actions import TurnScratch
from engine.funnel.compiled import CompiledFunnel, load_funnel
from engine.funnel.state import defaults
from engine.turn.advance import Mover, start_position
from tests.conftest import ROOT, puramur_data

DATA = Path(__file__).with_name("data") / "claims_labelled.yaml"
CASES: list[dict[str, Any]] = yaml.safe_load(DATA.read_text("utf-8"))["cases"]


@cache
def _funnels(tmp: str) -> dict[str, CompiledFunnel]:
    base = Path(tmp)
    plain = puramur_data()
    promo = copy.deepcopy(plain)
    catalog = yaml.safe_load((ROOT / "funnels" / "puramur" / "catalog.yaml").read_text("utf-8"))
    for product in catalog["products"]:
        if product["sku"] == "PR270300":
            product["discount"] = 20
    (base / "promo_catalog.yaml").write_text(yaml.safe_dump(catalog, allow_unicode=True))
    promo["catalog"] = str(base / "promo_catalog.yaml")
    promo["promotions"] = [{"name": "Welcome 10", "percent": 10, "code": "WELCOME10"}]
    out = {}
    for name, data in (("puramur", plain), ("puramur_promo", promo)):
        path = base / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False))
        out[name] = load_funnel(path)
    return out


@pytest.fixture(scope="module")
def funnels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CompiledFunnel]:
    return _funnels(str(tmp_path_factory.mktemp("claims")))


def refused(funnel: CompiledFunnel, reply: str, given: Mapping[str, Any],
            stage: str = "presentation") -> list[str]:
    """The kinds of the reply's refused claims, on the funnel's defaults plus ``given``."""
    state = {**defaults(funnel.spec), **copy.deepcopy(dict(given))}
    from datetime import UTC, datetime
    now = datetime(2026, 12, 5, tzinfo=UTC)
    pos = start_position(stage, now)
    mover = Mover(funnel, pos, now, TurnScratch("s", stage, 0, now))
    found = funnel.claims.check(reply, stage, state, mover.context(state))
    return sorted({r.kind for r in found})


def test_the_labelled_replies_are_judged_as_labelled(funnels: dict[str, CompiledFunnel]
                                                     ) -> None:
    """Precision and recall of the refusals, over every labelled reply."""
    assert len(CASES) >= 150
    assert {c["lang"] for c in CASES} == {"uk", "ru", "en", "pl"}
    counts: Counter[tuple[str, str]] = Counter()
    wrong = []
    for case in CASES:
        got = refused(funnels[case["funnel"]], case["reply"], case.get("state") or {})
        want = sorted(set(case["refuse"]))
        for kind in set(got) | set(want):
            outcome = "tp" if kind in got and kind in want else "fp" if kind in got else "fn"
            counts[(outcome, kind)] += 1
            counts[(outcome, case["lang"])] += 1
            counts[(outcome, "all")] += 1
        counts[("replies", "true" if not want else "false")] += 1
        counts[("replies_ok", "true" if not want else "false")] += int(got == want)
        if got != want:
            wrong.append(f"{case['id']}: got {got}, labelled {want}: {case['reply']!r} "
                         f"({case['why']})")
    lines = []
    for key in ("all", "en", "uk", "ru", "pl", "price", "discount", "product", "promise",
                "composition"):
        tp, fp, fn = (counts[(o, key)] for o in ("tp", "fp", "fn"))
        precision = tp / (tp + fp) if tp + fp else 1.0
        recall = tp / (tp + fn) if tp + fn else 1.0
        lines.append(f"{key:12} refused {tp + fp:4}  precision {precision:.3f}  "
                     f"recall {recall:.3f}")
    print(f"\n{len(CASES)} labelled replies: {counts[('replies', 'false')]} with false "
          f"claims ({counts[('replies_ok', 'false')]} judged exactly), "
          f"{counts[('replies', 'true')]} true ({counts[('replies_ok', 'true')]} passed)")
    print("\n".join(lines))
    assert not wrong, "\n".join(wrong)
