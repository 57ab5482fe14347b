"""A batch of messages in one unit of work has exactly the effect of the same messages handled one by one.

The service is driven through whole trip sagas on the in-memory store twice — once message by message,
once in batches mixing sagas (and several messages of one saga, and duplicates) — and every stored fact
must come out identical: events, outbox rows in order, timers, summaries, inbox, outcomes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from saga_orchestrator.orchestrator.inbound import CLIENT_IDS, REPLY_IDS, Envelope
from saga_orchestrator.orchestrator.ports import ConcurrencyConflict
from saga_orchestrator.orchestrator.service import Outcome, SagaService
from saga_orchestrator.orchestrator.store.memory import MemoryStore, MemoryUnitOfWork
from saga_orchestrator.participants.trip import PARTICIPANTS
from saga_orchestrator.participants.trip.definition import trip_definitions
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.message_types import ResultStatus, StepResult
from saga_orchestrator.schemas.topics import Topics

T0 = 1_700_000_000_000
TOPICS = Topics("t.")
SAGAS = [f"trip-{n}" for n in range(6)]


def start(saga_id: str) -> Envelope:
    return Envelope(SCENARIOS["happy"].start(saga_id), f"start:{saga_id}", inbox_key=(CLIENT_IDS, f"start:{saga_id}"))


def replies(store: MemoryStore, fail: frozenset[str] = frozenset()) -> list[Envelope]:
    """A reply to every command in the outbox (drained): success, or failure for steps named in ``fail``."""
    results = []
    for message in store.drain_outbox():
        participant = next((p for p in PARTICIPANTS if message.topic == TOPICS.commands(p)), None)
        if participant is None:
            continue
        command = wire.decode_command(message.value, participant=participant, message_id=message.message_id)
        failed = command.step in fail
        result = StepResult(saga_id=command.saga_id, step=command.step, kind=command.kind,
                            idempotency_key=command.idempotency_key, attempt=command.attempt,
                            status=ResultStatus.FAILED if failed else ResultStatus.SUCCEEDED,
                            error_type="CardDeclined" if failed else None)
        reply_id = f"{command.idempotency_key}:reply:{command.attempt}"
        results.append(Envelope(result, reply_id, inbox_key=(REPLY_IDS, reply_id)))
    return results


class Recorder:
    """Runs rounds of messages through a service and keeps what the store saw, outbox included."""

    def __init__(self, store: MemoryStore | None = None) -> None:
        self.store = store or MemoryStore(clock_ms=lambda: T0)
        self.service = SagaService(self.store, trip_definitions(), TOPICS, lambda: T0)
        self.outbox: list[tuple[str, str, str]] = []
        self.outcomes: list[Outcome] = []

    async def round(self, envelopes: Sequence[Envelope], batched: bool, fail: frozenset[str] = frozenset()
                    ) -> list[Envelope]:
        if batched:
            self.outcomes += await self.service.handle_many(envelopes)
        else:
            for envelope in envelopes:
                self.outcomes.append(await self.service.handle(envelope))
        self.outbox += [(m.topic, m.key, m.message_id) for _, m in self.store.outbox]
        return replies(self.store, fail)

    def facts(self) -> tuple[object, ...]:
        store = self.store
        events = {sid: [(e.seq, e.event_type, e.body) for e in evs] for sid, evs in store.events.items()}
        return (events, self.outbox, dict(store.timers), dict(store.summaries), store.inbox, self.outcomes)


async def drive(recorder: Recorder, batched: bool, fail: frozenset[str] = frozenset()) -> None:
    starts = [start(s) for s in SAGAS]
    pending = await recorder.round([*starts, starts[0]], batched, fail)  # one StartSaga delivered twice
    while pending:
        # every reply of this round, plus a redelivery of the first one, in one batch
        pending = await recorder.round([*pending, pending[0]], batched, fail)


async def test_a_batch_has_the_effect_of_its_messages_one_by_one() -> None:
    one_by_one, batched = Recorder(), Recorder()
    await drive(one_by_one, batched=False)
    await drive(batched, batched=True)
    assert batched.facts() == one_by_one.facts()
    assert {s.status for s in batched.store.summaries.values()} == {"COMPLETED"}
    assert batched.outcomes.count(Outcome.DUPLICATE) == 4  # the repeated start and one reply per round


async def test_a_failing_batch_compensates_like_one_by_one() -> None:
    one_by_one, batched = Recorder(), Recorder()
    await drive(one_by_one, batched=False, fail=frozenset({"charge_card"}))
    await drive(batched, batched=True, fail=frozenset({"charge_card"}))
    assert batched.facts() == one_by_one.facts()
    assert {s.status for s in batched.store.summaries.values()} == {"COMPENSATED"}


class ConflictOnce(MemoryStore):
    """A store whose first multi-saga unit of work loses a race at commit."""

    def __init__(self) -> None:
        super().__init__(clock_ms=lambda: T0)
        self.conflicts = 0

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[MemoryUnitOfWork]:
        async with super().begin() as uow:
            yield uow
            if self.conflicts == 0 and len({sid for sid, _ in uow._events}) > 1:
                self.conflicts += 1
                raise ConcurrencyConflict("a concurrent writer won")


async def test_after_a_conflict_a_batch_is_retried_saga_by_saga() -> None:
    one_by_one, retried = Recorder(), Recorder(ConflictOnce())
    await drive(one_by_one, batched=False)
    await drive(retried, batched=True)
    assert isinstance(retried.store, ConflictOnce) and retried.store.conflicts == 1
    assert retried.facts() == one_by_one.facts()


async def test_every_conflict_is_counted() -> None:
    conflicts: list[int] = []
    retried = Recorder(ConflictOnce())
    retried.service = SagaService(retried.store, trip_definitions(), TOPICS, lambda: T0,
                                  on_conflict=lambda: conflicts.append(1))
    await drive(retried, batched=True)
    assert len(conflicts) == 1  # saga_concurrency_conflicts_total: the one lost race, no more


async def test_due_timers_fire_in_one_unit_of_work() -> None:
    now = [T0]
    store = MemoryStore(clock_ms=lambda: now[0])
    service = SagaService(store, trip_definitions(), TOPICS, lambda: now[0])
    await service.handle_many([start(s) for s in SAGAS])
    store.drain_outbox()
    now[0] += 60_000  # every step timeout is due
    assert await service.fire_due_timers(limit=100) == 2 * len(SAGAS)  # flight and hotel of each saga
    timed_out = [e for events in store.events.values() for e in events if e.event_type == "StepTimedOut"]
    assert len(timed_out) == 2 * len(SAGAS)
    assert store.drain_outbox() != [] and await service.next_timer_due_ms() is None  # they wait for the answers


async def test_timers_due_after_the_read_horizon_wait() -> None:
    now = [T0]
    store = MemoryStore(clock_ms=lambda: now[0])
    service = SagaService(store, trip_definitions(), TOPICS, lambda: now[0])
    await service.handle_many([start(s) for s in SAGAS])
    store.drain_outbox()
    now[0] += 60_000  # every step timeout is due by the clock...
    # ...but the results read so far reach only to just after the start: a reply may still be unread.
    assert await service.fire_due_timers(limit=100, due_by_ms=T0 + 1) == 0
    assert not [e for events in store.events.values() for e in events if e.event_type == "StepTimedOut"]
    assert await service.fire_due_timers(limit=100, due_by_ms=now[0]) == 2 * len(SAGAS)


async def test_every_commit_is_announced_to_on_commit() -> None:
    commits: list[int] = []
    store = MemoryStore(clock_ms=lambda: T0)
    service = SagaService(store, trip_definitions(), TOPICS, lambda: T0, on_commit=lambda: commits.append(1))
    await service.handle_many([start(s) for s in SAGAS])
    assert commits == [1]  # one unit of work for the batch
    await service.handle(start(SAGAS[0]))  # a duplicate still commits its inbox claim
    assert len(commits) == 2
