"""Quarantine in the pure core: a saga that cannot go on records SagaQuarantined and stops (its timers with it),
takes nothing but a ReleaseSaga, and a release sends every open step again and goes on where it stood."""

from __future__ import annotations

import pytest

from saga_orchestrator.orchestrator.domain.builder import TimerKind
from saga_orchestrator.orchestrator.domain.decide import decide, quarantine, quarantine_unfolded
from saga_orchestrator.orchestrator.domain.errors import HistoryMismatch
from saga_orchestrator.orchestrator.domain.state import SagaStatus, fold
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.schemas.message_types import ReleaseSaga
from saga_orchestrator.testing.history import SagaRun, command_names, event_names
from tests.trip_runs import trip_run

REASON = "UnknownDefinition: trip version 1 is not deployed"


def _quarantined(run: SagaRun) -> None:
    decision = run.take(quarantine(TRIP, run.saga, REASON, "m-7", run.now))
    assert event_names(decision) == ["SagaQuarantined"]
    assert decision.dead_letter == REASON and not decision.commands and not decision.timers
    assert run.status() is SagaStatus.QUARANTINED and run.saga.reason == REASON


def test_a_quarantined_saga_stops_its_timers_and_refuses_every_message_but_a_release() -> None:
    run = trip_run("running")  # the charge is in flight, its timeout armed
    armed = set(run.armed)
    _quarantined(run)
    assert armed and set(run.armed) == set()  # every timer of the saga was made obsolete
    event = run.events[-1]
    assert isinstance(event, ev.SagaQuarantined) and event.message_id == "m-7"

    late_reply = run.ok("charge_card")
    assert not late_reply.events and late_reply.dead_letter is not None
    assert "saga release s1" in late_reply.dead_letter and REASON in late_reply.dead_letter
    assert run.cancel().dead_letter is not None and run.status() is SagaStatus.QUARANTINED
    stale = run.fire(TimerKind.STEP_TIMEOUT, "charge_card", attempt=1)
    assert not stale.events and stale.dead_letter is None  # a timer of a stopped saga does nothing


def test_a_release_sends_the_open_steps_again_and_the_saga_goes_on() -> None:
    run = trip_run("running")
    _quarantined(run)
    released = run.release()
    assert event_names(released) == ["SagaReleased", "StepCommandSent charge_card 2"]
    assert command_names(released) == ["payment.charge_card FORWARD 2"]
    assert run.status() is SagaStatus.RUNNING and run.saga.reason is None
    assert {timer.step for timer in run.armed.values()} == {"charge_card"}  # its timeout is armed again
    run.ok("charge_card")
    run.ok("send_itinerary")
    assert run.status() is SagaStatus.COMPLETED


def test_a_released_unwinding_saga_sends_its_compensations_again() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    run.fail("book_hotel", error="SoldOut")  # cancel_flight is in flight
    assert run.status() is SagaStatus.COMPENSATING
    _quarantined(run)
    released = run.release()
    assert command_names(released) == ["flight.cancel_flight COMPENSATE 2"]
    run.comp_ok("book_flight")
    assert run.status() is SagaStatus.COMPENSATED


def test_an_ended_saga_released_stays_ended_and_sends_nothing() -> None:
    run = trip_run("completed")
    _quarantined(run)
    released = run.release()
    assert event_names(released) == ["SagaReleased"] and not released.commands
    assert run.status() is SagaStatus.COMPLETED


def test_a_release_of_a_saga_that_is_not_quarantined_is_refused_and_changes_nothing_else() -> None:
    run = trip_run("running")
    before = run.saga
    repeated = run.release()
    [refused] = repeated.events
    assert isinstance(refused, ev.OperatorActionRefused) and (refused.action, refused.operator, refused.reason) == (
        "ReleaseSaga", "ops", "saga is RUNNING, not quarantined: nothing to release")
    assert repeated.dead_letter is None and not repeated.commands
    assert run.status() is SagaStatus.RUNNING and run.saga.steps == before.steps


def test_a_saga_whose_history_does_not_fold_is_quarantined_after_its_last_event() -> None:
    decision = quarantine_unfolded("s9", last_seq=12, definition_version=3, reason=REASON, message_id=None, now=5)
    [event] = decision.events
    assert isinstance(event, ev.SagaQuarantined)
    assert (event.seq, event.definition_version, event.reason, event.occurred_at) == (13, 3, REASON, 5)
    assert decision.state is None and decision.dead_letter == REASON


def test_a_release_without_a_quarantine_is_a_history_mismatch() -> None:
    run = trip_run("running")
    forged = ev.SagaReleased(saga_id="s1", seq=run.saga.last_seq + 1, definition_version=1, occurred_at=run.now)
    with pytest.raises(HistoryMismatch, match="not quarantined"):
        fold(TRIP, [*run.events, forged])


def test_a_quarantine_and_release_survive_a_fold_from_scratch() -> None:
    run = trip_run("running")
    _quarantined(run)
    assert fold(TRIP, run.events).status is SagaStatus.QUARANTINED
    run.release()
    state = fold(TRIP, run.events)
    assert state.status is SagaStatus.RUNNING and state.quarantined_from is None
    assert state.steps["charge_card"].attempt == 2


def test_a_release_for_a_saga_that_does_not_exist_is_dead_lettered() -> None:
    decision = decide(None, None, ReleaseSaga(saga_id="nobody", operator=None, detail=None), 1)
    assert not decision.events and decision.dead_letter is not None and "nobody" in decision.dead_letter


def test_a_compensation_reply_to_a_quarantined_saga_is_refused_too() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    run.fail("book_hotel", error="SoldOut")
    _quarantined(run)
    refused = run.comp_ok("book_flight")
    assert not refused.events and refused.dead_letter is not None
