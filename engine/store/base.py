"""The store's interface: what the engine core needs from session storage.

The core talks to a :class:`Store` and the records here; nothing in this
module imports psycopg, so the core's types load without a database driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from ..format.spec import FunnelSpec
from ..records.chunks import Chunk
from ..records.messages import Message
from ..records.orders import Conversion, Order

if TYPE_CHECKING:
    from .idempotency import Pending

__all__ = ["Control", "FollowUpClaim", "Held", "Inbound", "Match", "OutboxItem",
           "SessionAccess", "Store", "TurnWrite", "VectorSupport"]


@dataclass(frozen=True)
class Inbound:
    """A customer message's delivery key, unique per funnel and channel (a Telegram bot and
    ``update_id``, an HTTP ``Idempotency-Key``): recorded with the message, it makes a
    second delivery replay the first one's answer instead of running another turn
    (engine.store.idempotency)."""

    channel: str
    key: str


@dataclass
class OutboxItem:
    """A side effect (manager notification, hook) delivered once after the save commits."""

    key: str  # idempotency key: one delivery per key, ever
    kind: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class Control:
    """Who answers a session besides the bot (``funnel_control``): ``mode`` is ``manager``
    (a manager took it over) or ``approval`` (it waits for a manager's approval)."""

    mode: str
    manager: str | None
    since: datetime
    holding_sent: bool = False
    # An approval's: the move it holds (from, to, trigger, reason) and its deadline.
    held: dict[str, Any] | None = None
    deadline: datetime | None = None


@dataclass
class Held:
    """A customer message the bot lets pass while a manager holds the session: the
    message is marked held, the funnel's holding reply (once per take-over) logged and
    put in the outbox, the delivery key answered, the lease given back."""

    message_id: int
    stage: str
    response: dict[str, Any]  # what a second delivery of the message's key replays
    holding: str | None = None
    outbox: list[OutboxItem] = field(default_factory=list)


@dataclass
class TurnWrite:
    """Everything one turn writes, in one transaction."""

    session_id: str
    values: dict[str, Any]  # every column of the state row except timestamps
    expected_version: int  # row_version the turn loaded; 0 for a new session
    reply: str | None
    stage_after: str
    turn: dict[str, Any]
    outbox: list[OutboxItem] = field(default_factory=list)
    message_time: datetime | None = None
    # A new rolling summary folded during the turn, and the last message id it covers.
    summary: str | None = None
    summary_upto: int | None = None
    holder: str | None = None  # the turn's lease on the session, released by the save
    # The delivery key of the turn's message and the message's id: the save stores the
    # turn's answer under the key (set by the session handle, like ``holder``).
    inbound: Inbound | None = None
    message_id: int = 0
    # The version of the funnel the turn ran on, when it is not the one the session was
    # opened with (a session pinned to an old version): its columns are the ones saved.
    spec: FunnelSpec | None = None
    # A move held for a manager's approval (engine.turn.approval): the control row
    # written with the turn, ``{"held": {...}, "deadline": datetime}``.
    approval: dict[str, Any] | None = None


@dataclass(frozen=True)
class VectorSupport:
    """How this server searches embeddings: ``mode`` is ``pgvector`` or ``array``;
    ``schema`` where pgvector's type lives; ``missing`` why not pgvector (for the
    start-up warning), empty when it is used."""

    mode: str
    schema: str | None = None
    missing: str = ""


@dataclass(frozen=True)
class Match:
    """A message of a recalled stretch: its place in the session's order (``n``: its id
    in the message log), and the match it was found around (``hit``, ``similarity``)."""

    id: int
    role: str
    content: str
    n: int
    hit: int
    similarity: float


class FollowUpClaim(Protocol):
    """A due follow-up row, locked for one transaction (engine.store.follow_ups): what
    the block writes commits with it."""

    row: dict[str, Any]  # session_id, stage, step, anchor_at, anchor_id, due_at, sent, ...

    @property
    def session_id(self) -> str: ...

    async def customer_wrote(self) -> bool:
        """Whether the customer wrote since the row's anchor."""

    async def move(self, step: int, due: datetime | None,
                   sent: dict[str, int] | None = None) -> None:
        """Make ``step`` the next one, due at ``due`` (None: nothing is)."""

    async def cancel(self, *, opted_out: bool = False) -> None:
        """Nothing more is due; ``opted_out``: ever."""

    async def send(self, *, text: str, version: int, record: dict[str, Any],
                   delivery: OutboxItem | None, claims: list[dict[str, Any]],
                   spend: tuple[int, int, float | None] = (0, 0, 0.0)) -> int | None:
        """Log the follow-up (message and turn record) and queue ``delivery``; the
        message id, or None when the outbox had the key (sent before). ``spend``: the
        prompt and completion tokens and the cost of the model that wrote it (a
        ``prompt:`` step's), none for a declared text."""


class SessionAccess(Protocol):
    """What :meth:`Store.session` yields; ``control`` is the session's control row as
    :meth:`load` read it under the lease (None: the bot answers)."""

    control: Control | None

    async def load(self, window: int, *, text: str | None = None, current_id: int = 0,
                   inbound: Inbound | None = None
                   ) -> tuple[int, dict[str, Any] | None, list[Message]]:
        """Log ``text`` (if given), take the lease, read the row and the last ``window``
        messages: (message id, the row as JSON-friendly values or None, messages).

        Raises:
            DuplicateDelivery: ``inbound``'s key was recorded before: nothing was logged.
        """

    async def save(self, write: TurnWrite) -> int: ...

    async def hold(self, held: Held) -> None:
        """End the turn without the bot: the message held (see :class:`Held`), no state
        written, the lease given back."""


class Store(Protocol):
    """What the engine needs from storage."""

    async def ensure_schema(self, funnel: FunnelSpec) -> None:
        """Create the shared tables; raise SchemaOutdated if the funnel's table is behind."""

    async def check_schema(self, funnel: FunnelSpec) -> tuple[list[str], list[str]]:
        """(declared columns the table lacks, table columns the funnel does not declare)."""

    async def migrate(self, funnel: FunnelSpec, *, drop: bool = False, check: bool = False
                      ) -> list[str]:
        """Bring the funnel's table to its declaration; return what was (or would be) done."""

    async def log_message(self, funnel: FunnelSpec, session_id: str, role: str, content: str
                          ) -> int:
        """Append to the message log in its own commit; return the message id."""

    async def load(self, funnel: FunnelSpec, session_id: str) -> dict[str, Any] | None:
        """The session's row, or None for a new session."""

    async def save_turn(self, funnel: FunnelSpec, write: TurnWrite) -> int:
        """UPSERT the state (checking row_version), log the reply, record the turn and the
        outbox, in one transaction; return the new row_version.

        Raises:
            ConcurrentUpdate: the row changed since it was loaded; nothing was written.
        """

    def session(self, funnel: FunnelSpec, session_id: str
                ) -> AbstractAsyncContextManager[SessionAccess]:
        """One turn's access to a session: ``load`` takes its lease and reads, ``save``
        writes and gives the lease back. Turns of one session are serialized across
        processes and machines."""

    async def claim_outbox(self, funnel: str | None = None, session_id: str | None = None,
                           limit: int = 50, kinds: list[str] | None = None
                           ) -> list[dict[str, Any]]:
        """Undelivered outbox rows that are due (of ``kinds``, when given); a session's
        ``reply`` rows one at a time, in order."""

    async def finish_outbox(self, item_id: int, error: str | None, *,
                            retry_in: float | None = None, give_up: bool = False) -> None:
        """Mark an outbox row delivered, or failed with a retry time (``retry_in`` s, else
        a backoff), or given up on (``give_up``: never retried)."""

    async def outbox_target_done(self, item_id: int, target: str) -> None:
        """Record that ``target`` of an outbox row took it: it is not sent again."""

    async def outbox_backlog(self) -> dict[str, tuple[int, float]]:
        """Per funnel: undelivered rows still to try, and the oldest's overdue age (s)."""

    async def history(self, funnel: FunnelSpec, session_id: str, limit: int
                      ) -> list[dict[str, Any]]:
        """The last messages of a session with their stages and times."""

    async def purge(self, funnel: FunnelSpec, older_than: float, *, anonymize: bool = False,
                    batch: int = 1000) -> dict[str, int]:
        """Delete or anonymize sessions idle longer than ``older_than`` seconds."""

    async def purge_when_due(self, funnel: FunnelSpec, older_than: float, period: float, *,
                             anonymize: bool = False) -> tuple[str, dict[str, int] | None]:
        """``purge`` if no other worker runs it now and it did not run within ``period``
        seconds (engine.store.jobs): ``("done", counts)``, ``("busy"|"not_due", None)``."""

    async def purge_preview(self, funnel: FunnelSpec, older_than: float, *,
                            anonymize: bool = False) -> dict[str, int] | None:
        """What ``purge`` would touch, counted; ``None`` when the funnel has no table."""

    async def erase_session(self, funnel: FunnelSpec, session_id: str, *, by: str,
                            wait: float = 60.0) -> dict[str, Any]:
        """Delete every copy of one session after its turn; the receipt, rows per table
        (engine.store.erasure).

        Raises:
            UnknownSession: nothing of the session is stored.
            SessionBusy: its turn held it for ``wait`` seconds; nothing was erased.
        """

    async def export_session(self, funnel: FunnelSpec, session_id: str, *, by: str
                             ) -> dict[str, Any]:
        """Everything stored of one session, as one JSON-ready document.

        Raises:
            UnknownSession: nothing of the session is stored.
        """

    async def turn_records(self, funnel: FunnelSpec, session_id: str, limit: int = 1000
                           ) -> list[dict[str, Any]]:
        """A session's turn records, oldest first, with each turn's message and reply."""

    async def record_conversion(self, funnel: FunnelSpec, order: Order) -> Conversion:
        """Record an order against its session, once per order id (engine.records.orders).

        Raises:
            UnknownSession: the session is not in the funnel's table.
            OrderConflict: the order id was recorded before with other content.
        """

    async def summary_backlog(self, funnel: FunnelSpec, session_id: str, window: int,
                              limit: int = 200) -> tuple[str, int, list[tuple[int, Message]]]:
        """(summary, summary_upto, messages that left the window and are not summarized)."""

    async def save_summary(self, funnel: FunnelSpec, session_id: str, summary: str,
                           old_upto: int, new_upto: int) -> bool:
        """Store a new summary if ``summary_upto`` is still ``old_upto``."""

    async def accept_message(self, funnel: FunnelSpec, session_id: str, text: str,
                             inbound: Inbound, holder: str,
                             meta: dict[str, Any] | None = None) -> int | None:
        """Log a message with its delivery key in one commit (its turn runs later); the
        message id, or None when the key was seen before (nothing logged)."""

    async def inbound_pending(self, funnel: str, channel: str, key: str) -> Pending | None:
        """A delivery key's message and, once its turn is saved, the answer."""

    async def claim_inbound(self, funnel: str, channel: str, holder: str, *,
                            key: str | None = None, limit: int = 20
                            ) -> list[tuple[str, Pending]]:
        """Claim messages accepted and left unanswered (a dead worker's): (key, message)."""

    async def record_delivery(self, funnel: str, channel: str, session_id: str,
                              key: str | None, delivery: str, unreachable: str | None = None
                              ) -> None:
        """How a channel's reply went (on the message's key), and whether the channel can
        reach the session at all (``unreachable``: why not)."""

    async def add_outbox(self, funnel: str, session_id: str, items: list[OutboxItem]) -> int:
        """Add outbox rows outside a turn; a key taken adds nothing. How many were added."""

    async def control(self, funnel: str, session_id: str) -> Control | None:
        """The session's control row (engine.store.control); None while the bot answers."""

    async def take_over(self, funnel: str, session_id: str, manager: str,
                        mode: str = "manager", detail: Mapping[str, Any] | None = None
                        ) -> Control:
        """Hand the session to ``manager``; call it holding the session's lease."""

    async def manager_message(self, funnel: FunnelSpec, session_id: str, manager: str,
                              text: str, stage: str, delivery: OutboxItem | None, *,
                              key: str | None = None,
                              answer: Mapping[str, Any] | None = None) -> int:
        """Log a manager's message and its outbox delivery; the message's id. With a
        delivery ``key``, once: a key seen before raises DuplicateDelivery."""

    async def reply_target(self, funnel: str, session_id: str, channel: str
                           ) -> dict[str, Any] | None:
        """Where ``channel`` reaches the session's customer, or None."""

    async def release_control(self, funnel: FunnelSpec, session_id: str, manager: str,
                              values: dict[str, Any] | None, expected_version: int,
                              detail: Mapping[str, Any] | None = None) -> Control | None:
        """Give the session back to the bot (writing ``values`` when given); the control
        row it had, or None. Call it holding the session's lease."""

    async def resolve_approval(self, funnel: FunnelSpec, session_id: str, event: str,
                               manager: str | None, values: dict[str, Any] | None,
                               expected_version: int, detail: Mapping[str, Any], at: datetime,
                               outbox_items: Sequence[OutboxItem] = ()) -> Control | None:
        """End the session's approval (approved, rejected, timeout), writing ``values``;
        the approval's control row, or None (none waited). Under the session's lease."""

    async def due_approvals(self, funnel: str, now: datetime, limit: int = 100) -> list[str]:
        """The sessions whose approval is past its deadline at ``now``, oldest first."""

    async def knowledge_digest(self, funnel: str) -> str | None:
        """The digest of the funnel's indexed knowledge folder, or None when none is."""

    async def knowledge_replace(self, funnel: str, chunks: Sequence[Chunk], digest: str,
                                language: str | None) -> str:
        """Replace the funnel's knowledge chunks; return the text search configuration used."""

    async def knowledge_search(self, funnel: str, query: str, limit: int
                               ) -> list[tuple[Chunk, float]]:
        """The funnel's best chunks for a query, best first, with their ranks."""

    async def recall_prepare(self) -> VectorSupport:
        """Get the embeddings table ready for semantic recall: pgvector where the server
        has it, else the ``real[]`` fallback (engine.store.recall); which, and why."""

    async def recall_pending(self, funnel: str, session_id: str, model: str, limit: int
                             ) -> list[tuple[int, str]]:
        """The session's newest messages that ``model`` has not embedded: (id, text)."""

    async def recall_save(self, funnel: str, model: str,
                          vectors: Sequence[tuple[int, Sequence[float]]]) -> None:
        """Store messages' embeddings (unit vectors) by ``model``."""

    async def recall_dimension(self, model: str) -> int | None:
        """The dimension of ``model``'s stored embeddings; None when it has none."""

    async def recall_search(self, funnel: str, session_id: str, model: str,
                            query: Sequence[float], *, upto: int, top_k: int, before: int,
                            after: int, min_similarity: float) -> list[Match]:
        """The session's messages before ``upto`` most similar to ``query``, with their
        neighbours (engine.store.recall.search); never another session's."""

    async def save_version(self, funnel: str, version: int, digest: str, entry: str,
                           files: dict[str, str], *, trial: bool = False) -> bool:
        """Store a version's bundle in the version store (as a trial: by hash only, never
        loaded for a pinned session); True when it was new."""

    async def load_version(self, funnel: str, version: int
                           ) -> tuple[str, str, dict[str, str]] | None:
        """(hash, entry, files) of the version's current (deployed) bundle, or None."""

    async def list_versions(self, funnel: str) -> list[dict[str, Any]]:
        """Every stored bundle of the funnel."""

    async def sessions_by_version(self, funnel: FunnelSpec) -> dict[int, int]:
        """How many sessions each version holds."""

    async def sessions_on_other_versions(self, funnel: FunnelSpec, after: str = "",
                                         limit: int = 500) -> list[dict[str, Any]]:
        """Rows not on ``funnel.version``, by session id after ``after``."""

    async def move_session(self, funnel: FunnelSpec, values: dict[str, Any],
                           expected_version: int) -> bool:
        """Write a migrated session's state if its row is still at ``expected_version``."""

    async def follow_up_touch(self, funnel: str, session_id: str, stage: str,
                              anchor_at: datetime, anchor_id: int,
                              steps: Sequence[tuple[float, int]], *,
                              opted_out: bool = False) -> None:
        """After a customer turn in a stage with follow-ups (each step's ``after`` and
        ``max``): they count from this message (engine.store.follow_ups)."""

    async def follow_up_cancel(self, funnel: str, session_id: str, *,
                               opted_out: bool = False) -> None:
        """Nothing more is due for the session; ``opted_out``: ever again."""

    async def follow_up_state(self, funnel: str, session_id: str) -> dict[str, Any] | None:
        """The session's follow-up row, or None."""

    async def due_follow_ups(self, funnel: str, now: datetime, limit: int = 100) -> list[str]:
        """The sessions with a follow-up due at ``now``, oldest due first."""

    def claim_follow_up(self, funnel: str, session_id: str, now: datetime
                        ) -> AbstractAsyncContextManager[FollowUpClaim | None]:
        """The session's row while still due and free, locked for one transaction."""

    async def close(self) -> None: ...
