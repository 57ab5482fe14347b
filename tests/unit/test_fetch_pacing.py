"""The orchestrator's fetch waits for a batch while records flow and answers at once after a quiet spell."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from saga_orchestrator.orchestrator.consumer import (
    FETCH_MIN_BYTES,
    IDLE_AFTER_EMPTY_POLLS,
    IDLE_FETCH_WAIT_MS,
    FetchPacing,
)


def _consumer() -> Any:
    return SimpleNamespace(_fetcher=SimpleNamespace(_fetch_min_bytes=FETCH_MIN_BYTES, _fetch_max_wait_ms=75))


def _mode(consumer: Any) -> tuple[int, int]:
    return consumer._fetcher._fetch_min_bytes, consumer._fetcher._fetch_max_wait_ms


def test_empty_polls_make_the_fetch_answer_at_once_and_records_bring_the_batching_back() -> None:
    consumer, pacing = _consumer(), FetchPacing(75)
    for _ in range(IDLE_AFTER_EMPTY_POLLS - 1):
        pacing.polled(consumer, 0)
    assert _mode(consumer) == (FETCH_MIN_BYTES, 75) and not pacing.idle
    pacing.polled(consumer, 0)
    assert _mode(consumer) == (1, IDLE_FETCH_WAIT_MS) and pacing.idle
    pacing.polled(consumer, 3)
    assert _mode(consumer) == (FETCH_MIN_BYTES, 75) and not pacing.idle
    pacing.polled(consumer, 0)  # one empty poll among flowing records changes nothing
    assert _mode(consumer) == (FETCH_MIN_BYTES, 75)
