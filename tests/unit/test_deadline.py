"""A saga's deadline: the time from its start within which it must pass its pivot, or be cancelled."""

from __future__ import annotations

import dataclasses

import pytest

from saga_orchestrator.orchestrator.domain.builder import DEADLINE_TIMER_ID, Timer, TimerKind
from saga_orchestrator.orchestrator.domain.definition import RetryPolicy, SagaDefinition
from saga_orchestrator.orchestrator.domain.errors import DefinitionError
from saga_orchestrator.orchestrator.domain.messages import TimerFired
from saga_orchestrator.orchestrator.domain.model import SagaStatus
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.testing.history import T0, SagaRun

TRIP_IN_A_MINUTE = dataclasses.replace(TRIP, deadline_ms=60_000)


def _types(events: tuple[ev.Event, ...]) -> list[str]:
    return [type(event).__name__ for event in events]


def _charging(definition: SagaDefinition) -> SagaRun:
    """A trip whose flight and hotel are booked: the pivot (charge_card) is in flight."""
    run = SagaRun(definition)
    run.start()
    run.ok("book_flight")
    run.ok("book_hotel")
    return run


def test_a_start_arms_the_deadline_and_a_saga_without_one_arms_none() -> None:
    run = SagaRun(TRIP_IN_A_MINUTE)
    run.start()
    assert run.armed[DEADLINE_TIMER_ID].due_at == T0 + 60_000
    plain = SagaRun(TRIP)
    plain.start()
    assert not any(timer.kind is TimerKind.SAGA_DEADLINE for timer in plain.armed.values())


def test_the_deadline_before_the_pivot_cancels_and_compensates_what_was_done() -> None:
    run = SagaRun(TRIP_IN_A_MINUTE)
    run.start()
    run.ok("book_flight")
    decision = run.fire(TimerKind.SAGA_DEADLINE, "")
    assert _types(decision.events)[:2] == ["SagaCancelRequested", "SagaCompensationStarted"]
    requested = decision.events[0]
    assert isinstance(requested, ev.SagaCancelRequested) and requested.reason == "deadline of 60 s passed"
    assert "CompensationSent" in _types(decision.events)
    assert [(type(e).__name__, e.step) for e in decision.events if isinstance(e, ev.StepWithdrawn)] == [
        ("StepWithdrawn", "book_hotel")]  # in flight: withdrawn, never sent again
    assert DEADLINE_TIMER_ID not in run.armed
    run.comp_ok("book_flight")  # the unwinding waits for the hotel's participant to say whether it had run
    run.ok("book_hotel")  # it had
    run.comp_ok("book_hotel")
    assert run.saga.status is SagaStatus.CANCELLED


def test_passing_the_pivot_makes_the_deadline_obsolete_and_a_late_firing_changes_nothing() -> None:
    run = _charging(TRIP_IN_A_MINUTE)
    charged = run.ok("charge_card")
    assert DEADLINE_TIMER_ID in charged.obsolete_timers
    late = run.send(TimerFired(timer=Timer(saga_id=run.saga_id, kind=TimerKind.SAGA_DEADLINE, step="", attempt=0,
                                           due_at=T0 + 60_000)), at=T0 + 60_000)
    assert late.is_empty
    run.ok("send_itinerary")
    assert run.saga.status is SagaStatus.COMPLETED


def test_a_deadline_while_a_refundable_pivot_is_in_flight_cancels_and_refunds_it_if_it_went_through() -> None:
    run = _charging(TRIP_IN_A_MINUTE)
    decision = run.fire(TimerKind.SAGA_DEADLINE, "")
    assert _types(decision.events)[:2] == ["SagaCancelRequested", "SagaCompensationStarted"]
    run.ok("charge_card")  # the charge went through after all: it is refunded, then the bookings cancelled
    run.comp_ok("charge_card")
    run.comp_ok("book_flight")
    run.comp_ok("book_hotel")
    assert run.saga.status is SagaStatus.CANCELLED


def _no_refund() -> SagaDefinition:
    steps = tuple(dataclasses.replace(step, compensation=None) if step.pivot else step for step in TRIP.steps)
    return dataclasses.replace(TRIP_IN_A_MINUTE, steps=steps)


def test_at_the_deadline_a_pivot_without_undo_in_flight_is_withdrawn_and_had_it_run_the_saga_goes_on() -> None:
    run = _charging(_no_refund())
    assert run.armed[DEADLINE_TIMER_ID].due_at == T0 + 60_000  # armed while the pivot is in flight
    decision = run.fire(TimerKind.SAGA_DEADLINE, "")
    assert _types(decision.events) == ["StepWithdrawn"]
    assert run.status() is SagaStatus.RUNNING and DEADLINE_TIMER_ID not in run.armed
    went_on = run.ok("charge_card")  # it had run: past the pivot the deadline no longer applies
    assert _types(went_on.events) == ["StepSucceeded", "StepCommandSent"]
    run.ok("send_itinerary")
    assert run.status() is SagaStatus.COMPLETED


def test_at_the_deadline_a_pivot_without_undo_that_had_not_run_turns_the_saga_back() -> None:
    run = _charging(_no_refund())
    run.fire(TimerKind.SAGA_DEADLINE, "")
    turned = run.fail("charge_card", "Withdrawn")
    assert _types(turned.events)[:3] == ["StepFailed", "SagaCancelRequested", "SagaCompensationStarted"]
    assert turned.events[1].reason == "deadline of 60 s passed"  # type: ignore[attr-defined]
    run.comp_ok("book_flight")
    run.comp_ok("book_hotel")
    assert run.saga.status is SagaStatus.CANCELLED


def test_a_72_hour_deadline_bounds_a_step_of_24_hours_times_4_that_never_answers() -> None:
    slow = dataclasses.replace(TRIP.step("book_flight"), timeout_ms=24 * 3_600_000,
                               retry=RetryPolicy(max_attempts=4))
    definition = SagaDefinition(saga_type="slow", version=1, steps=(slow,), input_schema="x",
                                deadline_ms=72 * 3_600_000)
    run = SagaRun(definition)
    run.start()
    run.fire(TimerKind.STEP_TIMEOUT, "book_flight")  # 24 h: no answer; nothing is spent, nothing resent
    assert not any(t.kind is TimerKind.STEP_RETRY for t in run.armed.values())
    turned = run.fire(TimerKind.SAGA_DEADLINE, "")
    assert run.now == T0 + 72 * 3_600_000
    assert _types(turned.events) == ["SagaCancelRequested", "SagaCompensationStarted", "StepWithdrawn"]
    run.fail("book_flight", "Withdrawn")  # its participant: the command never ran
    assert run.saga.status is SagaStatus.CANCELLED and run.now == T0 + 72 * 3_600_000
    forward = [e for e in run.events if isinstance(e, ev.StepCommandSent)]
    assert [e.attempt for e in forward] == [1]  # the one attempt, never another


def test_a_timer_of_the_deadline_kind_with_another_id_changes_nothing() -> None:
    run = SagaRun(TRIP_IN_A_MINUTE)
    run.start()
    stray = run.send(TimerFired(timer=Timer(saga_id=run.saga_id, kind=TimerKind.SAGA_DEADLINE, step="book_flight",
                                            attempt=1, due_at=T0)))
    assert stray.is_empty


@pytest.mark.parametrize("deadline_ms", [0, -5])
def test_a_deadline_must_be_positive(deadline_ms: int) -> None:
    with pytest.raises(DefinitionError, match="deadline_ms must be positive"):
        SagaDefinition(saga_type="t", version=1, steps=TRIP.steps, input_schema="x", deadline_ms=deadline_ms)
