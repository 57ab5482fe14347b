"""The many-row operations of a unit of work behave like their one-row counterparts, on every adapter."""

from __future__ import annotations

import asyncio

import pytest

from saga_orchestrator.orchestrator.ports import ConcurrencyConflict, Writes
from tests.contract.test_store_contract import T0, Harness, ev, msg, saga_id, summary, timer

# The contract suite's fixtures (h: a fresh store of each adapter, memory and Postgres).
pytest_plugins = ("tests.contract.test_store_contract",)


async def test_claim_messages_claims_each_new_id_once(h: Harness) -> None:
    async with h.store.begin() as uow:
        assert await uow.claim_message("orchestrator", "m-1")
    async with h.store.begin() as uow:
        assert await uow.claim_messages("orchestrator", ["m-1", "m-2", "m-3", "m-2"]) == {"m-2", "m-3"}
        assert await uow.claim_messages("orchestrator", ["m-3", "m-4"]) == {"m-4"}
        assert await uow.claim_messages("orchestrator", []) == set()
        assert await uow.claim_messages("auditor", ["m-1"]) == {"m-1"}
    async with h.store.begin() as uow:
        assert await uow.claim_messages("orchestrator", ["m-1", "m-2", "m-4", "m-5"]) == {"m-5"}


async def test_load_events_after_reads_many_sagas_with_read_your_writes(h: Harness) -> None:
    a, b, c = saga_id(), saga_id(), saga_id()
    async with h.store.begin() as uow:
        await uow.append_events([ev(a, 1), ev(a, 2), ev(b, 1)])
    async with h.store.begin() as uow:
        await uow.append_events([ev(a, 3), ev(b, 2)])
        loaded = await uow.load_events_after({a: 1, b: 0, c: 0})
        assert {sid: [e.seq for e in events] for sid, events in loaded.items()} == {a: [2, 3], b: [1, 2]}
        assert all(e.recorded_at_ms is not None for events in loaded.values() for e in events)
        assert await uow.load_events_after({a: 3}) == {}
        assert await uow.load_events_after({}) == {}


async def test_delete_timers_removes_only_the_given_ones(h: Harness) -> None:
    a, b = saga_id(), saga_id()
    async with h.store.begin() as uow:
        await uow.schedule_timers([timer(a, "x", T0), timer(a, "y", T0), timer(b, "x", T0)])
    async with h.store.begin() as uow:
        await uow.delete_timers([(a, "STEP_TIMEOUT:x:1"), (b, "STEP_TIMEOUT:x:1"), (b, "missing")])
        await uow.delete_timers([])
    async with h.store.begin() as uow:
        assert [(t.saga_id, t.step) for t in await uow.claim_due(T0, 10)] == [(a, "y")]


async def test_upsert_summaries_keeps_the_highest_last_seq_per_saga(h: Harness) -> None:
    a, b = saga_id(), saga_id()
    async with h.store.begin() as uow:
        await uow.upsert_summaries([summary(a, "RUNNING", T0, 5)])
    async with h.store.begin() as uow:
        await uow.upsert_summaries([
            summary(a, "STALE", T0 + 1, 4),  # lower than the stored row: ignored
            summary(b, "RUNNING", T0 + 1, 1),
            summary(b, "COMPLETED", T0 + 2, 3),
            summary(b, "LATE", T0 + 3, 2),  # lower than the row before it in the same call
        ])
        await uow.upsert_summaries([])
    stored_a, stored_b = await h.store.get_summary(a), await h.store.get_summary(b)
    assert stored_a is not None and (stored_a.status, stored_a.last_seq) == ("RUNNING", 5)
    assert stored_b is not None and (stored_b.status, stored_b.last_seq, stored_b.updated_at_ms) == (
        "COMPLETED", 3, T0 + 2)


async def test_claim_and_load_is_claim_messages_then_load_events_after(h: Harness) -> None:
    a, b = saga_id(), saga_id()
    async with h.store.begin() as uow:
        assert await uow.claim_message("orchestrator", "m-1")
        await uow.append_events([ev(a, 1), ev(a, 2)])
    async with h.store.begin() as uow:
        await uow.append_events([ev(b, 1)])
        claimed, loaded = await uow.claim_and_load("orchestrator", ["m-1", "m-2", "m-2"], {a: 1, b: 0})
        assert claimed == {"m-2"}
        assert {sid: [e.seq for e in events] for sid, events in loaded.items()} == {a: [2], b: [1]}
        assert await uow.claim_and_load("orchestrator", [], {}) == (set(), {})


async def test_write_applies_every_part_like_the_one_table_methods(h: Harness) -> None:
    a, b = saga_id(), saga_id()
    async with h.store.begin() as uow:
        await uow.schedule_timers([timer(a, "old", T0), timer(b, "kept", T0 + 1)])
        await uow.upsert_summaries([summary(b, "RUNNING", T0, 7)])
    async with h.store.begin() as uow:
        await uow.write(Writes(
            deleted_timers=[(a, "STEP_TIMEOUT:old:1"), (a, "missing")],
            events=[ev(a, 1), ev(a, 2), ev(b, 8)],
            outbox=[msg(b, 3), msg(a, 1), msg(a, 2)],
            timers=[timer(a, "new", T0 + 2), timer(a, "new", T0 + 3)],  # the last of duplicates wins
            summaries=[summary(a, "RUNNING", T0, 2), summary(b, "STALE", T0, 6)],
        ))
        await uow.write(Writes())
    assert [e.seq for e in await h.store.load_events(a)] == [1, 2]
    assert [m.message_id for m in await h.outbox()] == [f"{b}:event:3", f"{a}:event:1", f"{a}:event:2"]
    async with h.store.begin() as uow:
        assert [(t.saga_id, t.step, t.due_at_ms) for t in await uow.claim_due(T0 + 10, 10)] == [
            (b, "kept", T0 + 1), (a, "new", T0 + 3)]
    stored_b = await h.store.get_summary(b)
    assert stored_b is not None and (stored_b.status, stored_b.last_seq) == ("RUNNING", 7)


async def test_write_of_a_recorded_seq_conflicts_and_writes_nothing(h: Harness) -> None:
    a = saga_id()
    async with h.store.begin() as uow:
        await uow.append_events([ev(a, 1)])
    with pytest.raises(ConcurrencyConflict):
        async with h.store.begin() as uow:
            await uow.write(Writes(events=[ev(a, 1, "Other")], outbox=[msg(a, 1)],
                                   summaries=[summary(a, "RUNNING", T0, 1)]))
    assert [e.event_type for e in await h.store.load_events(a)] == ["StepSucceeded"]
    assert await h.outbox() == []
    assert await h.store.get_summary(a) is None


async def test_deleting_timers_leaves_alone_one_another_unit_of_work_is_firing(h: Harness) -> None:
    a = saga_id()
    async with h.store.begin() as uow:
        await uow.schedule_timers([timer(a, "firing", T0), timer(a, "idle", T0 + 60_000)])
    with pytest.raises(RuntimeError):
        async with h.store.begin() as firing:
            assert [t.step for t in await firing.claim_due(T0, 10)] == ["firing"]
            async with h.store.begin() as uow:  # must not wait for the firing unit of work
                await asyncio.wait_for(uow.write(Writes(deleted_timers=[
                    (a, "STEP_TIMEOUT:firing:1"), (a, "STEP_TIMEOUT:idle:1")])), timeout=5)
            raise RuntimeError("the firing unit of work rolls back: its timer is due again")
    async with h.store.begin() as uow:
        assert [t.step for t in await uow.claim_due(T0 + 120_000, 10)] == ["firing"]
