"""Hooks of the F505 corpus case: `push_lead` is spelt `push_leads`, `alert_manager` is missing."""

from typing import Any


def push_leads(call: Any) -> None:
    return None


def score_lead(call: Any) -> None:
    return None
