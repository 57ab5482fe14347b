"""How a participant's next batch gathers: at once after a batch of one, and after a larger one while a burst's
events keep coming, up to the batch size or the deadline; a worker's first batch, also until it holds the rest of
each partition's fetched backlog."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from saga_orchestrator.participants.batching import GAP_S, behind, gather_backlog, gather_burst, gathers


@pytest.mark.parametrize(("last", "expected"), [(0, False), (1, False), (2, True), (100, True)])
def test_only_a_batch_of_more_than_one_lets_the_next_gather(last: int, expected: bool) -> None:
    assert gathers(last) is expected


async def _add_per_loop_pass(buffer: list[Any], count: int | None) -> None:
    """Append one item per pass of the event loop, as faust's stream feeds a batch: ``count`` of them, or for
    ever."""
    added = 0
    while count is None or added < count:
        buffer.append(added)
        added += 1
        await asyncio.sleep(0)


async def test_a_burst_is_gathered_whole_and_the_gathering_ends_once_it_stopped() -> None:
    buffer: list[Any] = ["first"]
    feeder = asyncio.ensure_future(_add_per_loop_pass(buffer, 40))
    loop = asyncio.get_running_loop()
    started = loop.time()
    await gather_burst(buffer, 1_000, started + 60.0)
    assert feeder.done() and len(buffer) == 41
    assert loop.time() - started < 30.0  # ended by the quiet gap, long before the deadline


async def test_nothing_more_arriving_ends_the_gathering_after_one_gap() -> None:
    buffer: list[Any] = ["first"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    await gather_burst(buffer, 1_000, started + 60.0)
    assert buffer == ["first"]
    assert GAP_S <= loop.time() - started + 0.001 < 30.0


async def test_a_stream_that_never_pauses_is_cut_at_the_batch_size() -> None:
    buffer: list[Any] = []
    feeder = asyncio.ensure_future(_add_per_loop_pass(buffer, None))
    try:
        await gather_burst(buffer, 50, asyncio.get_running_loop().time() + 60.0)
        assert len(buffer) >= 50
    finally:
        feeder.cancel()


async def test_a_stream_that_never_pauses_is_cut_at_the_deadline() -> None:
    buffer: list[Any] = []
    feeder = asyncio.ensure_future(_add_per_loop_pass(buffer, None))
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        await gather_burst(buffer, 10**9, started + 0.05)
        assert loop.time() - started >= 0.05
        assert 0 < len(buffer) < 10**9
    finally:
        feeder.cancel()


class _Message:
    def __init__(self, tp: str, offset: int) -> None:
        self.tp, self.offset = tp, offset


class _Event:
    def __init__(self, tp: str, offset: int) -> None:
        self.message = _Message(tp, offset)


def _ends(**ends: int | None) -> Any:
    return lambda tp: ends.get(tp)


def test_a_buffer_is_behind_while_a_partition_it_holds_has_records_fetched_past_its_last() -> None:
    held = [_Event("p0", 3), _Event("p0", 4), _Event("p1", 7)]
    assert behind(held, _ends(p0=6, p1=8))  # p0's record at offset 5 (a withdrawal, say) is not in yet
    assert not behind(held, _ends(p0=5, p1=8))
    # A partition it holds nothing of, or whose end is not known, does not hold it back.
    assert not behind(held, _ends(p0=5, p1=None, p2=100))
    assert not behind([], _ends(p0=5))


async def test_the_backlog_gathers_past_a_pause_until_each_partition_it_holds_is_in() -> None:
    # The command comes in, then nothing for much longer than a burst's gap (a loaded worker), then the
    # withdrawal queued behind it in the same partition: both are in the batch.
    buffer: list[Any] = [_Event("p0", 0)]

    async def late() -> None:
        await asyncio.sleep(GAP_S * 20)
        buffer.append(_Event("p0", 1))

    feeder = asyncio.ensure_future(late())
    await gather_backlog(buffer, 100, asyncio.get_running_loop().time() + 60.0, _ends(p0=2))
    assert feeder.done() and [event.message.offset for event in buffer] == [0, 1]


async def test_a_backlog_that_never_comes_is_waited_for_only_until_the_deadline() -> None:
    buffer: list[Any] = [_Event("p0", 0)]
    loop = asyncio.get_running_loop()
    started = loop.time()
    await gather_backlog(buffer, 100, started + 0.05, _ends(p0=10))
    assert len(buffer) == 1 and 0.05 <= loop.time() - started + 0.001 < 30.0
