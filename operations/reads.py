"""What the console and the command line read: the fleet, the sagas a selection takes, one saga, what waits on an
operator, the dead letters' sagas. One use-case per read, over the ``ReadsStore`` port."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..orchestrator.domain.definition import DefinitionRegistry, SagaDefinition
from ..orchestrator.domain.errors import DomainError
from ..orchestrator.domain.state import SagaState, SagaStatus, fold
from ..orchestrator.domain.waits import PersonWait
from ..orchestrator.ports import SagaSummaryRow
from ..orchestrator.recorded_replays import Replayed, recorded_replays
from ..participants.kit.participant import Participant
from ..schemas import wire
from ..schemas.codec import WireError
from ..schemas.event_types import Event
from ..schemas.registry import SchemaRegistry
from . import bulk_jobs, versions
from .paging import Page, decode_cursor, page_of
from .ports import AGE_BUCKETS, EndedCounts, HeatCell, OutboxView, ReadsStore, SagaFilter, TimerView, WedgedGroup
from .search import parse, searchable_fields

__all__ = ["AGE_BUCKETS", "Deferred", "Fleet", "OutboxView", "Reads", "SagaView", "TimerView", "WedgedGroup"]

FLEET_FRESH_S = 2.0
"""Pages and API calls within this long of a read of the unfinished sagas share it (the fleet page refreshes
every 5 s)."""
ENDED_FRESH_S = 15.0
"""The same for the sagas that ended in the last day: their count is the fleet's large part (every saga of the
day), changes by a small share in this long, and reading it every 2 s beside 200 sagas/s cost the services'
Postgres a measurable share of a core."""
OLDEST_SHOWN = 10
ENDED = tuple(status.value for status in SagaStatus if status.is_terminal)
UNFINISHED = tuple(status.value for status in SagaStatus if not status.is_terminal)
UNDONE = (SagaStatus.COMPENSATED.value, SagaStatus.COMPENSATION_FAILED.value, SagaStatus.CANCELLED.value)
"""The end states reached by compensating: the compensation rate counts them among the ended."""
QUARANTINED = bulk_jobs.Selection(statuses=(SagaStatus.QUARANTINED.value,))


@dataclass(frozen=True)
class Fleet:
    """The fleet at a glance: the unfinished sagas and those that ended in the last day, by type, state and age;
    the oldest unfinished sagas; the compensation rate."""

    cells: list[HeatCell]
    oldest: list[SagaSummaryRow]
    compensation_rate_hour: float | None  # compensated / ended in the last hour; None when none ended
    compensation_rate_day: float | None
    ended_hour: int
    ended_day: int

    def counts(self) -> dict[tuple[str, str], dict[str, int]]:
        """(saga type, state) → age bucket → count, rows in type then state order."""
        table: dict[tuple[str, str], dict[str, int]] = {}
        for cell in sorted(self.cells, key=lambda c: (c.saga_type, c.status)):
            table.setdefault((cell.saga_type, cell.status), {})[cell.bucket] = cell.count
        return table

    def by_status(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for cell in self.cells:
            totals[cell.status] = totals.get(cell.status, 0) + cell.count
        return dict(sorted(totals.items()))


@dataclass
class SagaView:
    """One saga: its events, its folded state (None when it does not fold here, with why), what waits."""

    saga_id: str
    events: list[Event]
    state: SagaState | None
    definition: SagaDefinition | None
    fold_error: str | None
    timers: list[TimerView] = field(default_factory=list)
    outbox: list[OutboxView] = field(default_factory=list)
    recorded_at_ms: dict[int, int] = field(default_factory=dict)  # seq → when it was stored
    persons: dict[str, PersonWait] = field(default_factory=dict)  # step → its command deferred to a person

    def output_of(self, step: str, schemas: SchemaRegistry) -> dict[str, Any] | None:
        """The step's output decoded from Avro (None when it gave none, or its schema is unknown here)."""
        if self.state is None or step not in self.state.steps:
            return None
        raw = self.state.steps[step].output
        if not raw:
            return None
        try:
            return schemas.decode(raw)[1]
        except WireError:
            return None


@dataclass(frozen=True)
class Deferred:
    participant: str
    saga_id: str
    step: str
    action: str
    idempotency_key: str
    deferred_at_ms: int


def saga_filter(selection: bulk_jobs.Selection, definitions: DefinitionRegistry) -> SagaFilter:
    """The store's filter for ``selection``: its participant resolved to the steps it serves. BulkJobError for a
    saga type or participant ``definitions`` do not know."""
    return bulk_jobs.criteria(selection, definitions).filter


class Reads:
    """The operator's reads over ``store``, folding with ``definitions``; ``participants``: whose deferred
    commands are read."""

    def __init__(self, store: ReadsStore, definitions: DefinitionRegistry, schemas: SchemaRegistry,
                 participants: Sequence[Participant] = ()) -> None:
        self.store = store
        self.definitions = definitions
        self.schemas = schemas
        self.participants = list(participants)
        # (when read, monotonic s; what was read), for the unfinished sagas and for the ended ones
        self._unfinished: tuple[float, tuple[list[HeatCell], list[SagaSummaryRow]]] | None = None
        self._ended: tuple[float, tuple[list[HeatCell], EndedCounts]] | None = None
        self._fleet_read = asyncio.Lock()

    async def fleet(self) -> Fleet:
        """Counts by saga type, state and age bucket (of the unfinished sagas and those that ended in the last
        day), the oldest unfinished sagas, the compensation rates. The unfinished sagas are read at most once
        every ``FLEET_FRESH_S``, the ended ones every ``ENDED_FRESH_S``, however many pages and API callers ask
        (its cost to the database stays that of one viewer)."""
        async with self._fleet_read:
            now = time.monotonic()
            if self._unfinished is None or now - self._unfinished[0] >= FLEET_FRESH_S:
                self._unfinished = (now, await self.store.unfinished(UNFINISHED, OLDEST_SHOWN))
            if self._ended is None or now - self._ended[0] >= ENDED_FRESH_S:
                self._ended = (now, await self.store.ended_last_day(ENDED, UNDONE))
            (unfinished, oldest), (ended, counts) = self._unfinished[1], self._ended[1]
        return Fleet(cells=unfinished + ended, oldest=oldest,
                     compensation_rate_hour=counts.undone_hour / counts.hour if counts.hour else None,
                     compensation_rate_day=counts.undone_day / counts.day if counts.day else None,
                     ended_hour=counts.hour, ended_day=counts.day)

    async def sagas(self, selection: bulk_jobs.Selection | None = None, limit: int = 100) -> list[SagaSummaryRow]:
        """Sagas of the read model that ``selection`` takes (every saga when None; the same sagas a bulk job's
        dry run counts), the oldest started first. BulkJobError for a saga type or participant not deployed."""
        return await self.store.list_sagas(None if selection is None else saga_filter(selection, self.definitions),
                                           limit)

    async def saga_page(self, selection: bulk_jobs.Selection | None = None, limit: int = 100,
                        cursor: str | None = None) -> Page[SagaSummaryRow]:
        """One page of ``sagas``: the first ``limit`` after ``cursor`` (a previous page's ``next_cursor``; from the
        start when None). BadCursor for a cursor no page gave; BulkJobError as ``sagas``."""
        after = None if cursor is None else decode_cursor(cursor)
        rows = await self.store.list_sagas(None if selection is None else saga_filter(selection, self.definitions),
                                           limit + 1, after)
        return page_of(rows, limit, lambda row: (row.started_at_ms, row.saga_id))

    async def version_counts(self) -> list[versions.VersionCounts]:
        """How many sagas run and how many ended per saga type and definition version (``operations.versions``)."""
        return await versions.version_counts(self.store)

    async def definition_versions(self) -> list[versions.DefinitionVersion]:
        """Every deployed definition version and every version sagas started on, with their running and ended
        counts."""
        return versions.definition_versions(self.definitions, await self.version_counts())

    async def counts(self) -> dict[str, int]:
        """How many sagas are in each state."""
        return await self.store.count_by_status()

    async def search(self, query: str, limit: int = 100, *, tenant: str | None = None,
                     started_after_ms: int | None = None, started_before_ms: int | None = None
                     ) -> list[SagaSummaryRow]:
        """Sagas whose id is ``query``, or one of whose searchable fields starts with it, whatever the case
        (``field=value``: that field only, when the deployed definitions declare ``field`` searchable); of them
        those of ``tenant`` started in [``started_after_ms``, ``started_before_ms``) when given. The exact
        matches first, then the newest started first (``operations.search``)."""
        fields = {name for names in self.searchable_fields().values() for name in names}
        search = parse(query, fields, tenant=tenant, started_after_ms=started_after_ms,
                       started_before_ms=started_before_ms)
        return [] if search is None else await self.store.search(search, limit)

    def searchable_fields(self) -> dict[str, tuple[str, ...]]:
        """Saga type → the input fields its sagas are found by (those its deployed definitions declare)."""
        return searchable_fields(self.definitions.definitions())

    async def search_keys(self, saga_id: str) -> dict[str, str]:
        return await self.store.search_keys(saga_id)

    async def wedged(self, min_failures: int = 3, per_group: int = 20) -> list[WedgedGroup]:
        """Unfinished sagas whose current step failed or timed out at least ``min_failures`` times, grouped by
        type, step and error, the largest group first."""
        return await self.store.wedged(min_failures, per_group, ENDED)

    async def saga(self, saga_id: str) -> SagaView | None:
        """One saga's events, state, live timers and unpublished outbox rows; None for an unknown id."""
        stored = await self.store.stored_saga(saga_id)
        if stored is None:
            return None
        events = [wire.decode_event(row.body) for row in stored.events]
        view = SagaView(saga_id, events, None, None, None, timers=stored.timers, outbox=stored.outbox,
                        recorded_at_ms={r.seq: r.recorded_at_ms or 0 for r in stored.events})
        try:
            view.definition = self.definitions.for_history(events)
            view.state = fold(view.definition, events)
        except DomainError as error:
            view.fold_error = f"{type(error).__name__}: {error}"
        if view.definition is not None and view.state is not None and not view.state.is_terminal:
            view.persons = await self._persons(saga_id, view.definition)
        return view

    async def _persons(self, saga_id: str, definition: SagaDefinition) -> dict[str, PersonWait]:
        """The saga's commands its participants deferred to a person, by step."""
        names = {step.participant for step in definition.steps if not step.waits}
        found: dict[str, PersonWait] = {}
        for participant in (p for p in self.participants if p.name in names):
            found |= {r.step: PersonWait(participant.name, r.idempotency_key, r.deferred_at_ms, r.answer_by_ms)
                      for r in await self.store.awaiting(participant, saga_id)}
        return found

    async def events_after(self, saga_id: str, after_seq: int) -> list[tuple[int, Event]]:
        """The saga's events after ``after_seq`` (the live timeline's next lines), with when each was stored."""
        return [(r.recorded_at_ms or 0, wire.decode_event(r.body))
                for r in await self.store.events_after(saga_id, after_seq)]

    async def events_before(self, saga_id: str, before_seq: int, limit: int) -> list[tuple[int, Event]]:
        """The saga's last ``limit`` events before ``before_seq`` in seq order (an earlier page of its timeline),
        with when each was stored."""
        return [(r.recorded_at_ms or 0, wire.decode_event(r.body))
                for r in await self.store.events_before(saga_id, before_seq, limit)]

    async def last_seq(self, saga_id: str) -> int | None:
        """The seq of the saga's last event; None for an unknown id."""
        return await self.store.last_seq(saga_id)

    async def message_progress(self, message_id: str) -> str:
        """``ReadsStore.message_progress``: queued, sent, or taken by the orchestrator."""
        return await self.store.message_progress(message_id)

    async def encoded_events(self, saga_id: str) -> list[tuple[int, bytes]]:
        """The saga's events as stored: (seq, Avro single-object encoding), in seq order."""
        return [(r.seq, r.body) for r in await self.store.events_after(saga_id, 0)]

    async def quarantined_page(self, limit: int = 200, cursor: str | None = None) -> Page[SagaSummaryRow]:
        """One page of the quarantined sagas (``saga_page``)."""
        return await self.saga_page(QUARANTINED, limit, cursor)

    async def parked(self) -> list[OutboxView]:
        """Every outbox row the broker refused for good, in the orchestrator's and each participant's outbox."""
        return await self.store.parked()

    async def deferred(self) -> list[Deferred]:
        """The commands each participant of the deployment deferred, waiting for an answer, oldest first."""
        each = await self.store.awaiting_of(self.participants)
        found = [Deferred(name, r.saga_id, r.step, r.action, r.idempotency_key, r.deferred_at_ms)
                 for name, rows in each.items() for r in rows]
        return sorted(found, key=lambda d: d.deferred_at_ms)

    async def saga_statuses(self, saga_ids: Collection[str]) -> dict[str, str]:
        """The status (the read model's) of each of ``saga_ids`` that has a history: a dead letter's replay is
        recorded there, and one of a step's command or reply is held back once the saga ended."""
        return await self.store.saga_statuses(saga_ids)

    async def recorded_replays(self, saga_ids: Collection[str]) -> dict[str, list[Replayed]]:
        """The dead-letter replays the histories of ``saga_ids`` record, by letter position."""
        return await recorded_replays(self.store, saga_ids)

