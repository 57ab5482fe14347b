"""The store port of the operations wing: what its use-cases read and write, not how a database provides it.

Each Protocol is sized to the use-case that calls it. Adapters: ``orchestrator.store.operations`` (one module per
concern, each with its Postgres and its memory adapter); both pass the same contract suite
(``tests/contract/``). Times are epoch milliseconds, as in ``orchestrator.ports``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..orchestrator.invariants import PendingTimer
from ..orchestrator.ports import SagaSummaryRow, StoredEvent, UnitOfWork
from ..outbox.table import OutboxMessage

if TYPE_CHECKING:  # the kit speaks to Postgres and the use-cases import this module: names only
    from ..participants.kit.ledger import AwaitingCommand
    from ..participants.kit.participant import Participant
    from .bulk_jobs import BulkJob, Count, Criteria, NewJob

# -- reads of the console and the command line; the console's sessions; verify's snapshot; table signals --

AGE_BUCKETS: tuple[tuple[str, int | None], ...] = (
    ("< 1 min", 60), ("< 10 min", 600), ("< 1 h", 3600), ("< 1 day", 86400), (">= 1 day", None))
"""The fleet's heat table columns: a saga's age (since it started) up to each bound, in seconds."""


def age_bucket(age_s: float) -> str:
    """The ``AGE_BUCKETS`` label of a saga ``age_s`` old."""
    return next(label for label, bound in AGE_BUCKETS if bound is None or age_s < bound)


@dataclass(frozen=True)
class HeatCell:
    """How many sagas of one type are in one state and one age bucket."""

    saga_type: str
    status: str
    bucket: str
    count: int


@dataclass(frozen=True)
class EndedCounts:
    """How many sagas ended in the last hour and day, and how many of them by compensating."""

    hour: int
    day: int
    undone_hour: int
    undone_day: int


@dataclass(frozen=True)
class SagaFilter:
    """Which sagas of the read model a listing takes; every criterion given must hold, none given takes all.

    ``older_than_s``: not updated for this long; ``steps``: the (saga type, current step) pairs of which one
    must hold (a participant's steps, resolved by the use-case from the definitions)."""

    saga_type: str | None = None
    statuses: tuple[str, ...] = ()
    older_than_s: float | None = None
    tenant: str | None = None
    error: str | None = None
    steps: tuple[tuple[str, str], ...] | None = None
    definition_version: int | None = None  # on this version of its type (as the read model records it)


@dataclass(frozen=True)
class SagaSearch:
    """What a search looks for (``operations.search.parse`` reads it from a search box's text): the saga whose id
    is ``saga_id``, and the sagas with a search key (in ``field``; any when empty) whose value starts with
    ``value``, whatever the case; of them, those of ``tenant`` started in [``started_after_ms``,
    ``started_before_ms``) when given."""

    saga_id: str
    value: str
    field: str = ""
    tenant: str | None = None
    started_after_ms: int | None = None
    started_before_ms: int | None = None


@dataclass(frozen=True)
class WedgedGroup:
    """Unfinished sagas stuck on one step of one type with one error, at least N failures each."""

    saga_type: str
    step: str
    error: str | None
    count: int
    max_failures: int
    saga_ids: list[str]


@dataclass(frozen=True)
class StuckQuery:
    """Which sagas of the read model the inbox takes (``operations.inbox``): those in ``statuses``, and those in
    ``failing`` whose current step (or compensation) failed at least ``min_failures`` times; of ``saga_type`` when
    given; last updated at or after ``since_ms`` and before ``before_ms`` when given; after ``after`` (updated_at
    in ms, saga id) in (updated_at ms, saga id) order."""

    statuses: tuple[str, ...]
    failing: tuple[str, ...] = ()
    min_failures: int = 3
    saga_type: str | None = None
    since_ms: int | None = None
    before_ms: int | None = None
    after: tuple[int, str] | None = None


TimerView = PendingTimer
"""A durable timer of one saga, still waiting."""


@dataclass(frozen=True)
class OutboxView:
    """A row the relay has not published yet (parked: the broker refused it for good, with why)."""

    table: str
    row_id: int
    topic: str
    created_at_ms: int
    parked_reason: str | None = None


@dataclass(frozen=True)
class ShapeStatusCount:
    """How many sagas of one type, started on one definition version and shape, are in one state. ``version`` and
    ``fingerprint`` are None for a read-model row written before they were recorded."""

    saga_type: str
    version: int | None
    fingerprint: str | None
    status: str
    count: int


@dataclass(frozen=True)
class StoredSaga:
    """One saga as stored, read in one snapshot: its events (with when each was stored), its live timers, its
    unpublished and parked outbox rows."""

    events: list[StoredEvent]
    timers: list[TimerView]
    outbox: list[OutboxView]


class ReadsStore(Protocol):
    """What the console's and the command line's reads ask of the orchestrator's tables (``operations.reads``).

    Every read runs under a statement timeout and takes no lock a service waits for."""

    async def unfinished(self, statuses: Sequence[str], oldest: int) -> tuple[list[HeatCell], list[SagaSummaryRow]]:
        """The sagas in ``statuses`` by type, state and age bucket; the ``oldest`` of them by start."""
        ...

    async def ended_last_day(self, statuses: Sequence[str], undone: Collection[str]
                             ) -> tuple[list[HeatCell], EndedCounts]:
        """The sagas in ``statuses`` updated in the last day by type, state and age bucket; how many in the last
        hour and day, and of them how many in ``undone``."""
        ...

    async def list_sagas(self, selection: SagaFilter | None, limit: int,
                         after: tuple[int, str] | None = None) -> list[SagaSummaryRow]:
        """At most ``limit`` sagas that ``selection`` takes (all when None), ordered by (started at, saga id);
        ``after``: a (started_at_ms, saga_id) place in that order, whose sagas before it and itself are left out
        (keyset paging: the place of the previous page's last saga)."""
        ...

    async def count_by_status(self) -> dict[str, int]:
        """How many sagas are in each state, by state name."""
        ...

    async def version_counts(self) -> list[ShapeStatusCount]:
        """How many sagas there are of each type, definition version, shape and state (every saga of the read
        model, in one aggregate), in no particular order."""
        ...

    async def search(self, search: SagaSearch, limit: int) -> list[SagaSummaryRow]:
        """At most ``limit`` sagas ``search`` finds: the exact matches first (its id, or a key whose value equals
        ``search.value`` but for case), then those with a key that only starts with it; each group the newest
        started first. A text that starts very many keys may be looked for among the first few thousand of them in
        value order (``PostgresReads``: ``SEARCH_CANDIDATES``): every exact match, then the closest values."""
        ...

    async def search_keys(self, saga_id: str) -> dict[str, str]:
        """The saga's search keys, field → value."""
        ...

    async def wedged(self, min_failures: int, per_group: int, ended: Collection[str]) -> list[WedgedGroup]:
        """Sagas not in ``ended`` whose current step failed at least ``min_failures`` times, grouped by type, step
        and error, the largest group first, at most ``per_group`` ids each (the most failed first)."""
        ...

    async def stored_saga(self, saga_id: str) -> StoredSaga | None:
        """The saga's events, timers and outbox rows in one snapshot; None when it has no event."""
        ...

    async def events_after(self, saga_id: str, after_seq: int) -> list[StoredEvent]:
        """The saga's events after ``after_seq``, in seq order, each with when it was stored."""
        ...

    async def events_before(self, saga_id: str, before_seq: int, limit: int) -> list[StoredEvent]:
        """The saga's last ``limit`` events before ``before_seq``, in seq order, each with when it was stored: a
        long history read backwards a page at a time."""
        ...

    async def last_seq(self, saga_id: str) -> int | None:
        """The seq of the saga's last event; None when it has no event (no such saga)."""
        ...

    async def message_progress(self, message_id: str) -> str:
        """Where the orchestrator's message ``message_id`` (a control command) stands: ``queued`` (still in its
        outbox), ``taken`` (its consumer claimed it: decided, applied or dead-lettered) or ``sent`` (neither)."""
        ...

    async def events_of(self, saga_ids: Collection[str], event_types: Collection[str]) -> list[StoredEvent]:
        """The events of ``event_types`` of ``saga_ids``, by saga id then seq."""
        ...

    async def saga_statuses(self, saga_ids: Collection[str]) -> dict[str, str]:
        """The read model's state of each of ``saga_ids`` that has one."""
        ...

    async def parked(self) -> list[OutboxView]:
        """Every row the broker refused for good, in the orchestrator's and each participant's outbox."""
        ...

    async def awaiting(self, participant: Participant, saga_id: str | None = None) -> list[AwaitingCommand]:
        """The commands ``participant`` deferred to a person (of one saga, when given), oldest first; none when the
        participant has not started here yet."""
        ...

    async def awaiting_of(self, participants: Sequence[Participant]) -> dict[str, list[AwaitingCommand]]:
        """``awaiting`` of each of ``participants`` (by name), in one read: every command each deferred."""
        ...

    async def stuck_sagas(self, query: StuckQuery, limit: int) -> list[SagaSummaryRow]:
        """At most ``limit`` sagas ``query`` takes, the longest unchanged first: by updated_at (to the millisecond),
        then saga id in byte order."""
        ...


@dataclass(frozen=True)
class StoredSession:
    """A console sign-in as stored: only the token's digest is kept."""

    operator: str
    csrf: str


class SessionStore(Protocol):
    """Where the console's sign-ins are kept (``operations.sessions``)."""

    async def add(self, digest: bytes, operator: str, csrf: str, lifetime_s: float) -> None:
        """Keep a sign-in for ``lifetime_s``; sign-ins past their time may be dropped now."""
        ...

    async def find(self, digest: bytes) -> StoredSession | None:
        """The live sign-in of ``digest``; None when there is none or it expired."""
        ...

    async def remove(self, digest: bytes) -> None:
        """End the sign-in of ``digest`` (nothing when there is none)."""
        ...


@dataclass
class VerifySnapshot:
    """What ``saga verify`` checks, read in one snapshot: each saga's events, summary, timers and its rows
    waiting in any outbox (the orchestrator's and each participant's, parked ones too)."""

    events: dict[str, list[StoredEvent]] = field(default_factory=dict)
    summaries: dict[str, SagaSummaryRow] = field(default_factory=dict)
    timers: dict[str, list[TimerView]] = field(default_factory=dict)
    outbox_rows: dict[str, dict[str, int]] = field(default_factory=dict)  # saga id → outbox table → rows
    now_ms: int = 0


class VerifyStore(Protocol):
    """What ``operations.verify`` reads."""

    async def snapshot(self, saga_ids: Collection[str] | None) -> VerifySnapshot:
        """Every saga (or ``saga_ids``) as stored, in one snapshot; empty when nothing ran here yet."""
        ...

    async def count_effects(self, participants: Sequence[Participant], saga_id: str) -> dict[str, dict[str, int]]:
        """participant → count name → value for ``saga_id`` (``participants.kit.effects``)."""
        ...

    async def duplicate_effects(self, participants: Sequence[Participant]) -> dict[str, dict[str, int]]:
        """Per declared table, the ``{saga_id}:{step}`` keys with more than one business row, and how many."""
        ...


@dataclass(frozen=True)
class RetryTimer:
    """A timer of a saga whose compensation of ``step`` is retrying."""

    saga_id: str
    saga_type: str
    step: str


class SignalStore(Protocol):
    """What the orchestrator's table signals read (``orchestrator.signals``); tables that hold live work only."""

    async def overdue_timers(self) -> tuple[int, float]:
        """How many timers are past due, and how long past due the most overdue one is (s; 0 when none)."""
        ...

    async def oldest_running(self) -> dict[str, float]:
        """Saga type → age (s, from its start) of its oldest RUNNING saga; types without one are absent."""
        ...

    async def retry_timers(self, kinds: Sequence[str], timeout_kind: str, limit: int) -> list[RetryTimer]:
        """At most ``limit`` timers, the earliest due first, of ``kinds``, or of ``timeout_kind`` past the first
        attempt."""
        ...

    async def events_of(self, saga_ids: Collection[str], event_types: Collection[str]) -> list[StoredEvent]:
        """The events of ``event_types`` of ``saga_ids``, by saga id then seq."""
        ...


# -- levers, the operator audit, bulk jobs, dead letters --


@dataclass(frozen=True)
class AuditEntry:
    """One row of the operator audit: who (``operator``) did what (``action``) to what (``target``, e.g. "saga
    t-1"), with what (``detail``) and what came of it (``outcome``); ``at_ms``: when it was written (0 before);
    ``entry_id``: its number in the audit, larger for a later entry (0 before)."""

    operator: str
    action: str
    target: str
    detail: Mapping[str, Any]
    outcome: str
    at_ms: int = 0
    entry_id: int = 0


class AuditStore(Protocol):
    """The operator audit: every action taken through the console or its API, refused ones too."""

    async def record(self, entry: AuditEntry) -> None:
        """Add ``entry`` (its time is the store's now)."""

    async def entries(self, limit: int, before: int | None = None) -> list[AuditEntry]:
        """The latest ``limit`` entries, newest first; ``before``: only those numbered below it (keyset paging:
        the ``entry_id`` of the previous page's last entry)."""


class LeverStore(AuditStore, Protocol):
    """What a lever writes: its control commands into the orchestrator's outbox (its relay publishes them on
    saga.control) and its audit entry."""

    async def queue_lever(self, entry: AuditEntry, commands: Sequence[OutboxMessage], shards: Sequence[int]) -> None:
        """Write ``entry`` and ``commands`` (in outbox ``shards``, one per command) in one transaction: a lever is
        never published unaudited nor audited unpublished. Nothing is written when it raises."""


class BatchWork(Protocol):
    """What a bulk job's batch needs of its use-case (``operations.bulk_jobs.BulkRunner``), asked by the store
    inside the batch's transaction."""

    def criteria(self, job: BulkJob) -> Criteria:
        """What the job selects; BulkJobError fails the job with its message."""

    def size(self, job: BulkJob) -> int:
        """How many sagas the job's next batch takes."""

    def commands(self, job: BulkJob, sagas: Sequence[tuple[str, str]]) -> list[OutboxMessage]:
        """The outbox rows for ``sagas`` ((saga id, saga type)); fewer when some cannot be written."""

    def shards(self, messages: Sequence[OutboxMessage]) -> list[int]:
        """The outbox shard of each row."""

    def ended(self, job: BulkJob, error: str | None) -> None:
        """The batch ended the job: DONE, or FAILED with ``error``."""


class BulkJobStore(Protocol):
    """Bulk jobs and the sagas they select, from the read model."""

    async def count(self, criteria: Criteria, sample: int) -> Count:
        """How many sagas started by now match ``criteria``, and the first ``sample`` ids in saga id order."""

    async def create(self, job: NewJob, criteria: Criteria) -> BulkJob | None:
        """Record a RUNNING job, its total what ``criteria`` matches now (in the same transaction); None, and
        nothing recorded, when nothing matches."""

    async def jobs(self, limit: int) -> list[BulkJob]:
        """The latest ``limit`` jobs, newest first."""

    async def job(self, job_id: int) -> BulkJob | None:
        """Job ``job_id``, or None."""

    async def cancel(self, job_id: int, operator: str) -> BulkJob | None:
        """Mark RUNNING job ``job_id`` CANCELLED by ``operator``; None when there is no RUNNING job of that id."""

    async def run_batch(self, work: BatchWork) -> int | None:
        """In one transaction: take the RUNNING job that is due first (one instance per job at a time), the
        next ``work.size`` sagas matching its criteria as of its start after its cursor, queue ``work.commands``
        in the outbox, move the cursor, the counts and the time the next batch may go (the batch's size over the
        job's rate), DONE when the batch was short. A job whose criteria fail is FAILED with the error. How
        many commands were queued; None when no job was due."""

    async def seconds_to_next(self) -> float | None:
        """How long until the earliest RUNNING job is due (negative: overdue); None when none runs."""


# -- the read model rebuilt from the events (``saga reproject``) --


class ReprojectionStore(Protocol):
    """What ``operations.reprojection`` reads and repairs: every saga's events, their read-model rows."""

    def iter_events(self, batch_size: int = 1000) -> AsyncIterator[StoredEvent]:
        """Every stored event by (saga_id, seq)."""
        ...

    async def summaries_of(self, saga_ids: Sequence[str]) -> dict[str, SagaSummaryRow]:
        """The read model's rows of these sagas (those that have one)."""
        ...

    async def remove_orphan_summaries(self, dry_run: bool = False) -> int:
        """Delete (or with ``dry_run`` count) read-model rows of sagas without events; how many."""
        ...

    def begin(self) -> AbstractAsyncContextManager[UnitOfWork]:
        """One transaction: its writes become visible together at commit (``orchestrator.ports.UnitOfWork``)."""
        ...
