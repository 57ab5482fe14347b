"""Given these messages, when this one arrives, then these events and commands: the trip saga, fail-fast.

Histories are built by driving ``decide`` (so every given history is one the core really produces); the
expectations are written out by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from saga_orchestrator.orchestrator.domain.builder import TimerKind
from saga_orchestrator.orchestrator.domain.state import SagaStatus, StepStatus
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas.event_types import SagaCancelRefused
from saga_orchestrator.testing.history import Action, SagaRun, command_names, event_names

FLIGHT, HOTEL, CHARGE, MAIL = "book_flight", "book_hotel", "charge_card", "send_itinerary"


def start() -> Action:
    return lambda r: r.start()


def ok(step: str, attempt: int | None = None) -> Action:
    return lambda r: r.ok(step, attempt)


def fail(step: str, error: str = "Boom", retryable: bool = False, attempt: int | None = None) -> Action:
    return lambda r: r.fail(step, error, retryable, attempt)


def comp_ok(step: str, attempt: int | None = None) -> Action:
    return lambda r: r.comp_ok(step, attempt)


def comp_fail(step: str, error: str = "Boom", retryable: bool = False) -> Action:
    return lambda r: r.comp_fail(step, error, retryable)


def fire(kind: TimerKind, step: str, attempt: int | None = None) -> Action:
    return lambda r: r.fire(kind, step, attempt)


def expired(step: str, attempt: int | None = None) -> Action:
    """The participant picked the attempt up after it expired: it did not run."""
    return lambda r: r.fail(step, "Expired", retryable=True, attempt=attempt)


def withdrawn(step: str) -> Action:
    """The participant's answer to a withdrawal of an attempt that had not run."""
    return lambda r: r.fail(step, "Withdrawn")


def cancel() -> Action:
    return lambda r: r.cancel()


def resume() -> Action:
    return lambda r: r.resume()


BOOKED = [start(), ok(FLIGHT), ok(HOTEL)]
CHARGED = [*BOOKED, ok(CHARGE)]
DECLINED = [*BOOKED, fail(CHARGE, "CardDeclined", retryable=True)]
STUCK = [*DECLINED, comp_fail(FLIGHT, "CancellationRefused", retryable=True)]  # COMPENSATION_FAILED
# cancelled with the hotel booking still in flight, then the flight refuses to cancel
STUCK_IN_FLIGHT = [start(), ok(FLIGHT), cancel(), comp_fail(FLIGHT, "CancellationRefused")]


@dataclass(frozen=True)
class Case:
    id: str
    given: list[Action]
    when: Action
    events: list[str]
    commands: list[str]
    status: SagaStatus


CASES = [
    # --- happy path, parallel roots ------------------------------------------------------------------
    Case("start dispatches both roots in parallel", [], start(),
         ["SagaStarted", "StepCommandSent book_flight 1", "StepCommandSent book_hotel 1"],
         ["flight.book_flight FORWARD 1", "hotel.book_hotel FORWARD 1"], SagaStatus.RUNNING),
    Case("first root succeeds: nothing else is ready", [start()], ok(FLIGHT),
         ["StepSucceeded book_flight 1"], [], SagaStatus.RUNNING),
    Case("second root succeeds: the pivot is ready", [start(), ok(HOTEL)], ok(FLIGHT),
         ["StepSucceeded book_flight 1", "StepCommandSent charge_card 1"],
         ["payment.charge_card FORWARD 1"], SagaStatus.RUNNING),
    Case("pivot succeeds: forward-only part starts", BOOKED, ok(CHARGE),
         ["StepSucceeded charge_card 1", "StepCommandSent send_itinerary 1"],
         ["notification.send_itinerary FORWARD 1"], SagaStatus.RUNNING),
    Case("last step succeeds: saga completes", CHARGED, ok(MAIL),
         ["StepSucceeded send_itinerary 1", "SagaCompleted"], [], SagaStatus.COMPLETED),
    # --- definitive failure at each point --------------------------------------------------------------
    Case("flight fails while hotel in flight: the hotel is withdrawn", [start()], fail(FLIGHT),
         ["StepFailed book_flight 1", "SagaCompensationStarted", "StepWithdrawn book_hotel 1"],
         ["hotel.book_hotel WITHDRAW 1"], SagaStatus.COMPENSATING),
    Case("in-flight hotel then succeeds: it is compensated", [start(), fail(FLIGHT)], ok(HOTEL),
         ["StepSucceeded book_hotel 1", "CompensationSent book_hotel 1"],
         ["hotel.cancel_hotel COMPENSATE 1"], SagaStatus.COMPENSATING),
    Case("in-flight hotel then fails: nothing to undo, the saga turned back", [start(), fail(FLIGHT)], fail(HOTEL),
         ["StepFailed book_hotel 1", "SagaCompensated"], [], SagaStatus.COMPENSATED),
    Case("withdrawn hotel had not run: nothing to undo", [start(), fail(FLIGHT)], withdrawn(HOTEL),
         ["StepFailed book_hotel 1", "SagaCompensated"], [], SagaStatus.COMPENSATED),
    Case("withdrawal unanswered: sent again", [start(), fail(FLIGHT)], fire(TimerKind.WITHDRAWAL_TIMEOUT, HOTEL),
         ["StepWithdrawn book_hotel 1"], ["hotel.book_hotel WITHDRAW 1"], SagaStatus.COMPENSATING),
    Case("both bookings fail for good: a business outcome, nothing to undo", [start(), fail(FLIGHT)],
         fail(HOTEL, "SoldOut"), ["StepFailed book_hotel 1", "SagaCompensated"], [], SagaStatus.COMPENSATED),
    Case("flight fails after hotel succeeded", [start(), ok(HOTEL)], fail(FLIGHT),
         ["StepFailed book_flight 1", "SagaCompensationStarted", "CompensationSent book_hotel 1"],
         ["hotel.cancel_hotel COMPENSATE 1"], SagaStatus.COMPENSATING),
    Case("card declined (non-retryable): both bookings undone in one wave", BOOKED,
         fail(CHARGE, "CardDeclined", retryable=True),
         ["StepFailed charge_card 1", "SagaCompensationStarted", "CompensationSent book_hotel 1",
          "CompensationSent book_flight 1"],
         ["hotel.cancel_hotel COMPENSATE 1", "flight.cancel_flight COMPENSATE 1"], SagaStatus.COMPENSATING),
    Case("one compensation of the wave done: wait for the other", DECLINED, comp_ok(HOTEL),
         ["StepCompensated book_hotel 1"], [], SagaStatus.COMPENSATING),
    Case("wave drained: saga compensated", [*DECLINED, comp_ok(HOTEL)], comp_ok(FLIGHT),
         ["StepCompensated book_flight 1", "SagaCompensated"], [], SagaStatus.COMPENSATED),
    Case("post-pivot step fails for good: saga fails, no compensation", CHARGED, fail(MAIL, "BadAddress"),
         ["StepFailed send_itinerary 1", "SagaFailed"], [], SagaStatus.FAILED),
    # --- transient failures and retries ----------------------------------------------------------------
    Case("transient failure schedules a retry", BOOKED, fail(CHARGE, "Unavailable", retryable=True),
         ["StepFailed charge_card 1", "StepRetryScheduled charge_card 2"], [], SagaStatus.RUNNING),
    Case("retry timer resends under the same key",
         [*BOOKED, fail(CHARGE, "Unavailable", retryable=True)], fire(TimerKind.STEP_RETRY, CHARGE),
         ["StepCommandSent charge_card 2"], ["payment.charge_card FORWARD 2"], SagaStatus.RUNNING),
    Case("retries exhausted: definitive failure compensates",
         [*BOOKED, *[a for n in range(1, 5) for a in (fail(CHARGE, "Unavailable", True),
                                                      fire(TimerKind.STEP_RETRY, CHARGE))]],
         fail(CHARGE, "Unavailable", retryable=True),
         ["StepFailed charge_card 5", "SagaCompensationStarted", "CompensationSent book_hotel 1",
          "CompensationSent book_flight 1"],
         ["hotel.cancel_hotel COMPENSATE 1", "flight.cancel_flight COMPENSATE 1"], SagaStatus.COMPENSATING),
    Case("post-pivot step retries without limit", [*CHARGED, *[
        a for _ in range(20) for a in (fail(MAIL, "Smtp", True), fire(TimerKind.STEP_RETRY, MAIL))]],
         fail(MAIL, "Smtp", retryable=True),
         ["StepFailed send_itinerary 21", "StepRetryScheduled send_itinerary 22"], [], SagaStatus.RUNNING),
    # --- timeouts: unknown outcome ---------------------------------------------------------------------
    Case("timeout: no attempt spent, none sent; the saga waits for the answer", [start()],
         fire(TimerKind.STEP_TIMEOUT, FLIGHT), ["StepTimedOut book_flight 1"], [], SagaStatus.RUNNING),
    Case("late success of the timed-out attempt settles the step", [start(), fire(TimerKind.STEP_TIMEOUT, FLIGHT)],
         ok(FLIGHT, 1), ["StepSucceeded book_flight 1"], [], SagaStatus.RUNNING),
    Case("picked up after it expired: not run, the next attempt goes at once", [start(),
         fire(TimerKind.STEP_TIMEOUT, FLIGHT)], expired(FLIGHT),
         ["StepFailed book_flight 1", "StepCommandSent book_flight 2"], ["flight.book_flight FORWARD 2"],
         SagaStatus.RUNNING),
    Case("expired attempts are not counted: a transient failure after three is still retried",
         [start(), expired(FLIGHT), expired(FLIGHT), expired(FLIGHT)], fail(FLIGHT, "Busy", retryable=True),
         ["StepFailed book_flight 4", "StepRetryScheduled book_flight 5"], [], SagaStatus.RUNNING),
    Case("the handler overran its time: the attempt counts, retried", [start(),
         fire(TimerKind.STEP_TIMEOUT, FLIGHT)], fail(FLIGHT, "HandlerTimedOut", retryable=True, attempt=1),
         ["StepFailed book_flight 1", "StepRetryScheduled book_flight 2"], [], SagaStatus.RUNNING),
    Case("handler overran on every attempt: failed for good, nothing took effect",
         [start(), ok(HOTEL), *[a for _ in range(2) for a in (fail(FLIGHT, "HandlerTimedOut", True),
                                                                fire(TimerKind.STEP_RETRY, FLIGHT))]],
         fail(FLIGHT, "HandlerTimedOut", retryable=True),
         ["StepFailed book_flight 3", "SagaCompensationStarted", "CompensationSent book_hotel 1"],
         ["hotel.cancel_hotel COMPENSATE 1"], SagaStatus.COMPENSATING),
    # --- duplicates and stale messages -----------------------------------------------------------------
    Case("duplicate success reply", [start(), ok(FLIGHT)], ok(FLIGHT), [], [], SagaStatus.RUNNING),
    Case("success after a definitive failure", [start(), fail(FLIGHT)], ok(FLIGHT, 1), [], [],
         SagaStatus.COMPENSATING),
    Case("failure of an attempt no longer awaited",
         [start(), fire(TimerKind.STEP_TIMEOUT, FLIGHT), expired(FLIGHT)],
         fail(FLIGHT, attempt=1), [], [], SagaStatus.RUNNING),
    Case("timeout timer after the reply", [start(), ok(FLIGHT)], fire(TimerKind.STEP_TIMEOUT, FLIGHT, 1),
         [], [], SagaStatus.RUNNING),
    Case("timeout timer of an older attempt", [start(), expired(FLIGHT)],
         fire(TimerKind.STEP_TIMEOUT, FLIGHT, 1), [], [], SagaStatus.RUNNING),
    Case("reply after the saga ended", [*CHARGED, ok(MAIL)], ok(MAIL, 1), [], [], SagaStatus.COMPLETED),
    Case("compensation reply twice", [*DECLINED, comp_ok(HOTEL)], comp_ok(HOTEL, 1), [], [],
         SagaStatus.COMPENSATING),
    Case("duplicate StartSaga is refused, saga unchanged", [start(), ok(FLIGHT)], start(),
         ["SagaRejected"], [], SagaStatus.RUNNING),
    # --- cancel ----------------------------------------------------------------------------------------
    Case("cancel with the hotel in flight: undo the flight, withdraw the hotel", [start(), ok(FLIGHT)],
         cancel(), ["SagaCancelRequested", "SagaCompensationStarted", "StepWithdrawn book_hotel 1",
                    "CompensationSent book_flight 1"],
         ["hotel.book_hotel WITHDRAW 1", "flight.cancel_flight COMPENSATE 1"], SagaStatus.COMPENSATING),
    Case("a timed-out step is withdrawn on a cancel, never sent again", [start(), ok(FLIGHT),
         fire(TimerKind.STEP_TIMEOUT, HOTEL)], cancel(),
         ["SagaCancelRequested", "SagaCompensationStarted", "StepWithdrawn book_hotel 1",
          "CompensationSent book_flight 1"],
         ["hotel.book_hotel WITHDRAW 1", "flight.cancel_flight COMPENSATE 1"], SagaStatus.COMPENSATING),
    Case("hotel succeeds during the cancel: next wave", [start(), ok(FLIGHT), cancel(), comp_ok(FLIGHT)],
         ok(HOTEL), ["StepSucceeded book_hotel 1", "CompensationSent book_hotel 1"],
         ["hotel.cancel_hotel COMPENSATE 1"], SagaStatus.COMPENSATING),
    Case("last undo of a cancel: saga cancelled",
         [start(), ok(FLIGHT), cancel(), comp_ok(FLIGHT), ok(HOTEL)], comp_ok(HOTEL),
         ["StepCompensated book_hotel 1", "SagaCancelled"], [], SagaStatus.CANCELLED),
    Case("cancel with nothing done nor in flight: cancelled at once",
         [start(), fail(FLIGHT, "Busy", True), fail(HOTEL, "Busy", True)], cancel(),
         ["SagaCancelRequested", "SagaCancelled"], [], SagaStatus.CANCELLED),
    Case("retry timer after a cancel is ignored",
         [start(), fail(FLIGHT, "Busy", True), fail(HOTEL, "Busy", True), cancel()],
         fire(TimerKind.STEP_RETRY, FLIGHT, 2), [], [], SagaStatus.CANCELLED),
    Case("cancel while the pivot is in flight: it is withdrawn", BOOKED, cancel(),
         ["SagaCancelRequested", "SagaCompensationStarted", "StepWithdrawn charge_card 1"],
         ["payment.charge_card WITHDRAW 1"], SagaStatus.COMPENSATING),
    Case("the withdrawn pivot had run: refunded", [*BOOKED, cancel()], ok(CHARGE),
         ["StepSucceeded charge_card 1", "CompensationSent charge_card 1"],
         ["payment.refund_card COMPENSATE 1"], SagaStatus.COMPENSATING),
    Case("the withdrawn pivot had not run: the bookings are undone", [*BOOKED, cancel()], withdrawn(CHARGE),
         ["StepFailed charge_card 1", "CompensationSent book_hotel 1", "CompensationSent book_flight 1"],
         ["hotel.cancel_hotel COMPENSATE 1", "flight.cancel_flight COMPENSATE 1"], SagaStatus.COMPENSATING),
    Case("cancel after the pivot is refused", CHARGED, cancel(), ["SagaCancelRefused"], [],
         SagaStatus.RUNNING),
    Case("cancel after the end is refused", [*CHARGED, ok(MAIL)], cancel(), ["SagaCancelRefused"], [],
         SagaStatus.COMPLETED),
    Case("second cancel is refused", [start(), ok(FLIGHT), cancel()], cancel(), ["SagaCancelRefused"], [],
         SagaStatus.COMPENSATING),
    Case("cancel while compensating a failure is refused", DECLINED, cancel(), ["SagaCancelRefused"], [],
         SagaStatus.COMPENSATING),
    # --- compensation failures, retries, operator --------------------------------------------------------
    Case("compensation refused for good: saga needs a human", DECLINED,
         comp_fail(FLIGHT, "CancellationRefused", retryable=True),
         ["CompensationFailed book_flight 1", "SagaCompensationFailed book_flight"], [],
         SagaStatus.COMPENSATION_FAILED),
    Case("transient compensation failure: retried", DECLINED, comp_fail(HOTEL, "Busy", retryable=True),
         ["CompensationFailed book_hotel 1", "CompensationRetryScheduled book_hotel 2"], [],
         SagaStatus.COMPENSATING),
    Case("compensation retry timer resends", [*DECLINED, comp_fail(HOTEL, "Busy", True)],
         fire(TimerKind.COMPENSATION_RETRY, HOTEL), ["CompensationSent book_hotel 2"],
         ["hotel.cancel_hotel COMPENSATE 2"], SagaStatus.COMPENSATING),
    Case("compensation timeout: resent later under the same key", DECLINED,
         fire(TimerKind.COMPENSATION_TIMEOUT, HOTEL),
         ["CompensationTimedOut book_hotel 1", "CompensationRetryScheduled book_hotel 2"], [],
         SagaStatus.COMPENSATING),
    Case("reply of the rest of the wave is recorded while stuck", STUCK, comp_ok(HOTEL),
         ["StepCompensated book_hotel 1"], [], SagaStatus.COMPENSATION_FAILED),
    Case("timers are ignored while stuck", STUCK, fire(TimerKind.COMPENSATION_TIMEOUT, HOTEL, 1), [], [],
         SagaStatus.COMPENSATION_FAILED),
    Case("operator resumes: failed compensation sent again", [*STUCK, comp_ok(HOTEL)], resume(),
         ["OperatorAction", "CompensationSent book_flight 2"], ["flight.cancel_flight COMPENSATE 2"],
         SagaStatus.COMPENSATING),
    Case("resume re-sends every open compensation", STUCK, resume(),
         ["OperatorAction", "CompensationSent book_hotel 2", "CompensationSent book_flight 2"],
         ["hotel.cancel_hotel COMPENSATE 2", "flight.cancel_flight COMPENSATE 2"], SagaStatus.COMPENSATING),
    Case("resumed compensation succeeds: saga compensated", [*STUCK, comp_ok(HOTEL), resume()],
         comp_ok(FLIGHT), ["StepCompensated book_flight 2", "SagaCompensated"], [], SagaStatus.COMPENSATED),
    Case("resume of a saga that is not stuck is refused, recorded", DECLINED, resume(), ["OperatorActionRefused"], [],
         SagaStatus.COMPENSATING),
    Case("forward reply is recorded while stuck", STUCK_IN_FLIGHT, ok(HOTEL),
         ["StepSucceeded book_hotel 1"], [], SagaStatus.COMPENSATION_FAILED),
    Case("withdrawal timeout is ignored while stuck", STUCK_IN_FLIGHT,
         fire(TimerKind.WITHDRAWAL_TIMEOUT, HOTEL, 1), [], [], SagaStatus.COMPENSATION_FAILED),
    Case("resume sends the withdrawal of an unresolved forward step again, never the step",
         STUCK_IN_FLIGHT, resume(),
         ["OperatorAction", "StepWithdrawn book_hotel 1", "CompensationSent book_flight 2"],
         ["hotel.book_hotel WITHDRAW 1", "flight.cancel_flight COMPENSATE 2"], SagaStatus.COMPENSATING),
    Case("after resume the unwinding carries on in waves", [*STUCK_IN_FLIGHT, resume(), ok(HOTEL, 1)],
         comp_ok(FLIGHT), ["StepCompensated book_flight 2", "CompensationSent book_hotel 1"],
         ["hotel.cancel_hotel COMPENSATE 1"], SagaStatus.COMPENSATING),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_transition(case: Case) -> None:
    run = SagaRun(TRIP)
    for action in case.given:
        run.now += 10
        action(run)
    run.now += 10
    decision = case.when(run)
    assert event_names(decision) == case.events
    assert command_names(decision) == case.commands
    assert run.saga.status is case.status


def test_commands_carry_frozen_keys_and_message_ids() -> None:
    run = SagaRun(TRIP, saga_id="trip-42")
    decision = run.start(payload=b"avro")
    flight, hotel = decision.commands
    assert (flight.idempotency_key, flight.message_id) == ("trip-42:book_flight", "trip-42:command:2")
    assert (hotel.idempotency_key, hotel.message_id) == ("trip-42:book_hotel", "trip-42:command:3")
    assert flight.input == b"avro" and flight.saga_type == "trip" and flight.participant == "flight"
    timer_ids = [t.timer_id for t in decision.timers]
    assert timer_ids == ["STEP_TIMEOUT:book_flight:1", "STEP_TIMEOUT:book_hotel:1"]
    assert all(t.due_at == run.now + 2_000 for t in decision.timers)
    assert flight.expires_at == run.now + 2_000 and flight.timeout_ms == 2_000  # the attempt's clock
    run.fire(TimerKind.STEP_TIMEOUT, FLIGHT)
    retry = run.fail(FLIGHT, "Expired", retryable=True)  # picked up too late: the next attempt at once
    assert retry.commands[0].idempotency_key == "trip-42:book_flight"  # the same operation: same key
    assert retry.commands[0].attempt == 2
    run.ok(FLIGHT)
    run.ok(HOTEL)
    declined = run.fail(CHARGE, "CardDeclined")
    assert {c.idempotency_key for c in declined.commands} == {
        "trip-42:book_flight:compensate",
        "trip-42:book_hotel:compensate",
    }


def test_reply_settles_and_obsoletes_timers() -> None:
    run = SagaRun(TRIP)
    run.start()
    assert run.ok(FLIGHT).obsolete_timers == ("STEP_TIMEOUT:book_flight:1",)
    run.fail(HOTEL, "Busy", retryable=True)
    late = run.ok(HOTEL, 1)  # a success of the attempt whose failure the retry was scheduled after
    assert "STEP_RETRY:book_hotel:2" in late.obsolete_timers
    assert run.saga.steps[HOTEL].status is StepStatus.SUCCEEDED


def test_pivot_and_failure_details_in_state() -> None:
    run = SagaRun(TRIP)
    for action in CHARGED:
        action(run)
    assert run.saga.pivot_passed
    run.fail(MAIL, "BadAddress")
    state = run.saga
    assert state.failed_step == MAIL
    assert state.reason is not None and "after pivot step charge_card" in state.reason
    assert state.steps[MAIL].last_error_type == "BadAddress"


def test_compensation_failed_reason_names_step_and_error() -> None:
    run = SagaRun(TRIP)
    for action in STUCK:
        action(run)
    state = run.saga
    assert state.compensation_failed_step == FLIGHT
    assert state.reason == (
        "compensation of book_flight failed for good: CancellationRefused: book_flight said "
        "CancellationRefused; a human must act"
    )


def test_cancel_refusal_reasons() -> None:
    run = SagaRun(TRIP)
    for action in CHARGED:
        action(run)
    refused = run.cancel().events[0]
    assert isinstance(refused, SagaCancelRefused)
    assert refused.reason == "pivot step charge_card already succeeded; the saga only moves forward"
    run.ok(MAIL)
    refused = run.cancel().events[0]
    assert isinstance(refused, SagaCancelRefused) and refused.reason == "saga already COMPLETED"


def test_cancelled_saga_keeps_the_cancel_reason() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.cancel("changed my mind")
    run.fail(FLIGHT)
    run.fail(HOTEL)
    assert run.saga.status is SagaStatus.CANCELLED
    assert run.saga.reason == "changed my mind"


def test_cancel_is_refused_while_a_pivot_without_compensation_is_in_flight() -> None:
    pivot = replace(TRIP.step(CHARGE), compensation=None)
    trip = replace(TRIP, steps=tuple(pivot if s.name == CHARGE else s for s in TRIP.steps))
    run = SagaRun(trip)
    for action in BOOKED:
        action(run)
    refused = run.cancel().events[0]
    assert isinstance(refused, SagaCancelRefused)
    assert refused.reason == (
        "pivot step charge_card is in flight and has no compensation; the saga only moves forward"
    )
    run.fail(CHARGE, "Unavailable", retryable=True)  # known failure, retry pending: cancel may win now
    assert event_names(run.cancel())[:2] == ["SagaCancelRequested", "SagaCompensationStarted"]
