"""The timer scheduler sleeps until the next timer is due instead of scanning on a clock, and a timer armed
earlier wakes it (in-memory store, real asyncio time, bounds far from the values they guard)."""

from __future__ import annotations

import asyncio
import time

from saga_orchestrator.orchestrator.ports import TimerRow
from saga_orchestrator.orchestrator.service import SagaService
from saga_orchestrator.orchestrator.store.memory import MemoryStore
from saga_orchestrator.orchestrator.timers import MAX_SLEEP_S, TimerScheduler
from saga_orchestrator.participants.trip.definition import trip_definitions
from saga_orchestrator.schemas.partitioning import partition_for
from saga_orchestrator.schemas.topics import Topics


def _clock() -> int:
    return time.time_ns() // 1_000_000


async def _running(scheduler: TimerScheduler, seconds: float) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.run(stop))
    await asyncio.sleep(seconds)
    stop.set()
    await task


async def test_a_quiet_scheduler_looks_about_once_a_second_and_never_scans() -> None:
    store = MemoryStore(clock_ms=_clock)
    scheduler = TimerScheduler(SagaService(store, trip_definitions(), Topics(), _clock), clock_ms=_clock)
    await _running(scheduler, 0.6)
    assert MAX_SLEEP_S >= 1.0
    assert scheduler.looks == 1  # polling every 50 ms would have looked 12 times
    assert scheduler.scans == 0  # no timer was due: no transaction


async def test_a_timer_armed_earlier_wakes_it() -> None:
    store = MemoryStore(clock_ms=_clock)
    scheduler = TimerScheduler(SagaService(store, trip_definitions(), Topics(), _clock), clock_ms=_clock)
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.run(stop))
    await asyncio.sleep(0.1)
    assert scheduler.looks == 1
    scheduler.armed([_clock() + 5])  # due before the scheduler meant to look again
    await asyncio.sleep(0.2)
    assert scheduler.looks >= 2
    later = scheduler.looks
    scheduler.armed([_clock() + 60_000])  # due after it looks anyway: no reason to wake
    await asyncio.sleep(0.2)
    assert scheduler.looks == later
    stop.set()
    await task


async def test_an_instance_fires_only_the_timers_of_its_partitions() -> None:
    partitions = (0, 1, 2, 3)
    store = MemoryStore(clock_ms=_clock, topic_partitions=len(partitions))
    on = {partition_for(f"saga-{n}".encode(), partitions): f"saga-{n}" for n in range(40)}
    mine, theirs = on[0], on[3]
    for saga in (mine, theirs):  # due already; an unknown saga's timer is quarantined, which is a firing too
        store.timers[(saga, "STEP_TIMEOUT:s:1")] = TimerRow(saga, "STEP_TIMEOUT:s:1", "STEP_TIMEOUT", "s", 1,
                                                            _clock() - 1000)
    scheduler = TimerScheduler(SagaService(store, trip_definitions(), Topics(), _clock), clock_ms=_clock,
                               partitions=lambda: frozenset({0, 1}))
    await _running(scheduler, 0.3)
    assert scheduler.fired == 1
    assert list(store.timers) == [(theirs, "STEP_TIMEOUT:s:1")]  # the other instance's, left for it
