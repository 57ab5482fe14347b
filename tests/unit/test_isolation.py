"""The one isolation ladder and the wait for the platform, without I/O: a scripted target counts every unit
it is asked to handle, and each rung is asserted by those counts.

The ladder: the batch; each group alone; each item alone ``poison_attempts`` times; the service's own end. A
platform fault at any rung leaves the ladder at once and spends no attempt; a conflict is tried again at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
from opentelemetry.trace import StatusCode

from saga_orchestrator.infra import tracing
from saga_orchestrator.infra.failures import WriteConflict
from saga_orchestrator.infra.health import ServiceHealth
from saga_orchestrator.infra.isolation import (
    BELOW_THE_BATCH,
    CONFLICT_RETRIES,
    GROUPS_ONE_BY_ONE,
    SPLIT_BY_A_CONFLICT,
    IsolationLadder,
    OutageWait,
)
from saga_orchestrator.orchestrator.ports import ConcurrencyConflict
from tests.spans import spans_in_memory


def disk_full() -> asyncpg.PostgresError:
    return asyncpg.DiskFullError("could not extend file: No space left on device")


class Poison(Exception):
    """An item's own fault."""


@dataclass
class Script:
    """Items are (group, name); ``poison`` names fail every unit they are in; ``failures`` maps a name to the
    errors its next units raise, one each."""

    poison: set[str] = field(default_factory=set)
    failures: dict[str, list[Exception]] = field(default_factory=dict)
    units: list[tuple[str, ...]] = field(default_factory=list)
    isolated: list[tuple[str, str]] = field(default_factory=list)

    def group_of(self, item: tuple[str, str]) -> Hashable:
        return item[0]

    async def handle(self, items: Sequence[tuple[str, str]]) -> list[str]:
        self.units.append(tuple(name for _, name in items))
        for _, name in items:
            if self.failures.get(name):
                raise self.failures[name].pop(0)
            if name in self.poison:
                raise Poison(name)
        return [f"done {name}" for _, name in items]

    async def isolate(self, item: tuple[str, str], error: Exception) -> str:
        self.isolated.append((item[1], repr(error)))
        return f"isolated {item[1]}"


ITEMS = [("s1", "a"), ("s2", "b"), ("s1", "c"), ("s3", "d")]


def ladder_of(script: Script, attempts: int, **options: Any) -> IsolationLadder[tuple[str, str], str]:
    return IsolationLadder(script, "test", attempts, span="test.unit", **options)


async def test_a_batch_that_goes_through_is_one_unit() -> None:
    script = Script()
    assert await ladder_of(script, 3).run(ITEMS) == ["done a", "done b", "done c", "done d"]
    assert script.units == [("a", "b", "c", "d")]


@pytest.mark.parametrize("concurrent", [False, True])
async def test_a_poison_item_is_found_rung_by_rung_and_isolated_alone(concurrent: bool) -> None:
    script = Script(poison={"c"})
    ladder = ladder_of(script, 3, concurrent_groups=concurrent)
    assert await ladder.run(ITEMS) == ["done a", "done b", "isolated c", "done d"]
    assert script.units[0] == ("a", "b", "c", "d")  # the batch
    # Each group alone; then the items of the one that failed alone, c three times.
    assert sorted(script.units[1:]) == sorted([("a", "c"), ("b",), ("d",), ("a",), ("c",), ("c",), ("c",)])
    assert script.units.index(("a", "c")) < script.units.index(("a",))
    assert script.isolated == [("c", "Poison('c')")]


async def test_each_item_is_handled_once_when_only_its_group_had_to_be_split() -> None:
    script = Script(poison={"c"})
    await ladder_of(script, 3).run(ITEMS)
    handled = [name for unit in script.units[1:] for name in unit]
    # b and d went through with their groups; a once with its group (rolled back) and once alone.
    assert handled.count("b") == handled.count("d") == 1 and handled.count("a") == 2


async def test_one_group_skips_the_batch_rung_and_one_item_goes_straight_to_its_attempts() -> None:
    script = Script(poison={"a"})
    assert await ladder_of(script, 2).run([("s1", "a")]) == ["isolated a"]
    assert script.units == [("a",), ("a",)]


async def test_an_item_that_recovers_on_a_later_attempt_is_not_isolated() -> None:
    script = Script(failures={"a": [Poison("once"), Poison("twice")]})
    assert await ladder_of(script, 3).run([("s1", "a")]) == ["done a"]
    assert script.units == [("a",)] * 3 and script.isolated == []


@pytest.mark.parametrize("rung", [0, 1, 3])
async def test_a_platform_fault_at_any_rung_leaves_the_ladder_and_spends_nothing(rung: int) -> None:
    # The poison item c makes the ladder climb down; the outage strikes at the rung-th unit.
    script = Script(poison={"c"})
    original = script.handle

    async def handle(items: Sequence[tuple[str, str]]) -> list[str]:
        if len(script.units) == rung:
            script.units.append(("outage",))
            raise disk_full()
        return await original(items)

    script.handle = handle  # type: ignore[method-assign]
    with pytest.raises(asyncpg.DiskFullError):
        await ladder_of(script, 3).run(ITEMS)
    assert script.units[-1] == ("outage",) and len(script.units) == rung + 1
    assert script.isolated == []


async def test_after_an_outage_the_same_batch_starts_over_with_every_attempt() -> None:
    # The caller hands the batch over again: the item whose try met the outage still gets all three tries.
    script = Script(failures={"a": [Poison("1"), disk_full()]})
    ladder = ladder_of(script, 3)
    with pytest.raises(asyncpg.DiskFullError):
        await ladder.run([("s1", "a")])
    script.failures["a"] = [Poison("1"), Poison("2")]
    assert await ladder.run([("s1", "a")]) == ["done a"]
    assert script.isolated == []


async def test_a_conflict_is_retried_at_once_within_a_group_and_counted() -> None:
    conflicts: list[int] = []
    script = Script(failures={"a": [ConcurrencyConflict("seq 2 taken")] * 2})
    ladder = ladder_of(script, 3, on_conflict=lambda: conflicts.append(1))
    assert await ladder.run([("s1", "a"), ("s1", "c")]) == ["done a", "done c"]
    assert script.units == [("a", "c")] * 3 and len(conflicts) == 2


async def test_a_conflict_in_a_batch_of_several_groups_splits_it_at_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="saga.isolation")
    script = Script(failures={"b": [WriteConflict()]})
    assert await ladder_of(script, 3).run(ITEMS) == ["done a", "done b", "done c", "done d"]
    assert script.units[0] == ("a", "b", "c", "d") and sorted(script.units[1:]) == [("a", "c"), ("b",), ("d",)]
    # Contention, not a failure: nothing a chaos run or an operator counts as work sent down the ladder.
    assert [record.getMessage() for record in caplog.records] == [SPLIT_BY_A_CONFLICT]


async def test_a_batch_that_fails_for_a_reason_of_its_own_says_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="saga.isolation")
    script = Script(failures={"b": [Poison("b")]})
    assert await ladder_of(script, 3).run(ITEMS) == ["done a", "done b", "done c", "done d"]
    assert [(record.levelname, record.getMessage()) for record in caplog.records] == [("WARNING", GROUPS_ONE_BY_ONE)]
    assert GROUPS_ONE_BY_ONE in BELOW_THE_BATCH and SPLIT_BY_A_CONFLICT not in BELOW_THE_BATCH


async def test_a_conflict_that_never_ends_counts_as_a_failure_of_the_unit() -> None:
    script = Script(failures={"a": [ConcurrencyConflict("again")] * (CONFLICT_RETRIES * 3)})
    assert await ladder_of(script, 3).run([("s1", "a")]) == ["isolated a"]
    assert script.isolated and "ConcurrencyConflict" in script.isolated[0][1]


async def test_an_end_that_fails_is_raised_to_the_caller() -> None:
    script = Script(poison={"a"})

    async def isolate(item: tuple[str, str], error: Exception) -> str:
        raise RuntimeError("the quarantine cannot be written")

    script.isolate = isolate  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="quarantine"):
        await ladder_of(script, 1).run([("s1", "a")])


# -- the wait --------------------------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_an_outage_is_reported_while_it_lasts_and_holds_timers_a_while_after() -> None:
    clock = Clock()
    health = ServiceHealth("test", clock=clock)
    health.consuming = True
    wait = OutageWait("participant flight", first_s=0.001, max_s=0.002, health=lambda: health)
    await wait.pause(disk_full())
    await wait.pause(disk_full())
    assert wait.waiting
    ready, why = health.readiness()
    assert not ready and any("participant flight waits out a platform fault" in text and "DiskFullError (53100)"
                             in text for text in why), why
    assert health.snapshot()["waiting_out"]["participant flight"]["fault"].startswith("DiskFullError (53100)")
    assert health.outage_within(10.0) and not health.outage_within(10.0, ignoring=("participant flight",))
    assert health.platform_faults.labels(component="participant flight")._value.get() == 1  # one outage, once
    clock.now += 2
    wait.over()
    assert not wait.waiting and health.snapshot()["waiting_out"] == {}
    assert health.outage_within(10.0)  # just over: timers still held
    clock.now += 11
    assert not health.outage_within(10.0)


async def test_the_wait_backs_off_and_starts_over_after_the_outage() -> None:
    health = ServiceHealth("test")
    wait = OutageWait("relay saga.outbox", first_s=0.01, max_s=0.04, health=lambda: health)
    loop = asyncio.get_running_loop()
    pauses = []
    for _ in range(4):
        started = loop.time()
        await wait.pause(TimeoutError())
        pauses.append(loop.time() - started)
    assert pauses[0] < pauses[2] and pauses[3] < 0.1
    wait.over()
    started = loop.time()
    await wait.pause(TimeoutError())
    assert loop.time() - started < 0.03


async def test_a_stop_ends_the_wait_early() -> None:
    stop = asyncio.Event()
    stop.set()
    wait = OutageWait("orchestrator messages", first_s=30, health=lambda: ServiceHealth("test"))
    await asyncio.wait_for(wait.pause(disk_full(), stop), timeout=1)


async def test_the_ladder_opens_each_units_spans_and_ends_them_with_it_a_failed_try_marked() -> None:
    trace_of = {group: f"00-{str(n) * 32}-{'c' * 16}-01" for n, group in enumerate(("s1", "s2", "s3"), start=1)}

    class Traced(Script):
        async def handle(self, items: Sequence[tuple[str, str]]) -> list[str]:
            for group, name in items:  # the service names each item's saga trace in the unit the ladder runs
                tracing.open_span(trace_of[group], {"item": name})
            return await super().handle(items)

    script = Traced(poison={"c"})
    with spans_in_memory() as exported:
        assert await ladder_of(script, 3).run(ITEMS) == ["done a", "done b", "isolated c", "done d"]
    spans = exported.get_finished_spans()
    # The batch, s1's group (a, c), a alone, c's three tries, then b and d: a span per item of each unit tried.
    assert script.units == [("a", "b", "c", "d"), ("a", "c"), ("a",), ("c",), ("c",), ("c",), ("b",), ("d",)]
    assert len(spans) == sum(len(unit) for unit in script.units) == 12
    assert {span.name for span in spans} == {"test.unit"}
    failed = sorted(str((span.attributes or {})["item"]) for span in spans
                    if span.status.status_code is StatusCode.ERROR)
    assert failed == ["a", "a", "b", "c", "c", "c", "c", "c", "d"]  # the units that failed: 4 + 2 + 3 spans
    assert {f"{span.context.trace_id:032x}" for span in spans if span.context} == {"1" * 32, "2" * 32, "3" * 32}
