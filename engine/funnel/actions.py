"""Actions: the business operations a model may ask for, decided by code.

Built-ins: ``present_products``, ``add_to_cart``, ``remove_from_cart``,
``append``, ``set``, ``request_handoff``, ``signal``. Anything else is a hook,
``module:function``, looked up beside the funnel file first (which modules a funnel
may name, and when they are reloaded: :mod:`engine.funnel.hooks`). A refused action
(unknown SKU, bad quantity, a hook that raised an ``Exception``) changes nothing; the
model is told on the next turn through the session's ``notices``. A hook that raises
anything else (``SystemExit``, ``KeyboardInterrupt``, ``CancelledError``) fails the
turn (:class:`~engine.errors.HookFailed`): the stage's fallback and a turn record.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..boundary.sanitize import excerpt
from ..errors import ActionRefused, ConfigError, HookFailed
from ..format.catalog import Catalog
from ..format.spec import ActionSpec, FunnelSpec
from .grounding import Confirm, Said
from .hooks import import_hook_module

# The keys the built-ins stamp on the list items they write: when and in which round the
# engine did it. The analysts' SQL reads them; the model never needs them (the prompt's
# compact state leaves them out: ~100 tokens of a contact-collection prompt).
ITEM_STAMPS = frozenset({"presented_at", "stage_iteration", "added_at", "recorded_at"})


@dataclass(frozen=True)
class ActionCall:
    """What a hook receives. Return updates for the action's ``writes`` fields, or raise
    :class:`engine.ActionRefused` to refuse."""

    name: str
    args: Mapping[str, Any]
    state: Mapping[str, Any]
    session_id: str
    stage: str
    now: datetime


@dataclass
class ActionOutcome:
    """One action the model (or a stage's ``on_enter``) asked for, and what code decided."""

    type: str
    args: dict[str, Any]
    accepted: bool
    reason: str | None = None


# The reason of a `request_handoff` call that names none.
DEFAULT_HANDOFF_REASON = "explicit_request"


@dataclass
class TurnScratch:
    """Per-turn mutable context the actions write into."""

    session_id: str
    stage: str
    stage_iteration: int
    now: datetime
    notices: list[str] = field(default_factory=list)
    handoff_requested: str | None = None
    # The customer's own words this turn can cite (their recent messages and this one):
    # what grounded facts and confirmed actions are checked against (engine.funnel.grounding).
    words: tuple[str, ...] = ()
    # What the model wrote that the customer's words do not support: (what, value).
    ungrounded: list[tuple[str, str]] = field(default_factory=list)

    @cached_property
    def said(self) -> Said:
        # The customer's words cut once a turn: every grounded value and `confirm:`
        # phrase of the turn reads them.
        return Said(self.words)

    @cached_property
    def now_iso(self) -> str:
        # Written once a turn: an aware datetime's isoformat takes ~1.6 us, and a turn
        # wrote it five to seven times.
        return self.now.isoformat()


Hook = Callable[[ActionCall], Mapping[str, Any] | None]


class ActionRunner:
    """Runs declared actions against a session's state; built once per funnel."""

    def __init__(self, spec: FunnelSpec, catalog: Catalog | None) -> None:
        self.spec = spec
        self.catalog = catalog
        self.hooks: dict[str, Hook] = {
            name: load_hook(a.hook, spec.path.parent) for name, a in spec.actions.items() if a.hook
        }
        # `confirm:` phrases, cut into words once per funnel.
        self.confirms = {name: Confirm(a.options["confirm"]) for name, a in spec.actions.items()
                         if isinstance(a.options.get("confirm"), Mapping)}

    def run(self, call: Mapping[str, Any], state: dict[str, Any], turn: TurnScratch
            ) -> ActionOutcome:
        name = str(call.get("type"))
        args = {k: v for k, v in call.items() if k != "type"}
        action = self.spec.actions.get(name)
        if action is None:
            return self._refuse(name, args, f"{excerpt(name)} is not an action of this funnel", turn)
        if action.builtin == "request_handoff" and not args.get("reason"):
            # The reason the hand-off will carry, before the check: a call without one is
            # an explicit request, and its `confirm:` phrases must hold for it too.
            args["reason"] = DEFAULT_HANDOFF_REASON
        confirm = self.confirms.get(name)
        if confirm is not None and confirm.holds(args, turn.said) is False:
            # Alerting a person on the model's word alone: only when the customer said so.
            turn.ungrounded.append((f"action {name}", str(args.get("reason") or "")))
            return self._refuse(name, args, "unconfirmed: the customer's messages do not ask "
                                "for it; ask the customer whether they want it", turn)
        try:
            if action.hook:
                self._run_hook(action, args, state, turn)
            else:
                getattr(self, f"_do_{action.builtin}")(action, args, state, turn)
        except ActionRefused as exc:
            return self._refuse(name, args, exc.reason, turn)
        return ActionOutcome(name, args, True)

    @staticmethod
    def _refuse(name: str, args: dict[str, Any], reason: str, turn: TurnScratch
                ) -> ActionOutcome:
        turn.notices.append(f"{name} refused: {reason}")
        return ActionOutcome(name, args, False, reason)

    def _run_hook(self, action: ActionSpec, args: dict[str, Any], state: dict[str, Any],
                  turn: TurnScratch) -> None:
        # A deep copy: what the hook changes in place never reaches the state (only
        # what it returns, for its `writes` fields).
        call = ActionCall(action.name, MappingProxyType(copy.deepcopy(args)),
                          MappingProxyType(copy.deepcopy(state)),
                          turn.session_id, turn.stage, turn.now)
        try:
            result = self.hooks[action.name](call)
        except ActionRefused:
            raise
        except Exception as exc:  # a broken hook refuses its action; the turn goes on
            raise ActionRefused(action.name, f"the hook failed: {exc}") from exc
        except BaseException as exc:  # SystemExit & co: the turn fails (fallback, record)
            raise HookFailed(f"the hook of action '{action.name}' ({action.hook}) raised "
                             f"{type(exc).__name__}: {exc}; a hook must return or raise "
                             "an Exception (engine.ActionRefused to refuse)") from None
        if not isinstance(result, Mapping | None):
            raise ActionRefused(action.name, f"the hook returned {type(result).__name__}; "
                                "it must return a mapping of its `writes` fields or None")
        writes = set(action.options.get("writes") or [])
        for key in result or {}:
            if key not in writes:
                raise ActionRefused(action.name, f"the hook wrote '{key}', which is not in its "
                                    f"`writes` list {sorted(writes)}")
        state.update(result or {})

    # -- built-ins ---------------------------------------------------------------
    def _product(self, action: str, sku: Any) -> Any:
        if self.catalog is None:
            raise ActionRefused(action, "the funnel has no catalog")
        try:
            return self.catalog.get(str(sku))
        except KeyError as exc:
            raise ActionRefused(action, str(exc.args[0])) from None

    def _qty(self, action: str, raw: Any, default: int | None) -> int | None:
        if raw is None:
            return default
        max_qty = self.spec.cart.max_qty if self.spec.cart else 20
        if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= max_qty:
            raise ActionRefused(action, f"quantity {excerpt(raw)} must be a whole number from 1 to "
                                f"{max_qty}")
        return raw

    def _do_present_products(self, action: ActionSpec, args: dict[str, Any],
                             state: dict[str, Any], turn: TurnScratch) -> None:
        field_name = self.spec.presented_field
        assert field_name is not None
        skus = args.get("skus") or ([args["sku"]] if "sku" in args else [])
        if not isinstance(skus, list) or not skus:
            raise ActionRefused(action.name, "give `skus`, a list of catalog SKUs")
        presented = list(state.get(field_name) or [])
        known = {p.get("sku") for p in presented}
        unknown = []
        for sku in skus[: self.spec.presented_max]:
            try:
                product = self._product(action.name, sku)
            except ActionRefused as exc:
                unknown.append(exc.reason)
                continue
            if product.sku not in known:
                presented.append({"sku": product.sku, "presented_at": turn.now_iso,
                                  "stage_iteration": turn.stage_iteration})
                known.add(product.sku)
        if unknown and len(unknown) == len(skus[: self.spec.presented_max]):
            raise ActionRefused(action.name, "; ".join(unknown))
        for reason in unknown:
            turn.notices.append(f"{action.name} partly refused: {reason}")
        state[field_name] = presented

    def _cart(self, state: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        assert self.spec.cart is not None
        name = self.spec.cart.field
        return name, [dict(x) for x in state.get(name) or []]

    def _do_add_to_cart(self, action: ActionSpec, args: dict[str, Any], state: dict[str, Any],
                        turn: TurnScratch) -> None:
        product = self._product(action.name, args.get("sku"))
        if self.spec.cart and product.sku == self.spec.cart.gift_sku:
            raise ActionRefused(action.name, f"{product.sku} is the gift; it is added by itself "
                                "when the cart reaches the threshold")
        qty = self._qty(action.name, args.get("qty"), 1)
        assert qty is not None
        name, cart = self._cart(state)
        line = next((x for x in cart if x.get("sku") == product.sku and not x.get("is_gift")),
                    None)
        max_qty = self.spec.cart.max_qty if self.spec.cart else 20
        if line is None:
            cart.append({"sku": product.sku, "name": product.name,
                         "price": product.as_prompt()["price"], "qty": qty,
                         "line_total": 0, "added_at": turn.now_iso})
        elif line["qty"] + qty > max_qty:
            raise ActionRefused(action.name, f"at most {max_qty} of {product.sku} per order")
        else:
            line["qty"] += qty
        state[name] = cart

    def _do_remove_from_cart(self, action: ActionSpec, args: dict[str, Any],
                             state: dict[str, Any], turn: TurnScratch) -> None:
        sku = str(args.get("sku"))
        qty = self._qty(action.name, args.get("qty"), None)
        name, cart = self._cart(state)
        line = next((x for x in cart if x.get("sku") == sku and not x.get("is_gift")), None)
        if line is None:
            raise ActionRefused(action.name, f"{excerpt(sku)} is not in the cart")
        if qty is None or qty >= line["qty"]:
            cart.remove(line)
        else:
            line["qty"] -= qty
        state[name] = cart

    def _do_append(self, action: ActionSpec, args: dict[str, Any], state: dict[str, Any],
                   turn: TurnScratch) -> None:
        target = action.options["field"]
        items = list(state.get(target) or [])
        items.append({**args, "stage": turn.stage, "recorded_at": turn.now_iso})
        state[target] = items

    def _do_set(self, action: ActionSpec, args: dict[str, Any], state: dict[str, Any],
                turn: TurnScratch) -> None:
        if "value" not in args:
            raise ActionRefused(action.name, "give `value`")
        state[action.options["field"]] = args["value"]

    def _do_request_handoff(self, action: ActionSpec, args: dict[str, Any],
                            state: dict[str, Any], turn: TurnScratch) -> None:
        reason = str(args.get("reason") or DEFAULT_HANDOFF_REASON)
        allowed = action.options.get("reasons")
        if allowed and reason not in allowed:
            raise ActionRefused(action.name, f"reason {excerpt(reason)} is not one of {allowed}")
        turn.handoff_requested = reason

    def _do_signal(self, action: ActionSpec, args: dict[str, Any], state: dict[str, Any],
                   turn: TurnScratch) -> None:
        return None


def load_hook(target: str | None, base: Path) -> Hook:
    """Resolve ``module:function``, looking beside the funnel file first.

    Raises:
        ConfigError: the module or the function does not exist, or the funnel may not
            name the module (the standard library, the engine: engine.funnel.hooks).
    """
    assert target is not None
    module_name, _, func_name = target.partition(":")
    try:
        module = import_hook_module(module_name, base)
    except (ImportError, SyntaxError) as exc:  # validate reports both (F501, F505)
        raise ConfigError(f"hook '{target}': cannot import '{module_name}': {exc}") from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise ConfigError(f"hook '{target}': module '{module_name}' has no function "
                          f"'{func_name}'")
    return fn  # type: ignore[no-any-return]
