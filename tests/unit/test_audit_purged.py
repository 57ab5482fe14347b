"""``saga audit`` of purged sagas: the topic's copies of the purged events must match the SagaPurged digest."""

from __future__ import annotations

from saga_orchestrator.orchestrator.audit import Difference, set_purged_aside
from saga_orchestrator.orchestrator.domain.retention import purged_event
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import wire
from saga_orchestrator.testing.history import SagaRun


def _purged_trip() -> tuple[dict[tuple[str, int], set[bytes]], SagaRun]:
    run = SagaRun(TRIP, saga_id="t-audit")
    run.start()
    for step in ("book_flight", "book_hotel", "charge_card", "send_itinerary"):
        run.ok(step)
    return {(e.saga_id, e.seq): {wire.encode_event(e)} for e in run.events}, run


def test_copies_that_match_the_digest_are_set_aside_and_the_purge_event_kept() -> None:
    published, run = _purged_trip()
    event = purged_event(run.saga, [next(iter(published[key])) for key in sorted(published)], 5, None)
    published[(run.saga_id, event.seq)] = {wire.encode_event(event)}
    published[("other", 1)] = {b"x"}
    kept, differences, unverifiable = set_purged_aside({run.saga_id: event}, published)
    assert set(kept) == {(run.saga_id, event.seq), ("other", 1)}
    assert (differences, unverifiable) == ([], 0)


def test_a_changed_copy_is_a_difference_and_a_missing_one_leaves_the_saga_unverifiable() -> None:
    published, run = _purged_trip()
    event = purged_event(run.saga, [next(iter(published[key])) for key in sorted(published)], 5, None)
    changed = dict(published)
    changed[(run.saga_id, 3)] = {b"forged"}
    _, differences, unverifiable = set_purged_aside({run.saga_id: event}, changed)
    assert differences == [Difference(run.saga_id, event.seq,
                                      "the topic's events before the purge do not match SagaPurged.purged_digest")]
    assert unverifiable == 0
    missing = {key: bodies for key, bodies in published.items() if key[1] != 1}  # the topic's retention ran
    _, differences, unverifiable = set_purged_aside({run.saga_id: event}, missing)
    assert (differences, unverifiable) == ([], 1)
