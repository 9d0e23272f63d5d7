"""The check: every claim of a reply against the catalog and the state, in code.

:class:`ClaimChecker` is built once per funnel (engine.funnel.compiled); a turn calls
:meth:`ClaimChecker.check` with the reply and the state as the turn leaves it (its
updates and actions applied, its exits taken), and gets the claims nothing backs.
No model decides what is true: the same reply and state give the same answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ..format.catalog import Catalog, Product
from ..format.claims import BUILTIN_PROMISES, ClaimsSpec, Promotion, decimal
from ..format.spec import FunnelSpec
from ..sandbox.expressions import compile_condition
from ..sandbox.patterns import compile_linear
from .lexicon import DISCOUNT_WORDS, NEGATIONS, PROMISES
from .money import Amount, amounts, matches_word
from .products import ProductIndex
from .text import Sentence, Word, fold, sentences

__all__ = ["ClaimChecker", "Refusal", "problem"]

_CENT = Decimal("0.01")
_LANGUAGES = ("uk", "ru", "en", "pl")
_NAME_WORD = re.compile(r"[^\W\d_]{2,}")

Condition = Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True)
class Refusal:
    """One claim of a reply that nothing backs.

    Attributes:
        kind: ``price``, ``discount``, ``product``, ``promise`` or a custom kind's name.
        text: the claim as the reply wrote it (bounded).
        expected: what the catalog or the state says instead.
        name: the promise or custom kind (``free_delivery``), else the kind.
    """

    kind: str
    text: str
    expected: str
    name: str = ""

    def as_record(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name or self.kind, "text": self.text,
                "expected": self.expected}

    def sentence(self) -> str:
        """The conflict, as the repair call quotes it to the model."""
        return f"the reply says \"{self.text}\"; {self.expected}"


def problem(refusals: list[Refusal]) -> str:
    """The repair call's account of what was refused, every conflict exactly."""
    return "; ".join(r.sentence() for r in refusals[:8])


def _money(value: Decimal) -> str:
    q = value.quantize(_CENT)
    return f"{q:f}".removesuffix(".00")


def _decimal(value: Any) -> Decimal | None:
    """A figure of the state or the catalog, to the cent (None: not a finite number)."""
    number = decimal(value)
    return number.quantize(_CENT) if number is not None else None


@dataclass(frozen=True)
class _Kind:
    name: str
    pattern: Any  # re.Pattern or an RE2 pattern
    when: Condition | None  # None: never backed
    source: str
    threshold: Decimal | None = None
    says: str = ""
    kind: str = "promise"
    products: frozenset[str] = frozenset()


class ClaimChecker:
    """The claims a funnel's replies may make, compiled once.

    Args:
        spec: the funnel; ``spec.claims`` and each stage's ``claims`` say what is checked.
        catalog: its catalog (prices, names, discounts), if it has one.
    """

    def __init__(self, spec: FunnelSpec, catalog: Catalog | None) -> None:
        self.spec = spec
        self.catalog = catalog
        cart = spec.cart
        self.currency = (catalog.currency if catalog else "").upper() or None
        self.products = ProductIndex(catalog, (spec.name, *spec.claims.not_products)) \
            if catalog else None
        self.thresholds = {
            "gift": _decimal(cart.gift_threshold) if cart else None,
            "free_delivery": _decimal(cart.free_delivery_threshold) if cart else None}
        # Fields that hold catalog products (the cart, the products shown): their words are
        # the catalog's, not the session's own facts.
        self._catalog_fields = frozenset(
            f for f in (cart.field if cart else None, spec.presented_field) if f)
        self.promotions = [(p, compile_condition(p.when) if p.when else None)
                           for p in spec.promotions]
        self._conditions: dict[str, Condition] = {}
        self._kinds: dict[str, list[_Kind]] = {}
        self.settings: dict[str, ClaimsSpec] = {
            name: stage.claims if stage.claims is not None else spec.claims
            for name, stage in spec.stages.items()}
        for stage, claims in self.settings.items():
            self._kinds[stage] = self._compile(claims)

    def active(self, stage: str) -> bool:
        """Whether replies in ``stage`` are checked."""
        return self.settings.get(stage, self.spec.claims).check

    def _condition(self, source: str) -> Condition:
        if source not in self._conditions:
            self._conditions[source] = compile_condition(source)
        return self._conditions[source]

    def _defaults(self) -> dict[str, str]:
        """The conditions the engine knows without a declaration, from cart and handoff."""
        out = {}
        cart, handoff = self.spec.cart, self.spec.handoff
        if cart and cart.free_delivery_flag:
            out["free_delivery"] = cart.free_delivery_flag
        if cart and cart.gift_flag:
            out["gift"] = cart.gift_flag
        if handoff and handoff.triggered_at:
            out["manager_contact"] = f"{handoff.triggered_at} is not none"
            if cart and cart.count:
                out["order_confirmed"] = f"{cart.count} > 0 and {handoff.triggered_at} " \
                                         "is not none"
        return out

    def _compile(self, claims: ClaimsSpec) -> list[_Kind]:
        languages = [c for c in (*self.spec.language_policy.languages,
                                 self.spec.language_policy.default) if c in _LANGUAGES] \
            or list(_LANGUAGES)
        languages = list(dict.fromkeys([*languages, "en"]))
        declared = {**self._defaults(), **claims.promises}
        kinds = []
        for name in BUILTIN_PROMISES:
            source = "|".join(f"(?:{PROMISES[name][c]})" for c in languages)
            when = declared.get(name)
            kinds.append(_Kind(name, re.compile(source), self._condition(when) if when else None,
                               when or "", self.thresholds.get(name)))
        for custom in claims.custom:
            parts = [p for c, p in custom.patterns.items() if c in languages or c == "*"] \
                or list(custom.patterns.values())
            if not parts:
                continue
            kinds.append(_Kind(custom.name, compile_linear("|".join(f"(?:{p})" for p in parts)),
                               self._condition(custom.when), custom.when, None, custom.says,
                               custom.kind or custom.name, frozenset(custom.products)))
        return kinds

    # -- the check -----------------------------------------------------------------------
    def check(self, reply: str, stage: str, state: Mapping[str, Any],
              context: Mapping[str, Any]) -> list[Refusal]:
        """The claims of ``reply`` nothing backs, for a turn that leaves ``state`` (and
        conditions read ``context``) in ``stage``'s settings."""
        claims = self.settings.get(stage, self.spec.claims)
        if not claims.check or not reply.strip():
            return []
        parts = sentences(reply)
        known = _known_words({k: v for k, v in state.items() if k not in self._catalog_fields})
        mentions = [self.products.mention(s, known) if self.products else None
                    for s in parts]
        cart = self._cart(state)
        named_anywhere = [p for m in mentions if m for p in m.products]
        presented = self._presented(state) if not named_anywhere else []
        found_in = [amounts(s) for s in parts]
        promotions = self._active(context)  # read once a check: the turn's state is set
        # The state's money figures, once a check, and only for a reply that quotes money.
        figures = self._figures(state, claims.figures, promotions) if claims.prices and any(
            not a.percent for found in found_in for a in found) else {}
        out: list[Refusal] = []
        cache: dict[str, bool] = {}
        previous: list[Product] = []
        for sentence, mention, found in zip(parts, mentions, found_in, strict=True):
            here = mention.products or mention.generic if mention else []
            if mention and claims.products:
                out += [Refusal("product", q, why) for q, why in mention.invented]
            nearby = here or previous
            if here:
                previous = here
            if claims.prices:
                out += self._prices(sentence, found, nearby, cart, presented, state, figures)
            if claims.discounts:
                out += self._discounts(sentence, found, [*nearby, *cart], promotions)
            out += self._promises(sentence, found, nearby, stage, context, cache)
        return out

    def _cart(self, state: Mapping[str, Any]) -> list[Product]:
        cart = self.spec.cart
        lines = state.get(cart.field) if cart else None
        out = []
        for line in lines if isinstance(lines, list) else ():
            if isinstance(line, Mapping) and self.catalog:
                product = self.catalog.by_sku.get(str(line.get("sku")))
                if product is not None:
                    out.append(product)
        return out

    def _presented(self, state: Mapping[str, Any]) -> list[Product]:
        field = self.spec.presented_field
        shown = state.get(field) if field else None
        out = []
        for item in shown if isinstance(shown, list) else ():
            sku = item.get("sku") if isinstance(item, Mapping) else item
            if self.catalog and (p := self.catalog.by_sku.get(str(sku))) is not None:
                out.append(p)
        return out

    def _figures(self, state: Mapping[str, Any], fields: Iterable[str],
                 promotions: list[Promotion]) -> dict[Decimal, str]:
        """The money figures the state holds, with what each is (``promotions``: those in
        force)."""
        out: dict[Decimal, str] = {}
        cart = self.spec.cart
        total = _decimal(state.get(cart.total)) if cart and cart.total else None
        names = [*fields, *([cart.total] if cart and cart.total else [])]
        for name in names:
            value = _decimal(state.get(name))
            if value is not None and value > 0:
                out.setdefault(value, f"{name} is {_money(value)}")
        for kind, threshold in self.thresholds.items():
            if threshold is None:
                continue
            what = "the gift threshold" if kind == "gift" else "the free-delivery threshold"
            out.setdefault(threshold, f"{what} is {_money(threshold)}")
            if total is not None and threshold > total:
                out.setdefault(threshold - total, f"{_money(threshold - total)} is left to "
                                                  f"{what}")
        for line in (state.get(cart.field) if cart else None) or ():
            if isinstance(line, Mapping):
                price, qty = _decimal(line.get("price")), _decimal(line.get("qty"))
                if price is not None and qty is not None and qty > 1:
                    out.setdefault((price * qty).quantize(_CENT),
                                   f"{_money(qty)} x {line.get('name')} is "
                                   f"{_money(price * qty)}")
        for promotion in promotions:
            if promotion.amount is not None:
                out.setdefault(promotion.amount.quantize(_CENT),
                               f"{promotion.name} gives {_money(promotion.amount)}")
            if promotion.percent is not None and total:
                off = (total * promotion.percent / 100).quantize(_CENT)
                out.setdefault(off, f"{promotion.name} takes {_money(off)} off the cart")
                out.setdefault(total - off, f"the cart after {promotion.name} is "
                                            f"{_money(total - off)}")
        return out

    def _product_prices(self, product: Product) -> list[Decimal]:
        prices = [product.price.quantize(_CENT)]
        discount = _decimal(product.attributes.get("discount"))
        if discount:
            prices.append((product.price * (100 - discount) / 100).quantize(_CENT))
        return prices

    def _prices(self, sentence: Sentence, found: list[Amount], nearby: list[Product],
                cart: list[Product], presented: list[Product], state: Mapping[str, Any],
                figures: Mapping[Decimal, str]) -> list[Refusal]:
        money = [a for a in found if not a.percent]
        if not money:
            return []
        backing = {price: p for p in (*presented, *cart, *nearby)
                   for price in self._product_prices(p)}
        out = []
        for amount in money:
            quote = sentence.quote(amount.start, amount.end)
            if amount.currency is not None and self.currency \
                    and amount.currency != self.currency:
                out.append(Refusal("price", quote, f"the shop's prices are in {self.currency}, "
                                                   f"not {amount.currency}"))
                continue
            value = amount.value.quantize(_CENT)
            if value in backing or value in figures:
                continue
            out.append(Refusal("price", quote, self._says(nearby, cart, state)))
        return out

    def _says(self, nearby: list[Product], cart: list[Product], state: Mapping[str, Any]
              ) -> str:
        unit = f" {self.currency}" if self.currency else ""
        if nearby:
            listed = "; ".join(f"{p.name} costs {_money(p.price)}{unit}"
                               for p in dict.fromkeys(nearby))
            return f"the catalog says {listed}"
        c = self.spec.cart
        total = _decimal(state.get(c.total)) if c and c.total else None
        if cart:
            return (f"the cart holds {', '.join(p.name for p in dict.fromkeys(cart))}, "
                    f"total {_money(total or Decimal(0))}{unit}")
        return ("no product named there costs that, and the cart is empty: quote only catalog "
                "prices of the products you name")

    def _active(self, context: Mapping[str, Any]) -> list[Promotion]:
        """The promotions in force (a condition that cannot be read: not in force)."""
        out = []
        for promotion, when in self.promotions:
            try:
                if when is None or when(context):
                    out.append(promotion)
            except Exception:
                continue
        return out

    def _discounts(self, sentence: Sentence, found: list[Amount], products: list[Product],
                   promotions: list[Promotion]) -> list[Refusal]:
        declared = {p.percent.quantize(_CENT) for p in promotions if p.percent is not None}
        declared |= {d for p in products
                     if (d := _decimal(p.attributes.get("discount"))) is not None}
        out = []
        percents = [a for a in found if a.percent]
        for amount in percents:
            if amount.value.quantize(_CENT) not in declared:
                out.append(Refusal("discount", sentence.quote(amount.start, amount.end),
                                   self._offers(promotions, products)))
        if percents:
            return out
        words = sentence.words
        for i, word in enumerate(words):
            if not matches_word(word.folded, DISCOUNT_WORDS):
                continue
            if _negation(words[max(0, i - 2):i], []):
                continue
            if not declared and not any(p.amount is not None for p in promotions):
                out.append(Refusal("discount", sentence.quote(
                    words[max(0, i - 2)].start, words[min(len(words) - 1, i + 2)].end),
                    self._offers(promotions, products)))
            break
        return out

    def _offers(self, promotions: list[Promotion], products: list[Product]) -> str:
        offers = [f"{p.name} ({_money(p.percent)}%)" if p.percent is not None
                  else f"{p.name} ({_money(p.amount or Decimal(0))} {self.currency or ''})"
                  for p in promotions]
        offers += [f"{p.name} ({_money(d)}% off)" for p in dict.fromkeys(products)
                   if (d := _decimal(p.attributes.get("discount")))]
        if not offers:
            return "the shop declares no discount or promotion: do not offer one"
        return f"the only discounts are {', '.join(offers)}"

    def _promises(self, sentence: Sentence, found: list[Amount], nearby: list[Product],
                  stage: str, context: Mapping[str, Any], cache: dict[str, bool]
                  ) -> list[Refusal]:
        if sentence.asks:
            return []
        out = []
        names = self.products.name_spans(sentence.folded) if self.products else []
        cart = self.spec.cart
        total = _decimal(context.get(cart.total)) if cart and cart.total else None
        for kind in self._kinds.get(stage, ()):
            match = next((m for m in kind.pattern.finditer(sentence.folded)
                          if not any(a <= m.start() and m.end() <= b for a, b in names)), None)
            custom = kind.name not in BUILTIN_PROMISES
            # A funnel's own pattern is the claim as written: no negation is read into it.
            if match is None or (not custom and _negated(sentence, match.start(),
                                                          match.end())):
                continue
            rule = {kind.threshold} if kind.threshold is not None else set()
            if kind.threshold is not None and total is not None and kind.threshold > total:
                rule.add(kind.threshold - total)
            if kind.products and nearby and all(p.sku in kind.products for p in nearby):
                continue  # true of the products the sentence is about
            if kind.threshold is not None and any(
                    not a.percent and a.value.quantize(_CENT) in rule for a in found):
                continue  # the rule ("free from 1500 UAH", "446 UAH more for a gift")
            if kind.when is not None:
                if kind.source not in cache:
                    try:
                        cache[kind.source] = bool(kind.when(context))
                    except Exception:  # a condition that cannot be read backs nothing
                        cache[kind.source] = False
                if cache[kind.source]:
                    continue
            quote = sentence.quote(match.start(), match.end())
            expected = kind.says or (
                f"its condition `{kind.source}` does not hold now" if kind.source
                else f"the funnel declares no condition for a {kind.name} promise")
            out.append(Refusal(kind.kind, quote, expected, kind.name))
        return out


def _negated(sentence: Sentence, start: int, end: int) -> bool:
    """A negation inside the phrase or in the two words before it ("no" only right
    before it: "No problem, delivery is free" still promises)."""
    return _negation([w for w in sentence.words if w.end <= start][-2:],
                     [w for w in sentence.words if start <= w.start < end])


def _negation(before: list[Word], inside: list[Word]) -> bool:
    if before and before[-1].folded in ("no", "немає", "нема", "нет", "brak"):
        return True
    return any(w.folded in NEGATIONS for w in (*before, *inside))


def _known_words(state: Mapping[str, Any]) -> frozenset[str]:
    """The folded words of the session's own short texts (a breed, a pet's name)."""
    out: set[str] = set()

    def walk(value: Any, depth: int) -> None:
        if depth > 3:
            return
        if isinstance(value, str) and len(value) <= 80:
            out.update(_NAME_WORD.findall(fold(value)))
        elif isinstance(value, Mapping):
            for v in value.values():
                walk(v, depth + 1)
        elif isinstance(value, list):
            for v in value[:20]:
                walk(v, depth + 1)

    walk(dict(state), 0)
    return frozenset(out)
