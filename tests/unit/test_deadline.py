"""A saga's deadline: the time from its start within which it must pass its pivot, or be cancelled."""

from __future__ import annotations

import dataclasses

import pytest

from saga_orchestrator.orchestrator.domain.builder import DEADLINE_TIMER_ID
from saga_orchestrator.orchestrator.domain.definition import SagaDefinition
from saga_orchestrator.orchestrator.domain.errors import DefinitionError
from saga_orchestrator.orchestrator.domain.messages import Timer, TimerFired, TimerKind
from saga_orchestrator.orchestrator.domain.status import SagaStatus
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
    assert DEADLINE_TIMER_ID not in run.armed
    run.comp_ok("book_flight")  # the hotel is still in flight: unwinding waits for its outcome
    run.ok("book_hotel")
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


def test_a_pivot_without_compensation_in_flight_holds_the_deadline_until_its_outcome_is_known() -> None:
    steps = tuple(dataclasses.replace(step, compensation=None) if step.pivot else step for step in TRIP.steps)
    no_refund = dataclasses.replace(TRIP_IN_A_MINUTE, steps=steps)
    run = _charging(no_refund)
    assert DEADLINE_TIMER_ID not in run.armed
    retry = run.fail("charge_card", error="Busy", retryable=True)  # a known failure: nothing was charged
    assert [t.timer_id for t in retry.timers if t.kind is TimerKind.SAGA_DEADLINE] == [DEADLINE_TIMER_ID]
    assert run.armed[DEADLINE_TIMER_ID].due_at == T0 + 60_000  # due when it always was
    decision = run.fire(TimerKind.SAGA_DEADLINE, "")
    assert _types(decision.events)[0] == "SagaCancelRequested"


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
