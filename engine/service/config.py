"""The service's configuration, from environment variables (uvicorn workers read it there).

`funnel serve` puts its options into the environment and starts uvicorn with
the app factory :func:`engine.service.app.create_app`, so every worker process
builds the same configuration. Tests build :class:`ServiceConfig` directly.

| variable | meaning | default |
| --- | --- | --- |
| ``FUNNEL_SERVE_FUNNELS`` | funnel files, separated by ``os.pathsep`` | required |
| ``FUNNEL_DB`` | PostgreSQL URL | the embedded server |
| ``FUNNEL_MODEL`` / ``FUNNEL_API_BASE`` | model for every funnel | each funnel's own |
| ``FUNNEL_STRUCTURED_OUTPUT`` | strategy for every funnel (docs/models.md) | each funnel's own |
| ``FUNNEL_API_KEYS`` | ``key1:converse,read_state@shop+b2b;key2:admin`` (``@``: those funnels only) | none |
| ``FUNNEL_SECRET`` | HMAC key of widget session tokens (≥ 16 chars) | random per process |
| ``FUNNEL_TOKEN_TTL`` | widget token lifetime, seconds | 2592000 (30 days) |
| ``FUNNEL_CORS_ORIGINS`` | allowed browser origins, comma-separated | none |
| ``FUNNEL_RATE_LIMIT`` | ``COUNT/SECONDS`` per client | ``60/60`` |
| ``FUNNEL_SESSION_QUEUE`` | turns of one session running or waiting, per process | 4 |
| ``FUNNEL_TURN_POOL`` | turns in flight per process (none holds a connection) | 500 |
| ``FUNNEL_DB_POOL`` | short-statement connections per process | 5 |
| ``FUNNEL_DB_TIMEOUT`` | seconds to wait for a database connection | 5 |
| ``FUNNEL_RETRY_AFTER`` | Retry-After of a 503 while the database is down | 5 |
| ``FUNNEL_METRICS_PUBLIC`` | ``1``: ``/metrics`` needs no key | 0 |
| ``FUNNEL_METRICS_DIR`` | workers' shared metrics folder (``PROMETHEUS_MULTIPROC_DIR``) | none |
| ``FUNNEL_HANDOFF_WEBHOOK`` | manager URL of handoff alerts (over the funnel's) | the funnel's |
| ``FUNNEL_HANDOFF_WEBHOOK_<NAME>`` | the same for funnel NAME only | ``FUNNEL_HANDOFF_WEBHOOK`` |
| ``FUNNEL_PUBLIC_URL`` | the service's public base URL, for the alert's ``link`` | none (no link) |
| ``FUNNEL_DISPATCH_INTERVAL`` | seconds between background outbox dispatches | 5 |
| ``FUNNEL_TELEGRAM_API`` | Bot API base URL | ``https://api.telegram.org`` |
| ``FUNNEL_TELEGRAM_TOKEN_<NAME>`` | bot token of funnel NAME (upper case) | none |
| ``FUNNEL_TELEGRAM_SECRET_<NAME>`` | its webhook secret token | none |
| ``FUNNEL_TELEGRAM_GROUPS_<NAME>`` | ``1``: answer in groups (one session per member) | 0 |
| ``FUNNEL_TELEGRAM_USERNAME_<NAME>`` | the bot's @username, for mentions in groups | ``getMe`` |
| ``FUNNEL_TELEGRAM_START_FIELD_<NAME>`` | state field that keeps ``/start PAYLOAD`` | ``source`` |
| ``FUNNEL_TRUSTED_PROXIES`` | proxies whose ``X-Forwarded-For`` is believed (IPs) | none |
| ``FUNNEL_REPLAY_WAIT`` | seconds a retry waits for its first delivery's turn | 120 |
| ``FUNNEL_RELOAD`` | ``0``: do not watch the funnels' files (``SIGHUP`` still reloads) | 1 |
| ``FUNNEL_RELOAD_INTERVAL`` | seconds between two looks at the funnels' files | 0.5 |
| ``FUNNEL_RETENTION_INTERVAL`` | seconds between scheduled retention purges (``0``: none) | 3600 |
| ``FUNNEL_RETENTION_ANONYMIZE`` | ``1``: the scheduled purge anonymizes instead of deleting | 0 |
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..funnel.compiled import CompiledFunnel
from ..llm.models import Model
from ..llm.strategy import CHOICES

_TRUE = ("1", "true", "yes")
SCOPES = frozenset({"converse", "read_state", "conversions", "metrics", "manage", "erase",
                    "admin"})
DEFAULT_TELEGRAM_API = "https://api.telegram.org"


# What the app's shutdown may take in all, once the requests in flight are done or cut
# (engine.service.app's lifespan; engine.service.server adds uvicorn's graceful period).
LIFESPAN_SHUTDOWN_SECONDS = 10.0

@dataclass(frozen=True)
class TelegramBot:
    token: str
    secret: str
    groups: bool = False  # answer in groups and supergroups (only when addressed)
    username: str | None = None  # without "@"; None: asked with getMe when needed
    start_field: str | None = "source"  # where `/start PAYLOAD` is kept, if declared
    # The managers' chat: hand-off alerts go there with take over / release buttons.
    manager_chat: int | None = None
    # Show the reply as the model writes it: a message edited at most once a second
    # (engine.service.telegram.live).
    stream: bool = False


@dataclass
class ServiceConfig:
    """Everything the app needs; :meth:`from_env` reads it from the environment."""

    funnels: list[str | Path | CompiledFunnel]
    db: str | None = None
    model: str | Model | None = None  # None: each funnel's own model
    api_base: str | None = None
    structured_output: str | None = None  # None: each funnel's model.structured_output
    api_keys: dict[str, frozenset[str]] = field(default_factory=dict)
    # The funnels a key is limited to (``KEY:scopes@a+b``); a key not here has every funnel.
    key_funnels: dict[str, frozenset[str]] = field(default_factory=dict)
    secret: bytes = b""
    token_ttl: float = 30 * 86400
    cors_origins: list[str] = field(default_factory=list)
    rate_limit: tuple[int, float] = (60, 60.0)
    session_queue: int = 4
    turn_pool: int = 500
    db_pool: int = 5
    db_timeout: float = 5.0
    retry_after: int = 5
    metrics_public: bool = False
    metrics_dir: str | None = None
    telegram_api: str = DEFAULT_TELEGRAM_API
    telegram: dict[str, TelegramBot] = field(default_factory=dict)  # funnel name -> bot
    secret_generated: bool = False
    handoff_webhook: str | None = None  # every funnel's manager URL (over the funnel's own)
    handoff_webhooks: dict[str, str] = field(default_factory=dict)  # NAME suffix -> URL
    public_url: str | None = None  # base of the conversation link in handoff alerts
    dispatch_interval: float = 5.0
    trusted_proxies: list[str] = field(default_factory=list)  # empty: X-Forwarded-For ignored
    replay_wait: float = 120.0
    reload: bool = True  # watch the funnels' files (engine.service.reload)
    reload_interval: float = 0.5
    retention_interval: float = 3600.0  # 0: no scheduled purge (engine.service.retention)
    retention_anonymize: bool = False

    def __post_init__(self) -> None:
        if not self.secret:
            self.secret = secrets.token_bytes(32)
            self.secret_generated = True
        if len(self.secret) < 16:
            raise ConfigError("FUNNEL_SECRET must have at least 16 characters")
        for key, scopes in self.api_keys.items():
            if not key:
                raise ConfigError("FUNNEL_API_KEYS: an empty key")
            if scopes - SCOPES:
                raise ConfigError(f"FUNNEL_API_KEYS: unknown scope(s) "
                                  f"{', '.join(sorted(scopes - SCOPES))}; known: "
                                  f"{', '.join(sorted(SCOPES))}")
        positions = {key: n for n, key in enumerate(self.api_keys, start=1)}
        for key, funnels in self.key_funnels.items():
            if key not in positions:
                raise ConfigError("FUNNEL_API_KEYS: a key is limited to funnels but has no "
                                  "scopes; give it as KEY:SCOPES@FUNNEL[+FUNNEL...]")
            if not funnels:
                raise ConfigError(f"FUNNEL_API_KEYS: key #{positions[key]} is limited to no "
                                  "funnel ('@' names none); name them (@shop+b2b) or drop the "
                                  "'@' to allow every funnel")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ServiceConfig:
        """Read the ``FUNNEL_*`` variables (see the module docstring).

        Raises:
            ConfigError: a variable is malformed or no funnel is given.
        """
        env = os.environ if env is None else env
        funnels: list[str | Path | CompiledFunnel] = [
            p for p in env.get("FUNNEL_SERVE_FUNNELS", "").split(os.pathsep) if p]
        if not funnels:
            raise ConfigError("FUNNEL_SERVE_FUNNELS names no funnel file")
        telegram: dict[str, TelegramBot] = {}
        prefix = "FUNNEL_TELEGRAM_TOKEN_"
        for name, token in env.items():
            if name.startswith(prefix) and token:
                suffix = name.removeprefix(prefix)
                secret = env.get(f"FUNNEL_TELEGRAM_SECRET_{suffix}", "")
                if not secret:
                    raise ConfigError(f"{name} is set but FUNNEL_TELEGRAM_SECRET_{suffix} is not: "
                                      "the webhook needs a secret token")
                telegram[suffix] = TelegramBot(
                    token, secret,
                    groups=env.get(f"FUNNEL_TELEGRAM_GROUPS_{suffix}", "0") in _TRUE,
                    username=env.get(f"FUNNEL_TELEGRAM_USERNAME_{suffix}", "").lstrip("@")
                    or None,
                    start_field=env.get(f"FUNNEL_TELEGRAM_START_FIELD_{suffix}") or "source",
                    manager_chat=_chat_id(env.get(f"FUNNEL_TELEGRAM_MANAGER_CHAT_{suffix}"),
                                          f"FUNNEL_TELEGRAM_MANAGER_CHAT_{suffix}"),
                    stream=env.get(f"FUNNEL_TELEGRAM_STREAM_{suffix}", "0") in _TRUE)
        secret = env.get("FUNNEL_SECRET", "")
        hooks_prefix = "FUNNEL_HANDOFF_WEBHOOK_"
        hooks = {name.removeprefix(hooks_prefix): url for name, url in env.items()
                 if name.startswith(hooks_prefix) and url}
        return cls(
            funnels=funnels,
            db=env.get("FUNNEL_DB") or None,
            model=env.get("FUNNEL_MODEL") or None,
            api_base=env.get("FUNNEL_API_BASE") or None,
            structured_output=_strategy(env.get("FUNNEL_STRUCTURED_OUTPUT") or None),
            api_keys=parse_api_keys(env.get("FUNNEL_API_KEYS", "")),
            key_funnels=parse_key_funnels(env.get("FUNNEL_API_KEYS", "")),
            secret=secret.encode(),
            token_ttl=_number(env, "FUNNEL_TOKEN_TTL", 30 * 86400),
            cors_origins=[o.strip().rstrip("/") for o in env.get("FUNNEL_CORS_ORIGINS", "")
                          .split(",") if o.strip()],
            rate_limit=parse_rate(env.get("FUNNEL_RATE_LIMIT", "60/60")),
            session_queue=int(_number(env, "FUNNEL_SESSION_QUEUE", 4)),
            turn_pool=int(_number(env, "FUNNEL_TURN_POOL", 500)),
            db_pool=int(_number(env, "FUNNEL_DB_POOL", 5)),
            db_timeout=_number(env, "FUNNEL_DB_TIMEOUT", 5),
            retry_after=int(_number(env, "FUNNEL_RETRY_AFTER", 5)),
            metrics_public=env.get("FUNNEL_METRICS_PUBLIC", "0") in ("1", "true", "yes"),
            metrics_dir=(env.get("PROMETHEUS_MULTIPROC_DIR") or env.get("FUNNEL_METRICS_DIR")
                         or None),
            telegram_api=env.get("FUNNEL_TELEGRAM_API") or DEFAULT_TELEGRAM_API,
            telegram=telegram,
            handoff_webhook=env.get("FUNNEL_HANDOFF_WEBHOOK") or None,
            handoff_webhooks=hooks,
            public_url=(env.get("FUNNEL_PUBLIC_URL") or "").rstrip("/") or None,
            dispatch_interval=_number(env, "FUNNEL_DISPATCH_INTERVAL", 5),
            trusted_proxies=[p.strip() for p in env.get("FUNNEL_TRUSTED_PROXIES", "").split(",")
                             if p.strip()],
            replay_wait=_number(env, "FUNNEL_REPLAY_WAIT", 120),
            reload=env.get("FUNNEL_RELOAD", "1") in _TRUE,
            reload_interval=_number(env, "FUNNEL_RELOAD_INTERVAL", 0.5),
            retention_interval=_interval(env, "FUNNEL_RETENTION_INTERVAL", 3600),
            retention_anonymize=env.get("FUNNEL_RETENTION_ANONYMIZE", "0") in _TRUE,
        )

    def telegram_bot(self, funnel: str) -> TelegramBot | None:
        return self.telegram.get(env_suffix(funnel))

    def webhook(self, funnel: str) -> str | None:
        """The manager URL of ``funnel``'s handoff alerts, when configured here."""
        return self.handoff_webhooks.get(env_suffix(funnel)) or self.handoff_webhook


def check_key_funnels(config: ServiceConfig, served: Iterable[str]) -> None:
    """Every funnel a key is limited to is served (``KEY:scopes@a+b``).

    Raises:
        ConfigError: naming the key's position (``key #2``), never the key.
    """
    names = set(served)
    positions = {key: n for n, key in enumerate(config.api_keys, start=1)}
    for key, limited in config.key_funnels.items():
        unknown = sorted(limited - names)
        if unknown:
            raise ConfigError(
                f"FUNNEL_API_KEYS: key #{positions.get(key, '?')} is limited to "
                f"{', '.join(repr(u[:80]) for u in unknown)}, which this service does not "
                f"serve; it serves {', '.join(sorted(names))} (the funnels' `name:`)")


def _chat_id(value: str | None, name: str) -> int | None:
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name} must be a Telegram chat id (an integer such as "
                          f"-1001234567890), not {value[:40]!r}") from None


def env_suffix(funnel: str) -> str:
    """The suffix of a funnel's per-funnel variables: ``b2b-demo`` -> ``B2B_DEMO``."""
    return re.sub(r"[^A-Z0-9]", "_", funnel.upper())


def parse_api_keys(text: str) -> dict[str, frozenset[str]]:
    """``key1:converse,read_state@shop;key2:admin`` -> {key: scopes}. Messages never quote
    a key. The funnels after ``@`` are :func:`parse_key_funnels`'."""
    return {key: scopes for _, key, scopes, _ in _entries(text)}


def parse_key_funnels(text: str) -> dict[str, frozenset[str]]:
    """``key1:converse@shop+b2b;key2:admin`` -> {key1: {shop, b2b}}: the keys limited to
    funnels (``@`` then names joined by ``+``); a key without ``@`` has every funnel."""
    return {key: funnels for _, key, _, funnels in _entries(text) if funnels is not None}


def _entries(text: str) -> list[tuple[int, str, frozenset[str], frozenset[str] | None]]:
    """(position, key, scopes, funnels or None) of each entry of ``FUNNEL_API_KEYS``."""
    entries: list[tuple[int, str, frozenset[str], frozenset[str] | None]] = []
    for n, item in enumerate((i.strip() for i in text.split(";")), start=1):
        if not item:
            continue
        key, sep, rest = item.partition(":")
        scopes, at, limited = rest.partition("@")
        names = frozenset(s.strip() for s in scopes.split(",") if s.strip())
        if not sep or not key.strip() or not names:
            raise ConfigError(f"FUNNEL_API_KEYS: entry {n} is not "
                              "KEY:SCOPE[,SCOPE...][@FUNNEL[+FUNNEL...]]")
        if len(key.strip()) < 16:
            raise ConfigError(f"FUNNEL_API_KEYS: the key of entry {n} is shorter than 16 characters")
        unknown = names - SCOPES
        if unknown:
            raise ConfigError(f"FUNNEL_API_KEYS: entry {n} has unknown scope(s) "
                              f"{', '.join(sorted(unknown))}; known: {', '.join(sorted(SCOPES))}")
        funnels = frozenset(f.strip() for f in limited.split("+") if f.strip()) if at else None
        if funnels is not None and not funnels:
            raise ConfigError(f"FUNNEL_API_KEYS: entry {n} has '@' but names no funnel; give "
                              "@FUNNEL[+FUNNEL...], or drop the '@' to allow every funnel")
        entries.append((n, key.strip(), names, funnels))
    return entries


def parse_rate(text: str) -> tuple[int, float]:
    """``60/60`` (60 requests per 60 seconds) -> (60, 60.0)."""
    count, _, seconds = text.partition("/")
    try:
        rate = (int(count), float(seconds or 60))
    except ValueError:
        raise ConfigError(f"FUNNEL_RATE_LIMIT must be COUNT/SECONDS, e.g. 60/60; got {text!r}"
                          ) from None
    if rate[0] < 1 or rate[1] <= 0:
        raise ConfigError(f"FUNNEL_RATE_LIMIT must be positive; got {text!r}")
    return rate


def _strategy(value: str | None) -> str | None:
    if value is not None and value not in CHOICES:
        raise ConfigError(f"FUNNEL_STRUCTURED_OUTPUT must be one of {', '.join(CHOICES)}; "
                          f"got {value!r}")
    return value


def _interval(env: Mapping[str, str], name: str, default: float) -> float:
    """Seconds, or ``0`` for never."""
    raw = env.get(name, "").strip()
    return 0.0 if raw in ("0", "0.0") else _number(env, name, default)


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number; got {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be positive; got {raw!r}")
    return value
