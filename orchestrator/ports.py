"""Ports of the orchestrator's storage: what the service needs, not how a database provides it.

Adapters: ``orchestrator.store.postgres`` (production) and ``orchestrator.store.memory`` (tests, demos).
Both pass the same contract suite (``tests/contract/test_store_contract.py``).

Times are epoch milliseconds everywhere in these types; adapters convert.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..infra.failures import WriteConflict
from ..outbox.table import OutboxMessage
from .domain.deploys import RunningShape

if TYPE_CHECKING:
    from .domain.definition import SagaDefinition

__all__ = [
    "ConcurrencyConflict",
    "DeadLetterIndex",
    "EventReader",
    "EventsOfSagas",
    "InboxKey",
    "IndexedLetter",
    "LetterFilter",
    "OutboxMessage",
    "PurgeStore",
    "PurgeUnitOfWork",
    "SagaSummaryRow",
    "StatusMark",
    "StoredEvent",
    "TimerRow",
    "UnitOfWork",
    "UnitOfWorkFactory",
    "Writes",
]


class ConcurrencyConflict(WriteConflict):
    """Another writer appended the same (saga_id, seq), or claimed the same inbox message, first.

    Retryable at once (``infra.failures`` classifies it a conflict): roll back, reload the saga and decide
    again (a redelivered message then finds its inbox row and is skipped).
    """


InboxKey = tuple[str, str]
"""A message's key in the inbox: (namespace, message id). Ids a client gives and ids the system derives live in
namespaces of their own (``orchestrator.inbound``), so no client can claim an id the system will use."""


@dataclass(frozen=True)
class StoredEvent:
    """One recorded saga event: ``body`` is the Avro single-object encoding of the domain event.

    ``recorded_at_ms`` is filled in by the store on load; when appending, ``None`` means "now".
    """

    saga_id: str
    seq: int
    event_type: str
    body: bytes
    recorded_at_ms: int | None = None


@dataclass(frozen=True)
class TimerRow:
    """A durable timer; ``timer_id`` is unique within a saga (see ``Timer.timer_id``)."""

    saga_id: str
    timer_id: str
    kind: str
    step: str
    attempt: int
    due_at_ms: int


@dataclass(frozen=True)
class SagaSummaryRow:
    """The read-model row of one saga (a projection of its events)."""

    saga_id: str
    saga_type: str
    tenant_id: str | None
    status: str
    started_at_ms: int
    updated_at_ms: int
    last_seq: int
    failed_step: str | None = None
    reason: str | None = None
    current_step: str | None = None  # orchestrator.domain.model.trouble: the step it waits on, the most failed first
    step_failures: int = 0  # that step's failed or timed-out attempts
    last_error: str | None = None  # the latest of them: its error type, or "timeout"
    definition_version: int | None = None  # the version it started on (None: a row written before 0.3)
    definition_fingerprint: str | None = None  # the shape it started on (SagaDefinition.fingerprint)


@dataclass(frozen=True)
class SearchKey:
    """One business-key field of a saga's input that its definition declares searchable (``searchable=``)."""

    saga_id: str
    field: str
    value: str


@dataclass(frozen=True)
class StatusMark:
    """A new status for a saga's read-model row without a fold of its history (a saga quarantined because its
    history does not fold): the row's other columns stay as they are."""

    saga_id: str
    status: str
    reason: str | None
    last_seq: int
    updated_at_ms: int


@dataclass(frozen=True)
class Writes:
    """Every write of a batch of decisions, for ``UnitOfWork.write`` (applied in this field order)."""

    deleted_timers: Sequence[tuple[str, str]] = ()  # (saga_id, timer_id)
    events: Sequence[StoredEvent] = ()
    outbox: Sequence[OutboxMessage] = ()
    timers: Sequence[TimerRow] = ()
    summaries: Sequence[SagaSummaryRow] = ()
    marks: Sequence[StatusMark] = ()
    search_keys: Sequence[SearchKey] = ()  # written once, when the saga starts
    bulk_refusals: Mapping[int, int] = field(default_factory=dict)  # bulk job id -> its commands refused now


class UnitOfWork(Protocol):
    """One database transaction, as the service uses it: every write becomes visible at commit, or none does.

    Reads see this transaction's own writes (read-your-writes) and committed data of others.
    """

    async def claim_and_load(self, claims: Sequence[InboxKey], after_seq: Mapping[str, int]
                             ) -> tuple[set[InboxKey], dict[str, list[StoredEvent]]]:
        """Record ``claims`` as processed (the inbox) and read the sagas' newer events, in one round trip where
        the adapter can.

        Returns the claims made now (one given twice is claimed once; those already processed are left out:
        the caller skips those messages) and, per saga id, its events with ``seq`` greater than the mapped
        value, in seq order (sagas with no such event are absent). A concurrent claim of the same key either
        waits for the other transaction and then counts as processed, or raises ConcurrencyConflict. The
        events may be read before such a wait; a decision taken from that read cannot commit (its seq is
        taken), so the caller retries, as after any conflict.
        """
        ...

    async def write(self, writes: Writes) -> None:
        """Every part of ``writes``, applied in its field order (one round trip where the adapter can):
        delete the timers (missing ones are ignored, and so are timers another open unit of work has claimed:
        they are being fired, waiting for that unit of work could deadlock with it, and firing an obsolete
        timer is harmless), append the events, queue the outbox rows (published only if this unit of work
        commits, in the given order), insert or replace the timers by (saga_id, timer_id) (the last of
        duplicates wins), upsert the summaries (one with a lower ``last_seq`` than the stored row is
        ignored, so a late writer cannot move the projection backwards; of several rows of one saga the
        highest ``last_seq`` wins) and apply the status marks to the summary rows that exist (likewise never
        backwards).

        Raises ConcurrencyConflict if an event's (saga_id, seq) already exists, now or at commit: the key that
        stops two writers of one saga from both appending seq N.
        """
        ...

    async def claim_timers(self, due: Sequence[TimerRow]) -> list[TimerRow]:
        """Claim (and delete, pending commit) those of ``due`` still stored exactly as given (same kind, step,
        attempt and due time), skipping timers another open unit of work has claimed; the claimed ones, in the
        given order.

        Claiming is deleting, inside the unit of work that handles the timers (Postgres: ``DELETE ... WHERE
        ... IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING``), so: commit → the timer is gone and its
        effects are recorded, atomically; rollback or crash → the timer row is back, due, and any instance
        fires it again; two instances never fire the same timer concurrently, and a timer re-armed or
        removed since it was read is not fired as it was. A unit of work that re-schedules the ``timer_id``
        it handles simply upserts it again.
        """
        ...


class UnitOfWorkFactory(Protocol):
    """Starts units of work."""

    def begin(self) -> AbstractAsyncContextManager[UnitOfWork]:
        """``async with factory.begin() as uow:`` — commits on normal exit, rolls back on exception.

        The commit itself may raise ConcurrencyConflict (an adapter that checks conflicts late).
        """
        ...

    async def due_timers(self, now_ms: int, limit: int, partitions: Collection[int] | None = None) -> list[TimerRow]:
        """Up to ``limit`` stored timers with ``due_at_ms <= now_ms``, earliest first (outside any unit of work:
        a read; ``UnitOfWork.claim_timers`` claims them); with ``partitions``, only timers of sagas on those
        partitions (an instance's share: it fires them against its own read horizon)."""
        ...

    async def next_due_ms(self, partitions: Collection[int] | None = None) -> int | None:
        """When the earliest stored timer (of sagas on ``partitions``, when given) is due (epoch ms), None when
        there is none."""
        ...


class PurgeUnitOfWork(UnitOfWork, Protocol):
    """A unit of work of retention (``orchestrator.retention``): ended sagas give up their events."""

    async def claim_ended(self, statuses: Sequence[str], ended_before_ms: int, limit: int,
                          skip: Sequence[str] = ()) -> list[str]:
        """Lock the read-model rows of up to ``limit`` sagas in ``statuses`` last updated before the cutoff,
        oldest first, passing over rows other units of work hold and the ids in ``skip``; their saga ids."""
        ...

    async def load_events_after(self, after_seq: Mapping[str, int]) -> dict[str, list[StoredEvent]]:
        """Per saga id, its events with ``seq`` greater than the mapped value, in seq order; sagas with no
        such event are absent."""
        ...

    async def delete_events_through(self, through: Mapping[str, int]) -> None:
        """Delete each saga's events up to the mapped seq, and the saga's timers."""
        ...


class PurgeStore(Protocol):
    """Starts the units of work of retention and counts what they would take."""

    def begin(self) -> AbstractAsyncContextManager[PurgeUnitOfWork]:
        """As ``UnitOfWorkFactory.begin``."""
        ...

    async def count_ended(self, statuses: Sequence[str], ended_before_ms: int) -> int:
        """Sagas in ``statuses`` whose read-model row was last updated before the cutoff."""
        ...


class ShapeStore(Protocol):
    """What the orchestrator checks its definitions against at start: the shapes its running sagas started on."""

    async def running_shapes(self) -> list[RunningShape]:
        """The sagas a decision may still move on (``domain.model.UNSETTLED_STATUSES``), by type, version and
        shape."""
        ...

    async def recorded_shapes(self, fingerprints: Collection[str]) -> dict[str, Mapping[str, Any]]:
        """The shapes (``SagaDefinition.shape``) recorded under ``fingerprints``, those known."""
        ...

    async def record_shapes(self, definitions: Sequence[SagaDefinition]) -> None:
        """Keep the shapes of ``definitions`` (a shape already kept stays as it is)."""
        ...

    async def running_histories(self) -> dict[str, list[bytes]]:
        """The stored events (encoded, in seq order) of every saga a decision may still move on
        (``UNSETTLED_STATUSES``, by the read model's status), by saga id: what candidate definitions are checked
        against before a deploy. Ended sagas are not read."""
        ...


class EventReader(Protocol):
    """Read-only queries for the CLI and audits (outside any unit of work)."""

    async def get_summary(self, saga_id: str) -> SagaSummaryRow | None:
        """The summary of one saga, or None."""
        ...

    async def count_by_status(self, timeout_s: float | None = None) -> dict[str, int]:
        """Number of sagas per status (``timeout_s``: give up after that long)."""
        ...

    async def load_events(self, saga_id: str) -> list[StoredEvent]:
        """All events of one saga in seq order."""
        ...

    def iter_events(self, batch_size: int = 1000) -> AsyncIterator[StoredEvent]:
        """Every stored event, ordered by (saga_id, seq), fetched ``batch_size`` at a time."""
        ...


class EventsOfSagas(Protocol):
    """The events of some types in the histories of some sagas, in one read (``PostgresReads``, ``MemoryReads``)."""

    async def events_of(self, saga_ids: Collection[str], event_types: Collection[str]) -> list[StoredEvent]:
        """The events of ``saga_ids`` whose type is one of ``event_types``, by saga then seq."""
        ...


@dataclass(frozen=True)
class IndexedLetter:
    """One record on saga.dlq as the dead-letter index keeps it: its position there, when it was written there and
    when its record failed (the write time for a record that is no readable letter), the fields the lists filter on,
    the record's value (the letter with the original bytes; None for a record without one), when an operator
    last replayed it (None: never), and when an operator last dismissed it (handled without a replay), who and why
    (None: never)."""

    partition: int
    offset: int
    written_at_ms: int
    failed_at_ms: int
    saga_id: str | None
    source_topic: str | None
    reason: str | None
    record: bytes | None
    replayed_at_ms: int | None = None
    dismissed_at_ms: int | None = None
    dismissed_by: str | None = None
    dismiss_reason: str | None = None


@dataclass(frozen=True)
class LetterFilter:
    """Which letters: of ``saga_id``, from ``source`` (a topic), whose reason contains ``reason`` (any case), failed
    at or after ``since_ms``; a None filter passes everything."""

    saga_id: str | None = None
    source: str | None = None
    reason: str | None = None
    since_ms: int | None = None


class DeadLetterIndex(Protocol):
    """The dead letters on saga.dlq, kept by the orchestrator (``orchestrator.dead_letter_index``) and read by the
    operations wing. A letter is keyed by its position on saga.dlq: writing it again changes nothing."""

    async def positions(self) -> dict[int, int]:
        """Per saga.dlq partition, the offset the index has read up to (the next to read)."""
        ...

    async def record(self, letters: Sequence[IndexedLetter], positions: Mapping[int, int]) -> None:
        """Keep ``letters`` (as given, replayed or not; a letter already kept is left as it is) and advance the
        positions read to ``positions``, atomically: a restart reads on from where the rows stop."""
        ...

    async def newest(self, where: LetterFilter, limit: int) -> list[IndexedLetter]:
        """The ``limit`` letters that pass ``where`` and failed last, newest first."""
        ...

    async def at(self, positions: Collection[tuple[int, int]]) -> list[IndexedLetter]:
        """The letters at these (partition, offset) positions (a position without one is left out)."""
        ...

    async def mark_replayed(self, positions: Collection[tuple[int, int]], at_ms: int) -> None:
        """Note that the letters at ``positions`` were replayed at ``at_ms``."""
        ...

    async def dismiss(self, positions: Collection[tuple[int, int]], operator: str, reason: str, at_ms: int) -> None:
        """Note that ``operator`` dismissed the letters at ``positions`` at ``at_ms`` because of ``reason``:
        handled without a replay (a later dismissal replaces an earlier one; a replay later is still allowed)."""
        ...

    async def unhandled(self, after: tuple[int, int, int] | None, since_ms: int | None, before_ms: int | None,
                        limit: int) -> list[IndexedLetter]:
        """Up to ``limit`` letters neither replayed nor dismissed that failed in [``since_ms``, ``before_ms``),
        oldest failure first, after the letter keyed ``after`` (failed at, partition, offset)."""
        ...

    async def count(self) -> int:
        """How many letters the index holds."""
        ...
