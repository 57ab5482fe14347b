"""The timers' read horizon: a timer due at T fires only once every reply sent before T has been read."""

from __future__ import annotations

import pytest

from saga_orchestrator.orchestrator.horizon import HOLD_ALL, PartitionProgress, partition_horizon, read_horizon


def progress(position: int, end: int | None, checked: int | None = 5_000, last: int | None = None) -> PartitionProgress:
    return PartitionProgress(position=position, end_offset=end, checked_ms=checked, last_record_ms=last)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (progress(10, 10, checked=5_000, last=1_000), 5_000),  # caught up: as of the fetch answer
        (progress(0, 0, checked=5_000), 5_000),  # an empty partition is caught up
        (progress(7, 10, checked=5_000, last=1_000), 1_000),  # lagging: as of the last record read
        (progress(7, 10, checked=5_000, last=None), HOLD_ALL),  # lagging, nothing read yet
        (progress(0, None, checked=None), HOLD_ALL),  # no fetch answered yet
        (progress(3, 2, checked=5_000, last=900), 5_000),  # read_committed: position past the stable offset
    ],
)
def test_partition_horizon(case: PartitionProgress, expected: int) -> None:
    assert partition_horizon(case) == expected


def test_the_most_lagging_partition_decides() -> None:
    partitions = [progress(10, 10, checked=5_000), progress(4, 9, last=2_500), progress(3, 8, last=4_000)]
    assert read_horizon(partitions) == 2_500


def test_no_partition_holds_every_timer() -> None:
    assert read_horizon([]) == HOLD_ALL
