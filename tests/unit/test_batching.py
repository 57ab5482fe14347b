"""How long a participant's batch may fill: nothing after a small batch, more after a fuller one."""

from __future__ import annotations

import pytest

from saga_orchestrator.participants.batching import gather_wait_s


@pytest.mark.parametrize(("last", "expected"), [(0, 0.0), (1, 0.0), (10, 0.0025), (50, 0.0125), (100, 0.025),
                                                (300, 0.025)])
def test_the_wait_follows_the_last_batch(last: int, expected: float) -> None:
    assert gather_wait_s(last, 100, 0.025) == pytest.approx(expected)
