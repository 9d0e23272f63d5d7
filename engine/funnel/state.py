"""Session state: defaults, merging the model's updates, and derived fields.

The model proposes ``updates``; this module decides what is kept: only
declared fields the model may write, merged as a JSON Merge Patch (RFC 7396:
objects merge, arrays and scalars replace, ``null`` removes), then checked
against the field's declared schema. Derived fields (completeness, cart
totals, gift line, free delivery) are always recomputed by code.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

import jsonschema_rs

from ..boundary.sanitize import excerpt
from ..format.catalog import Catalog
from ..format.phones import example, normalize_phone, region_of
from ..format.spec import FunnelSpec
from ..sandbox.expressions import compile_condition_list
from ..sandbox.patterns import linear_validator
from .grounding import Said, unground

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$")


def defaults(spec: FunnelSpec) -> dict[str, Any]:
    """The state of a new session: every declared field at its default."""
    return {name: copy.deepcopy(f.default) for name, f in spec.state.items()}


def plain(value: Any) -> Any:
    """Database values as JSON-friendly Python: Decimal -> int/float, datetime -> ISO text."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def normalize_formats(value: Any, schema: Mapping[str, Any], path: str, notices: list[str]) -> Any:
    """Normalize ``format: phone/email`` values inside ``value``; drop invalid ones with a notice."""
    fmt = schema.get("format")
    if isinstance(value, str) and fmt == "phone":
        region = region_of(schema)
        phone = normalize_phone(value, region)
        if phone is None:
            where = (f"a number of {region} such as {example(region)}, or an international "
                     "one starting with +") if region else "a number starting with +"
            notices.append(f"{excerpt(value)} is not a valid phone number for {path}; it was "
                           f"not saved (expected {where})")
        return phone
    if isinstance(value, str) and fmt in ("date-time", "date"):
        try:
            parsed = datetime.fromisoformat(value.strip())
        except ValueError:
            notices.append(f"{excerpt(value)} is not an ISO {fmt} for {path} (e.g. "
                           "2026-12-01T14:30:00+02:00); it was not saved")
            return None
        if fmt == "date-time" and parsed.tzinfo is None:
            notices.append(f"{excerpt(value)} for {path} has no time zone; it was not saved")
            return None
        return value.strip()
    if isinstance(value, str) and fmt == "email":
        email = value.strip().lower()
        if not _EMAIL.fullmatch(email):
            notices.append(f"{excerpt(value)} is not a valid e-mail address for {path}; it was not saved")
            return None
        return email
    props = schema.get("properties")
    if isinstance(value, dict) and isinstance(props, dict):
        out = {}
        for key, sub in value.items():
            if key in props:
                normalized = normalize_formats(sub, props[key], f"{path}.{key}", notices)
                if normalized is None and sub is not None:
                    continue
                out[key] = normalized
            else:
                out[key] = sub
        return out
    return value


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396 JSON Merge Patch: objects merge, everything else replaces, null removes."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def fast_validator(schema: Mapping[str, Any]) -> jsonschema_rs.Draft202012Validator | None:
    """``schema`` compiled by jsonschema-rs, or None when it cannot be (a dangling
    ``$ref``: then only jsonschema runs, and reports it). Formats are annotations, as
    for jsonschema without a format checker; nothing is ever fetched.

    The turn asks it first whether a value is valid (a fraction of a microsecond,
    against tens for jsonschema); jsonschema stays the authority: it decides (and
    explains) whatever this one rejects or cannot read."""
    try:
        # The linear regex engine (Rust's `regex`), never fancy-regex's backtracking:
        # the patterns were checked for RE2 (engine.sandbox.patterns), which it reads.
        return jsonschema_rs.Draft202012Validator(dict(schema), validate_formats=False,
                                                  offline=True,
                                                  pattern_options=jsonschema_rs.RegexOptions())
    except ValueError:  # jsonschema_rs.ValidationError: an unresolvable or invalid schema
        return None


class StateRules:
    """The funnel's state rules, compiled once: field validators and derived-field logic."""

    def __init__(
        self,
        spec: FunnelSpec,
        catalog: Catalog | None,
        completeness: list[tuple[Callable[[Mapping[str, Any]], bool], int, str]],
    ) -> None:
        self.spec = spec
        self.catalog = catalog
        self.completeness = completeness
        # All rules as one expression: one sandbox context per turn instead of one per rule.
        self._all_rules = compile_condition_list([src for _, _, src in completeness]) \
            if completeness else None
        self.validators = {
            name: linear_validator(_storable(_nullable(f.schema, f.nullable), f.type))
            for name, f in spec.state.items()
        }
        self.fast_validators = {name: fast_validator(v.schema)
                                for name, v in self.validators.items()
                                if isinstance(v.schema, Mapping)}

    def invalid(self, name: str, value: Any) -> str | None:
        """Why ``value`` cannot be stored in the field ``name`` (its declared schema and
        its column), or None when it can."""
        fast = self.fast_validators.get(name)
        if fast is not None:
            try:
                if fast.is_valid(value):
                    return None
            except ValueError:  # not a JSON value (a datetime): jsonschema decides
                pass
        error = next(iter(self.validators[name].iter_errors(value)), None)
        if error is None:
            return None
        where = "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in error.path)
        # jsonschema quotes the whole value: a short excerpt is all the model needs.
        message = error.message if len(error.message) <= 120 else \
            f"{excerpt(error.instance)} breaks its `{error.validator}` rule"
        return f"{name}{where}: {message}"

    def guard(self, state: dict[str, Any], before: Mapping[str, Any], notices: list[str]
              ) -> None:
        """Put back every field an action or hook changed to a value its schema refuses,
        so the state saved is always valid (a bad hook must not brick the session)."""
        for name, value in list(state.items()):
            if name in self.validators and value is not before.get(name):
                problem = self.invalid(name, value)
                if problem is not None:
                    state[name] = before.get(name)
                    notices.append(f"{problem}; the change was not saved")

    def apply_updates(
        self, state: dict[str, Any], updates: Mapping[str, Any], allowed: frozenset[str],
        notices: list[str], words: Said | Sequence[str] | None = None,
        ungrounded: list[tuple[str, str]] | None = None,
    ) -> list[str]:
        """Merge the model's ``updates`` into ``state``; return the fields that changed.

        A field outside ``allowed`` (undeclared, engine-owned, or not in the
        stage's schema) is ignored with a notice; a merged value that breaks the
        field's declared schema is not kept. With the customer's ``words``, a value
        for a part marked ``grounded`` that they do not hold is dropped with a
        notice and listed in ``ungrounded``; one they hold is stored in their form
        (engine.funnel.grounding).
        """
        changed: list[str] = []
        for name, patch in updates.items():
            field = self.spec.state.get(name)
            if field is None or name not in allowed:
                notices.append(f"the field {excerpt(name)} cannot be updated at this stage")
                continue
            patch = normalize_formats(patch, field.schema, name, notices)
            if field.grounded_paths and words is not None:
                # The customer's own facts: kept, in the customer's form, only when their
                # messages hold them.
                patch, dropped = unground(patch, field.grounded_paths, field.schema, words)
                for where, value, why in dropped:
                    notices.append(f"{name}{where}: {excerpt(value)} {why}; ask the customer, "
                                   "the value was not saved")
                    if ungrounded is not None:
                        ungrounded.append((f"{name}{where}", value))
                if patch is None:
                    continue
            merged = merge_patch(state.get(name), patch) if field.type == "object" else patch
            problem = self.invalid(name, merged)
            if problem is not None:
                notices.append(f"{problem}; the update was not saved")
                continue
            if merged != state.get(name):
                state[name] = merged
                changed.append(name)
        return changed

    def recompute(self, state: dict[str, Any], ctx: Mapping[str, Any], now: str) -> None:
        """Recompute every derived field from the state (never from the model)."""
        spec = self.spec
        if spec.cart is not None:
            self._recompute_cart(state, now)
        if spec.completeness_field:
            score = 0
            for hit, (_cond, points, _source) in zip(self.completeness_hits(ctx),
                                                     self.completeness, strict=True):
                if hit:
                    score += points
            state[spec.completeness_field] = score

    def completeness_hits(self, ctx: Mapping[str, Any]) -> list[bool]:
        """Which completeness rules hold, in order: one evaluation of them all."""
        try:
            return self._all_rules(ctx) if self._all_rules else []
        except Exception:  # some rule fails here: evaluate them one by one
            hits = []
            for cond, _points, _source in self.completeness:
                try:
                    hits.append(cond(ctx))
                except Exception:  # a rule that cannot be evaluated scores nothing
                    hits.append(False)
            return hits

    def _recompute_cart(self, state: dict[str, Any], now: str) -> None:
        cart = self.spec.cart
        assert cart is not None
        lines = [dict(line) for line in state.get(cart.field) or [] if not line.get("is_gift")]
        total = Decimal(0)
        count = 0
        for line in lines:
            price = Decimal(str(line["price"]))
            line["line_total"] = plain((price * int(line["qty"])).quantize(Decimal("0.01")))
            total += Decimal(str(line["line_total"]))
            count += int(line["qty"])
        gift_ok = cart.gift_threshold is not None and total >= Decimal(str(cart.gift_threshold))
        if gift_ok and cart.gift_sku and self.catalog and cart.gift_sku in self.catalog.by_sku:
            old = next((x for x in state.get(cart.field) or [] if x.get("is_gift")), None)
            gift = self.catalog.by_sku[cart.gift_sku]
            lines.append({"sku": gift.sku, "name": gift.name, "price": 0, "qty": 1,
                          "line_total": 0, "is_gift": True,
                          "added_at": old["added_at"] if old else now})
        state[cart.field] = lines
        if cart.total:
            state[cart.total] = plain(total.quantize(Decimal("0.01")))
        if cart.count:
            state[cart.count] = count
        if cart.gift_flag:
            state[cart.gift_flag] = gift_ok
        if cart.free_delivery_flag:
            free = cart.free_delivery_threshold
            state[cart.free_delivery_flag] = free is not None and total >= Decimal(str(free))

    def thresholds(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """Ready-made booleans and remainders for the prompt, so the model computes nothing."""
        cart = self.spec.cart
        if cart is None:
            return {"gift_threshold": None, "gift_ready": False, "gift_remaining": None,
                    "free_delivery_threshold": None, "free_delivery_ready": False,
                    "free_delivery_remaining": None}
        total = Decimal(str(state.get(cart.total, 0) if cart.total else 0))

        def remaining(threshold: float | None) -> Any:
            if threshold is None:
                return None
            return plain(max(Decimal(0), Decimal(str(threshold)) - total))

        return {
            "gift_threshold": cart.gift_threshold,
            "gift_ready": cart.gift_threshold is not None
            and total >= Decimal(str(cart.gift_threshold)),
            "gift_remaining": remaining(cart.gift_threshold),
            "free_delivery_threshold": cart.free_delivery_threshold,
            "free_delivery_ready": cart.free_delivery_threshold is not None
            and total >= Decimal(str(cart.free_delivery_threshold)),
            "free_delivery_remaining": remaining(cart.free_delivery_threshold),
        }


def _storable(schema: dict[str, Any], ftype: str) -> dict[str, Any]:
    """The declared schema, plus what the column can hold (an integer column is int4)."""
    if ftype == "integer":
        return {"allOf": [schema, {"minimum": -(2**31), "maximum": 2**31 - 1}]}
    return schema


def _nullable(schema: dict[str, Any], nullable: bool) -> dict[str, Any]:
    schema = {k: v for k, v in schema.items() if k not in ("country_code", "region")}
    if nullable and "type" in schema:
        return {"anyOf": [{"type": "null"}, schema]}
    return schema
