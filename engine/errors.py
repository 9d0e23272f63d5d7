"""The exception tree of the funnel engine.

Every error a user can cause is a :class:`FunnelError`; the CLI prints its
message and exits without a traceback. Messages say where (file:line, field
path or session), what was expected, and what to do about it::

    FunnelError
    ├── InvalidInput            a caller's input was refused (session id, message): nothing ran
    │   ├── OrderRejected       an order's field is missing or out of bounds (engine.records.orders)
    │   ├── OrderConflict       an order id recorded before with other content
    │   ├── UnknownSession      no such session (an order names one the funnel never saw)
    │   ├── ReleaseRejected     a release's stage or field updates were refused: nothing written
    │   ├── NotTakenOver        a manager acted on a session no manager holds (take it over)
    │   ├── NotAwaitingApproval a manager approved or rejected a session no approval holds
    │   └── ApprovalRefused     the move an approval held no longer applies: nothing written
    ├── ConfigError             a funnel, template, schema or catalog is wrong
    │   ├── FunnelInvalid       `funnel validate` found errors (carries them all)
    │   ├── CatalogError        the catalog file is wrong (names file and line)
    │   └── MigrationError      a declared state migration cannot apply to a session's state
    ├── ModelError              the model could not be called
    │   └── ResponseRefused     a provider's response decoded past its bound (a gzip bomb)
    ├── ActionRefused           an action's arguments were refused (unknown SKU, ...)
    ├── HookFailed              a hook raised what is not an Exception (SystemExit, ...)
    │   └── HookTimeout         a hook did not return within the turn's deadline
    ├── StoreError              the database failed or is unreachable
    │   ├── StoreUnavailable    cannot connect (down, wrong URL)
    │   ├── SchemaOutdated      the table is behind the funnel: run `funnel migrate`
    │   ├── ConcurrentUpdate    a stale save lost the race for a session
    │   ├── SessionBusy         an erasure waited too long for a session's turn
    │   └── DuplicateDelivery   a message's delivery key was seen before: no second turn
    └── PromptTooLarge          a prompt cannot fit the stage's token budget
        └── MessageTooLong      only the customer's message keeps it over (ask to shorten)

:class:`Diagnostic` is one problem `funnel validate` found (file, line, column, code,
message); :class:`FunnelInvalid` carries every one of them. It lives here, at the
bottom of the package, so that this module imports nothing of the engine.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "Diagnostic",
    "ActionRefused",
    "CatalogError",
    "ConcurrentUpdate",
    "ConfigError",
    "DuplicateDelivery",
    "FunnelError",
    "FunnelInvalid",
    "HookFailed",
    "HookTimeout",
    "InvalidInput",
    "MessageTooLong",
    "MigrationError",
    "ModelError",
    "OrderConflict",
    "OrderRejected",
    "NotTakenOver",
    "NotAwaitingApproval",
    "ApprovalRefused",
    "PromptTooLarge",
    "ReleaseRejected",
    "ResponseRefused",
    "SchemaOutdated",
    "SessionBusy",
    "StoreError",
    "StoreUnavailable",
    "UnknownSession",
    "closest",
    "did_you_mean",
    "first_line",
]


Severity = Literal["error", "warning"]


@dataclass(frozen=True, order=True)
class Diagnostic:
    """A problem in a funnel file (or a file it names).

    Attributes:
        file: the file at fault, as given on the command line or resolved from the funnel.
        line: 1-based line (0 when unknown).
        col: 1-based column (0 when unknown).
        severity: ``"error"`` or ``"warning"``.
        code: a stable code such as ``F101`` (see docs/funnel-format.md).
        message: what is wrong, what was expected, and the fix.
    """

    file: str
    line: int
    col: int
    severity: Severity
    code: str
    message: str

    def format(self) -> str:
        """``file:line:col: severity CODE message``, the form editors and CI understand."""
        return f"{self.file}:{self.line}:{self.col}: {self.severity} {self.code} {self.message}"

    def github(self) -> str:
        """A GitHub Actions workflow command that annotates the line in a pull request."""
        kind = "error" if self.severity == "error" else "warning"
        msg = self.message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
        return f"::{kind} file={self.file},line={self.line},col={self.col},title={self.code}::{msg}"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to ``name``, if one is close enough to be a typo of it."""
    matches = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest known name, or ``""``."""
    match = closest(name, known)
    return f" (did you mean '{match}'?)" if match else ""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (driver errors run on for lines), or its type."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class FunnelError(Exception):
    """Root of every error the engine raises on purpose."""


class InvalidInput(FunnelError):
    """A caller's input was refused before anything ran: a bad session id or message.

    The service answers it with HTTP 400; nothing was written.
    """


class OrderRejected(InvalidInput):
    """An order (engine.records.orders) was refused: ``field`` is missing, of the wrong type
    (``kind`` "shape": HTTP 400) or out of bounds (``kind`` "value": HTTP 422)."""

    def __init__(self, field: str, expected: str, kind: str) -> None:
        super().__init__(f"order field '{field}': expected {expected}")
        self.field = field
        self.kind = kind


class OrderConflict(InvalidInput):
    """An order id was recorded before with other content; the first one stands (HTTP 409)."""


class UnknownSession(InvalidInput):
    """The session named is not in the funnel's table (HTTP 404)."""


class ReleaseRejected(InvalidInput):
    """A release's stage or field updates were refused (HTTP 422); nothing was written.

    ``problems`` lists each refusal: an undeclared stage, a field that is not declared
    or is the engine's, a value its schema refuses.
    """

    def __init__(self, session_id: str, problems: list[str]) -> None:
        super().__init__(f"session {session_id!r} was not released: {'; '.join(problems)}; "
                         "fix them and release again")
        self.problems = problems


class NotTakenOver(InvalidInput):
    """A manager wrote to or released a session no manager holds (HTTP 409)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} is answered by the bot, not by a manager: "
                         "take it over first (POST .../sessions/{id}/takeover)")
        self.session_id = session_id


class NotAwaitingApproval(InvalidInput):
    """A manager approved or rejected a session that waits for no approval (HTTP 409):
    it was decided already (by another manager, or its timeout), or never asked."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} waits for no approval: it was approved, "
                         "rejected or timed out already, or never asked; read its control "
                         "(GET .../sessions/{id}/control)")
        self.session_id = session_id


class ApprovalRefused(InvalidInput):
    """The move an approval held cannot be made now (HTTP 422): the session is no longer
    where it was held, or the stage it led to is gone. Nothing was written; reject it."""

    def __init__(self, session_id: str, problems: list[str]) -> None:
        super().__init__(f"session {session_id!r}: the approved move cannot be made: "
                         f"{'; '.join(problems)}; reject it instead")
        self.problems = problems


class ConfigError(FunnelError):
    """A funnel file, template, output schema or catalog is wrong.

    Attributes:
        file: the file at fault, when known.
        line: 1-based line in that file, when known.
    """

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None) -> None:
        self.file = file
        self.line = line
        where = f"{file}:{line}: " if file and line else (f"{file}: " if file else "")
        super().__init__(f"{where}{message}")


class FunnelInvalid(ConfigError):
    """A funnel failed validation; ``diagnostics`` holds every problem found."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = diagnostics
        errors = [d for d in diagnostics if d.severity == "error"]
        shown = "\n".join(d.format() for d in errors[:20])
        more = f"\n... and {len(errors) - 20} more" if len(errors) > 20 else ""
        super().__init__(
            f"the funnel has {len(errors)} error(s); run `funnel validate` for the full list:\n"
            f"{shown}{more}"
        )


class CatalogError(ConfigError):
    """The catalog file is missing, unreadable or malformed; names the file and line.

    Attributes:
        detail: the problem without the file and line.
    """

    def __init__(self, detail: str, *, file: Path | str, line: int | None = None) -> None:
        self.detail = detail
        super().__init__(detail, file=str(file), line=line)


class MigrationError(ConfigError):
    """A step of the funnel's ``migrations:`` cannot be applied to a session's state (a
    move through a value that is not an object, say); names the step and the path.

    Attributes:
        detail: the problem without the file and line.
    """

    def __init__(self, detail: str, *, file: Path | str | None = None,
                 line: int | None = None) -> None:
        self.detail = detail
        super().__init__(detail, file=str(file) if file else None, line=line)


class ModelError(FunnelError):
    """The model could not be called (HTTP error, timeout, bad credentials).

    Attributes:
        attempts: the HTTP calls made before giving up (retries and fallback models included).
        spent_ms: the time those calls took, waits between them left out.
        prompt_tokens: the prompt tokens they sent, as far as counted (a call cut at the
            deadline was sent, and a provider bills what it read).
        calls: each of those calls (``engine.records.calls.Call``), for the turn record.
    """

    def __init__(self, message: str, *, attempts: int = 1, spent_ms: float = 0.0,
                 prompt_tokens: int = 0, calls: Sequence[Any] = ()) -> None:
        self.attempts = attempts
        self.spent_ms = spent_ms
        self.prompt_tokens = prompt_tokens
        self.calls = tuple(calls)
        super().__init__(message)


class ResponseRefused(ModelError):
    """A provider's response was not read to its end: its body decoded past
    :data:`engine.llm.bounded.MAX_RESPONSE_BYTES`, or came in an encoding the engine cannot
    decode under that bound. Never retried: the same provider would send it again."""


class ActionRefused(FunnelError):
    """An action the model asked for was refused; the model is told next turn."""

    def __init__(self, action: str, reason: str) -> None:
        self.action = action
        self.reason = reason
        super().__init__(f"action '{action}' refused: {reason}")


class HookFailed(FunnelError):
    """A hook raised something that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``, ``asyncio.CancelledError``), or could not be run: the turn
    treats it as any other failure (engine.funnel.hooks)."""


class HookTimeout(HookFailed):
    """A hook did not return within the turn's deadline; its thread runs on, its result
    is dropped."""


class StoreError(FunnelError):
    """The session store failed."""


class StoreUnavailable(StoreError):
    """The database cannot be reached; nothing was written."""


class SchemaOutdated(StoreError):
    """The session table is behind the funnel declaration."""


class SessionBusy(StoreError):
    """A session stayed in a turn for longer than an erasure would wait; nothing was
    erased (the service answers 503 with Retry-After)."""


class ConcurrentUpdate(StoreError):
    """A save found a newer version of the session than the one it loaded.

    Attributes:
        session_id: the session whose save lost.
        expected: the row version the turn loaded.
        found: the version found instead; None when the row is gone (purged meanwhile).
    """

    def __init__(self, session_id: str, expected: int, found: Any) -> None:
        self.session_id = session_id
        self.expected = expected
        self.found = found
        super().__init__(
            f"session {session_id!r} changed while this turn ran (loaded version {expected}, "
            f"found {found}); the turn was not saved and will be retried"
        )


class DuplicateDelivery(StoreError):
    """A customer message came again with a delivery key already recorded (a Telegram
    re-delivery, an HTTP client's retry): nothing was logged and no turn runs.

    Attributes:
        session_id: the session of the first delivery.
        message_id: the first delivery's message id (None if its turn never logged it).
        response: the first delivery's answer, or None while its turn still runs.
    """

    def __init__(self, session_id: str, key: str, message_id: int | None,
                 response: dict[str, Any] | None) -> None:
        self.session_id = session_id
        self.key = key
        self.message_id = message_id
        self.response = response
        super().__init__(
            f"session {session_id!r}: the message with delivery key {key[:80]!r} was received "
            "before; its first turn's answer is replayed, no second turn runs")


class PromptTooLarge(FunnelError):
    """The rendered prompt exceeds the stage's budget even after trimming."""

    def __init__(self, stage: str, tokens: int, budget: int) -> None:
        self.stage = stage
        self.tokens = tokens
        self.budget = budget
        super().__init__(
            f"stage '{stage}': the prompt needs {tokens} tokens after trimming the window and the "
            f"summary, over its budget of {budget}; shorten the template or raise "
            f"`prompt_budget` for the stage"
        )


class MessageTooLong(PromptTooLarge):
    """The customer's message alone keeps the prompt over the stage's budget.

    The turn answers with ``memory.too_long_reply`` (please shorten) instead of
    the fallback; nothing else about the session is wrong.
    """
