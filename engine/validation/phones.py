"""``format: phone`` fields: their default region (F008) and the deprecated
``country_code`` (F009). The numbers themselves: engine.format.phones."""

from __future__ import annotations

from typing import Any

from ..format.phones import known_region, region_for_calling_code
from .diagnostics import Report


def check_phones(state: dict[str, Any], report: Report) -> None:
    """Every phone field and nested property of ``state`` (the declared fields)."""
    for name, raw in state.items():
        _check(raw, ("state", name), f"state.{name}", report)


def _check(schema: Any, keys: tuple[str | int, ...], path: str, report: Report) -> None:
    if not isinstance(schema, dict):
        return
    region, code = schema.get("region"), schema.get("country_code")
    if isinstance(region, str) and not known_region(region):
        report.at((*keys, "region"), "error", "F008", f"{path}: region {region!r} is not an "
                  "ISO 3166 code with phone numbers; use two capital letters such as UA, DE, "
                  "GB or US")
    if code is not None:
        stands_for = region_for_calling_code(str(code))
        if stands_for is None:
            report.at((*keys, "country_code"), "error", "F008", f"{path}: country_code "
                      f"{code!r} is no country's calling code; declare the region instead "
                      "(region: UA)")
        elif region is None:
            report.at((*keys, "country_code"), "warning", "F009", f"{path}: country_code is "
                      f"deprecated; write region: {stands_for} (the ISO 3166 region, whose "
                      "trunk prefix the engine then knows); country_code still works", key=True)
        else:
            report.at((*keys, "country_code"), "warning", "F009", f"{path}: country_code is "
                      f"deprecated and region {region!r} wins; remove country_code", key=True)
    properties = schema.get("properties")
    for sub, child in properties.items() if isinstance(properties, dict) else ():
        _check(child, (*keys, "properties", sub), f"{path}.{sub}", report)
    if isinstance(schema.get("items"), dict):
        _check(schema["items"], (*keys, "items"), f"{path}[]", report)
