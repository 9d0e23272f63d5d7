"""The format layer: a funnel checked against the format's JSON Schema (F003, F004).

The schema is ``schemas/funnel.schema.json``, shipped in the package as
``engine/data/funnel.schema.json``: the same schema editors use.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import jsonschema

from ..errors import did_you_mean
from .diagnostics import Report


@cache
def packaged_validator(name: str) -> jsonschema.Draft202012Validator:
    """A validator for a JSON Schema shipped in ``engine/data`` (``funnel``, ``scenario``)."""
    text = resources.files("engine").joinpath(f"data/{name}.schema.json").read_text("utf-8")
    return jsonschema.Draft202012Validator(json.loads(text))


def format_schema() -> dict[str, Any]:
    """The funnel format's JSON Schema (2020-12), shipped inside the package."""
    return dict(packaged_validator("funnel").schema)  # type: ignore[arg-type]


def check_format(data: dict[str, Any], report: Report) -> None:
    for error in sorted(packaged_validator("funnel").iter_errors(data), key=lambda e: list(e.path)):
        keys = tuple(error.absolute_path)
        if error.validator == "additionalProperties":
            allowed = set(error.schema.get("properties", {}))
            extra = [k for k in error.instance if k not in allowed] if isinstance(
                error.instance, dict
            ) else []
            for name in extra:
                report.at(
                    (*keys, name),
                    "error",
                    "F003",
                    f"unknown key '{name}' in {_where(keys)}{did_you_mean(str(name), allowed)}; "
                    f"expected one of: {', '.join(sorted(allowed))}",
                    key=True,
                )
            continue
        if error.validator == "required":
            report.at(keys, "error", "F004", f"{_where(keys)}: {error.message}")
            continue
        if error.validator == "oneOf" and keys and keys[0] == "actions":
            report.at(keys, "error", "F004", f"action '{keys[-1]}' needs exactly one of "
                      "`builtin` or `hook`")
            continue
        if error.validator == "pattern" and error.schema is format_schema()["$defs"]["stage_name"]:
            report.at(keys, "error", "F004", f"{_where(keys)}: {error.instance!r} is not a valid "
                      "stage name (lowercase letters, digits and _)")
            continue
        if error.validator == "anyOf" and any(
                error.schema is format_schema()["$defs"][name] for name in _TEXTS):
            longest = error.schema["anyOf"][0].get("maxLength")
            limit = f" of at most {longest} characters" if longest else ""
            report.at(keys, "error", "F004", f"{_where(keys)}: a customer text is a non-empty "
                      f"string{limit} (the funnel's default language), or a map from language "
                      "codes to such strings (`{uk: \"...\", en: \"...\"}`); got "
                      f"{str(error.instance)[:80]!r}")
            continue
        if error.validator == "propertyNames":
            name = error.instance
            report.at((*keys, name), "error", "F004", f"{_where(keys)}: {name!r} is not a valid "
                      "name (lowercase letters, digits and _, at most 63)", key=True)
            continue
        report.at(keys, "error", "F004", f"{_where(keys)}: {error.message}")


# The format's definitions of a text a customer receives (engine.format.texts).
_TEXTS = ("customer_text", "customer_text_short")


def _where(keys: tuple[Any, ...]) -> str:
    if not keys:
        return "the funnel"
    return "`" + ".".join(str(k) for k in keys) + "`"
