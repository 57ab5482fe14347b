"""Consumer lag from what a Kafka consumer already knows: no request to the broker.

A fetch response carries each partition's end offset (aiokafka's ``highwater``; under ``read_committed`` the
last stable offset), and the consumer knows the position it reads from, so the lag of an assigned partition
is their difference, as of the consumer's last fetch of it. Records fetched but not yet handled count as lag:
their first offset stands in for the position. A partition fetched from nothing yet (just assigned) is left
out until it has been.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

POSITION_WAIT_S = 0.2
"""A position the consumer does not know yet (it is being reset after an assignment) is not waited for longer:
the lag is read at scrape time."""


async def partition_lags(assigned: Iterable[Any], end_offset: Callable[[Any], int | None],
                         position: Callable[[Any], Awaitable[int | None]],
                         unhandled_from: Mapping[Any, int] | None = None) -> dict[tuple[str, int], int]:
    """The lag of each partition in ``assigned`` (objects with ``topic`` and ``partition``), by (topic,
    partition): ``end_offset`` (None while unknown) minus the first offset ``unhandled_from`` gives, else
    ``position``; never below 0."""
    lags: dict[tuple[str, int], int] = {}
    for tp in assigned:
        with contextlib.suppress(Exception):  # a partition revoked meanwhile, a position still unknown
            end = end_offset(tp)
            if end is None or end < 0:
                continue
            at = (unhandled_from or {}).get(tp)
            if at is None:
                at = await asyncio.wait_for(position(tp), POSITION_WAIT_S)
            if at is not None:
                lags[(tp.topic, tp.partition)] = max(0, end - at)
    return lags
