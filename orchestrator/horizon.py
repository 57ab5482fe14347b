"""How far the orchestrator has read its results topics, as a point in time: the timers' horizon.

A step timeout means "no reply came before the deadline". That is only known once every reply sent before
the deadline has been read: while the orchestrator works through a backlog, replies that beat the deadline
may still wait unread in Kafka, and timing those steps out would retry (or unwind) work that succeeded,
adding load exactly when the system is behind. So a timer fires only when its due time is at or before the
read horizon: the earliest, over the results partitions, of

- the time the partition was last seen caught up (its next offset at the high watermark), or
- the producer timestamp of the last record read from it, while it still lags.

A partition with nothing known yet (no fetch answered, or lagging with nothing read) holds every timer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

HOLD_ALL = 0
"""A horizon before every due time: no timer fires."""


@dataclass(frozen=True)
class PartitionProgress:
    """What the consumer knows about one results partition."""

    position: int  # offset of the next record to hand to the orchestrator
    end_offset: int | None  # last stable offset (the high watermark for plain producers); None: no answer yet
    checked_ms: int | None  # wall-clock ms of the fetch answer that reported ``end_offset``
    last_record_ms: int | None  # producer timestamp of the last record read, if any


def partition_horizon(progress: PartitionProgress) -> int:
    """Up to which wall-clock ms every record of this partition has been read (``HOLD_ALL`` if unknown)."""
    if progress.end_offset is None or progress.checked_ms is None:
        return HOLD_ALL
    if progress.position >= progress.end_offset:
        return progress.checked_ms
    return progress.last_record_ms if progress.last_record_ms is not None else HOLD_ALL


def read_horizon(partitions: Iterable[PartitionProgress]) -> int:
    """The read horizon over ``partitions``: the earliest partition horizon (``HOLD_ALL`` for none)."""
    horizons = [partition_horizon(progress) for progress in partitions]
    return min(horizons) if horizons else HOLD_ALL
