"""Batches of a faust stream that follow the load: what has arrived, the moment the worker is free.

faust's ``noack_take(max, within)`` flushes its buffer on a clock: every ``within`` seconds, or when ``max``
events are in. An idle worker wakes up every ``within`` (40 times a second at 25 ms), and a lone command waits
for the next tick (half of ``within`` on average). ``natural_batches`` sleeps until an event arrives and hands
over what is buffered then. While a batch is being handled, the stream's events wait in its queue, so the next
batch is whatever piled up meanwhile (group commit): batches grow with the load, not with a wait. After a large
batch it waits a little for the rest of a burst, at most ``max_wait_s`` and in proportion to how full that batch
was; after a small one it waits for nothing.

Like ``noack_take``, it yields events unacknowledged (the caller acks them once their batch committed) and
feeds its buffer from a processor on the stream, so it relies on faust's stream internals (``add_processor``,
``_enable_passive``, ``current_event``), which ``constraints.txt`` pins.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from mode.utils.aiter import aiter
from mode.utils.futures import notify


def gather_wait_s(last_batch: int, max_size: int, max_wait_s: float) -> float:
    """How long to let a batch fill after its first event: in proportion to how full the last batch was (a
    burst is likely still arriving), nothing after a batch of one."""
    if last_batch <= 1:
        return 0.0
    return max_wait_s * min(1.0, last_batch / max_size)


async def natural_batches(stream: Any, max_size: int, max_wait_s: float) -> AsyncIterator[list[Any]]:
    """Lists of up to ``max_size`` unacknowledged events of ``stream``, each as soon as the caller asks for it
    and at least one event is in (see the module's docstring)."""
    buffer: list[Any] = []
    arrived = asyncio.Event()  # the buffer holds an event
    full = asyncio.Event()
    drained = asyncio.Event()  # a full buffer was handed over: adding may go on
    handing_over: asyncio.Future[None] | None = None

    async def add(value: Any) -> Any:
        nonlocal handing_over
        if handing_over is not None:  # a batch is with the caller: this event waits for the next one
            try:
                await handing_over
            finally:
                handing_over = None
        event = stream.current_event
        if event is None:
            raise RuntimeError("a stream event without current_event")
        buffer.append(event)
        arrived.set()
        if len(buffer) >= max_size:
            full.set()
            drained.clear()
            await stream.wait(drained)  # never more than max_size in one batch
        return value

    acks_were = stream.enable_acks
    stream.enable_acks = False  # the caller acks each event after its batch committed
    stream.add_processor(add)
    stream._enable_passive(aiter(stream.channel))
    last = 0
    try:
        while not stream.should_stop:
            await stream.wait_for_stopped(arrived)  # no timeout: an idle worker sleeps
            wait_s = gather_wait_s(last, max_size, max_wait_s)
            if wait_s:
                await stream.wait_for_stopped(full, timeout=wait_s)
            else:
                await asyncio.sleep(0)  # let the events already queued in
            if not buffer:
                continue
            handing_over = asyncio.get_running_loop().create_future()
            batch, last = list(buffer), len(buffer)
            try:
                yield batch
            finally:
                buffer.clear()
                arrived.clear()
                full.clear()
                notify(handing_over)
                drained.set()
    finally:
        stream.enable_acks = acks_were
        stream._processors.remove(add)
