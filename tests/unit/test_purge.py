"""Retention in the pure core: the SagaPurged that stands in for an ended saga's events, folding a purged
history, and what a purged saga does with messages."""

from __future__ import annotations

import pytest

from saga_orchestrator.orchestrator.domain.builder import Timer, TimerKind
from saga_orchestrator.orchestrator.domain.decide import DUPLICATE_START_REASON, decide
from saga_orchestrator.orchestrator.domain.errors import HistoryMismatch, IllegalTransition
from saga_orchestrator.orchestrator.domain.messages import IncomingMessage, TimerFired
from saga_orchestrator.orchestrator.domain.retention import may_purge, purged_digest, purged_event
from saga_orchestrator.orchestrator.domain.state import SagaState, SagaStatus, apply_event, fold
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.message_types import (
    CancelSaga,
    CommandKind,
    ResultStatus,
    ResumeCompensation,
    StartSaga,
    StepResult,
)
from saga_orchestrator.testing.history import SagaRun
from tests.trip_runs import trip_run

NOW = 2_000_000


def _ended(kind: str) -> SagaRun:
    return trip_run(kind, f"t-{kind}")


def _purged(run: SagaRun) -> tuple[ev.SagaPurged, SagaState]:
    event = purged_event(run.saga, [wire.encode_event(e) for e in run.events], NOW, "ana")
    return event, fold(None, [event])


def test_the_purge_event_follows_the_history_and_digests_its_bytes() -> None:
    run = _ended("compensated")
    event, _ = _purged(run)
    assert (event.seq, event.purged_through_seq, event.final_status) == (len(run.events) + 1, len(run.events),
                                                                          "COMPENSATED")
    assert (event.ended_at, event.occurred_at, event.operator) == (run.saga.updated_at, NOW, "ana")
    assert event.purged_digest == purged_digest(wire.encode_event(e) for e in run.events)
    # Lengths are part of the digest: the same bytes cut differently are different histories.
    assert purged_digest([b"ab", b"c"]) != purged_digest([b"a", b"bc"])
    assert wire.decode_event(wire.encode_event(event)) == event


def test_a_purged_history_folds_to_the_same_state_as_the_whole_history_and_its_purge() -> None:
    run = _ended("completed")
    event, purged = _purged(run)
    assert purged.status is SagaStatus.PURGED and purged.is_terminal
    assert purged.reason == f"ended COMPLETED; events 1-{event.purged_through_seq} purged"
    assert fold(TRIP, [*run.events, event]) == purged
    assert (purged.last_seq, purged.started_at, purged.saga_type) == (event.seq, run.saga.updated_at, "trip")


@pytest.mark.parametrize(("kind", "cutoff", "expected"), [
    ("completed", NOW, True), ("compensated", NOW, True), ("running", NOW, False),
    ("completed", 1_000_000, False),  # ended at (or after) the cutoff
])
def test_may_purge_only_what_ended_before_the_cutoff(kind: str, cutoff: int, expected: bool) -> None:
    assert may_purge(_ended(kind).saga, cutoff) is expected


def test_a_saga_waiting_for_an_operator_or_still_running_cannot_be_purged() -> None:
    run = _ended("running")
    with pytest.raises(IllegalTransition):
        apply_event(TRIP, run.saga, purged_event(run.saga, [], NOW, None))
    failed = SagaRun(TRIP, saga_id="t-stuck")
    failed.start()
    failed.ok("book_flight")
    failed.fail("book_hotel", error="SoldOut")
    failed.comp_fail("book_flight", error="CancellationRefused")
    assert failed.saga.status is SagaStatus.COMPENSATION_FAILED
    with pytest.raises(IllegalTransition):
        apply_event(TRIP, failed.saga, purged_event(failed.saga, [], NOW, None))


def test_a_purge_event_that_misstates_the_end_or_the_range_is_a_broken_history() -> None:
    run = _ended("completed")
    event, _ = _purged(run)
    with pytest.raises(HistoryMismatch, match="ended FAILED"):
        apply_event(TRIP, run.saga, ev.SagaPurged(**{**vars(event), "final_status": "FAILED"}))
    with pytest.raises(HistoryMismatch, match="purged through"):
        fold(None, [ev.SagaPurged(**{**vars(event), "purged_through_seq": 3})])


def test_a_purged_saga_refuses_a_start_and_a_cancel_and_ignores_the_rest() -> None:
    run = _ended("completed")
    event, state = _purged(run)
    start = decide(None, state, StartSaga(saga_id=run.saga_id, saga_type="trip", tenant_id=None, input=b"x"), NOW)
    [refused] = start.events
    assert isinstance(refused, ev.SagaRejected) and refused.reason == DUPLICATE_START_REASON
    assert refused.seq == event.seq + 1 and start.state is not None and start.state.status is SagaStatus.PURGED
    cancel = decide(None, state, CancelSaga(saga_id=run.saga_id, reason="late"), NOW)
    assert [type(e).__name__ for e in cancel.events] == ["SagaCancelRefused"]
    quiet: list[IncomingMessage] = [
        StepResult(saga_id=run.saga_id, step="book_flight", kind=CommandKind.FORWARD,
                   idempotency_key=f"{run.saga_id}:book_flight", attempt=1, status=ResultStatus.SUCCEEDED),
        ResumeCompensation(saga_id=run.saga_id, operator="ana", detail=None),
        TimerFired(timer=Timer(saga_id=run.saga_id, kind=TimerKind.STEP_TIMEOUT, step="book_flight", attempt=1,
                               due_at=NOW)),
    ]
    for message in quiet:
        assert decide(None, state, message, NOW).is_empty, message
