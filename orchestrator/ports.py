"""Ports of the orchestrator's storage: what the service needs, not how a database provides it.

Adapters: ``orchestrator.store.postgres`` (production) and ``orchestrator.store.memory`` (tests, demos).
Both pass the same contract suite (``tests/contract/test_store_contract.py``).

Times are epoch milliseconds everywhere in these types; adapters convert.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from ..outbox.table import OutboxMessage

__all__ = [
    "ConcurrencyConflict",
    "EventReader",
    "OutboxMessage",
    "SagaSummaryRow",
    "StoredEvent",
    "TimerQueue",
    "TimerRow",
    "UnitOfWork",
    "UnitOfWorkFactory",
    "Writes",
]


class ConcurrencyConflict(Exception):
    """Another writer appended the same (saga_id, seq), or claimed the same inbox message, first.

    Retryable: roll back, reload the saga and decide again (a redelivered message then finds its inbox
    row and is skipped).
    """

    retriable = True


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


@dataclass(frozen=True)
class Writes:
    """Every write of a batch of decisions, for ``UnitOfWork.write`` (applied in this field order)."""

    deleted_timers: Sequence[tuple[str, str]] = ()  # (saga_id, timer_id)
    events: Sequence[StoredEvent] = ()
    outbox: Sequence[OutboxMessage] = ()
    timers: Sequence[TimerRow] = ()
    summaries: Sequence[SagaSummaryRow] = ()


class TimerQueue(Protocol):
    """Due timers, claimed safely when several orchestrator instances run the scheduler.

    Chosen design: claim = delete, inside the unit of work that handles the timers. ``claim_due`` deletes
    the due rows it returns, skipping rows another open transaction has claimed (Postgres:
    ``DELETE ... WHERE ... IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING``). Handling the timer (events,
    outbox, new timers) happens in the same unit of work, so:

    - commit → the timer is gone and its effects are recorded, atomically;
    - rollback or crash → the timer row is back, due, and any instance fires it again;
    - two instances never fire the same timer concurrently (the second skips the locked row).

    A timer handled in a unit of work that also re-schedules the same ``timer_id`` simply upserts it again.
    """

    async def claim_due(self, now_ms: int, limit: int) -> list[TimerRow]:
        """Claim (and delete, pending commit) up to ``limit`` timers with ``due_at_ms <= now_ms``,
        earliest first."""
        ...


class UnitOfWork(TimerQueue, Protocol):
    """One database transaction: every write becomes visible at commit, or none does.

    Reads see this transaction's own writes (read-your-writes) and committed data of others.
    """

    async def claim_message(self, consumer: str, message_id: str) -> bool:
        """Record ``message_id`` as processed by ``consumer`` (inbox). False if it already was: the caller
        skips the message. May raise ConcurrencyConflict when a concurrent transaction claims it too."""
        ...

    async def load_events(self, saga_id: str, after_seq: int = 0) -> list[StoredEvent]:
        """The saga's events with ``seq > after_seq``, in seq order ([] for an unknown saga)."""
        ...

    async def claim_messages(self, consumer: str, message_ids: Sequence[str]) -> set[str]:
        """``claim_message`` for many ids in one go: returns the ids claimed now (an id given twice is
        claimed once; ids already processed are left out)."""
        ...

    async def load_events_after(self, after_seq: Mapping[str, int]) -> dict[str, list[StoredEvent]]:
        """``load_events`` for many sagas in one go: per saga id, its events with ``seq`` greater than the
        mapped value, in seq order; sagas with no such event are absent from the result."""
        ...

    async def append_events(self, events: Sequence[StoredEvent]) -> None:
        """Append events. Raises ConcurrencyConflict if any (saga_id, seq) already exists — now or at
        commit; the (saga_id, seq) key is what stops two writers of one saga from both appending seq N."""
        ...

    async def add_outbox(self, messages: Sequence[OutboxMessage]) -> None:
        """Queue messages for the relay; they are published only if this unit of work commits."""
        ...

    async def schedule_timers(self, timers: Sequence[TimerRow]) -> None:
        """Insert or replace timers by (saga_id, timer_id); the last of duplicates in one call wins."""
        ...

    async def delete_timer(self, saga_id: str, timer_id: str) -> None:
        """Cancel a timer; no error if it does not exist."""
        ...

    async def claim_and_load(self, consumer: str, message_ids: Sequence[str], after_seq: Mapping[str, int]
                             ) -> tuple[set[str], dict[str, list[StoredEvent]]]:
        """``claim_messages`` and ``load_events_after`` together (one round trip where the adapter can).

        The events may be read before a concurrent claim of one of the ids was waited for; a decision
        taken from such a read cannot commit (its seq is taken), so the caller retries, as after any
        conflict.
        """
        ...

    async def write(self, writes: Writes) -> None:
        """Every part of ``writes`` (one round trip where the adapter can), with the effects and errors of
        ``delete_timers``, ``append_events``, ``add_outbox``, ``schedule_timers`` and ``upsert_summaries``
        called in that order."""
        ...

    async def delete_timers(self, keys: Sequence[tuple[str, str]]) -> None:
        """Cancel many timers given as (saga_id, timer_id); missing ones are ignored, and so are timers another
        open unit of work has claimed (they are being fired: waiting for that unit of work could deadlock
        with it, and a fired obsolete timer is harmless)."""
        ...

    async def upsert_summary(self, summary: SagaSummaryRow) -> None:
        """Insert or update the saga's summary row. An update with a lower ``last_seq`` than the stored
        row is ignored, so a late writer cannot move the projection backwards."""
        ...

    async def upsert_summaries(self, summaries: Sequence[SagaSummaryRow]) -> None:
        """``upsert_summary`` for many rows in one go (several rows of one saga: the highest ``last_seq``
        wins, as if applied one by one)."""
        ...


class UnitOfWorkFactory(Protocol):
    """Starts units of work."""

    def begin(self) -> AbstractAsyncContextManager[UnitOfWork]:
        """``async with factory.begin() as uow:`` — commits on normal exit, rolls back on exception.

        The commit itself may raise ConcurrencyConflict (an adapter that checks conflicts late).
        """
        ...


class EventReader(Protocol):
    """Read-only queries for the CLI and audits (outside any unit of work)."""

    async def get_summary(self, saga_id: str) -> SagaSummaryRow | None:
        """The summary of one saga, or None."""
        ...

    async def list_summaries(
        self,
        *,
        status: str | None = None,
        saga_type: str | None = None,
        tenant_id: str | None = None,
        updated_before_ms: int | None = None,
        limit: int = 100,
    ) -> list[SagaSummaryRow]:
        """Summaries matching every given filter, least recently updated first (so "RUNNING and not
        updated for 5 minutes" lists the most stuck sagas first)."""
        ...

    async def count_by_status(self) -> dict[str, int]:
        """Number of sagas per status."""
        ...

    async def load_events(self, saga_id: str) -> list[StoredEvent]:
        """All events of one saga in seq order."""
        ...

    def iter_events(self, batch_size: int = 1000) -> AsyncIterator[StoredEvent]:
        """Every stored event, ordered by (saga_id, seq), fetched ``batch_size`` at a time."""
        ...
