"""One contract for the read side of the operations wing's store port (``operations.ports``: ``ReadsStore``,
``SignalStore``, ``VerifyStore``, ``SessionStore``), run against both adapters: the memory one of the test kit
and the Postgres one of the orchestrator's schema.

Times are written relative to the wall clock: the Postgres adapters measure ages and windows from ``now()``,
the memory ones from their store's clock (here the wall clock too).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from saga_orchestrator.operations import versions
from saga_orchestrator.operations.ports import (
    EndedCounts,
    HeatCell,
    ReadsStore,
    RetryTimer,
    SagaFilter,
    SagaSearch,
    SessionStore,
    ShapeStatusCount,
    SignalStore,
    StoredSession,
    StuckQuery,
    TimerView,
    VerifyStore,
)
from saga_orchestrator.orchestrator.ports import OutboxMessage, SagaSummaryRow, SearchKey, StoredEvent, TimerRow, Writes
from saga_orchestrator.orchestrator.store.memory import MemoryStore
from saga_orchestrator.orchestrator.store.operations.reads import MemoryReads, PostgresReads
from saga_orchestrator.orchestrator.store.operations.sessions import MemorySessionStore, PostgresSessionStore
from saga_orchestrator.orchestrator.store.operations.signals import MemorySignals, PostgresSignals
from saga_orchestrator.orchestrator.store.operations.verify import MemoryVerify, PostgresVerify
from saga_orchestrator.orchestrator.store.postgres import PostgresStore

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS


@dataclass
class Wing:
    """The wing's read ports over one store, and how to write that store."""

    reads: ReadsStore
    signals: SignalStore
    verify: VerifyStore
    sessions: SessionStore
    write: Callable[[Writes], Awaitable[None]]
    reset: Callable[[], Awaitable[None]]
    now_ms: int


def _memory() -> Wing:
    store = MemoryStore()

    async def write(writes: Writes) -> None:
        async with store.begin() as uow:
            await uow.write(writes)

    async def reset() -> None:
        pass  # a fresh MemoryStore per test

    return Wing(MemoryReads(store), MemorySignals(store), MemoryVerify(store), MemorySessionStore(), write, reset,
                store.clock_ms())


def _postgres(pool: asyncpg.Pool) -> Wing:
    store = PostgresStore(pool)

    async def reset() -> None:
        await pool.execute("TRUNCATE saga.events, saga.inbox, saga.outbox, saga.outbox_parked, saga.timers,"
                           " saga.saga_summary, saga.search_keys, saga.console_sessions")

    async def write(writes: Writes) -> None:
        async with store.begin() as uow:
            await uow.write(writes)

    return Wing(PostgresReads(pool), PostgresSignals(pool), PostgresVerify(pool), PostgresSessionStore(pool), write,
                reset, time.time_ns() // 1_000_000)


@pytest.fixture(params=["memory", "postgres"])
def wing_factory(request: pytest.FixtureRequest) -> Wing:
    return _memory() if request.param == "memory" else _postgres(request.getfixturevalue("pg_pool"))


@pytest.fixture
async def wing(wing_factory: Wing) -> Wing:
    await wing_factory.reset()
    return wing_factory


def row(saga_id: str, status: str, started_ago_ms: int, now_ms: int, *, saga_type: str = "trip",
        tenant: str | None = None, updated_ago_ms: int = 0, step: str | None = None, failures: int = 0,
        error: str | None = None, version: int | None = None, fingerprint: str | None = None) -> SagaSummaryRow:
    return SagaSummaryRow(saga_id, saga_type, tenant, status, now_ms - started_ago_ms, now_ms - updated_ago_ms, 1,
                          current_step=step, step_failures=failures, last_error=error, definition_version=version,
                          definition_fingerprint=fingerprint)


def event(saga_id: str, seq: int, event_type: str = "StepSucceeded") -> StoredEvent:
    return StoredEvent(saga_id, seq, event_type, f"{saga_id}/{seq}".encode())


async def test_list_sagas_filters_and_lists_the_oldest_started_first(wing: Wing) -> None:
    now = wing.now_ms
    await wing.write(Writes(summaries=[
        row("a", "RUNNING", 3 * HOUR_MS, now, tenant="t1", step="pay", failures=2, error="Declined"),
        row("b", "COMPLETED", 2 * HOUR_MS, now, saga_type="refund", updated_ago_ms=HOUR_MS),
        row("c", "RUNNING", HOUR_MS, now, tenant="t2", step="book_hotel", version=2)]))
    ids = [r.saga_id for r in await wing.reads.list_sagas(None, 10)]
    assert ids == ["a", "b", "c"]
    assert [r.saga_id for r in await wing.reads.list_sagas(None, 2)] == ["a", "b"]
    taken = {
        SagaFilter(statuses=("RUNNING",)): ["a", "c"],
        SagaFilter(saga_type="refund"): ["b"],
        SagaFilter(tenant="t2"): ["c"],
        SagaFilter(error="Declined"): ["a"],
        SagaFilter(older_than_s=30 * 60): ["b"],
        SagaFilter(steps=(("trip", "book_hotel"), ("refund", "pay"))): ["c"],
        SagaFilter(statuses=("RUNNING",), tenant="t1"): ["a"],
        SagaFilter(statuses=("FAILED",)): [],
        SagaFilter(saga_type="trip", definition_version=2): ["c"],
    }
    for selection, expected in taken.items():
        assert [r.saga_id for r in await wing.reads.list_sagas(selection, 10)] == expected, selection
    assert await wing.reads.count_by_status() == {"COMPLETED": 1, "RUNNING": 2}


async def test_list_sagas_pages_from_a_place_in_its_order_the_saga_id_breaking_ties(wing: Wing) -> None:
    now = wing.now_ms
    await wing.write(Writes(summaries=[
        row("b", "RUNNING", HOUR_MS, now), row("a", "RUNNING", HOUR_MS, now), row("c", "COMPLETED", HOUR_MS, now),
        row("d", "RUNNING", 2 * HOUR_MS, now), row("e", "RUNNING", MINUTE_MS, now)]))
    assert [r.saga_id for r in await wing.reads.list_sagas(None, 10)] == ["d", "a", "b", "c", "e"]
    after_a = (now - HOUR_MS, "a")
    assert [r.saga_id for r in await wing.reads.list_sagas(None, 2, after_a)] == ["b", "c"]
    assert [r.saga_id for r in await wing.reads.list_sagas(SagaFilter(statuses=("RUNNING",)), 10, after_a)] \
        == ["b", "e"]
    assert [r.saga_id for r in await wing.reads.list_sagas(None, 10, (now - HOUR_MS, "a0"))] == ["b", "c", "e"]
    assert await wing.reads.list_sagas(None, 10, (now, "")) == []


def search(saga_id: str, value: str, field: str = "", **filters: Any) -> SagaSearch:
    return SagaSearch(saga_id=saga_id, value=value, field=field, **filters)


async def test_search_finds_by_id_by_value_and_by_field_newest_first(wing: Wing) -> None:
    now = wing.now_ms
    await wing.write(Writes(summaries=[row("a", "RUNNING", 2 * MINUTE_MS, now), row("b", "RUNNING", MINUTE_MS, now)],
                            search_keys=[SearchKey("a", "email", "x@example.com"), SearchKey("b", "customer_id", "a"),
                                         SearchKey("b", "email", "x@example.com")]))
    assert [r.saga_id for r in await wing.reads.search(search("zzz", "x@example.com"), 10)] == ["b", "a"]
    assert [r.saga_id for r in await wing.reads.search(search("a", "a"), 10)] == ["b", "a"]  # its id, b's key
    assert [r.saga_id for r in await wing.reads.search(search("zzz", "x@example.com", "customer_id"), 10)] == []
    assert [r.saga_id for r in await wing.reads.search(search("zzz", "x@example.com", "email"), 1)] == ["b"]
    assert await wing.reads.search_keys("b") == {"customer_id": "a", "email": "x@example.com"}
    assert await wing.reads.search_keys("none") == {}


async def test_search_finds_a_values_start_whatever_the_case_exact_matches_first(wing: Wing) -> None:
    now = wing.now_ms
    await wing.write(Writes(
        summaries=[row("old-exact", "COMPLETED", 3 * MINUTE_MS, now), row("prefix", "RUNNING", 2 * MINUTE_MS, now),
                   row("new-exact", "RUNNING", MINUTE_MS, now), row("other", "RUNNING", 0, now),
                   row("acme", "RUNNING", 4 * MINUTE_MS, now)],
        search_keys=[SearchKey("old-exact", "customer_id", "acme"), SearchKey("prefix", "customer_id", "ACME-42"),
                     SearchKey("prefix", "email", "acme@example.com"),  # two keys match: the saga once
                     SearchKey("new-exact", "email", "Acme"), SearchKey("other", "customer_id", "acm"),
                     SearchKey("other", "email", "x-acme@example.com")]))  # acme inside, not at the start

    async def found(query: SagaSearch, limit: int = 10) -> list[str]:
        return [r.saga_id for r in await wing.reads.search(query, limit)]

    assert await found(search("zzz", "ACME")) == ["new-exact", "old-exact", "prefix"]
    assert await found(search("acme", "ACME")) == ["new-exact", "old-exact", "acme", "prefix"]  # its id: exact
    assert await found(search("zzz", "acme-4")) == ["prefix"]
    assert await found(search("zzz", "ACME", "email")) == ["new-exact", "prefix"]
    assert await found(search("zzz", "a")) == ["other", "new-exact", "prefix", "old-exact"]  # none exact
    assert await found(search("zzz", "ACME"), 2) == ["new-exact", "old-exact"]
    assert await found(search("zzz", "acme%")) == [] and await found(search("zzz", "acm_")) == []  # no wildcards


async def test_search_finds_values_holding_equals_signs_and_odd_characters(wing: Wing) -> None:
    now = wing.now_ms
    await wing.write(Writes(summaries=[row("s1", "RUNNING", MINUTE_MS, now), row("s2", "RUNNING", 0, now)],
                            search_keys=[SearchKey("s1", "token", "b=c"), SearchKey("s2", "token", "Zoë=1\\%")]))
    assert [r.saga_id for r in await wing.reads.search(search("a=b=c", "b=c", "token"), 10)] == ["s1"]
    assert [r.saga_id for r in await wing.reads.search(search("zzz", "b="), 10)] == ["s1"]
    assert [r.saga_id for r in await wing.reads.search(search("zzz", "zoë=1\\"), 10)] == ["s2"]


async def test_search_narrows_to_a_tenant_and_a_start_window(wing: Wing) -> None:
    now = wing.now_ms
    await wing.write(Writes(
        summaries=[row("t1-old", "RUNNING", 3 * HOUR_MS, now, tenant="t1"),
                   row("t1-new", "RUNNING", MINUTE_MS, now, tenant="t1"),
                   row("t2-new", "RUNNING", MINUTE_MS, now, tenant="t2"), row("none", "RUNNING", 0, now)],
        search_keys=[SearchKey(i, "customer_id", "acme-1") for i in ("t1-old", "t1-new", "t2-new", "none")]))

    async def found(**filters: Any) -> list[str]:
        return sorted(r.saga_id for r in await wing.reads.search(search("t2-new", "acme", **filters), 10))

    assert await found(tenant="t1") == ["t1-new", "t1-old"]
    assert await found(tenant="t3") == []  # the id matches, not the tenant
    assert await found(started_after_ms=now - HOUR_MS) == ["none", "t1-new", "t2-new"]
    assert await found(started_before_ms=now - HOUR_MS) == ["t1-old"]
    assert await found(started_after_ms=now - MINUTE_MS, started_before_ms=now) == ["t1-new", "t2-new"]
    assert await found(tenant="t2", started_after_ms=now - HOUR_MS) == ["t2-new"]


async def test_wedged_groups_unfinished_sagas_by_step_and_error(wing: Wing) -> None:
    now = wing.now_ms
    await wing.write(Writes(summaries=[
        row("a", "RUNNING", MINUTE_MS, now, step="pay", failures=3, error="Declined"),
        row("b", "RUNNING", MINUTE_MS, now, step="pay", failures=5, error="Declined"),
        row("c", "SUSPENDED", MINUTE_MS, now, step="book_hotel", failures=4, error="timeout"),
        row("d", "RUNNING", MINUTE_MS, now, step="pay", failures=1, error="Declined"),  # too few failures
        row("e", "FAILED", MINUTE_MS, now, step="pay", failures=9, error="Declined")]))  # ended
    groups = await wing.reads.wedged(3, 20, ["FAILED", "COMPLETED"])
    assert [(g.saga_type, g.step, g.error, g.count, g.max_failures, g.saga_ids) for g in groups] == [
        ("trip", "pay", "Declined", 2, 5, ["b", "a"]), ("trip", "book_hotel", "timeout", 1, 4, ["c"])]
    assert [g.saga_ids for g in await wing.reads.wedged(3, 1, ["FAILED"])] == [["b"], ["c"]]


async def test_stuck_sagas_take_states_and_failing_ones_longest_unchanged_first(wing: Wing) -> None:
    now = wing.now_ms
    await wing.write(Writes(summaries=[
        row("a", "FAILED", 30 * HOUR_MS, now, updated_ago_ms=26 * HOUR_MS),  # ended long ago: still taken
        row("b", "QUARANTINED", HOUR_MS, now, updated_ago_ms=HOUR_MS, saga_type="refund"),
        row("c", "RUNNING", HOUR_MS, now, updated_ago_ms=2 * HOUR_MS, step="pay", failures=3),
        row("d", "RUNNING", HOUR_MS, now, updated_ago_ms=3 * HOUR_MS, step="pay", failures=2),  # too few
        row("e", "COMPLETED", HOUR_MS, now, updated_ago_ms=4 * HOUR_MS, step="pay", failures=5),  # not failing
        row("f", "COMPENSATING", HOUR_MS, now, updated_ago_ms=HOUR_MS, step="book_flight", failures=4),
        row("g", "FAILED", HOUR_MS, now, updated_ago_ms=HOUR_MS)]))  # f's and g's stamp: ids break the tie
    everything = StuckQuery(statuses=("FAILED", "QUARANTINED"), failing=("RUNNING", "COMPENSATING"), min_failures=3)

    async def ids(query: StuckQuery, limit: int = 10) -> list[str]:
        return [r.saga_id for r in await wing.reads.stuck_sagas(query, limit)]

    assert await ids(everything) == ["a", "c", "b", "f", "g"]
    assert await ids(everything, 2) == ["a", "c"]
    taken = await wing.reads.stuck_sagas(everything, 10)
    after_c = (taken[1].updated_at_ms, "c")
    assert await ids(StuckQuery(("FAILED", "QUARANTINED"), ("RUNNING", "COMPENSATING"), after=after_c)) == [
        "b", "f", "g"]
    after_b = (taken[2].updated_at_ms, "b")
    assert await ids(StuckQuery(("FAILED", "QUARANTINED"), ("RUNNING", "COMPENSATING"), after=after_b)) == ["f", "g"]
    assert await ids(StuckQuery(("FAILED",))) == ["a", "g"]
    assert await ids(StuckQuery((), ("COMPENSATING",), min_failures=4)) == ["f"]
    assert await ids(dataclasses.replace(everything, saga_type="refund")) == ["b"]
    assert await ids(dataclasses.replace(everything, since_ms=now - 2 * HOUR_MS - MINUTE_MS,
                                         before_ms=now - HOUR_MS)) == ["c"]


async def test_the_fleet_counts_by_type_state_and_age(wing: Wing) -> None:
    now = wing.now_ms
    await wing.write(Writes(summaries=[
        row("a", "RUNNING", 30_000, now), row("b", "RUNNING", 2 * HOUR_MS, now),
        row("c", "COMPENSATED", 2 * HOUR_MS, now, updated_ago_ms=10 * MINUTE_MS),
        row("d", "COMPLETED", 3 * HOUR_MS, now, updated_ago_ms=2 * HOUR_MS),
        row("e", "COMPLETED", 3 * 86_400_000, now, updated_ago_ms=2 * 86_400_000)]))  # ended before the day
    cells, oldest = await wing.reads.unfinished(["RUNNING"], 1)
    assert sorted(cells, key=lambda c: c.bucket) == [HeatCell("trip", "RUNNING", "< 1 day", 1),
                                                     HeatCell("trip", "RUNNING", "< 1 min", 1)]
    assert [r.saga_id for r in oldest] == ["b"]
    ended, counts = await wing.reads.ended_last_day(["COMPENSATED", "COMPLETED"], ["COMPENSATED"])
    assert sorted(ended, key=lambda c: c.status) == [HeatCell("trip", "COMPENSATED", "< 1 day", 1),
                                                     HeatCell("trip", "COMPLETED", "< 1 day", 1)]
    assert counts == EndedCounts(hour=1, day=2, undone_hour=1, undone_day=1)


async def test_version_counts_count_each_type_version_shape_and_state_once(wing: Wing) -> None:
    now = wing.now_ms
    assert await wing.reads.version_counts() == []
    await wing.write(Writes(summaries=[
        row("a", "RUNNING", 0, now, version=1, fingerprint="f1"),
        row("b", "RUNNING", 0, now, version=1, fingerprint="f1"),
        row("c", "COMPLETED", 0, now, version=1, fingerprint="f1"),
        row("d", "QUARANTINED", 0, now, version=1, fingerprint="g1"),  # the same version, another shape
        row("e", "COMPENSATED", 0, now, version=2, fingerprint="f2"),
        row("f", "RUNNING", 0, now, saga_type="refund", version=1, fingerprint="r1"),
        row("g", "RUNNING", 0, now),  # written before versions were recorded
        row("h", "CANCELLED", 0, now)]))
    cells = sorted(await wing.reads.version_counts(),
                   key=lambda c: (c.saga_type, c.version or 0, c.fingerprint or "", c.status))
    assert cells == [
        ShapeStatusCount("refund", 1, "r1", "RUNNING", 1),
        ShapeStatusCount("trip", None, None, "CANCELLED", 1), ShapeStatusCount("trip", None, None, "RUNNING", 1),
        ShapeStatusCount("trip", 1, "f1", "COMPLETED", 1), ShapeStatusCount("trip", 1, "f1", "RUNNING", 2),
        ShapeStatusCount("trip", 1, "g1", "QUARANTINED", 1), ShapeStatusCount("trip", 2, "f2", "COMPENSATED", 1)]
    tallied = await versions.version_counts(wing.reads)
    assert [(c.saga_type, c.version, c.running, c.ended) for c in tallied] == [
        ("refund", 1, 1, 0), ("trip", None, 1, 1), ("trip", 1, 3, 1), ("trip", 2, 0, 1)]
    assert tallied[2].shapes == (versions.ShapeCounts("f1", 2, 1), versions.ShapeCounts("g1", 1, 0))


async def test_a_stored_saga_holds_its_events_timers_and_outbox_rows(wing: Wing) -> None:
    now = wing.now_ms
    await wing.write(Writes(
        events=[event("a", 1, "SagaStarted"), event("a", 2), event("b", 1, "SagaStarted")],
        timers=[TimerRow("a", "t2", "STEP_TIMEOUT", "pay", 2, now + 2000),
                TimerRow("a", "t1", "STEP_RETRY", "pay", 1, now + 1000)],
        outbox=[OutboxMessage("t.payment.commands", "a", b"x", {}, "m-1"),
                OutboxMessage("t.payment.commands", "b", b"y", {}, "m-2")],
        summaries=[row("a", "RUNNING", MINUTE_MS, now)]))
    stored = await wing.reads.stored_saga("a")
    assert stored is not None
    assert [(e.seq, e.event_type, e.body) for e in stored.events] == [(1, "SagaStarted", b"a/1"),
                                                                    (2, "StepSucceeded", b"a/2")]
    assert all(e.recorded_at_ms is not None and abs(e.recorded_at_ms - now) < MINUTE_MS for e in stored.events)
    assert stored.timers == [TimerView("STEP_RETRY", "pay", 1, now + 1000), TimerView("STEP_TIMEOUT", "pay", 2,
                                                                                        now + 2000)]
    assert [(o.table, o.topic, o.parked_reason) for o in stored.outbox] == [("saga.outbox", "t.payment.commands",
                                                                           None)]
    assert await wing.reads.stored_saga("none") is None


async def test_events_after_and_of_types_read_in_seq_order(wing: Wing) -> None:
    await wing.write(Writes(events=[event("a", 1, "SagaStarted"), event("a", 2, "OperatorAction"), event("a", 3),
                                    event("b", 1, "OperatorAction"), event("c", 1, "OperatorAction")]))
    assert [e.seq for e in await wing.reads.events_after("a", 1)] == [2, 3]
    assert await wing.reads.events_after("a", 3) == []
    assert [e.seq for e in await wing.reads.events_before("a", 4, 2)] == [2, 3]  # the last two, in seq order
    assert [e.seq for e in await wing.reads.events_before("a", 3, 5)] == [1, 2]
    assert await wing.reads.events_before("a", 1, 5) == []
    found = await wing.reads.events_of({"b", "a"}, ["OperatorAction"])
    assert [(e.saga_id, e.seq) for e in found] == [("a", 2), ("b", 1)]
    assert await wing.reads.events_of(set(), ["OperatorAction"]) == []
    assert await wing.signals.events_of({"c"}, ["OperatorAction", "SagaStarted"]) == [
        e for e in await wing.reads.events_after("c", 0)]


async def test_saga_statuses_name_only_the_sagas_that_have_one(wing: Wing) -> None:
    now = wing.now_ms
    await wing.write(Writes(summaries=[row("a", "RUNNING", 0, now), row("b", "COMPENSATED", 0, now)]))
    assert await wing.reads.saga_statuses({"a", "b", "none"}) == {"a": "RUNNING", "b": "COMPENSATED"}
    assert await wing.reads.saga_statuses(set()) == {}
    assert await wing.reads.parked() == []  # nothing refused by the broker here


async def test_signals_read_overdue_timers_running_ages_and_retrying_compensations(wing: Wing) -> None:
    now = wing.now_ms
    assert await wing.signals.overdue_timers() == (0, 0.0)
    await wing.write(Writes(
        timers=[TimerRow("a", "t1", "COMPENSATION_RETRY", "pay", 1, now - 60_000),
                TimerRow("b", "t1", "COMPENSATION_TIMEOUT", "hotel", 2, now + 60_000),
                TimerRow("c", "t1", "COMPENSATION_TIMEOUT", "hotel", 1, now + 60_000)],
        summaries=[row("a", "COMPENSATING", HOUR_MS, now), row("b", "COMPENSATING", HOUR_MS, now),
                   row("c", "COMPENSATING", HOUR_MS, now), row("r", "RUNNING", HOUR_MS, now),
                   row("s", "RUNNING", MINUTE_MS, now), row("x", "RUNNING", 2 * HOUR_MS, now, saga_type="refund")]))
    overdue, oldest_s = await wing.signals.overdue_timers()
    assert overdue == 1 and 59 <= oldest_s < 120
    ages = await wing.signals.oldest_running()
    assert sorted(ages) == ["refund", "trip"] and 3590 < ages["trip"] < 3700 and 7190 < ages["refund"] < 7300
    assert await wing.signals.retry_timers(["COMPENSATION_RETRY"], "COMPENSATION_TIMEOUT", 10) == [
        RetryTimer("a", "trip", "pay"), RetryTimer("b", "trip", "hotel")]
    assert len(await wing.signals.retry_timers(["COMPENSATION_RETRY"], "COMPENSATION_TIMEOUT", 1)) == 1


async def test_verify_reads_every_saga_or_the_wanted_ones_in_one_snapshot(wing: Wing) -> None:
    now = wing.now_ms
    await wing.write(Writes(
        events=[event("a", 1, "SagaStarted"), event("a", 2), event("b", 1, "SagaStarted")],
        timers=[TimerRow("a", "t1", "STEP_TIMEOUT", "pay", 1, now + 1000)],
        outbox=[OutboxMessage("t.payment.commands", "a", b"x", {}, "m-1")],
        summaries=[row("a", "RUNNING", MINUTE_MS, now), row("b", "COMPLETED", MINUTE_MS, now)]))
    every = await wing.verify.snapshot(None)
    assert {i: [e.seq for e in events] for i, events in every.events.items()} == {"a": [1, 2], "b": [1]}
    assert sorted(every.summaries) == ["a", "b"] and every.summaries["b"].status == "COMPLETED"
    assert every.timers == {"a": [TimerView("STEP_TIMEOUT", "pay", 1, now + 1000)]}
    assert every.outbox_rows == {"a": {"saga.outbox": 1}}
    assert abs(every.now_ms - now) < MINUTE_MS
    one = await wing.verify.snapshot(["b"])
    assert sorted(one.events) == ["b"] and sorted(one.summaries) == ["b"] and not one.timers and not one.outbox_rows
    assert await wing.verify.duplicate_effects([]) == {}


async def test_a_session_is_found_until_removed_or_expired(wing: Wing) -> None:
    await wing.sessions.add(b"k1", "ivo", "csrf-1", 3600)
    await wing.sessions.add(b"k2", "ana", "csrf-2", 0.2)
    assert await wing.sessions.find(b"k1") == StoredSession("ivo", "csrf-1")
    assert await wing.sessions.find(b"none") is None
    await wing.sessions.remove(b"k1")
    await wing.sessions.remove(b"k1")  # nothing left: no error
    assert await wing.sessions.find(b"k1") is None
    await asyncio.sleep(0.3)
    assert await wing.sessions.find(b"k2") is None
