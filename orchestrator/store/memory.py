"""In-memory adapter of the storage ports, for unit tests and demos.

Same observable semantics as the Postgres adapter (the contract suite runs against both): a unit of work
buffers its writes and applies them at commit, all at once; rollback discards them. Conflicts that Postgres
reports at insert time (duplicate seq, duplicate inbox id) are reported here at insert time when the
committed state already shows them, else at commit. Claimed timers are hidden from other open units of
work, like ``FOR UPDATE SKIP LOCKED`` rows.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from ...schemas.partitioning import partition_for
from ..domain.definition import SagaDefinition
from ..domain.deploys import RunningShape
from ..domain.model import UNSETTLED_STATUSES, SagaStatus
from ..ports import (
    ConcurrencyConflict,
    InboxKey,
    OutboxMessage,
    SagaSummaryRow,
    SearchKey,
    StoredEvent,
    TimerRow,
    Writes,
)

_TimerKey = tuple[str, str]


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class MemoryUnitOfWork:
    """``UnitOfWork`` and ``PurgeUnitOfWork`` whose writes live in this object until ``MemoryStore`` commits
    them."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._events: dict[tuple[str, int], StoredEvent] = {}
        self._inbox: set[tuple[str, str]] = set()
        self._outbox: list[OutboxMessage] = []
        self._timers: dict[_TimerKey, TimerRow | None] = {}  # None = deleted in this unit of work
        self._summaries: dict[str, SagaSummaryRow] = {}
        self._search_keys: list[SearchKey] = []
        self._claimed: set[_TimerKey] = set()
        self._claimed_sagas: set[str] = set()
        self._deleted_through: dict[str, int] = {}

    async def claim_and_load(self, claims: Sequence[InboxKey], after_seq: Mapping[str, int]
                             ) -> tuple[set[InboxKey], dict[str, list[StoredEvent]]]:
        """Claim each new key (committed or claimed here already: not again), then read the events."""
        claimed = set()
        for key in claims:
            if key not in self._store.inbox and key not in self._inbox:
                self._inbox.add(key)
                claimed.add(key)
        return claimed, await self.load_events_after(after_seq)

    async def load_events_after(self, after_seq: Mapping[str, int]) -> dict[str, list[StoredEvent]]:
        """Committed events plus this unit of work's own, in seq order; sagas with no newer event are left out."""
        loaded = {saga_id: self._events_of(saga_id, after) for saga_id, after in after_seq.items()}
        return {saga_id: events for saga_id, events in loaded.items() if events}

    async def write(self, writes: Writes) -> None:
        """Buffer every part, in ``Writes`` field order."""
        for timer_key in writes.deleted_timers:
            if timer_key in self._claimed or timer_key not in self._store.claimed:  # one being fired elsewhere stays
                self._timers[timer_key] = None
        now = self._store.clock_ms()
        for event in writes.events:
            key = (event.saga_id, event.seq)
            if key in self._store.event_keys or key in self._events:
                raise ConcurrencyConflict(f"event {key} already recorded")
            if event.recorded_at_ms is None:
                event = StoredEvent(event.saga_id, event.seq, event.event_type, event.body, now)
            self._events[key] = event
        self._outbox.extend(writes.outbox)
        for timer in writes.timers:
            self._timers[(timer.saga_id, timer.timer_id)] = timer
        for summary in writes.summaries:
            current = self._summaries.get(summary.saga_id) or self._store.summaries.get(summary.saga_id)
            if current is None or current.last_seq <= summary.last_seq:
                self._summaries[summary.saga_id] = summary
        for mark in writes.marks:
            current = self._summaries.get(mark.saga_id) or self._store.summaries.get(mark.saga_id)
            if current is not None and current.last_seq <= mark.last_seq:
                self._summaries[mark.saga_id] = dataclasses.replace(
                    current, status=mark.status, reason=mark.reason, last_seq=mark.last_seq,
                    updated_at_ms=mark.updated_at_ms)
        self._search_keys.extend(writes.search_keys)
        # writes.bulk_refusals: this store keeps no bulk jobs (they run only in the Postgres orchestrator)

    async def claim_timers(self, due: Sequence[TimerRow]) -> list[TimerRow]:
        """Those of ``due`` visible to this unit of work exactly as given and not claimed by another open one;
        deleted here."""
        claimed = []
        for timer in due:
            key = (timer.saga_id, timer.timer_id)
            visible = self._timers[key] if key in self._timers else self._store.timers.get(key)
            if visible != timer or key in self._store.claimed:
                continue
            self._timers[key] = None
            self._claimed.add(key)
            self._store.claimed.add(key)
            claimed.append(timer)
        return claimed

    async def claim_ended(self, statuses: Sequence[str], ended_before_ms: int, limit: int,
                          skip: Sequence[str] = ()) -> list[str]:
        """Summaries of ended sagas, oldest first, passing over those another open unit of work claimed."""
        passed_over = set(skip) | self._store.claimed_sagas
        ended = sorted((s for s in self._store.summaries.values()
                        if s.status in statuses and s.updated_at_ms < ended_before_ms and s.saga_id not in passed_over),
                       key=lambda s: (s.updated_at_ms, s.saga_id))[:limit]
        ids = [summary.saga_id for summary in ended]
        self._claimed_sagas.update(ids)
        self._store.claimed_sagas.update(ids)
        return ids

    async def delete_events_through(self, through: Mapping[str, int]) -> None:
        """Buffer the deletion of each saga's events up to the mapped seq, and of its timers."""
        self._deleted_through.update(through)
        for key in [*self._store.timers, *self._timers]:
            if key[0] in through:
                self._timers[key] = None

    def _events_of(self, saga_id: str, after_seq: int) -> list[StoredEvent]:
        deleted = self._deleted_through.get(saga_id, 0)
        committed = [e for e in self._store.events.get(saga_id, []) if e.seq > max(after_seq, deleted)]
        own = [e for (sid, seq), e in self._events.items() if sid == saga_id and seq > after_seq]
        return sorted(committed + own, key=lambda e: e.seq)

    def _commit(self) -> None:
        """Check conflicts, then apply everything; synchronous, so atomic for other coroutines."""
        store = self._store
        for event_key in self._events:
            if event_key in store.event_keys:
                raise ConcurrencyConflict(f"event {event_key} recorded by a concurrent unit of work")
        for inbox_key in self._inbox:
            if inbox_key in store.inbox:
                raise ConcurrencyConflict(f"message {inbox_key} claimed by a concurrent unit of work")
        for saga_id, seq in self._deleted_through.items():
            store.events[saga_id] = [e for e in store.events.get(saga_id, []) if e.seq > seq]
            store.event_keys -= {(saga_id, n) for n in range(1, seq + 1)}
        for (saga_id, _), event in sorted(self._events.items()):
            store.events.setdefault(saga_id, []).append(event)
            store.event_keys.add((saga_id, event.seq))
        for saga_id in {sid for sid, _ in self._events}:
            store.events[saga_id].sort(key=lambda e: e.seq)
        store.inbox |= self._inbox
        for message in self._outbox:
            store.outbox.append((store.next_outbox_id, message))
            store.next_outbox_id += 1
        for timer_key, timer in self._timers.items():
            if timer is None:
                store.timers.pop(timer_key, None)
            else:
                store.timers[timer_key] = timer
        for saga_id, summary in self._summaries.items():
            current = store.summaries.get(saga_id)
            if current is None or current.last_seq <= summary.last_seq:
                store.summaries[saga_id] = summary
        store.search_keys.update(self._search_keys)

    def _release(self) -> None:
        self._store.claimed -= self._claimed
        self._claimed.clear()
        self._store.claimed_sagas -= self._claimed_sagas
        self._claimed_sagas.clear()


class MemoryStore:
    """``UnitOfWorkFactory``, ``PurgeStore`` and ``EventReader`` over dictionaries; state is public for test
    assertions."""

    def __init__(self, clock_ms: Callable[[], int] = _wall_clock_ms, topic_partitions: int | None = None) -> None:
        self.clock_ms = clock_ms
        self._partitions = tuple(range(topic_partitions)) if topic_partitions else None
        self.events: dict[str, list[StoredEvent]] = {}
        self.event_keys: set[tuple[str, int]] = set()
        self.inbox: set[tuple[str, str]] = set()
        self.outbox: list[tuple[int, OutboxMessage]] = []  # (id, message), id order
        self.next_outbox_id = 1
        self.timers: dict[_TimerKey, TimerRow] = {}
        self.summaries: dict[str, SagaSummaryRow] = {}
        self.search_keys: set[SearchKey] = set()
        self.claimed: set[_TimerKey] = set()  # timers claimed by open units of work
        self.claimed_sagas: set[str] = set()  # ended sagas claimed by open units of work (retention)
        self.shapes: dict[str, Mapping[str, Any]] = {}  # recorded shapes by fingerprint

    async def running_shapes(self) -> list[RunningShape]:
        """``ShapeStore.running_shapes``."""
        counted = Counter((s.saga_type, s.definition_version, s.definition_fingerprint)
                          for s in self.summaries.values() if SagaStatus(s.status) in UNSETTLED_STATUSES)
        return [RunningShape(*key, sagas) for key, sagas in
                sorted(counted.items(), key=lambda item: (item[0][0], item[0][1] or 0, item[0][2] or ""))]

    async def recorded_shapes(self, fingerprints: Collection[str]) -> dict[str, Mapping[str, Any]]:
        """``ShapeStore.recorded_shapes``."""
        return {fingerprint: self.shapes[fingerprint] for fingerprint in fingerprints if fingerprint in self.shapes}

    async def record_shapes(self, definitions: Sequence[SagaDefinition]) -> None:
        """``ShapeStore.record_shapes``."""
        for definition in definitions:
            self.shapes.setdefault(definition.fingerprint, definition.shape())

    async def running_histories(self) -> dict[str, list[bytes]]:
        """``ShapeStore.running_histories``."""
        return {saga_id: [event.body for event in self.events.get(saga_id, [])]
                for saga_id, summary in sorted(self.summaries.items())
                if SagaStatus(summary.status) in UNSETTLED_STATUSES and self.events.get(saga_id)}

    async def due_timers(self, now_ms: int, limit: int, partitions: Collection[int] | None = None) -> list[TimerRow]:
        """Committed due timers (of sagas on ``partitions``, when given), earliest first."""
        return sorted((t for t in self.timers.values() if t.due_at_ms <= now_ms and self.owned(t.saga_id, partitions)),
                      key=lambda t: (t.due_at_ms, t.saga_id, t.timer_id))[:limit]

    async def next_due_ms(self, partitions: Collection[int] | None = None) -> int | None:
        """When the earliest committed timer (of sagas on ``partitions``, when given) is due, None when there is
        none."""
        return min((timer.due_at_ms for timer in self.timers.values() if self.owned(timer.saga_id, partitions)),
                   default=None)

    def owned(self, saga_id: str, partitions: Collection[int] | None) -> bool:
        """Whether a timer of ``saga_id`` belongs to an instance owning ``partitions`` (as the Postgres store:
        every timer when either is unknown)."""
        if partitions is None or self._partitions is None:
            return True
        return partition_for(saga_id.encode(), self._partitions) in partitions

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[MemoryUnitOfWork]:
        """Commit on normal exit (may raise ConcurrencyConflict), discard on exception."""
        uow = MemoryUnitOfWork(self)
        try:
            yield uow
            uow._commit()
        finally:
            uow._release()

    def drain_outbox(self) -> list[OutboxMessage]:
        """Committed outbox messages in id order, removed from the store (what a relay would publish)."""
        messages = [message for _, message in self.outbox]
        self.outbox.clear()
        return messages

    async def count_ended(self, statuses: Sequence[str], ended_before_ms: int) -> int:
        """Sagas in ``statuses`` whose summary was last updated before the cutoff."""
        return sum(1 for s in self.summaries.values() if s.status in statuses and s.updated_at_ms < ended_before_ms)

    async def get_summary(self, saga_id: str) -> SagaSummaryRow | None:
        """The summary of one saga, or None."""
        return self.summaries.get(saga_id)

    async def count_by_status(self, timeout_s: float | None = None) -> dict[str, int]:
        """Number of sagas per status."""
        counts: dict[str, int] = {}
        for summary in self.summaries.values():
            counts[summary.status] = counts.get(summary.status, 0) + 1
        return dict(sorted(counts.items()))

    async def summaries_of(self, saga_ids: Sequence[str]) -> dict[str, SagaSummaryRow]:
        """The read model's rows of these sagas (those that have one)."""
        return {saga_id: self.summaries[saga_id] for saga_id in saga_ids if saga_id in self.summaries}

    async def remove_orphan_summaries(self, dry_run: bool = False) -> int:
        """Delete (or with ``dry_run`` count) read-model rows of sagas without events; how many."""
        orphans = [saga_id for saga_id in self.summaries if not self.events.get(saga_id)]
        if not dry_run:
            for saga_id in orphans:
                del self.summaries[saga_id]
        return len(orphans)

    async def load_events(self, saga_id: str) -> list[StoredEvent]:
        """All committed events of one saga in seq order."""
        return list(self.events.get(saga_id, []))

    async def iter_events(self, batch_size: int = 1000) -> AsyncIterator[StoredEvent]:
        """Every committed event by (saga_id, seq)."""
        for saga_id in sorted(self.events):
            for event in list(self.events[saga_id]):
                yield event
