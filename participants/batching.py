"""Batches of a faust stream that follow the load: what has arrived, the moment the worker is free.

faust's ``noack_take(max, within)`` flushes its buffer on a clock: every ``within`` seconds, or when ``max``
events are in. An idle worker wakes up every ``within`` (40 times a second at 25 ms), and a lone command waits
for the next tick (half of ``within`` on average). ``natural_batches`` sleeps until an event arrives and hands
over what is buffered then. While a batch is being handled, the events that arrive gather in the buffer, so the
next batch is whatever piled up meanwhile (group commit): batches grow with the load, not with a wait. After a
batch of more than one, and for the first batch (a worker starting on a backlog), it lets the batch gather while
its events keep coming (a burst: each within ``GAP_S`` of the last), at most ``max_wait_s``; after a batch of one
it waits for nothing. The first batch also waits, up to ``BACKLOG_WAIT_S``, until it holds every record fetched so
far of each partition it holds a record of (``behind``): a command and the withdrawal queued behind it (same
saga, same partition) are then handled together, however slowly a loaded worker is fed (a fence, not a timing).

Like ``noack_take``, it yields events unacknowledged (the caller acks them once their batch committed) and
feeds its buffer from a processor on the stream, so it relies on faust's stream internals (``add_processor``,
``_enable_passive``, ``current_event``), which ``constraints.txt`` pins.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from mode.utils.aiter import aiter

GAP_S = 0.002
"""While a batch gathers, it waits for the next event this long: a burst's events come closer together."""

BACKLOG_WAIT_S = 5.0
"""The longest a worker's first batch waits for the rest of a backlog it was fetched (``behind``)."""

Highwater = Callable[[Any], int | None]
"""The log end offset of a topic partition as of the consumer's latest fetch of it (None: not known)."""


def gathers(last_batch: int) -> bool:
    """Whether the next batch waits for the rest of a burst: only after a batch of more than one (a lone
    event at a quiet time is handed over at once)."""
    return last_batch > 1


async def natural_batches(stream: Any, max_size: int, max_wait_s: float) -> AsyncIterator[list[Any]]:
    """Lists of up to ``max_size`` unacknowledged events of ``stream``, each as soon as the caller asks for it
    and at least one event is in (see the module's docstring).

    The buffer is emptied as a batch is handed over, so the events that arrive while the caller handles it
    gather for the next one (up to ``max_size``: then the stream waits). faust's stream takes one event from
    its channel per pass of the event loop, so a worker whose loop is busy (several participants, relays)
    would otherwise hand over one or two events at a time however many were queued.
    """
    buffer: list[Any] = []
    arrived = asyncio.Event()  # the buffer holds an event
    drained = asyncio.Event()  # a full buffer was handed over: adding may go on

    async def add(value: Any) -> Any:
        event = stream.current_event
        if event is None:
            raise RuntimeError("a stream event without current_event")
        buffer.append(event)
        arrived.set()
        if len(buffer) >= max_size:
            drained.clear()
            await stream.wait(drained)  # never more than max_size in one batch
        return value

    loop = asyncio.get_running_loop()
    highwater = _highwater_of(stream)
    acks_were = stream.enable_acks
    stream.enable_acks = False  # the caller acks each event after its batch committed
    stream.add_processor(add)
    stream._enable_passive(aiter(stream.channel))
    # The first batch gathers what is queued (a worker starting on a backlog): a command withdrawn while its
    # participant was down then comes in the batch of its withdrawal, and does not run (kit.handling). A gap in
    # the hand-over (a loaded worker) does not end it while a partition's fetched records are not all in.
    last, first = max_size, True
    try:
        while not stream.should_stop:
            await stream.wait_for_stopped(arrived)  # no timeout: an idle worker sleeps
            await asyncio.sleep(0)  # let the events already queued in
            if gathers(last):
                await gather_burst(buffer, max_size, loop.time() + max_wait_s)
            if first and buffer:
                first = False
                await gather_backlog(buffer, max_size, loop.time() + BACKLOG_WAIT_S, highwater)
            if not buffer:
                continue
            batch, last = list(buffer), len(buffer)  # never over max_size: ``add`` waits at max_size
            buffer.clear()
            arrived.clear()
            drained.set()
            yield batch
    finally:
        stream.enable_acks = acks_were
        stream._processors.remove(add)


async def gather_burst(buffer: list[Any], max_size: int, deadline: float) -> None:
    """Let ``buffer`` fill while its events keep coming ``GAP_S`` apart or closer, until it holds ``max_size``
    or the loop's clock passes ``deadline``.

    faust hands a worker's events over one per pass of the event loop (its consumer's drain, then the stream),
    and a pass takes as long as the CPU work of every task ready in it: a worker whose batches keep its loop
    busy is fed slowly, so its next batch is small again. Waiting here frees the loop for the hand-over."""
    loop = asyncio.get_running_loop()
    while len(buffer) < max_size:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        had = len(buffer)
        await asyncio.sleep(min(GAP_S, remaining))
        if len(buffer) == had:
            return


def behind(buffer: list[Any], highwater: Highwater) -> bool:
    """Whether a partition of which ``buffer`` holds an event has records fetched past the last one it holds:
    the rest of that partition's backlog is still being handed over."""
    last: dict[Any, int] = {}
    for event in buffer:
        message = event.message
        last[message.tp] = max(message.offset, last.get(message.tp, -1))
    for tp, offset in last.items():
        end = highwater(tp)
        if end is not None and offset < end - 1:
            return True
    return False


async def gather_backlog(buffer: list[Any], max_size: int, deadline: float, highwater: Highwater) -> None:
    """Let ``buffer`` fill while it is ``behind`` (bursts of it, as ``gather_burst``), until it holds
    ``max_size`` or the loop's clock passes ``deadline``."""
    loop = asyncio.get_running_loop()
    while len(buffer) < max_size and loop.time() < deadline and behind(buffer, highwater):
        await asyncio.sleep(GAP_S)
        await gather_burst(buffer, max_size, deadline)


def _highwater_of(stream: Any) -> Highwater:
    """The highwater of the stream's consumer (faust's ``Consumer.highwater``); None when it cannot say (the
    partition no longer assigned, nothing fetched of it yet)."""
    consumer = stream.app.consumer

    def highwater(tp: Any) -> int | None:
        try:
            end = consumer.highwater(tp)
        except Exception:  # revoked (aiokafka asserts it is assigned): the batch does not wait for it
            return None
        return end if isinstance(end, int) else None

    return highwater
