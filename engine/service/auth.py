"""API keys with scopes, and the widget's signed session tokens.

API keys come from configuration (``FUNNEL_API_KEYS``); a request presents one
as ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``. A key may be limited to some
funnels (``KEY:scopes@a+b``): any other funnel is a 404 to it, the same answer as a
funnel that does not exist, so a key learns nothing of the funnels it may not reach.
Every configured key is compared with :func:`hmac.compare_digest` (no early exit),
and no key, right or wrong, is ever logged or echoed: a client is known by its
key's position only.

A browser never holds an API key and never names its session. The widget
asks ``POST /v1/funnels/{funnel}/widget/session`` for a token, which the
service signs (HMAC-SHA256 with ``FUNNEL_SECRET``) over the funnel, a random
session id it chose, and an expiry; the widget sends it back as a bearer
token. A token whose signature does not match (a changed session id, another
funnel, a forged one) is refused, so guessing ids reads or writes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.requests import Request

_TOKEN_CONTEXT = b"funnel-widget-v1."


@dataclass(frozen=True)
class Client:
    """Who made a request: ``key#N`` for the N-th configured key in logs and metrics;
    ``identity``, a digest of the key, where it must stay the same client when the keys
    are reordered (idempotency records). Never the key itself."""

    name: str
    scopes: frozenset[str]
    identity: str = ""
    funnels: frozenset[str] | None = None  # None: every funnel (``KEY:scopes@a+b`` limits)

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes

    def covers(self, funnel: str) -> bool:
        """Whether the key may reach ``funnel`` at all (a funnel it may not is a 404)."""
        return self.funnels is None or funnel in self.funnels


def presented_key(request: Request) -> str | None:
    """The credential in ``Authorization: Bearer`` or ``X-API-Key``, if any."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    key = request.headers.get("x-api-key", "").strip()
    return key or None


class ApiKeys:
    """The configured keys; :meth:`check` finds the client a presented key belongs to."""

    def __init__(self, keys: Mapping[str, frozenset[str]],
                 funnels: Mapping[str, frozenset[str]] | None = None) -> None:
        limited = funnels or {}
        self._keys = [(k.encode(), frozenset(s), limited.get(k)) for k, s in keys.items()]

    def __len__(self) -> int:
        return len(self._keys)

    def check(self, presented: str | None) -> Client | None:
        if not presented:
            return None
        given = presented.encode("utf-8", "replace")
        found: Client | None = None
        for n, (key, scopes, funnels) in enumerate(self._keys, start=1):
            # Compare against every key, even after a match: timing tells nothing.
            if hmac.compare_digest(given, key) and found is None:
                found = Client(f"key#{n}", scopes, key_identity(key), funnels)
        return found


def key_identity(key: bytes) -> str:
    """A stable name for an API key: a truncated SHA-256 (the keys are long random
    secrets, so the digest reveals nothing a guess could use). Records scoped by it
    stay the client's whatever the key's place in ``FUNNEL_API_KEYS``."""
    return "k:" + hashlib.sha256(b"funnel-api-key:" + key).hexdigest()[:24]


@dataclass(frozen=True)
class WidgetSession:
    funnel: str
    session_id: str
    expires_at: int


class WidgetTokens:
    """Issue and verify ``payload.signature`` tokens (both base64url, no padding)."""

    def __init__(self, secret: bytes, ttl: float) -> None:
        self._secret = secret
        self.ttl = ttl

    def issue(self, funnel: str, session_id: str | None = None) -> tuple[str, WidgetSession]:
        """A token for ``session_id`` (a new random ``w-...`` id when None)."""
        session = WidgetSession(funnel, session_id or f"w-{secrets.token_urlsafe(18)}",
                                int(time.time() + self.ttl))
        body = json.dumps({"f": session.funnel, "s": session.session_id,
                           "exp": session.expires_at}, separators=(",", ":")).encode()
        payload = _b64(body)
        return f"{payload}.{_b64(self._sign(payload))}", session

    def verify(self, token: str | None, funnel: str) -> WidgetSession | None:
        """The session a valid, unexpired token of ``funnel`` names; else None."""
        if not token or token.count(".") != 1 or len(token) > 1000:
            return None
        payload, _, signature = token.partition(".")
        try:
            given = _unb64(signature)
        except ValueError:
            return None
        if not hmac.compare_digest(given, self._sign(payload)):
            return None
        try:
            data = json.loads(_unb64(payload))
            session = WidgetSession(str(data["f"]), str(data["s"]), int(data["exp"]))
        except (ValueError, KeyError, TypeError):
            return None
        if session.funnel != funnel or session.expires_at < time.time():
            return None
        return session

    def _sign(self, payload: str) -> bytes:
        return hmac.new(self._secret, _TOKEN_CONTEXT + payload.encode("ascii", "replace"),
                        hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError) as exc:
        raise ValueError(str(exc)) from None
