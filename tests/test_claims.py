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
from conftest import ROOT, puramur_data

from engine.funnel.actions import TurnScratch
from engine.funnel.compiled import CompiledFunnel, load_funnel
from engine.funnel.state import defaults
from engine.turn.advance import Mover, start_position

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


@pytest.mark.parametrize(("reply", "state", "kinds"), [
    # The reply, word for word.
    ("Exotic Spa shampoo is only 99 UAH today, and a 50% discount on the lotion!", {},
     ["discount", "price"]),
    # What SmolLM2-135M wrote (issue 38): unbacked product and order claims.
    ("Our shampoos are natural and biodegradable.", {}, ["composition"]),
    ("Your request has been approved.", {}, ["promise"]),
    ("Confirming order.", {}, ["promise"]),
    ("Your cart total is 1,120 UAH.", {"cart_total": 697}, ["price"]),
    # Full-width digits and letters are read as what they look like (NFKC).
    ("Exotic Spa shampoo: ２７７ ＵＡＨ.", {}, []),
    ("Exotic Spa shampoo: ９９ ＵＡＨ.", {}, ["price"]),
    ("₴277 for Exotic Spa shampoo.", {}, []),
    ("Шампунь Exotic Spa — 277,00 грн.", {}, []),
    ("Набір Professional grooming коштує 1 250 грн.", {}, []),
    ("Набір Professional grooming коштує 1\u00a0250\u00a0грн.", {}, []),
    ("Exotic Spa shampoo costs $9.", {}, ["price"]),
    # A declared alias names the product in another language (the catalog's `aliases`).
    ("Професійний набір для грумінгу коштує 1 250 грн.", {}, []),
    ("Профессиональный набор для груминга стоит 999 грн.", {}, ["price"]),
    ("Profesjonalny zestaw do pielęgnacji kosztuje 1250 zł.", {}, ["price"]),
    # An invented SKU, a real one.
    ("I added PR999999 to your cart.", {}, ["product"]),
    ("PR251010 is Exotic Spa shampoo.", {}, []),
    # A pet's breed beside a product word is the session's fact, not a product name.
    ("The best Sphynx shampoo here is Exotic Spa shampoo.", {"pet": {"breed": "Sphynx"}}, []),
    # Numbers that are not money.
    ("Murka is 3 years old, weighs 4 kg; the bottle is 250 ml. Call +380 67 123 45 67 "
     "on 12.05.2026 at 15:00.", {}, []),
])
def test_hostile_replies(funnels: dict[str, CompiledFunnel], reply: str,
                         state: dict[str, Any], kinds: list[str]) -> None:
    assert refused(funnels["puramur"], reply, state) == kinds


def test_a_promise_holds_once_the_state_backs_it(funnels: dict[str, CompiledFunnel]) -> None:
    puramur = funnels["puramur"]
    assert refused(puramur, "A manager will call you shortly.", {}) == ["promise"]
    assert refused(puramur, "A manager will call you shortly.",
                   {"handoff_triggered_at": "2026-12-05T10:00:00+00:00"}) == []
    assert refused(puramur, "Delivery is free!", {"cart_free_delivery": True}) == []
    assert refused(puramur, "Would you like free delivery?", {}) == []  # an offer
    assert refused(puramur, "Delivery is not free yet.", {}) == []  # said not to hold


def test_a_long_reply_of_true_claims_passes(funnels: dict[str, CompiledFunnel]) -> None:
    """Not a timing: the check reads each sentence a bounded number of times, so a long
    reply (the contract's 1,500 characters of claims) is checked in one pass."""
    reply = ("Exotic Spa shampoo costs 277 UAH. " * 44)[:1500]
    assert refused(funnels["puramur"], reply, {}) == []


# -- bad declarations: `funnel validate` errors with their line, never a run-time failure --

def _validate(tmp_path: Path, edit: Any, catalog: str | None = None) -> list[Any]:
    from engine.validation import check_file

    data = puramur_data()
    edit(data)
    if catalog is not None:
        (tmp_path / "catalog.yaml").write_text(catalog)
        data["catalog"] = str(tmp_path / "catalog.yaml")
    path = tmp_path / "puramur.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False))
    return [d for d in check_file(path)[1] if d.severity == "error"]


def _custom(pattern: str, lang: str = "en") -> Any:
    return lambda d: d["claims"]["custom"].update(
        {"cure": {"patterns": {lang: pattern}, "when": "false"}})


@pytest.mark.parametrize(("edit", "code", "words"), [
    (_custom(r"(a+)+\1"), "F901", "linear time"),
    (_custom("(?=heals)"), "F901", "linear time"),
    (_custom("heals", "de"), "F901", "does not speak"),
    (lambda d: d["claims"]["promises"].update(order_confirmed="cart_totl > 0"), "F402",
     "cart_totl"),
    (lambda d: d["claims"]["custom"]["composition"].update(when="nope("), "F401",
     "does not parse"),
    (lambda d: d["claims"].update(figures=["delivery_fee"]), "F902", "not a state field"),
    (lambda d: d["claims"].update(figures=["pet"]), "F902", "number field"),
    (lambda d: d.update(promotions=[{"name": "Spring"}]), "F903", "gives nothing"),
    (lambda d: d.update(promotions=[{"name": "Spring", "percent": 5, "skus": ["PR1"]}]),
     "F903", "PR1"),
])
def test_bad_claims_are_validate_errors_with_their_line(tmp_path: Path, edit: Any, code: str,
                                                        words: str) -> None:
    errors = _validate(tmp_path, edit)
    found = [d for d in errors if d.code == code]
    assert found and words in found[0].message and found[0].line > 0, errors


CATALOG = """currency: UAH
products:
  - {sku: PR100999, name: Brilliant Gloss (gift), price: 0}
  - {sku: A1, name: Silk shampoo, price: 100}
  - {sku: A2, name: silk  Shampoo, price: 120}
  - {sku: A3, name: Silk serum, price: 130, discount: 140}
"""


def test_a_catalog_with_one_name_for_two_products_or_a_bad_discount_is_refused(
        tmp_path: Path) -> None:
    errors = _validate(tmp_path, lambda d: None, CATALOG)
    by_code = {d.code: d for d in errors}
    assert by_code["F904"].line == 5 and "A1" in by_code["F904"].message
    assert by_code["F905"].line == 6 and "140" in by_code["F905"].message
    assert str(tmp_path / "catalog.yaml") == by_code["F904"].file
