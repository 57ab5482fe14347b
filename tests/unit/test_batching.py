"""How a participant's next batch gathers: at once after a batch of one, and after a larger one while a burst's
events keep coming, up to the batch size or the deadline."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from saga_orchestrator.participants.batching import GAP_S, gather_burst, gathers


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
