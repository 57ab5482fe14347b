"""One contract for the storage ports, run against every adapter (in-memory and Postgres).

An adapter passes when it behaves like a single transactional store: ordered event streams, optimistic
concurrency on (saga_id, seq), inbox dedup, all-or-nothing units of work, safely claimable timers and a
forward-only summary projection.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import asyncpg
import orjson
import pytest

from saga_orchestrator.cli.scenarios import SCENARIOS
from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.envelope import Envelope
from saga_orchestrator.orchestrator.ports import (
    ConcurrencyConflict,
    EventReader,
    OutboxMessage,
    SagaSummaryRow,
    StoredEvent,
    TimerRow,
    UnitOfWorkFactory,
)
from saga_orchestrator.orchestrator.sagas.trip import TRIP
from saga_orchestrator.orchestrator.service import SagaService
from saga_orchestrator.orchestrator.store.memory import MemoryStore
from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import SagaCancelRequested
from saga_orchestrator.schemas.topics import Topics

T0 = 1_700_000_000_000  # a fixed epoch-ms origin: timer and summary times are data, not the clock


class Store(UnitOfWorkFactory, EventReader, Protocol):
    """Both ports, as one type for the tests (every adapter implements both)."""


@dataclass
class Harness:
    store: Store
    outbox: Callable[[], Awaitable[list[OutboxMessage]]]  # committed outbox rows, id order
    reset: Callable[[], Awaitable[None]]


@pytest.fixture(scope="module")
async def pg_pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, 4)
    await migrate(pool)
    yield pool
    await pool.close()


def _memory_harness() -> Harness:
    store = MemoryStore()

    async def outbox() -> list[OutboxMessage]:
        return [message for _, message in store.outbox]

    async def reset() -> None:
        pass  # a fresh MemoryStore per test

    return Harness(store, outbox, reset)


def _postgres_harness(pool: asyncpg.Pool) -> Harness:
    async def outbox() -> list[OutboxMessage]:
        rows = await pool.fetch(
            "SELECT topic, message_key, value, headers::text AS headers, message_id"
            " FROM saga.outbox ORDER BY id"
        )
        return [
            OutboxMessage(
                r["topic"], r["message_key"], r["value"], orjson.loads(r["headers"]), r["message_id"]
            )
            for r in rows
        ]

    async def reset() -> None:
        await pool.execute("TRUNCATE saga.events, saga.inbox, saga.outbox, saga.timers, saga.saga_summary")

    return Harness(PostgresStore(pool), outbox, reset)


@pytest.fixture(params=["memory", "postgres"])
def harness_factory(request: pytest.FixtureRequest) -> Harness:
    if request.param == "memory":
        return _memory_harness()
    return _postgres_harness(request.getfixturevalue("pg_pool"))


@pytest.fixture
async def h(harness_factory: Harness) -> Harness:
    await harness_factory.reset()
    return harness_factory


def saga_id() -> str:
    return f"saga-{uuid.uuid4().hex[:8]}"


def ev(sid: str, seq: int, event_type: str = "StepSucceeded") -> StoredEvent:
    return StoredEvent(saga_id=sid, seq=seq, event_type=event_type, body=f"{sid}/{seq}".encode())


def msg(sid: str, n: int) -> OutboxMessage:
    return OutboxMessage("saga.events", sid, b"v%d" % n, {"saga_id": sid}, f"{sid}:event:{n}")


def timer(sid: str, name: str, due_at_ms: int, attempt: int = 1) -> TimerRow:
    return TimerRow(sid, f"STEP_TIMEOUT:{name}:{attempt}", "STEP_TIMEOUT", name, attempt, due_at_ms)


def summary(sid: str, status: str, updated: int, last_seq: int, saga_type: str = "trip") -> SagaSummaryRow:
    return SagaSummaryRow(sid, saga_type, "tenant-1", status, T0, updated, last_seq)


# --- events ---------------------------------------------------------------------------------------------


async def test_events_load_in_seq_order_with_read_your_writes(h: Harness) -> None:
    sid = saga_id()
    async with h.store.begin() as uow:
        assert await uow.load_events(sid) == []
        await uow.append_events([ev(sid, 1), ev(sid, 2)])
        assert [e.seq for e in await uow.load_events(sid)] == [1, 2]
    async with h.store.begin() as uow:
        await uow.append_events([ev(sid, 4), ev(sid, 3)])
        assert [e.seq for e in await uow.load_events(sid, after_seq=2)] == [3, 4]
    loaded = await h.store.load_events(sid)
    assert [(e.seq, e.body) for e in loaded] == [(n, f"{sid}/{n}".encode()) for n in (1, 2, 3, 4)]
    assert all(e.recorded_at_ms is not None and e.event_type == "StepSucceeded" for e in loaded)
    assert await h.store.load_events(saga_id()) == []


async def test_appending_an_existing_seq_conflicts(h: Harness) -> None:
    sid = saga_id()
    async with h.store.begin() as uow:
        await uow.append_events([ev(sid, 1), ev(sid, 2)])
    with pytest.raises(ConcurrencyConflict):
        async with h.store.begin() as uow:
            await uow.append_events([ev(sid, 2, "Other")])
    with pytest.raises(ConcurrencyConflict):
        async with h.store.begin() as uow:
            await uow.append_events([ev(sid, 3), ev(sid, 3)])
    assert [(e.seq, e.event_type) for e in await h.store.load_events(sid)] == [
        (1, "StepSucceeded"),
        (2, "StepSucceeded"),
    ]


async def test_two_writers_of_one_saga_cannot_both_append_the_same_seq(h: Harness) -> None:
    sid = saga_id()
    with pytest.raises(ConcurrencyConflict):
        async with h.store.begin() as late:
            assert await late.load_events(sid) == []  # both decide from the same (empty) history
            async with h.store.begin() as early:
                assert await early.load_events(sid) == []
                await early.append_events([ev(sid, 1, "SagaStarted")])
            await late.append_events([ev(sid, 1, "SagaRejected")])
            # an adapter may detect the conflict only at commit: the block ends normally to commit
    events = await h.store.load_events(sid)
    assert [(e.seq, e.event_type) for e in events] == [(1, "SagaStarted")]


# --- inbox ----------------------------------------------------------------------------------------------


async def test_inbox_claims_a_message_once_per_consumer(h: Harness) -> None:
    async with h.store.begin() as uow:
        assert await uow.claim_message("orchestrator", "m-1") is True
        assert await uow.claim_message("orchestrator", "m-1") is False
    async with h.store.begin() as uow:
        assert await uow.claim_message("orchestrator", "m-1") is False
        assert await uow.claim_message("auditor", "m-1") is True
        assert await uow.claim_message("orchestrator", "m-2") is True


# --- atomicity ------------------------------------------------------------------------------------------


async def test_rollback_discards_every_write(h: Harness) -> None:
    sid = saga_id()
    async with h.store.begin() as uow:
        await uow.schedule_timers([timer(sid, "committed", T0)])
    with pytest.raises(RuntimeError):
        async with h.store.begin() as uow:
            assert await uow.claim_message("orchestrator", "m-1")
            await uow.append_events([ev(sid, 1)])
            await uow.add_outbox([msg(sid, 1)])
            await uow.schedule_timers([timer(sid, "new", T0)])
            assert len(await uow.claim_due(T0, 10)) == 2
            await uow.upsert_summary(summary(sid, "RUNNING", T0, 1))
            raise RuntimeError("handler failed")
    assert await h.store.load_events(sid) == []
    assert await h.outbox() == []
    assert await h.store.get_summary(sid) is None
    async with h.store.begin() as uow:
        assert [t.step for t in await uow.claim_due(T0, 10)] == ["committed"]
        assert await uow.claim_message("orchestrator", "m-1") is True


async def test_a_conflict_discards_the_unit_of_works_other_writes(h: Harness) -> None:
    sid = saga_id()
    async with h.store.begin() as uow:
        await uow.append_events([ev(sid, 1)])
    with pytest.raises(ConcurrencyConflict):
        async with h.store.begin() as uow:
            assert await uow.claim_message("orchestrator", "m-9")
            await uow.add_outbox([msg(sid, 9)])
            await uow.append_events([ev(sid, 1)])
    assert await h.outbox() == []
    async with h.store.begin() as uow:
        assert await uow.claim_message("orchestrator", "m-9") is True


async def test_outbox_rows_appear_on_commit_in_order(h: Harness) -> None:
    a, b = saga_id(), saga_id()
    async with h.store.begin() as uow:
        await uow.add_outbox([msg(a, 1), msg(b, 1), msg(a, 2)])
    async with h.store.begin() as uow:
        await uow.add_outbox([msg(b, 2)])
        await uow.add_outbox([])
    rows = await h.outbox()
    assert [m.message_id for m in rows] == [f"{a}:event:1", f"{b}:event:1", f"{a}:event:2", f"{b}:event:2"]
    assert rows[0] == msg(a, 1)


# --- timers ---------------------------------------------------------------------------------------------


async def test_claim_due_returns_due_timers_earliest_first_and_removes_them(h: Harness) -> None:
    a, b = saga_id(), saga_id()
    async with h.store.begin() as uow:
        await uow.schedule_timers(
            [timer(a, "s2", T0 + 200), timer(b, "s1", T0 + 100), timer(a, "late", T0 + 10_000)]
        )
    async with h.store.begin() as uow:
        assert await uow.claim_due(T0 + 50, 10) == []
        claimed = await uow.claim_due(T0 + 500, 1)
        assert claimed == [timer(b, "s1", T0 + 100)]
        assert await uow.claim_due(T0 + 500, 10) == [timer(a, "s2", T0 + 200)]
    async with h.store.begin() as uow:
        assert await uow.claim_due(T0 + 500, 10) == []
        assert await uow.claim_due(T0 + 10_000, 10) == [timer(a, "late", T0 + 10_000)]


async def test_schedule_upserts_and_delete_cancels(h: Harness) -> None:
    sid = saga_id()
    async with h.store.begin() as uow:
        await uow.schedule_timers([timer(sid, "s1", T0 + 100), timer(sid, "s2", T0 + 100)])
    async with h.store.begin() as uow:
        moved = TimerRow(sid, timer(sid, "s1", 0).timer_id, "STEP_TIMEOUT", "s1", 1, T0 + 900)
        await uow.schedule_timers([timer(sid, "s1", T0 + 300), moved])  # last duplicate wins
        await uow.delete_timer(sid, timer(sid, "s2", 0).timer_id)
        await uow.delete_timer(sid, "no-such-timer")
    async with h.store.begin() as uow:
        assert await uow.claim_due(T0 + 800, 10) == []
        assert await uow.claim_due(T0 + 900, 10) == [moved]


async def test_a_claimed_timer_is_invisible_to_other_units_of_work_until_rollback(h: Harness) -> None:
    sid = saga_id()
    async with h.store.begin() as uow:
        await uow.schedule_timers([timer(sid, "s1", T0), timer(sid, "s2", T0 + 1)])
    with pytest.raises(RuntimeError):
        async with h.store.begin() as first:
            assert [t.step for t in await first.claim_due(T0 + 10, 1)] == ["s1"]
            async with h.store.begin() as second:  # another scheduler instance, concurrently
                assert [t.step for t in await second.claim_due(T0 + 10, 10)] == ["s2"]
            raise RuntimeError("first instance crashed while handling s1")
    async with h.store.begin() as uow:
        assert [t.step for t in await uow.claim_due(T0 + 10, 10)] == ["s1"]


# --- summaries and reads --------------------------------------------------------------------------------


async def test_summary_upsert_moves_forward_only_and_lists_by_status_and_age(h: Harness) -> None:
    a, b, c = "saga-a", "saga-b", "saga-c"
    async with h.store.begin() as uow:
        await uow.upsert_summary(summary(a, "RUNNING", T0 + 10, 1))
        await uow.upsert_summary(summary(b, "RUNNING", T0 + 5, 1, saga_type="refund"))
        await uow.upsert_summary(dataclasses.replace(summary(c, "COMPLETED", T0 + 20, 9), tenant_id="tenant-2"))
    done = SagaSummaryRow(
        a, "trip", "tenant-1", "FAILED", T0, T0 + 30, 5, failed_step="pay", reason="declined"
    )
    async with h.store.begin() as uow:
        await uow.upsert_summary(done)
    async with h.store.begin() as uow:
        await uow.upsert_summary(summary(a, "RUNNING", T0 + 40, 4))  # stale projection write: ignored
    assert await h.store.get_summary(a) == done
    assert await h.store.get_summary("saga-none") is None
    assert [s.saga_id for s in await h.store.list_summaries()] == [b, c, a]
    assert [s.saga_id for s in await h.store.list_summaries(status="RUNNING")] == [b]
    assert [s.saga_id for s in await h.store.list_summaries(saga_type="trip")] == [c, a]
    assert [s.saga_id for s in await h.store.list_summaries(updated_before_ms=T0 + 30)] == [b, c]
    assert [s.saga_id for s in await h.store.list_summaries(limit=2)] == [b, c]
    assert [s.saga_id for s in await h.store.list_summaries(tenant_id="tenant-2")] == [c]
    assert [s.saga_id for s in await h.store.list_summaries(tenant_id="tenant-1", saga_type="trip")] == [a]
    assert await h.store.count_by_status() == {"COMPLETED": 1, "FAILED": 1, "RUNNING": 1}


async def test_iter_events_visits_every_event_by_saga_then_seq(h: Harness) -> None:
    sagas = ["saga-b", "saga-a", "saga-c", "saga-A"]
    async with h.store.begin() as uow:
        for sid in sagas:
            await uow.append_events([ev(sid, n) for n in (3, 1, 2)])
    seen = [(e.saga_id, e.seq) async for e in h.store.iter_events(batch_size=2)]
    assert seen == [(sid, n) for sid in sorted(sagas) for n in (1, 2, 3)]


# --- a saga's deadline, through the service ---------------------------------------------------------------

async def test_a_saga_deadline_is_kept_as_a_timer_and_cancels_the_saga_when_it_fires(h: Harness) -> None:
    now = [T0]
    registry = DefinitionRegistry([dataclasses.replace(TRIP, deadline_ms=60_000)])
    service = SagaService(h.store, registry, Topics("t."), lambda: now[0])
    sid = saga_id()
    await service.handle(Envelope(SCENARIOS["happy"].start(sid), f"start:{sid}"))
    now[0] = T0 + 59_999
    fired_before = await service.fire_due_timers(100)  # the steps' timeouts and retries, not the deadline
    now[0] = T0 + 60_000
    while await service.fire_due_timers(100):
        pass
    async with h.store.begin() as uow:
        events = [wire.decode_event(e.body) for e in await uow.load_events(sid)]
    requested = [e for e in events if isinstance(e, SagaCancelRequested)]
    assert fired_before > 0
    assert [e.reason for e in requested] == ["deadline of 60 s passed"]
    assert requested[0].occurred_at == T0 + 60_000
