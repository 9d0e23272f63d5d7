"""The ``claims:`` and ``promotions:`` blocks: what a reply may claim and what backs it.

The model writes the words the customer reads. A funnel declares which claims
those words may make, and the catalog and the state decide whether each one is
true (engine.claims checks them, in code)::

    claims:
      figures: [cart_total]             # state fields holding money a reply may quote
      promises:                         # a promise needs its condition to hold
        free_delivery: cart_free_delivery
        order_confirmed: "cart_item_count > 0 and handoff_reason == 'cart_confirmed'"
      custom:
        composition:
          patterns: {en: '\\b(natural|organic)\\b', uk: 'натуральн'}
          when: "false"
          says: the catalog declares no composition claims
    promotions:
      - {name: Welcome 10, percent: 10, code: WELCOME10}

A stage may set ``claims:`` too: its keys replace the funnel's for that stage
(``claims: {check: false}`` turns the check off there).

This module only reads the declaration; `funnel validate` (engine.validation.claims)
reports what is wrong with it, with its line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["BUILTIN_PROMISES", "ClaimsSpec", "CustomClaim", "Promotion", "claims_spec",
           "decimal", "promotions"]

# The promises the engine knows how to find in a reply, in uk, ru, en and pl
# (engine.claims.promises): each needs a state condition that backs it.
BUILTIN_PROMISES = ("free_delivery", "gift", "order_confirmed", "manager_contact")


@dataclass(frozen=True)
class CustomClaim:
    """A claim kind the funnel defines: a pattern per language and its condition."""

    name: str
    patterns: dict[str, str]
    when: str
    says: str = ""
    kind: str = ""  # what a refusal is counted as (several claims may share one); "": name
    # SKUs the claim is true of: backed when every product the sentence names is one.
    products: tuple[str, ...] = ()


@dataclass(frozen=True)
class Promotion:
    """A discount the shop really gives: what backs a discount or percentage in a reply."""

    name: str
    percent: Decimal | None = None
    amount: Decimal | None = None
    code: str | None = None
    skus: tuple[str, ...] = ()  # empty: every product
    when: str | None = None


@dataclass(frozen=True)
class ClaimsSpec:
    """The claims a funnel's (or a stage's) replies are checked for.

    ``promises`` maps a promise kind to the condition that backs it; a kind the
    funnel does not map gets the engine's default condition (from ``cart:`` and
    ``handoff:``), and a kind with neither is never backed.
    """

    check: bool = True
    prices: bool = True
    discounts: bool = True
    products: bool = True
    figures: tuple[str, ...] = ()
    promises: dict[str, str] = field(default_factory=dict)
    custom: tuple[CustomClaim, ...] = ()
    # Capitalized words next to a product word that are not product names (the shop's
    # own name: "Puramur shampoo" is no invented product).
    not_products: tuple[str, ...] = ()


def claims_spec(raw: Any, base: ClaimsSpec | None = None) -> ClaimsSpec:
    """The declaration ``raw`` (a funnel's or a stage's ``claims:``) over ``base``."""
    base = base or ClaimsSpec()
    if raw is None:
        return base
    if raw is False:
        return ClaimsSpec(check=False)
    if not isinstance(raw, Mapping):
        return base
    promises = dict(base.promises)
    for kind, when in (raw.get("promises") or {}).items():
        promises[str(kind)] = "false" if when is False else "true" if when is True \
            else str(when)
    custom = {c.name: c for c in base.custom}
    for name, item in (raw.get("custom") or {}).items():
        if isinstance(item, Mapping):
            custom[str(name)] = CustomClaim(
                name=str(name),
                patterns={str(k): str(v) for k, v in (item.get("patterns") or {}).items()},
                when="false" if item.get("when") is False else str(item.get("when", "false")),
                says=str(item.get("says") or ""), kind=str(item.get("kind") or name),
                products=tuple(str(p) for p in item.get("products") or ()))
    return ClaimsSpec(
        check=bool(raw.get("check", base.check)),
        prices=bool(raw.get("prices", base.prices)),
        discounts=bool(raw.get("discounts", base.discounts)),
        products=bool(raw.get("products", base.products)),
        figures=tuple(str(f) for f in raw.get("figures", base.figures) or ()),
        promises=promises,
        custom=tuple(custom.values()),
        not_products=tuple(str(w) for w in raw.get("not_products", base.not_products) or ()),
    )


def decimal(value: Any) -> Decimal | None:
    """``value`` as a finite Decimal (a YAML number or a numeric string), else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def promotions(raw: Any) -> tuple[Promotion, ...]:
    """The funnel's ``promotions:`` list."""
    out = []
    for item in raw or ():
        if not isinstance(item, Mapping):
            continue
        when = item.get("when")
        out.append(Promotion(
            name=str(item.get("name", "")), percent=decimal(item.get("percent")),
            amount=decimal(item.get("amount")),
            code=str(item["code"]) if item.get("code") is not None else None,
            skus=tuple(str(s) for s in item.get("skus") or ()),
            when=None if when is None else str(when)))
    return tuple(out)
