"""The product catalog: the only source of names and prices.

The model names a SKU; the catalog says what it is called and what it
costs. A SKU the catalog does not know is refused, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from ..boundary.sanitize import excerpt
from ..errors import CatalogError, did_you_mean
from . import _yaml


@dataclass(frozen=True)
class Product:
    sku: str
    name: str
    price: Decimal
    attributes: dict[str, Any] = field(default_factory=dict, hash=False)

    def as_prompt(self) -> dict[str, Any]:
        """What a prompt shows of the product (price as a number, attributes flattened)."""
        return {"sku": self.sku, "name": self.name, "price": _num(self.price), **self.attributes}


@dataclass(frozen=True)
class Catalog:
    path: Path
    currency: str
    products: tuple[Product, ...]
    by_sku: dict[str, Product]

    def get(self, sku: str) -> Product:
        """Look a SKU up; raise ``KeyError`` with a did-you-mean message."""
        try:
            return self.by_sku[sku]
        except KeyError:
            raise KeyError(f"unknown SKU {excerpt(sku)}{did_you_mean(sku[:100], self.by_sku)}"
                           ) from None


def _num(value: Decimal) -> int | float:
    return int(value) if value == value.to_integral_value() else float(value)


def load_catalog(path: Path) -> Catalog:
    """Load ``products: [{sku, name, price, ...}]`` from YAML.

    Raises:
        CatalogError: missing file, bad YAML, a product without sku/name/price,
            a negative price, or a duplicate SKU; names the file and line.
    """
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise CatalogError(f"cannot read the catalog: {exc.strerror or exc}", file=path) from None
    try:
        located = _yaml.load(text)
    except _yaml.YamlSyntaxError as exc:
        raise CatalogError(str(exc), file=path, line=exc.line) from None
    data = located.data if isinstance(located.data, dict) else {}
    raw_products = data.get("products")
    if not isinstance(raw_products, list):
        raise CatalogError("a catalog needs `products:`, a list of {sku, name, price}", file=path)
    products: list[Product] = []
    by_sku: dict[str, Product] = {}
    for i, raw in enumerate(raw_products):
        line = located.where(("products", i))[0]
        if not isinstance(raw, dict) or not {"sku", "name", "price"} <= set(raw):
            raise CatalogError("each product needs `sku`, `name` and `price`", file=path, line=line)
        try:
            price = Decimal(str(raw["price"])) if not isinstance(raw["price"], bool) \
                else Decimal("nan")
        except InvalidOperation:
            price = Decimal("nan")
        if not price.is_finite():  # YAML's .nan and .inf parse as floats: not a price
            raise CatalogError(f"price {raw['price']!r} of {raw['sku']!r} is not a finite "
                               "number; write the price, e.g. 420 or 420.50", file=path,
                               line=located.where(("products", i, "price"))[0] or line)
        if price < 0:
            raise CatalogError(f"price of {raw['sku']} is negative", file=path, line=line)
        sku = str(raw["sku"])
        if sku in by_sku:
            raise CatalogError(f"duplicate SKU '{sku}'", file=path, line=line)
        attrs = {k: v for k, v in raw.items() if k not in ("sku", "name", "price")}
        product = Product(sku=sku, name=str(raw["name"]), price=price, attributes=attrs)
        products.append(product)
        by_sku[sku] = product
    # Every product shows the same keys, so a template reading `p.gift` on a
    # product without it gets None, not a StrictUndefined error.
    keys = {k for p in products for k in p.attributes}
    for p in products:
        for k in keys - set(p.attributes):
            p.attributes[k] = None
    return Catalog(path, str(data.get("currency", "")), tuple(products), by_sku)
