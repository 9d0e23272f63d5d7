"""Action hooks of the b2b_demo funnel (``funnels/b2b_demo.yaml``).

The funnel binds ``book_demo: {hook: b2b_hooks:book_demo, writes: [demo_booking]}``;
the engine finds this module beside the funnel file and calls ``book_demo(call)``
when the model emits ``{"type": "book_demo", "slot": ..., "email": ..., "name": ...}``.

The hook is pure and deterministic: no network, no clock other than ``call.now``,
no randomness. Booking in a real calendar belongs in a separate side-effect
action delivered through the outbox; this hook only decides whether the slot
and the contact are acceptable and returns the booking record to store.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from engine.errors import ActionRefused

ACTION = "book_demo"
DEMO_LENGTH = timedelta(minutes=30)
# Working hours, in the slot's own UTC offset (the visitor's local time):
# a demo starts at 09:00 at the earliest and ends by 18:00, Monday to Friday.
FIRST_START_HOUR = 9
LAST_END_HOUR = 18
MIN_NOTICE = timedelta(hours=2)
MAX_AHEAD = timedelta(days=60)

EMAIL = re.compile(r"^[A-Za-z0-9._%+'-]+@((?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,})$")
# Consumer mailbox providers: an address there is not a work email.
FREE_MAIL_DOMAINS = frozenset(
    {
        "aol.com",
        "gmail.com",
        "gmx.com",
        "gmx.de",
        "googlemail.com",
        "hotmail.com",
        "icloud.com",
        "live.com",
        "mail.com",
        "mail.ru",
        "me.com",
        "msn.com",
        "outlook.com",
        "pm.me",
        "proton.me",
        "protonmail.com",
        "ukr.net",
        "yahoo.com",
        "yandex.ru",
        "zoho.com",
    }
)


class HookCall(Protocol):
    """What the engine passes to a hook (see docs/funnel-format.md, "Hooks")."""

    args: Mapping[str, Any]
    state: Mapping[str, Any]
    session_id: str
    stage: str
    now: datetime


def book_demo(call: HookCall) -> dict[str, Any] | None:
    """Accept a demo slot and return ``{"demo_booking": {...}}``.

    Arguments come from the action first and fall back to the session state
    (``preferred_slot``, ``contact.name``, ``contact.email``).

    Raises:
        ActionRefused: the slot is missing, malformed, in the past, too soon,
            too far ahead or outside working hours; or the email is missing,
            malformed or a personal mailbox; or the contact's name is missing.
    """
    contact = call.state.get("contact") or {}
    starts = _parse_slot(call.args.get("slot") or call.state.get("preferred_slot"))
    _check_slot(starts, call.now)
    email = _work_email(call.args.get("email") or contact.get("email"))
    name = str(call.args.get("name") or contact.get("name") or "").strip()
    if not name:
        raise ActionRefused(ACTION, "the contact's name is missing; ask for it before booking")
    digest = hashlib.sha256(f"{call.session_id}|{starts.isoformat()}".encode()).hexdigest()
    return {
        "demo_booking": {
            "ref": f"DEMO-{digest[:8].upper()}",
            "starts_at": starts.isoformat(),
            "ends_at": (starts + DEMO_LENGTH).isoformat(),
            "attendee_name": name,
            "attendee_email": email,
            "booked_at": call.now.isoformat(),
        }
    }


def _parse_slot(value: Any) -> datetime:
    if not value:
        raise ActionRefused(ACTION, "no demo slot was given; ask the visitor for a day and time")
    try:
        starts = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
    except ValueError:
        raise ActionRefused(
            ACTION,
            f"slot {value!r} is not an ISO 8601 date and time such as 2025-06-03T14:00:00+02:00",
        ) from None
    if starts.tzinfo is None or starts.utcoffset() is None:
        raise ActionRefused(ACTION, f"slot {value!r} has no time zone; ask which time zone the visitor is in")
    return starts


def _check_slot(starts: datetime, now: datetime) -> None:
    if starts <= now:
        raise ActionRefused(ACTION, f"the slot {starts.isoformat()} is in the past")
    if starts - now < MIN_NOTICE:
        raise ActionRefused(ACTION, "a demo needs at least 2 hours' notice; offer a later time")
    if starts - now > MAX_AHEAD:
        raise ActionRefused(ACTION, "demos can be booked at most 60 days ahead")
    if starts.weekday() >= 5:
        raise ActionRefused(ACTION, "demos run Monday to Friday; offer a weekday")
    ends = starts + DEMO_LENGTH
    end_limit = starts.replace(hour=LAST_END_HOUR, minute=0, second=0, microsecond=0)
    if starts.hour < FIRST_START_HOUR or ends > end_limit:
        raise ActionRefused(
            ACTION,
            f"demos run from {FIRST_START_HOUR:02d}:00 to {LAST_END_HOUR:02d}:00 "
            "in the visitor's time zone; offer a time inside working hours",
        )
    if starts.minute not in (0, 30) or starts.second or starts.microsecond:
        raise ActionRefused(ACTION, "demos start on the hour or at half past")


def _work_email(value: Any) -> str:
    email = str(value or "").strip()
    if not email:
        raise ActionRefused(ACTION, "the work email is missing; ask for it before booking")
    match = EMAIL.match(email)
    if not match:
        raise ActionRefused(ACTION, f"{email!r} is not a valid email address")
    if match.group(1).lower() in FREE_MAIL_DOMAINS:
        raise ActionRefused(
            ACTION, f"{email!r} is a personal mailbox; ask for a work email at the company's domain"
        )
    return email
