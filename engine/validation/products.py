"""F211: a template that reads a product field no product of the catalog has.

A template loops over the catalog (``{% for p in catalog %}``) and reads fields
of each product (``p.pets``). A field no product has renders as nothing on every
turn, or fails every turn of the stage: caught here, at the line, with the fields
the catalog does have.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jinja2 import nodes

from ..errors import CatalogError, did_you_mean
from ..format.catalog import load_catalog
from ..format.paths import funnel_roots, is_confined

__all__ = ["product_fields", "unknown_product_fields"]

# What every product shows a template besides its attributes (Product.as_prompt).
_BUILT_IN = frozenset({"sku", "name", "price"})


def product_fields(data: dict[str, Any], funnel: Path) -> frozenset[str] | None:
    """The fields a template may read of a product, or None when there is no usable
    catalog (its own check, F502, reports why)."""
    catalog = data.get("catalog")
    if not isinstance(catalog, str):
        return None
    path = funnel.parent / catalog
    if not is_confined(path, funnel_roots(funnel)) or not path.is_file():
        return None
    try:
        products = load_catalog(path).products
    except CatalogError:
        return None
    return _BUILT_IN | {k for p in products for k in p.attributes}


def unknown_product_fields(tree: nodes.Template, fields: frozenset[str]
                           ) -> Iterator[tuple[int, str]]:
    """(line, message) for every read of a product field outside ``fields``."""
    for loop in tree.find_all(nodes.For):
        if not (isinstance(loop.iter, nodes.Name) and loop.iter.name == "catalog"
                and isinstance(loop.target, nodes.Name)):
            continue
        var = loop.target.name
        parts: list[nodes.Node] = [*loop.body, *loop.else_]
        if loop.test is not None:
            parts.append(loop.test)
        for part in parts:
            for read in (part, *part.find_all((nodes.Getattr, nodes.Getitem))):
                attr = _field(read, var)
                if attr is not None and attr not in fields:
                    yield read.lineno, (
                        f"`{var}.{attr}`: no product in the catalog has a field '{attr}'"
                        f"{did_you_mean(attr, fields)}; products have: "
                        f"{', '.join(sorted(fields))}")


def _field(node: nodes.Node, var: str) -> str | None:
    if isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name) \
            and node.node.name == var:
        return node.attr
    if isinstance(node, nodes.Getitem) and isinstance(node.node, nodes.Name) \
            and node.node.name == var and isinstance(node.arg, nodes.Const) \
            and isinstance(node.arg.value, str):
        return node.arg.value
    return None
