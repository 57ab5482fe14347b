"""One contract for the storage ports, run against every adapter (in-memory and Postgres).

An adapter passes when it behaves like a single transactional store: ordered event streams, optimistic
concurrency on (saga_id, seq), inbox dedup, all-or-nothing units of work, safely claimable timers and a
forward-only summary projection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol, cast

import asyncpg
import orjson
import pytest

from saga_orchestrator.operations.ports import ReprojectionStore
from saga_orchestrator.operations.reprojection import reproject
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.domain.deploys import RunningShape
from saga_orchestrator.orchestrator.inbound import Envelope
from saga_orchestrator.orchestrator.outbound import summary_of
from saga_orchestrator.orchestrator.ports import (
    ConcurrencyConflict,
    EventReader,
    OutboxMessage,
    PurgeStore,
    PurgeUnitOfWork,
    SagaSummaryRow,
    ShapeStore,
    StoredEvent,
    TimerRow,
    UnitOfWork,
    UnitOfWorkFactory,
    Writes,
)
from saga_orchestrator.orchestrator.retention import purge_ended
from saga_orchestrator.orchestrator.service import SagaService
from saga_orchestrator.orchestrator.store.memory import MemoryStore
from saga_orchestrator.orchestrator.store.postgres import PostgresStore
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import SagaCancelRequested, SagaPurged
from saga_orchestrator.schemas.partitioning import partition_for
from saga_orchestrator.schemas.topics import Topics
from tests.trip_runs import trip_run

T0 = 1_700_000_000_000  # a fixed epoch-ms origin: timer and summary times are data, not the clock


class Store(UnitOfWorkFactory, PurgeStore, EventReader, ReprojectionStore, Protocol):
    """Every port, as one type for the tests (every adapter implements them all)."""

    def begin(self) -> AbstractAsyncContextManager[PurgeUnitOfWork]: ...


PARTITIONS = 4  # the stores record each timer's partition among these


@dataclass
class Harness:
    store: Store
    outbox: Callable[[], Awaitable[list[OutboxMessage]]]  # committed outbox rows, id order
    reset: Callable[[], Awaitable[None]]


def _memory_harness() -> Harness:
    store = MemoryStore(topic_partitions=PARTITIONS)

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
        await pool.execute("TRUNCATE saga.events, saga.inbox, saga.outbox, saga.timers, saga.saga_summary,"
                           " saga.definition_shapes")

    return Harness(PostgresStore(pool, topic_partitions=PARTITIONS), outbox, reset)


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


def events(*rows: StoredEvent) -> Writes:
    return Writes(events=list(rows))


async def load(uow: UnitOfWork, after_seq: dict[str, int]) -> dict[str, list[int]]:
    """The seqs the unit of work reads for these sagas (claiming nothing)."""
    _, loaded = await uow.claim_and_load([], after_seq)
    return {sid: [e.seq for e in rows] for sid, rows in loaded.items()}


async def claim(uow: UnitOfWork, *message_ids: str, consumer: str = "orchestrator") -> set[str]:
    claimed, _ = await uow.claim_and_load([(consumer, message_id) for message_id in message_ids], {})
    assert {namespace for namespace, _ in claimed} <= {consumer}
    return {message_id for _, message_id in claimed}


async def claim_due(h: Harness, uow: UnitOfWork, now_ms: int, limit: int,
                    partitions: set[int] | None = None) -> list[TimerRow]:
    """What the scheduler does: read the due timers, then claim them in the unit of work."""
    return await uow.claim_timers(await h.store.due_timers(now_ms, limit, partitions))


# --- events ---------------------------------------------------------------------------------------------


async def test_events_load_in_seq_order_with_read_your_writes(h: Harness) -> None:
    sid = saga_id()
    async with h.store.begin() as uow:
        assert await load(uow, {sid: 0}) == {}
        await uow.write(events(ev(sid, 1), ev(sid, 2)))
        assert await load(uow, {sid: 0}) == {sid: [1, 2]}
    async with h.store.begin() as uow:
        await uow.write(events(ev(sid, 4), ev(sid, 3)))
        assert await load(uow, {sid: 2}) == {sid: [3, 4]}
    loaded = await h.store.load_events(sid)
    assert [(e.seq, e.body) for e in loaded] == [(n, f"{sid}/{n}".encode()) for n in (1, 2, 3, 4)]
    assert all(e.recorded_at_ms is not None and e.event_type == "StepSucceeded" for e in loaded)
    assert await h.store.load_events(saga_id()) == []


async def test_many_sagas_load_in_one_read_with_read_your_writes(h: Harness) -> None:
    a, b, c = saga_id(), saga_id(), saga_id()
    async with h.store.begin() as uow:
        await uow.write(events(ev(a, 1), ev(a, 2), ev(b, 1)))
    async with h.store.begin() as uow:
        await uow.write(events(ev(a, 3), ev(b, 2)))
        assert await load(uow, {a: 1, b: 0, c: 0}) == {a: [2, 3], b: [1, 2]}
        _, loaded = await uow.claim_and_load([], {a: 0})
        assert all(e.recorded_at_ms is not None for e in loaded[a])
        assert await load(uow, {a: 3}) == {}
        assert await load(uow, {}) == {}


async def test_appending_an_existing_seq_conflicts_and_writes_nothing(h: Harness) -> None:
    sid = saga_id()
    async with h.store.begin() as uow:
        await uow.write(events(ev(sid, 1), ev(sid, 2)))
    with pytest.raises(ConcurrencyConflict):
        async with h.store.begin() as uow:
            await uow.write(Writes(events=[ev(sid, 2, "Other")], outbox=[msg(sid, 2)],
                                   summaries=[summary(sid, "RUNNING", T0, 2)]))
    with pytest.raises(ConcurrencyConflict):
        async with h.store.begin() as uow:
            await uow.write(events(ev(sid, 3), ev(sid, 3)))
    assert [(e.seq, e.event_type) for e in await h.store.load_events(sid)] == [
        (1, "StepSucceeded"),
        (2, "StepSucceeded"),
    ]
    assert await h.outbox() == []
    assert await h.store.get_summary(sid) is None


async def test_two_writers_of_one_saga_cannot_both_append_the_same_seq(h: Harness) -> None:
    sid = saga_id()
    with pytest.raises(ConcurrencyConflict):
        async with h.store.begin() as late:
            assert await load(late, {sid: 0}) == {}  # both decide from the same (empty) history
            async with h.store.begin() as early:
                assert await load(early, {sid: 0}) == {}
                await early.write(events(ev(sid, 1, "SagaStarted")))
            await late.write(events(ev(sid, 1, "SagaRejected")))
            # an adapter may detect the conflict only at commit: the block ends normally to commit
    stored = await h.store.load_events(sid)
    assert [(e.seq, e.event_type) for e in stored] == [(1, "SagaStarted")]


# --- inbox ----------------------------------------------------------------------------------------------


async def test_inbox_claims_a_message_once_per_consumer(h: Harness) -> None:
    async with h.store.begin() as uow:
        assert await claim(uow, "m-1") == {"m-1"}
        assert await claim(uow, "m-1") == set()
    async with h.store.begin() as uow:
        assert await claim(uow, "m-1", "m-2", "m-3", "m-2") == {"m-2", "m-3"}
        assert await claim(uow, "m-3", "m-4") == {"m-4"}
        assert await claim(uow) == set()
        assert await claim(uow, "m-1", consumer="auditor") == {"m-1"}
    async with h.store.begin() as uow:
        assert await claim(uow, "m-1", "m-2", "m-4", "m-5") == {"m-5"}


async def test_claim_and_load_claims_then_reads_in_one_call(h: Harness) -> None:
    a, b = saga_id(), saga_id()
    async with h.store.begin() as uow:
        assert await claim(uow, "m-1") == {"m-1"}
        await uow.write(events(ev(a, 1), ev(a, 2)))
    async with h.store.begin() as uow:
        await uow.write(events(ev(b, 1)))
        claimed, loaded = await uow.claim_and_load(
            [("orchestrator", "m-1"), ("orchestrator", "m-2"), ("orchestrator", "m-2"), ("orchestrator:reply", "m-1")],
            {a: 1, b: 0})
        assert claimed == {("orchestrator", "m-2"), ("orchestrator:reply", "m-1")}  # a namespace of its own
        assert {sid: [e.seq for e in rows] for sid, rows in loaded.items()} == {a: [2], b: [1]}
        assert await uow.claim_and_load([], {}) == (set(), {})


# --- atomicity ------------------------------------------------------------------------------------------


async def test_rollback_discards_every_write(h: Harness) -> None:
    sid = saga_id()
    async with h.store.begin() as uow:
        await uow.write(Writes(timers=[timer(sid, "committed", T0)]))
    with pytest.raises(RuntimeError):
        async with h.store.begin() as uow:
            assert await claim(uow, "m-1") == {"m-1"}
            await uow.write(Writes(events=[ev(sid, 1)], outbox=[msg(sid, 1)], timers=[timer(sid, "new", T0)]))
            assert len(await claim_due(h, uow, T0, 10)) == 1  # the committed one: a new one is not due yet
            await uow.write(Writes(summaries=[summary(sid, "RUNNING", T0, 1)]))
            raise RuntimeError("handler failed")
    assert await h.store.load_events(sid) == []
    assert await h.outbox() == []
    assert await h.store.get_summary(sid) is None
    async with h.store.begin() as uow:
        assert [t.step for t in await claim_due(h, uow, T0, 10)] == ["committed"]
        assert await claim(uow, "m-1") == {"m-1"}


async def test_a_conflict_discards_the_unit_of_works_other_writes(h: Harness) -> None:
    sid = saga_id()
    async with h.store.begin() as uow:
        await uow.write(events(ev(sid, 1)))
    with pytest.raises(ConcurrencyConflict):
        async with h.store.begin() as uow:
            assert await claim(uow, "m-9") == {"m-9"}
            await uow.write(Writes(outbox=[msg(sid, 9)]))
            await uow.write(events(ev(sid, 1)))
    assert await h.outbox() == []
    async with h.store.begin() as uow:
        assert await claim(uow, "m-9") == {"m-9"}


async def test_outbox_rows_appear_on_commit_in_order(h: Harness) -> None:
    a, b = saga_id(), saga_id()
    async with h.store.begin() as uow:
        await uow.write(Writes(outbox=[msg(a, 1), msg(b, 1), msg(a, 2)]))
    async with h.store.begin() as uow:
        await uow.write(Writes(outbox=[msg(b, 2)]))
        await uow.write(Writes())
    rows = await h.outbox()
    assert [m.message_id for m in rows] == [f"{a}:event:1", f"{b}:event:1", f"{a}:event:2", f"{b}:event:2"]
    assert rows[0] == msg(a, 1)


async def test_write_applies_every_part_in_one_call(h: Harness) -> None:
    a, b = saga_id(), saga_id()
    async with h.store.begin() as uow:
        await uow.write(Writes(timers=[timer(a, "old", T0), timer(b, "kept", T0 + 1)],
                               summaries=[summary(b, "RUNNING", T0, 7)]))
    async with h.store.begin() as uow:
        await uow.write(Writes(
            deleted_timers=[(a, "STEP_TIMEOUT:old:1"), (a, "missing")],
            events=[ev(a, 1), ev(a, 2), ev(b, 8)],
            outbox=[msg(b, 3), msg(a, 1), msg(a, 2)],
            timers=[timer(a, "new", T0 + 2), timer(a, "new", T0 + 3)],  # the last of duplicates wins
            summaries=[summary(a, "RUNNING", T0, 2), summary(b, "STALE", T0, 6)],
        ))
    assert [e.seq for e in await h.store.load_events(a)] == [1, 2]
    assert [m.message_id for m in await h.outbox()] == [f"{b}:event:3", f"{a}:event:1", f"{a}:event:2"]
    async with h.store.begin() as uow:
        assert [(t.saga_id, t.step, t.due_at_ms) for t in await claim_due(h, uow, T0 + 10, 10)] == [
            (b, "kept", T0 + 1), (a, "new", T0 + 3)]
    stored_b = await h.store.get_summary(b)
    assert stored_b is not None and (stored_b.status, stored_b.last_seq) == ("RUNNING", 7)


# --- timers ---------------------------------------------------------------------------------------------


async def test_due_timers_come_earliest_first_and_a_claim_removes_them(h: Harness) -> None:
    a, b = saga_id(), saga_id()
    async with h.store.begin() as uow:
        await uow.write(Writes(timers=[timer(a, "s2", T0 + 200), timer(b, "s1", T0 + 100),
                                       timer(a, "late", T0 + 10_000)]))
    async with h.store.begin() as uow:
        assert await claim_due(h, uow, T0 + 50, 10) == []
        claimed = await claim_due(h, uow, T0 + 500, 1)
        assert claimed == [timer(b, "s1", T0 + 100)]
        assert await claim_due(h, uow, T0 + 500, 10) == [timer(a, "s2", T0 + 200)]
    async with h.store.begin() as uow:
        assert await claim_due(h, uow, T0 + 500, 10) == []
        assert await claim_due(h, uow, T0 + 10_000, 10) == [timer(a, "late", T0 + 10_000)]


async def test_a_timer_changed_since_it_was_read_is_not_claimed_as_it_was(h: Harness) -> None:
    sid = saga_id()
    async with h.store.begin() as uow:
        await uow.write(Writes(timers=[timer(sid, "s1", T0), timer(sid, "s2", T0)]))
    read = await h.store.due_timers(T0 + 10, 10)
    async with h.store.begin() as uow:  # re-armed and cancelled meanwhile, by the saga's own decisions
        await uow.write(Writes(deleted_timers=[(sid, timer(sid, "s2", 0).timer_id)], timers=[timer(sid, "s1", T0 + 5)]))
    async with h.store.begin() as uow:
        assert await uow.claim_timers(read) == []
    async with h.store.begin() as uow:
        assert await claim_due(h, uow, T0 + 10, 10) == [timer(sid, "s1", T0 + 5)]


def _saga_on(partition: int) -> str:
    """A fresh saga id whose key lands on ``partition`` of PARTITIONS."""
    while partition_for((found := saga_id()).encode(), tuple(range(PARTITIONS))) != partition:
        pass
    return found


async def test_an_instance_claims_the_timers_of_its_partitions_only(h: Harness) -> None:
    mine, theirs = _saga_on(1), _saga_on(2)
    async with h.store.begin() as uow:
        await uow.write(Writes(timers=[timer(mine, "s1", T0 + 200), timer(theirs, "s1", T0 + 100)]))
    assert await h.store.next_due_ms({0, 1}) == T0 + 200  # the other one is due earlier, but not ours
    assert await h.store.next_due_ms() == T0 + 100
    assert await h.store.next_due_ms({3}) is None
    async with h.store.begin() as uow:
        assert await claim_due(h, uow, T0 + 500, 10, {0, 1}) == [timer(mine, "s1", T0 + 200)]
        assert await claim_due(h, uow, T0 + 500, 10, {3}) == []
    async with h.store.begin() as uow:
        assert await claim_due(h, uow, T0 + 500, 10, {2}) == [timer(theirs, "s1", T0 + 100)]


async def test_timers_upsert_and_deletes_cancel_only_the_given_ones(h: Harness) -> None:
    sid, other = saga_id(), saga_id()
    async with h.store.begin() as uow:
        await uow.write(Writes(timers=[timer(sid, "s1", T0 + 100), timer(sid, "s2", T0 + 100),
                                       timer(other, "s2", T0 + 100)]))
    async with h.store.begin() as uow:
        moved = TimerRow(sid, timer(sid, "s1", 0).timer_id, "STEP_TIMEOUT", "s1", 1, T0 + 900)
        await uow.write(Writes(
            deleted_timers=[(sid, timer(sid, "s2", 0).timer_id), (sid, "no-such-timer"), (other, "missing")],
            timers=[timer(sid, "s1", T0 + 300), moved]))  # the last duplicate wins
    async with h.store.begin() as uow:
        assert await claim_due(h, uow, T0 + 800, 10) == [timer(other, "s2", T0 + 100)]
        assert await claim_due(h, uow, T0 + 900, 10) == [moved]


async def test_a_claimed_timer_is_invisible_to_other_units_of_work_until_rollback(h: Harness) -> None:
    sid = saga_id()
    async with h.store.begin() as uow:
        await uow.write(Writes(timers=[timer(sid, "s1", T0), timer(sid, "s2", T0 + 1)]))
    with pytest.raises(RuntimeError):
        async with h.store.begin() as first:
            assert [t.step for t in await claim_due(h, first, T0 + 10, 1)] == ["s1"]
            async with h.store.begin() as second:  # another scheduler instance, concurrently
                assert [t.step for t in await claim_due(h, second, T0 + 10, 10)] == ["s2"]
            raise RuntimeError("first instance crashed while handling s1")
    async with h.store.begin() as uow:
        assert [t.step for t in await claim_due(h, uow, T0 + 10, 10)] == ["s1"]


async def test_deleting_timers_leaves_alone_one_another_unit_of_work_is_firing(h: Harness) -> None:
    a = saga_id()
    async with h.store.begin() as uow:
        await uow.write(Writes(timers=[timer(a, "firing", T0), timer(a, "idle", T0 + 60_000)]))
    with pytest.raises(RuntimeError):
        async with h.store.begin() as firing:
            assert [t.step for t in await claim_due(h, firing, T0, 10)] == ["firing"]
            async with h.store.begin() as uow:  # must not wait for the firing unit of work
                await asyncio.wait_for(uow.write(Writes(deleted_timers=[
                    (a, "STEP_TIMEOUT:firing:1"), (a, "STEP_TIMEOUT:idle:1")])), timeout=5)
            raise RuntimeError("the firing unit of work rolls back: its timer is due again")
    async with h.store.begin() as uow:
        assert [t.step for t in await claim_due(h, uow, T0 + 120_000, 10)] == ["firing"]


# --- summaries and reads --------------------------------------------------------------------------------


async def test_summary_upsert_moves_forward_only_and_counts_by_status(h: Harness) -> None:
    a, b, c = "saga-a", "saga-b", "saga-c"
    async with h.store.begin() as uow:
        await uow.write(Writes(summaries=[
            summary(a, "RUNNING", T0 + 10, 1), summary(b, "RUNNING", T0 + 5, 1, saga_type="refund"),
            dataclasses.replace(summary(c, "COMPLETED", T0 + 20, 9), tenant_id="tenant-2")]))
    done = SagaSummaryRow(
        a, "trip", "tenant-1", "FAILED", T0, T0 + 30, 5, failed_step="pay", reason="declined"
    )
    async with h.store.begin() as uow:
        await uow.write(Writes(summaries=[done]))
    async with h.store.begin() as uow:
        await uow.write(Writes(summaries=[summary(a, "RUNNING", T0 + 40, 4)]))  # stale projection write: ignored
    assert await h.store.get_summary(a) == done
    assert await h.store.get_summary("saga-none") is None
    assert await h.store.get_summary(b) == summary(b, "RUNNING", T0 + 5, 1, saga_type="refund")
    assert (await h.store.get_summary(c) or done).tenant_id == "tenant-2"
    assert await h.store.count_by_status() == {"COMPLETED": 1, "FAILED": 1, "RUNNING": 1}


async def test_summaries_of_one_write_keep_the_highest_last_seq_per_saga(h: Harness) -> None:
    a, b = saga_id(), saga_id()
    async with h.store.begin() as uow:
        await uow.write(Writes(summaries=[summary(a, "RUNNING", T0, 5)]))
    async with h.store.begin() as uow:
        await uow.write(Writes(summaries=[
            summary(a, "STALE", T0 + 1, 4),  # lower than the stored row: ignored
            summary(b, "RUNNING", T0 + 1, 1),
            summary(b, "COMPLETED", T0 + 2, 3),
            summary(b, "LATE", T0 + 3, 2),  # lower than the row before it in the same call
        ]))
    stored_a, stored_b = await h.store.get_summary(a), await h.store.get_summary(b)
    assert stored_a is not None and (stored_a.status, stored_a.last_seq) == ("RUNNING", 5)
    assert stored_b is not None and (stored_b.status, stored_b.last_seq, stored_b.updated_at_ms) == (
        "COMPLETED", 3, T0 + 2)


async def test_iter_events_visits_every_event_by_saga_then_seq(h: Harness) -> None:
    sagas = ["saga-b", "saga-a", "saga-c", "saga-A"]
    async with h.store.begin() as uow:
        await uow.write(events(*(ev(sid, n) for sid in sagas for n in (3, 1, 2))))
    seen = [(e.saga_id, e.seq) async for e in h.store.iter_events(batch_size=2)]
    assert seen == [(sid, n) for sid in sorted(sagas) for n in (1, 2, 3)]


# --- retention ------------------------------------------------------------------------------------------


async def test_ended_sagas_are_claimed_oldest_first_once_and_their_events_deleted_through_a_seq(h: Harness) -> None:
    a, b, c, d = "saga-1", "saga-2", "saga-3", "saga-4"
    async with h.store.begin() as uow:
        await uow.write(Writes(
            events=[ev(sid, n) for sid in (a, b) for n in (1, 2, 3)],
            timers=[timer(a, "s1", T0), timer(c, "s1", T0)],
            summaries=[summary(a, "COMPLETED", T0 + 2, 3), summary(b, "COMPENSATED", T0 + 1, 3),
                       summary(c, "RUNNING", T0, 1), summary(d, "COMPLETED", T0 + 9, 1)]))
    assert await h.store.count_ended(["COMPLETED", "COMPENSATED"], T0 + 5) == 2
    with pytest.raises(RuntimeError):
        async with h.store.begin() as first:
            assert await first.claim_ended(["COMPLETED", "COMPENSATED"], T0 + 5, 1) == [b]
            async with h.store.begin() as second:  # another purge, concurrently: the claimed row is skipped
                assert await second.claim_ended(["COMPLETED", "COMPENSATED"], T0 + 5, 10) == [a]
            raise RuntimeError("the first purge stops")
    async with h.store.begin() as uow:
        assert await uow.claim_ended(["COMPLETED", "COMPENSATED"], T0 + 5, 10, skip=[b]) == [a]
        await uow.delete_events_through({a: 2})
        assert await uow.load_events_after({a: 0, b: 1}) == {
            a: [e for e in await h.store.load_events(a) if e.seq == 3],
            b: [e for e in await h.store.load_events(b) if e.seq > 1]}
    assert [e.seq for e in await h.store.load_events(a)] == [3]
    async with h.store.begin() as uow:
        assert [t.saga_id for t in await claim_due(h, uow, T0, 10)] == [c]  # a's timers went with its events


async def test_a_purge_works_through_the_port_on_every_store(h: Harness) -> None:
    runs = {kind: trip_run(kind, f"{kind}-{uuid.uuid4().hex[:6]}", T0) for kind in ("compensated", "running")}
    for run in runs.values():  # histories as the orchestrator would have left them
        async with h.store.begin() as uow:
            await uow.write(Writes(events=[StoredEvent(e.saga_id, e.seq, type(e).__name__, wire.encode_event(e))
                                           for e in run.events], summaries=[summary_of(run.saga)]))
    ended, running = runs["compensated"].saga_id, runs["running"].saga_id
    registry = DefinitionRegistry([TRIP])
    assert await purge_ended(h.store, registry, Topics("t."), ended_before_ms=T0 + 600_000, now_ms=T0 + 700_000,
                             operator="contract") == 1
    [purged] = [wire.decode_event(row.body) for row in await h.store.load_events(ended)]
    assert isinstance(purged, SagaPurged) and (purged.final_status, purged.operator) == ("COMPENSATED", "contract")
    assert purged.seq == runs["compensated"].saga.last_seq + 1
    assert [m.message_id for m in await h.outbox()] == [f"{ended}:event:{purged.seq}"]
    statuses = {sid: (await h.store.get_summary(sid) or summary(sid, "NONE", 0, 0)).status for sid in (ended, running)}
    assert statuses == {ended: "PURGED", running: "RUNNING"}
    assert len(await h.store.load_events(running)) == len(runs["running"].events)


async def test_a_reprojection_repairs_and_removes_read_model_rows_on_every_store(h: Harness) -> None:
    runs = [trip_run(kind, f"{kind}-{uuid.uuid4().hex[:6]}", T0) for kind in ("completed", "compensated")]
    damaged, intact = runs
    orphan = f"orphan-{uuid.uuid4().hex[:6]}"
    async with h.store.begin() as uow:  # a lost row, a right one, and a row of a saga without events
        await uow.write(Writes(events=[StoredEvent(e.saga_id, e.seq, type(e).__name__, wire.encode_event(e))
                                       for run in runs for e in run.events],
                               summaries=[summary_of(intact.saga), summary(orphan, "RUNNING", T0, 1)]))
    registry = DefinitionRegistry([TRIP])
    counted = await reproject(h.store, registry, dry_run=True)
    assert (counted.sagas, counted.repaired, counted.removed) == (2, 1, 1)
    assert await h.store.summaries_of([damaged.saga_id, orphan]) == {orphan: summary(orphan, "RUNNING", T0, 1)}
    done = await reproject(h.store, registry)
    assert (done.repaired, done.removed, done.unfoldable) == (1, 1, [])
    found = await h.store.summaries_of([damaged.saga_id, intact.saga_id, orphan])
    assert found == {damaged.saga_id: summary_of(damaged.saga), intact.saga_id: summary_of(intact.saga)}


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
    events_of = [wire.decode_event(e.body) for e in await h.store.load_events(sid)]
    requested = [e for e in events_of if isinstance(e, SagaCancelRequested)]
    assert fired_before > 0
    assert [e.reason for e in requested] == ["deadline of 60 s passed"]
    assert requested[0].occurred_at == T0 + 60_000


async def test_running_sagas_are_counted_by_type_version_and_shape_and_shapes_are_kept(h: Harness) -> None:
    def row(sid: str, status: str, version: int | None, fingerprint: str | None) -> SagaSummaryRow:
        return dataclasses.replace(summary(sid, status, T0, 1), definition_version=version,
                                   definition_fingerprint=fingerprint)

    rows = [row("a", "RUNNING", 1, "f1"), row("b", "COMPENSATING", 1, "f1"), row("c", "QUARANTINED", 1, "f2"),
            row("d", "FAILED", 2, "f3"), row("e", "COMPLETED", 1, "f1"), row("f", "COMPENSATED", 2, "f3"),
            row("g", "RUNNING", None, None), row("h", "COMPENSATION_FAILED", 1, "f1")]
    async with h.store.begin() as uow:
        await uow.write(Writes(summaries=rows))
    store = cast(ShapeStore, h.store)
    assert await store.running_shapes() == [
        RunningShape("trip", None, None, 1), RunningShape("trip", 1, "f1", 3), RunningShape("trip", 1, "f2", 1),
        RunningShape("trip", 2, "f3", 1)]
    await store.record_shapes([TRIP])
    await store.record_shapes([dataclasses.replace(TRIP, version=2)])  # the same shape: kept once, as first seen
    assert await store.recorded_shapes([TRIP.fingerprint, "unknown"]) == {TRIP.fingerprint: TRIP.shape()}


async def test_the_histories_checked_before_a_deploy_are_those_of_the_sagas_not_ended(h: Harness) -> None:
    statuses = {"run": "RUNNING", "back": "COMPENSATING", "held": "QUARANTINED", "done": "COMPLETED",
                "undone": "COMPENSATED", "refused": "REJECTED"}
    async with h.store.begin() as uow:
        await uow.write(Writes(events=[ev(sid, seq) for sid in statuses for seq in (1, 2)],
                               summaries=[summary(sid, status, T0, 2) for sid, status in statuses.items()]))
    assert await cast(ShapeStore, h.store).running_histories() == {
        sid: [f"{sid}/1".encode(), f"{sid}/2".encode()] for sid in ("back", "held", "run")}
