"""The outbox relay's poll interval: short while polls find rows, doubling while they find none, and left
alone by rows that a writer's wake-up brought (no I/O: the relay is only constructed)."""

from __future__ import annotations

from typing import Any

import pytest

from saga_orchestrator.outbox.relay import OutboxRelay


def idle_relay() -> OutboxRelay:
    pool: Any = None  # never touched: only the poll arithmetic runs
    return OutboxRelay(pool, "saga.outbox", producer_factory=lambda: None, min_poll_ms=25, max_poll_ms=200)


@pytest.mark.parametrize(("idle_s", "published", "woken", "expected_s"), [
    (0.2, 3, False, 0.025),  # a poll found rows a writer elsewhere committed: look again soon
    (0.2, 3, True, 0.2),     # the rows came with a wake-up: polls stay as rare as they were
    (0.025, 0, False, 0.05),  # nothing found: wait twice as long...
    (0.025, 0, True, 0.05),   # ...woken or not
    (0.15, 0, False, 0.2),   # ...up to max_poll_ms
])
def test_next_poll_interval(idle_s: float, published: int, woken: bool, expected_s: float) -> None:
    assert idle_relay()._next_poll_s(idle_s, published, woken) == pytest.approx(expected_s)
