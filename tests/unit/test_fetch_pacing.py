"""The orchestrator's fetch answers at once while polls stay small and waits, in proportion, when they grow."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from saga_orchestrator.orchestrator.consumer import (
    FETCH_MIN_BYTES,
    FULL_POLL,
    IDLE_AFTER_EMPTY_POLLS,
    IDLE_FETCH_WAIT_MS,
    SMALL_POLL,
    FetchPacing,
)


def _consumer() -> Any:
    return SimpleNamespace(_fetcher=SimpleNamespace(_fetch_min_bytes=1, _fetch_max_wait_ms=IDLE_FETCH_WAIT_MS))


def _mode(consumer: Any) -> tuple[int, int]:
    return consumer._fetcher._fetch_min_bytes, consumer._fetcher._fetch_max_wait_ms


def test_small_and_empty_polls_make_the_next_fetch_answer_as_soon_as_a_record_arrives() -> None:
    consumer, pacing = _consumer(), FetchPacing(75)
    for records in (0, 1, SMALL_POLL):
        pacing.polled(consumer, records)
        assert _mode(consumer) == (1, IDLE_FETCH_WAIT_MS)


def test_the_wait_grows_with_the_poll_and_stops_at_the_setting() -> None:
    pacing = FetchPacing(75)
    waits = [pacing.next_fetch(SMALL_POLL + extra)[1] for extra in (FULL_POLL // 5, FULL_POLL // 2, FULL_POLL)]
    assert waits == [15, 35, 75]
    assert pacing.next_fetch(10_000) == (FETCH_MIN_BYTES, 75)


def test_a_big_poll_sets_the_batching_fetch_and_a_small_one_sets_it_back() -> None:
    consumer, pacing = _consumer(), FetchPacing(75)
    pacing.polled(consumer, 500)
    assert _mode(consumer) == (FETCH_MIN_BYTES, 75)
    pacing.polled(consumer, SMALL_POLL)
    assert _mode(consumer) == (1, IDLE_FETCH_WAIT_MS)


def test_a_longer_setting_than_the_idle_wait_is_kept_for_the_long_poll() -> None:
    assert FetchPacing(900).next_fetch(0) == (1, 900)


def test_the_fixed_pacing_waits_whenever_records_flow_and_answers_at_once_after_a_quiet_spell() -> None:
    consumer, pacing = _consumer(), FetchPacing(75, adaptive=False)
    pacing.polled(consumer, 1)
    assert _mode(consumer) == (FETCH_MIN_BYTES, 75)
    for _ in range(IDLE_AFTER_EMPTY_POLLS - 1):
        pacing.polled(consumer, 0)
    assert _mode(consumer) == (FETCH_MIN_BYTES, 75)  # an empty poll among flowing records changes nothing
    pacing.polled(consumer, 0)
    assert _mode(consumer) == (1, IDLE_FETCH_WAIT_MS)
    pacing.polled(consumer, 0)
    assert _mode(consumer) == (1, IDLE_FETCH_WAIT_MS)
    pacing.polled(consumer, 2)
    assert _mode(consumer) == (FETCH_MIN_BYTES, 75)
