"""F901-F905: what the replies may claim (``claims:``, ``promotions:``) and the catalog
names the claims are checked against.

- F901 a custom claim's pattern RE2 cannot run (a backreference, a lookaround: it
  could backtrack), or one for a language the funnel does not speak;
- F902 ``claims.figures`` naming a field that is not a number;
- F903 a promotion that gives nothing, or names a SKU the catalog does not have;
- F904 two catalog products with the same name or alias: a reply naming it could not
  be checked against one price;
- F905 a product's ``discount`` that is not a percentage between 0 and 100.

The claims' conditions (``promises``, ``custom.*.when``, ``promotions[].when``) are
checked with every other condition (engine.validation.semantics, F401/F402/F205).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import CatalogError, did_you_mean
from ..format import _yaml
from ..format.catalog import load_catalog
from ..format.paths import funnel_roots, is_confined
from ..sandbox.patterns import PatternRefused, compile_linear
from .diagnostics import Report, as_dict, as_list

__all__ = ["check_claims", "claim_conditions"]

_ANY_LANGUAGE = "*"


def _blocks(data: dict[str, Any]) -> Iterator[tuple[tuple[str | int, ...], dict[str, Any]]]:
    """Every ``claims:`` block (the funnel's, each stage's) with its key path."""
    yield ("claims",), as_dict(data.get("claims"))
    for name, raw in as_dict(data.get("stages")).items():
        block = as_dict(raw).get("claims")
        if isinstance(block, dict):
            yield ("stages", name, "claims"), block


def claim_conditions(data: dict[str, Any]) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """(key path, source) of every condition the claims declare."""
    for keys, block in _blocks(data):
        for kind, when in as_dict(block.get("promises")).items():
            if isinstance(when, str):
                yield (*keys, "promises", kind), when
        for kind, item in as_dict(block.get("custom")).items():
            when = as_dict(item).get("when")
            if isinstance(when, str):
                yield (*keys, "custom", kind, "when"), when
    for i, promotion in enumerate(as_list(data.get("promotions"))):
        when = as_dict(promotion).get("when")
        if isinstance(when, str):
            yield ("promotions", i, "when"), when


def _languages(data: dict[str, Any]) -> set[str]:
    language = as_dict(data.get("language"))
    found = {str(c) for c in as_list(language.get("follow_customer"))}
    for key in ("default", "fixed"):
        if isinstance(language.get(key), str):
            found.add(language[key])
    return found or {"en"}


def check_claims(data: dict[str, Any], state: dict[str, Any], report: Report) -> None:
    """Report what is wrong with the funnel's claims, promotions and catalog names."""
    languages = _languages(data)
    for keys, block in _blocks(data):
        for kind, item in as_dict(block.get("custom")).items():
            for lang, pattern in as_dict(as_dict(item).get("patterns")).items():
                where = (*keys, "custom", kind, "patterns", lang)
                if lang != _ANY_LANGUAGE and lang not in languages:
                    report.at(where, "error", "F901", f"claim '{kind}' has a pattern for "
                              f"'{lang}', a language the funnel does not speak (it speaks "
                              f"{', '.join(sorted(languages))}); use one of those, or '*' for "
                              "every language", key=True)
                if not isinstance(pattern, str):
                    continue
                try:
                    compile_linear(pattern)
                except PatternRefused as exc:
                    report.at(where, "error", "F901", f"claim '{kind}': {exc}")
        for i, name in enumerate(as_list(block.get("figures"))):
            field = as_dict(state.get(name)) if isinstance(name, str) else {}
            if not isinstance(name, str) or name not in state:
                report.at((*keys, "figures", i), "error", "F902", f"claims.figures names "
                          f"{name!r}, which is not a state field{did_you_mean(str(name), state)}")
            elif field.get("type") not in ("number", "integer"):
                report.at((*keys, "figures", i), "error", "F902", f"claims.figures names "
                          f"'{name}', a {field.get('type')} field: a money figure is a number "
                          "field (type: number)")
    skus = _catalog_skus(data, report)
    for i, raw in enumerate(as_list(data.get("promotions"))):
        promotion = as_dict(raw)
        if promotion.get("percent") is None and promotion.get("amount") is None:
            report.at(("promotions", i), "error", "F903", f"promotion "
                      f"{promotion.get('name')!r} gives nothing: set `percent:` (10 for 10% "
                      "off) or `amount:` (a sum off)")
        for j, sku in enumerate(as_list(promotion.get("skus"))):
            if skus is not None and str(sku) not in skus:
                report.at(("promotions", i, "skus", j), "error", "F903", f"promotion "
                          f"{promotion.get('name')!r} names SKU {sku!r}, which the catalog does "
                          f"not have{did_you_mean(str(sku), skus)}")


def _catalog_skus(data: dict[str, Any], report: Report) -> set[str] | None:
    """The catalog's SKUs, after reporting its names said twice (F904) and its bad
    discounts (F905); None when there is no readable catalog (F502 says why)."""
    catalog = data.get("catalog")
    if not isinstance(catalog, str):
        return None
    path = report.path.parent / catalog
    if not is_confined(path, funnel_roots(report.path)) or not path.is_file():
        return None
    try:
        loaded = load_catalog(path)
        located = _yaml.load(path.read_text("utf-8"))
    except (CatalogError, OSError, _yaml.YamlSyntaxError):
        return None
    seen: dict[str, str] = {}
    for i, product in enumerate(loaded.products):
        line = located.where(("products", i))[0]
        names = [product.name, *_aliases(product.attributes.get("aliases"))]
        for name in names:
            folded = " ".join(name.casefold().split())
            other = seen.get(folded)
            if other is not None and other != product.sku:
                _add(report, path, line, "F904", f"product {product.sku} is named "
                     f"'{name}', as {other} is: a reply that names it cannot be checked "
                     "against one price; give each product its own name and aliases")
            seen.setdefault(folded, product.sku)
        discount = product.attributes.get("discount")
        if discount is not None and (isinstance(discount, bool) or not isinstance(
                discount, int | float) or not 0 < discount < 100):
            _add(report, path, located.where(("products", i, "discount"))[0] or line, "F905",
                 f"product {product.sku}: discount {discount!r} is not a percentage; write "
                 "the percent off, between 0 and 100 (20 for 20% off)")
    return set(loaded.by_sku)


def _add(report: Report, path: Path, line: int, code: str, message: str) -> None:
    report.add(path, line, 1, "error", code, message)


def _aliases(raw: Any) -> list[str]:
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, dict):
        return [a for v in raw.values() for a in _aliases(v)]
    if isinstance(raw, list):
        return [a for v in raw for a in _aliases(v)]
    return []
