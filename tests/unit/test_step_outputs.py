"""Step outputs travel on: a command carries the outputs of the steps it depends on, a compensation also its
own forward output (what it has to undo)."""

from __future__ import annotations

from saga_orchestrator.orchestrator.domain.builder import TimerKind
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas.message_types import CommandKind, ResultStatus
from saga_orchestrator.testing.history import SagaRun

FLIGHT, HOTEL, CHARGE, NOTIFY = "book_flight", "book_hotel", "charge_card", "send_itinerary"
BOOKED = {FLIGHT: b'{"booking_id": 11}', HOTEL: b'{"booking_id": 22}', CHARGE: b'{"charge_id": 33}'}


def _ok(run: SagaRun, step: str, output: bytes | None) -> list[tuple[str, tuple[tuple[str, bytes], ...]]]:
    decision = run.reply(step, CommandKind.FORWARD, ResultStatus.SUCCEEDED, output=output)
    return [(command.step, command.step_outputs) for command in decision.commands]


def test_each_forward_command_carries_the_outputs_of_the_steps_it_depends_on() -> None:
    run = SagaRun(TRIP, saga_id="trip-42")
    first = run.start()
    assert [(c.step, c.step_outputs) for c in first.commands] == [(FLIGHT, ()), (HOTEL, ())]
    assert _ok(run, FLIGHT, BOOKED[FLIGHT]) == []
    assert _ok(run, HOTEL, BOOKED[HOTEL]) == [(CHARGE, ((FLIGHT, BOOKED[FLIGHT]), (HOTEL, BOOKED[HOTEL])))]
    assert _ok(run, CHARGE, BOOKED[CHARGE]) == [  # by step name
        (NOTIFY, ((FLIGHT, BOOKED[FLIGHT]), (HOTEL, BOOKED[HOTEL]), (CHARGE, BOOKED[CHARGE])))]


def test_a_compensation_carries_its_own_steps_output_and_a_step_without_output_is_left_out() -> None:
    run = SagaRun(TRIP, saga_id="trip-43")
    run.start()
    _ok(run, FLIGHT, BOOKED[FLIGHT])
    _ok(run, HOTEL, None)  # a participant that answers without an output
    declined = run.fail(CHARGE, "CardDeclined")
    assert sorted((c.step, c.kind, c.step_outputs) for c in declined.commands) == [
        (FLIGHT, CommandKind.COMPENSATE, ((FLIGHT, BOOKED[FLIGHT]),)),
        (HOTEL, CommandKind.COMPENSATE, ()),
    ]


def test_a_retried_command_carries_the_same_outputs() -> None:
    run = SagaRun(TRIP, saga_id="trip-44")
    run.start()
    _ok(run, FLIGHT, BOOKED[FLIGHT])
    [(_, sent)] = _ok(run, HOTEL, BOOKED[HOTEL])
    retried = run.fail(CHARGE, "Unavailable", retryable=True)
    assert retried.commands == ()  # a retry is scheduled, then sent when its timer fires
    [again] = run.fire(TimerKind.STEP_RETRY, CHARGE).commands
    assert (again.attempt, again.step_outputs) == (2, sent)
