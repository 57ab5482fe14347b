"""An operator's levers in the pure core: given a saga's history, when a lever is pulled, then what it records.

RetryNow sends a step (or a compensation) waiting on its retry backoff at once, as the attempt that was due and
under its same key; Redrive sends the failed steps of a FAILED saga again, as their next attempts under their
same keys, with a fresh attempt budget; every lever pulled where it cannot apply is recorded as refused with
why, and changes nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saga_orchestrator.orchestrator.domain.builder import Decision, TimerKind
from saga_orchestrator.orchestrator.domain.decide import quarantine
from saga_orchestrator.orchestrator.domain.definition import SagaDefinition
from saga_orchestrator.orchestrator.domain.errors import DefinitionError, IllegalTransition
from saga_orchestrator.orchestrator.domain.evolve import apply_event
from saga_orchestrator.orchestrator.domain.model import ANSWER
from saga_orchestrator.orchestrator.domain.retention import purged_event
from saga_orchestrator.orchestrator.domain.state import SagaStatus, StepState, StepStatus, fold
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.schemas.message_types import (
    CancelSaga,
    CommandKind,
    Lever,
    ResultStatus,
    StepResult,
)
from saga_orchestrator.testing import SagaEnvironment, fail, fail_transiently, succeed
from saga_orchestrator.testing.history import SagaRun, describe
from tests.unit.test_continue_mode import BATCH_UNDO


def names(events: tuple[ev.Event, ...]) -> list[str]:
    return [describe(event) for event in events]


# The trip with every step but the pivot skippable.
SKIPPABLE_TRIP = SagaDefinition(
    saga_type=TRIP.saga_type, version=TRIP.version, input_schema=TRIP.input_schema,
    steps=tuple(dataclasses.replace(step, skippable=not step.pivot) for step in TRIP.steps))


def _charge_waits_on_its_backoff() -> SagaRun:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    run.ok("book_hotel")
    run.fail("charge_card", "CardNetworkTimeout", retryable=True)
    assert run.saga.steps["charge_card"].status is StepStatus.RETRY_SCHEDULED
    return run


def test_retry_now_sends_the_due_attempt_at_once_under_the_same_key() -> None:
    run = _charge_waits_on_its_backoff()
    decision = run.operate(Lever.RETRY_NOW, "charge_card")
    assert names(decision.events) == ["OperatorAction", "StepCommandSent charge_card 2"]
    [action] = [event for event in decision.events if isinstance(event, ev.OperatorAction)]
    assert (action.action, action.operator, action.detail) == (Lever.RETRY_NOW, "ops", "charge_card: asked by support")
    [command] = decision.commands
    assert (command.step, command.attempt, command.idempotency_key) == ("charge_card", 2, "s1:charge_card")
    assert run.sent[-1].kind is CommandKind.FORWARD


def test_the_backoff_timer_that_fires_afterwards_changes_nothing() -> None:
    run = _charge_waits_on_its_backoff()
    run.operate(Lever.RETRY_NOW, "charge_card")
    assert run.fire(TimerKind.STEP_RETRY, "charge_card", attempt=2).events == ()
    run.ok("charge_card")
    run.ok("send_itinerary")
    assert run.status() is SagaStatus.COMPLETED


def test_retry_now_of_a_compensation_waiting_on_its_backoff_sends_it_at_once() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    run.fail("book_hotel", "SoldOut")
    run.comp_fail("book_flight", "Unavailable", retryable=True)
    assert run.saga.steps["book_flight"].status is StepStatus.COMPENSATION_RETRY_SCHEDULED
    decision = run.operate(Lever.RETRY_NOW, "book_flight")
    assert names(decision.events) == ["OperatorAction", "CompensationSent book_flight 2"]
    run.comp_ok("book_flight")
    assert run.status() is SagaStatus.COMPENSATED


def test_terminate_ends_a_running_saga_as_it_stands_compensating_nothing() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")  # book_hotel is still in flight
    decision = run.operate(Lever.TERMINATE, reason="refunded by phone")
    assert names(decision.events) == ["OperatorAction", "StepWithdrawn book_hotel 1", "SagaTerminated"]
    assert decision.commands == () and decision.timers == ()
    [withdrawal] = decision.withdrawals  # what is in flight must not run after the saga was settled by hand
    assert (withdrawal.step, withdrawal.attempt, withdrawal.idempotency_key) == ("book_hotel", 1, "s1:book_hotel")
    assert run.status() is SagaStatus.TERMINATED and run.saga.reason == "refunded by phone"
    assert run.ok("book_hotel").events == ()  # a late reply changes nothing
    assert run.fire(TimerKind.STEP_TIMEOUT, "book_hotel", attempt=1).events == ()


def test_terminate_ends_a_saga_waiting_after_a_failed_compensation() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_hotel")
    run.ok("book_flight")
    run.fail("charge_card", "CardDeclined")
    run.comp_fail("book_flight", "CancellationRefused")
    run.comp_ok("book_hotel")
    assert run.status() is SagaStatus.COMPENSATION_FAILED
    decision = run.operate(Lever.TERMINATE, reason="the airline cancelled the fare itself")
    assert names(decision.events) == ["OperatorAction", "SagaTerminated"] and run.status() is SagaStatus.TERMINATED


def test_a_paused_saga_records_replies_and_sends_nothing_until_unpaused() -> None:
    run = SagaRun(TRIP)
    run.start()
    paused = run.operate(Lever.PAUSE)
    assert names(paused.events) == ["OperatorAction"] and run.saga.paused
    assert set(paused.obsolete_timers) == {"STEP_TIMEOUT:book_flight:1", "STEP_TIMEOUT:book_hotel:1"}
    assert names(run.ok("book_flight").events) == ["StepSucceeded book_flight 1"]
    assert names(run.ok("book_hotel").events) == ["StepSucceeded book_hotel 1"]  # charge_card is not sent
    assert run.fire(TimerKind.STEP_TIMEOUT, "book_hotel", attempt=1).events == ()
    unpaused = run.operate(Lever.UNPAUSE)
    assert names(unpaused.events) == ["OperatorAction", "StepCommandSent charge_card 1"] and not run.saga.paused
    run.ok("charge_card")
    run.ok("send_itinerary")
    assert run.status() is SagaStatus.COMPLETED


def test_a_retry_scheduled_while_paused_arms_no_timer_and_goes_on_unpause() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.operate(Lever.PAUSE)
    failed = run.fail("book_hotel", "Unavailable", retryable=True)
    assert names(failed.events) == ["StepFailed book_hotel 1", "StepRetryScheduled book_hotel 2"]
    assert failed.timers == () and failed.commands == ()
    in_flight = run.operate(Lever.UNPAUSE)  # book_flight was in flight: sent again, same key; the hotel's retry now
    assert names(in_flight.events) == ["OperatorAction", "StepCommandSent book_hotel 2",
                                       "StepCommandSent book_flight 2"]
    assert {command.idempotency_key for command in in_flight.commands} == {"s1:book_flight", "s1:book_hotel"}


def test_skip_records_a_stuck_step_skipped_and_its_dependents_go_on() -> None:
    run = SagaRun(SKIPPABLE_TRIP)
    run.start()
    run.ok("book_flight")
    run.fail("book_hotel", "Unavailable", retryable=True)
    decision = run.operate(Lever.SKIP, "book_hotel", reason="booked by phone")
    assert names(decision.events) == ["OperatorAction", "StepSkipped book_hotel", "StepCommandSent charge_card 1"]
    assert run.saga.steps["book_hotel"].waived and "STEP_RETRY:book_hotel:2" in decision.obsolete_timers
    assert run.ok("book_hotel", attempt=1).events == ()  # a late success of the skipped step changes nothing
    run.ok("charge_card")
    run.ok("send_itinerary")
    assert run.status() is SagaStatus.COMPLETED


def test_a_skipped_step_is_not_undone_when_the_saga_unwinds_later() -> None:
    run = SagaRun(SKIPPABLE_TRIP)
    run.start()
    run.ok("book_flight")
    run.operate(Lever.SKIP, "book_hotel", reason="booked by phone")  # in flight
    run.fail("charge_card", "CardDeclined")
    assert [command.step for command in run.sent if command.kind is CommandKind.COMPENSATE] == ["book_flight"]
    run.comp_ok("book_flight")
    assert run.status() is SagaStatus.COMPENSATED


def test_a_pivot_cannot_be_skippable() -> None:
    with pytest.raises(DefinitionError, match="a pivot cannot be skippable"):
        dataclasses.replace(TRIP.step("charge_card"), skippable=True)


def _failed_after_its_pivot() -> SagaRun:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    run.ok("book_hotel")
    run.ok("charge_card")
    run.fail("send_itinerary", "AddressGone")  # for good: after the pivot the saga ends FAILED, nothing undone
    assert run.status() is SagaStatus.FAILED and run.saga.pivot_passed
    return run


def test_force_compensate_undoes_a_saga_that_failed_after_its_pivot_the_pivot_too() -> None:
    run = _failed_after_its_pivot()
    decision = run.operate(Lever.FORCE_COMPENSATE, reason="the trip cannot be delivered")
    assert names(decision.events) == ["OperatorAction", "SagaCompensationStarted", "CompensationSent charge_card 1"]
    assert run.saga.forced_compensation and run.saga.reason == "forced by an operator: the trip cannot be delivered"
    wave = run.comp_ok("charge_card")  # the refund first, then both bookings
    assert sorted(names(wave.events)) == ["CompensationSent book_flight 1", "CompensationSent book_hotel 1",
                                          "StepCompensated charge_card 1"]
    run.comp_ok("book_flight")
    run.comp_ok("book_hotel")
    assert run.status() is SagaStatus.COMPENSATED


def test_force_compensate_of_a_running_saga_withdraws_what_is_in_flight() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")  # book_hotel is in flight
    decision = run.operate(Lever.FORCE_COMPENSATE, reason="fraud suspected")
    assert names(decision.events) == ["OperatorAction", "SagaCompensationStarted", "StepWithdrawn book_hotel 1",
                                      "CompensationSent book_flight 1"]
    assert names(run.ok("book_hotel").events) == ["StepSucceeded book_hotel 1"]  # it had run: undone next
    wave = run.comp_ok("book_flight")
    assert names(wave.events) == ["StepCompensated book_flight 1", "CompensationSent book_hotel 1"]
    run.comp_ok("book_hotel")
    assert run.status() is SagaStatus.COMPENSATED


def test_redrive_sends_a_step_that_failed_after_the_pivot_again_as_its_next_attempt_under_its_key() -> None:
    run = _failed_after_its_pivot()
    decision = run.operate(Lever.REDRIVE, reason="the address was corrected")
    assert names(decision.events) == ["OperatorAction", "StepCommandSent send_itinerary 2"]
    [action] = [event for event in decision.events if isinstance(event, ev.OperatorAction)]
    assert (action.action, action.operator, action.detail) == (Lever.REDRIVE, "ops", "the address was corrected")
    [command] = decision.commands
    assert (command.step, command.attempt, command.idempotency_key) == ("send_itinerary", 2, "s1:send_itinerary")
    assert run.status() is SagaStatus.RUNNING and run.saga.reason is None and run.saga.failed_step is None
    run.ok("send_itinerary")
    assert run.status() is SagaStatus.COMPLETED


def test_a_redriven_step_counts_its_attempts_from_the_redrive_and_only_those_a_worker_started_on() -> None:
    run = _failed_after_its_pivot()
    run.operate(Lever.REDRIVE, reason="the address was corrected")
    def step() -> StepState:
        return run.saga.steps["send_itinerary"]

    assert (step().attempt, step().spent) == (2, 1)  # its first attempt since the redrive is in flight
    assert names(run.fail("send_itinerary", "Unavailable", retryable=True).events) == [
        "StepFailed send_itinerary 2", "StepRetryScheduled send_itinerary 3"]
    [retry] = [timer for timer in run.armed.values() if timer.kind is TimerKind.STEP_RETRY]
    policy = TRIP.step("send_itinerary").retry
    assert retry.due_at == run.now + policy.backoff_ms(1, "s1:send_itinerary:2")  # a first failure's backoff
    run.fire(TimerKind.STEP_RETRY, "send_itinerary")
    assert (step().attempt, step().spent) == (3, 2)
    assert names(run.fail("send_itinerary", "Expired", retryable=True).events) == [
        "StepFailed send_itinerary 3", "StepCommandSent send_itinerary 4"]  # not picked up in time: at once
    assert (step().attempt, step().spent) == (4, 2)  # and not spent
    assert names(run.fail("send_itinerary", "HandlerTimedOut", retryable=True).events) == [
        "StepFailed send_itinerary 4", "StepRetryScheduled send_itinerary 5"]  # started on and overran: spent
    assert (step().attempt, step().spent) == (5, 3)


def test_a_saga_that_turned_back_before_its_pivot_with_nothing_to_undo_is_compensated_not_failed() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.fail("book_flight", "InvalidRoute")
    run.fail("book_hotel", "SoldOut")  # nothing took effect: a business "no", nobody needs to act
    assert run.status() is SagaStatus.COMPENSATED and "nothing needed undoing" in (run.saga.reason or "")
    [refused] = run.operate(Lever.REDRIVE, reason="routes loaded").events
    assert isinstance(refused, ev.OperatorActionRefused)
    assert refused.reason == "saga is COMPENSATED: only a FAILED saga can be re-driven"


def _no_hotel_undo() -> SagaDefinition:
    return SagaDefinition(
        saga_type=TRIP.saga_type, version=TRIP.version, input_schema=TRIP.input_schema,
        steps=tuple(dataclasses.replace(step, compensation=None)
                    if step.name == "book_hotel" else step for step in TRIP.steps))


def test_a_step_without_undo_that_took_effect_after_the_turn_back_ends_the_saga_failed_for_a_human() -> None:
    run = SagaRun(_no_hotel_undo())
    run.start()
    turned = run.fail("book_flight", "InvalidRoute")  # the hotel, in flight and without undo, is withdrawn
    assert names(turned.events) == ["StepFailed book_flight 1", "SagaCompensationStarted",
                                    "StepWithdrawn book_hotel 1"]
    ended = run.ok("book_hotel")  # it had run before the withdrawal reached it
    assert names(ended.events) == ["StepSucceeded book_hotel 1", "SagaFailed"]
    assert run.status() is SagaStatus.FAILED and run.saga.failed_step == "book_hotel"
    assert run.saga.reason == ("book_hotel took effect, as its participant said only after the saga turned back "
                               "(step book_flight failed (InvalidRoute: book_flight said InvalidRoute)), and has no "
                               "undo; a human must act")
    [refused] = run.operate(Lever.REDRIVE, reason="routes loaded").events  # it turned back: not forward again
    assert isinstance(refused, ev.OperatorActionRefused) and refused.reason.startswith("the saga turned back")
    settled = run.operate(Lever.TERMINATE, reason="hotel booking cancelled by phone")  # the way out
    assert names(settled.events) == ["OperatorAction", "SagaTerminated"] and run.status() is SagaStatus.TERMINATED


def test_a_step_without_undo_withdrawn_before_it_ran_leaves_the_saga_compensated() -> None:
    run = SagaRun(_no_hotel_undo())
    run.start()
    run.fail("book_flight", "InvalidRoute")
    ended = run.fail("book_hotel", "Withdrawn")
    assert names(ended.events) == ["StepFailed book_hotel 1", "SagaCompensated"]


def test_terminate_settles_a_failed_saga_by_hand() -> None:
    run = _failed_after_its_pivot()
    decision = run.operate(Lever.TERMINATE, reason="itinerary sent by hand")
    assert names(decision.events) == ["OperatorAction", "SagaTerminated"]
    assert run.status() is SagaStatus.TERMINATED and run.saga.reason == "itinerary sent by hand"


REDRIVE_REFUSALS: list[tuple[str, SagaDefinition, Callable[[SagaRun], object], str | None, str | None, str]] = [
    ("redrive without a reason", TRIP, lambda run: _fail_after_pivot(run), None, None, "Redrive needs a reason"),
    ("redrive naming a step", TRIP, lambda run: _fail_after_pivot(run), "send_itinerary", "fixed",
     "Redrive names no step"),
    ("redrive a running saga", TRIP, lambda run: (run.start(),), None, "fixed",
     "saga is RUNNING: only a FAILED saga can be re-driven"),
    ("redrive a compensated saga", TRIP, lambda run: (run.start(), run.ok("book_hotel"),
                                                      run.fail("book_flight", "InvalidRoute"),
                                                      run.comp_ok("book_hotel")), None, "fixed",
     "saga is COMPENSATED: only a FAILED saga"),
    ("redrive a completed saga", TRIP, lambda run: (run.start(), run.ok("book_flight"), run.ok("book_hotel"),
                                                    run.ok("charge_card"), run.ok("send_itinerary")), None, "fixed",
     "saga is COMPLETED: only a FAILED saga"),
    ("redrive a saga that goes on past failures", BATCH_UNDO,
     lambda run: (run.start(), run.fail("a", "Broken"), run.ok("c"), run.cancel(), run.ok("alert"),
                  run.ok("report"), run.comp_ok("c")),  # FAILED: its alert and report landed after the cancel
     None, "fixed", "its failure mode is CONTINUE"),
]


def _fail_after_pivot(run: SagaRun) -> None:
    run.start()
    for step in ("book_flight", "book_hotel", "charge_card"):
        run.ok(step)
    run.fail("send_itinerary", "AddressGone")


@pytest.mark.parametrize(("given", "definition", "history", "step", "reason", "expected"), REDRIVE_REFUSALS,
                         ids=[r[0] for r in REDRIVE_REFUSALS])
def test_a_redrive_that_cannot_apply_is_refused(given: str, definition: SagaDefinition,
                                                history: Callable[[SagaRun], object], step: str | None,
                                                reason: str | None, expected: str) -> None:
    run = SagaRun(definition)
    history(run)
    before = run.saga
    decision = run.operate(Lever.REDRIVE, step, reason=reason)
    [refused] = decision.events
    assert isinstance(refused, ev.OperatorActionRefused), given
    assert refused.reason.startswith(expected), refused.reason
    assert decision.commands == () and run.saga.steps == before.steps and run.saga.status is before.status


def test_a_history_that_starts_a_failed_saga_again_does_not_fold() -> None:
    run = _failed_after_its_pivot()
    again = ev.SagaStarted(saga_id="s1", seq=run.saga.last_seq + 1, definition_version=TRIP.version,
                           occurred_at=run.now, saga_type=TRIP.saga_type, tenant_id=None, input=b"", traceparent=None)
    with pytest.raises(IllegalTransition, match="from FAILED to RUNNING: a saga starts once"):
        fold(TRIP, [*run.events, again])


REFUSALS: list[tuple[str, Callable[[SagaRun], object], str, str | None, str]] = [
    ("a step in flight", lambda run: (run.start(),), Lever.RETRY_NOW, "book_flight",
     "step book_flight is RUNNING, not waiting on a retry backoff"),
    ("a step that succeeded", lambda run: (run.start(), run.ok("book_flight")), Lever.RETRY_NOW, "book_flight",
     "step book_flight is SUCCEEDED, not waiting on a retry backoff"),
    ("a step the saga does not have", lambda run: (run.start(),), Lever.RETRY_NOW, "book_car",
     "RetryNow needs one of the saga's steps"),
    ("no step", lambda run: (run.start(),), Lever.RETRY_NOW, None, "RetryNow needs the step it acts on"),
    ("an ended saga", lambda run: (run.start(), run.ok("book_hotel"), run.fail("book_flight", "InvalidRoute"),
                                   run.comp_ok("book_hotel")),
     Lever.RETRY_NOW, "book_flight", "saga is COMPENSATED: nothing waits to be retried"),
    ("a lever nobody knows", lambda run: (run.start(),), "Teleport", None, "unknown lever 'Teleport'"),
    ("terminate without a reason", lambda run: (run.start(),), Lever.TERMINATE, None, "Terminate needs a reason"),
    ("terminate an ended saga", lambda run: (run.start(), run.ok("book_hotel"), run.fail("book_flight", "InvalidRoute"),
                                             run.comp_ok("book_hotel")), Lever.TERMINATE, None,
     "saga already COMPENSATED"),
    ("pause an ended saga", lambda run: (run.start(), run.ok("book_hotel"), run.fail("book_flight", "InvalidRoute"),
                                         run.comp_ok("book_hotel")), Lever.PAUSE, None,
     "saga is COMPENSATED: only a RUNNING or COMPENSATING saga can be paused"),
    ("pause twice", lambda run: (run.start(), run.operate(Lever.PAUSE)), Lever.PAUSE, None, "saga is already paused"),
    ("unpause a saga not paused", lambda run: (run.start(),), Lever.UNPAUSE, None, "saga is not paused"),
    ("skip a step not skippable", lambda run: (run.start(),), Lever.SKIP, "book_flight",
     "step book_flight is not skippable"),
    ("retry now while paused", lambda run: (run.start(), run.operate(Lever.PAUSE),
                                            run.fail("book_hotel", "Unavailable", retryable=True)),
     Lever.RETRY_NOW, "book_hotel", "saga is paused: unpause it"),
]
FORCE_REFUSALS: list[tuple[str, Callable[[SagaRun], object], str | None, str]] = [
    ("force without a reason", lambda run: (run.start(), run.ok("book_flight")), None,
     "ForceCompensate needs a reason"),
    ("force a completed saga", lambda run: (run.start(), run.ok("book_flight"), run.ok("book_hotel"),
                                            run.ok("charge_card"), run.ok("send_itinerary")), "fraud",
     "saga is COMPLETED: only a RUNNING or FAILED saga can be compensated by force"),
    ("force a saga that turned back with nothing to undo", lambda run: (
        run.start(), run.fail("book_flight", "InvalidRoute"), run.fail("book_hotel", "SoldOut")), "fraud",
     "saga is COMPENSATED: only a RUNNING or FAILED saga can be compensated by force"),
]


@pytest.mark.parametrize(("given", "history", "reason", "expected"), FORCE_REFUSALS,
                         ids=[r[0] for r in FORCE_REFUSALS])
def test_a_forced_compensation_that_cannot_apply_is_refused(given: str, history: Callable[[SagaRun], object],
                                                            reason: str | None, expected: str) -> None:
    run = SagaRun(TRIP)
    history(run)
    [refused] = run.operate(Lever.FORCE_COMPENSATE, reason=reason).events
    assert isinstance(refused, ev.OperatorActionRefused), given
    assert refused.reason.startswith(expected), refused.reason


SKIP_REFUSALS: list[tuple[str, Callable[[SagaRun], object], str | None, str | None, str]] = [
    ("skip without a reason", lambda run: (run.start(),), "book_flight", None, "Skip needs a reason"),
    ("skip a step that succeeded", lambda run: (run.start(), run.ok("book_flight")), "book_flight", "done",
     "step book_flight is SUCCEEDED: only a step in flight, waiting on a retry or waiting for a signal can be skipped"),
    ("skip a step not yet sent", lambda run: (run.start(),), "send_itinerary", "done",
     "step send_itinerary is PENDING"),
    ("skip while paused", lambda run: (run.start(), run.operate(Lever.PAUSE)), "book_flight", "done",
     "saga is paused: only a running saga's step can be skipped"),
    ("skip in an unwinding saga", lambda run: (run.start(), run.fail("book_flight", "InvalidRoute")), "book_hotel",
     "done", "saga is COMPENSATING: only a running saga's step can be skipped"),
]


@pytest.mark.parametrize(("given", "history", "step", "reason", "expected"), SKIP_REFUSALS,
                         ids=[r[0] for r in SKIP_REFUSALS])
def test_a_skip_that_cannot_apply_is_refused(given: str, history: Callable[[SagaRun], object], step: str | None,
                                             reason: str | None, expected: str) -> None:
    run = SagaRun(SKIPPABLE_TRIP)
    history(run)
    before = run.saga
    [refused] = run.operate(Lever.SKIP, step, reason=reason).events
    assert isinstance(refused, ev.OperatorActionRefused), given
    assert refused.reason.startswith(expected), refused.reason
    assert run.saga.steps == before.steps


@pytest.mark.parametrize(("given", "history", "lever", "step", "reason"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_lever_that_cannot_apply_is_refused_with_why_and_changes_nothing(
        given: str, history: Callable[[SagaRun], object], lever: str, step: str | None, reason: str) -> None:
    run = SagaRun(TRIP)
    history(run)
    before = run.saga
    decision = run.operate(lever, step, reason=None if given == "terminate without a reason" else "asked by support")
    [refused] = decision.events
    assert isinstance(refused, ev.OperatorActionRefused), given
    assert refused.reason.startswith(reason) and (refused.action, refused.step, refused.operator) == (
        lever, step, "ops")
    assert decision.commands == () and decision.timers == ()
    assert run.saga.steps == before.steps and run.saga.status is before.status


def test_a_lever_on_a_rejected_saga_is_refused() -> None:
    run = SagaRun(None)
    run.start("no_such_type")
    [refused] = run.operate(Lever.RETRY_NOW, "book_flight").events
    assert isinstance(refused, ev.OperatorActionRefused) and refused.reason == "saga is REJECTED: nothing runs"


STEPS = list(TRIP.order)
MOVE_NAMES = ["ok", "fail", "fail_retryable", "comp_ok", "comp_fail_retryable", "retry_now", "fire", "terminate",
              "pause", "unpause", "cancel", "skip", "force", "redrive"]
MOVES = st.lists(st.tuples(st.sampled_from(MOVE_NAMES), st.sampled_from(STEPS)), max_size=25)
GIVEN: dict[str, Callable[[SagaRun], object]] = {
    "started": lambda run: run.start(),
    "failed before its pivot": lambda run: (run.start(), run.fail("book_flight", "InvalidRoute"),
                                            run.fail("book_hotel", "SoldOut")),
    "failed after its pivot": _fail_after_pivot,
}


@pytest.mark.parametrize("given_history", list(GIVEN))
@settings(max_examples=150, deadline=None)
@given(moves=MOVES)
def test_no_lever_makes_an_illegal_transition_or_undoes_a_passed_pivot(given_history: str,
                                                                      moves: list[tuple[str, str]]) -> None:
    """Any mix of replies, timers, cancels and levers, from a saga just started or one that ended FAILED: every
    history folds (the fold checks every transition), a saga that passed its pivot never sends a compensation, a
    paused one sends nothing until unpaused, a terminated one sends nothing, and a redrive sends each step again
    under its same key as an attempt it never sent before."""
    run = SagaRun(SKIPPABLE_TRIP)
    GIVEN[given_history](run)
    for move, step in moves:
        state = run.saga.steps[step]
        paused, sent = run.saga.paused, len(run.sent)
        try:
            if move == "retry_now":
                run.operate(Lever.RETRY_NOW, step)
            elif move == "terminate":
                run.operate(Lever.TERMINATE, reason="settled by hand")
            elif move in ("pause", "unpause"):
                run.operate(Lever.PAUSE if move == "pause" else Lever.UNPAUSE)
            elif move == "cancel":
                run.cancel()
            elif move == "skip":
                run.operate(Lever.SKIP, step, reason="settled by hand")
            elif move == "force":
                run.operate(Lever.FORCE_COMPENSATE, reason="asked by support")
            elif move == "redrive":
                sent_before = {(command.step, command.attempt) for command in run.sent}
                decision = run.operate(Lever.REDRIVE, reason="fixed")
                if not isinstance(decision.events[0], ev.OperatorActionRefused):
                    assert run.status() is not SagaStatus.FAILED and decision.commands
                    assert all(command.idempotency_key == f"s1:{command.step}"
                               and (command.step, command.attempt) not in sent_before
                               for command in decision.commands)
            elif move == "fire":
                armed = [timer for timer in run.armed.values() if timer.step == step]
                if armed:
                    run.fire(armed[0].kind, step)
            elif move in ("ok", "fail", "fail_retryable") and state.status is StepStatus.RUNNING:
                if move == "ok":
                    run.ok(step)
                else:
                    run.fail(step, "Boom", retryable=move == "fail_retryable")
            elif move.startswith("comp") and state.status is StepStatus.COMPENSATING:
                if move == "comp_ok":
                    run.comp_ok(step)
                else:
                    run.comp_fail(step, "Boom", retryable=True)
        finally:
            if paused and move != "unpause":
                assert len(run.sent) == sent, f"{move} {step} sent a command while paused"
            if run.status() is SagaStatus.TERMINATED:
                sent = len(run.sent)
                assert run.operate(Lever.RETRY_NOW, step).commands == () and len(run.sent) == sent
            if run.saga.pivot_passed and not run.saga.forced_compensation:
                assert not any(command.kind is CommandKind.COMPENSATE for command in run.sent), names(
                    tuple(run.events))


async def test_retry_now_in_the_environment_skips_the_backoff() -> None:
    from saga_orchestrator.participants.trip.scenarios import SCENARIOS

    env = SagaEnvironment(TRIP)
    env.script(("payment", "charge_card"), fail_transiently(1))
    saga_id = await env.start("trip", SCENARIOS["happy"].trip("t-1"))
    await env.retry_now(saga_id, "charge_card")
    state = env.state(saga_id)
    assert state is not None and state.status is SagaStatus.COMPLETED  # the 200 ms backoff never passed
    assert any(isinstance(event, ev.OperatorAction) and event.action == Lever.RETRY_NOW
               for event in env.history(saga_id))


async def test_terminate_in_the_environment() -> None:
    from saga_orchestrator.participants.trip.scenarios import SCENARIOS

    env = SagaEnvironment(TRIP)
    env.script(("payment", "charge_card"), fail_transiently(1))
    saga_id = await env.start("trip", SCENARIOS["happy"].trip("t-2"))
    await env.terminate(saga_id, "the customer paid at the desk")
    result = await env.result(saga_id)
    assert result.status == "TERMINATED" and result.compensated == []


async def test_pause_holds_a_saga_in_the_environment_until_unpaused() -> None:
    from saga_orchestrator.participants.trip.scenarios import SCENARIOS

    env = SagaEnvironment(TRIP)
    env.script(("payment", "charge_card"), fail_transiently(1))
    saga_id = await env.start("trip", SCENARIOS["happy"].trip("t-3"))
    await env.pause(saga_id)
    await env.advance(hours=1)  # the charge's retry would have gone after 200 ms
    state = env.state(saga_id)
    assert state is not None and state.status is SagaStatus.RUNNING and state.paused
    assert state.steps["charge_card"].status is StepStatus.RETRY_SCHEDULED
    await env.unpause(saga_id)
    result = await env.result(saga_id)
    assert result.status == "COMPLETED" and result.attempts("charge_card") == 2


async def test_redrive_in_the_environment_completes_a_saga_that_failed_after_its_pivot() -> None:
    from saga_orchestrator.participants.trip.scenarios import SCENARIOS

    env = SagaEnvironment(TRIP)
    env.script(("notification", "send_itinerary"), fail("AddressGone"))
    saga_id = await env.start("trip", SCENARIOS["happy"].trip("t-4"))
    failed = await env.result(saga_id)
    assert failed.status == "FAILED" and failed.compensated == []
    env.script(("notification", "send_itinerary"), succeed())  # the address was corrected
    await env.redrive(saga_id, "address corrected")
    result = await env.result(saga_id)
    assert result.status == "COMPLETED" and result.attempts("send_itinerary") == 2


def test_an_answer_a_person_gave_records_who_and_why_before_its_outcome() -> None:
    run = SagaRun(TRIP)
    run.start()
    answer = StepResult(saga_id="s1", step="book_flight", kind=CommandKind.FORWARD, idempotency_key="s1:book_flight",
                        attempt=1, status=ResultStatus.SUCCEEDED, operator="pat", detail="seat confirmed by phone")
    decision = run.send(answer)
    assert names(decision.events) == ["OperatorAction", "StepSucceeded book_flight 1"]
    action = decision.events[0]
    assert isinstance(action, ev.OperatorAction)
    assert (action.action, action.operator, action.detail) == (ANSWER, "pat", "book_flight: seat confirmed by phone")
    assert run.send(answer).events == ()  # the same answer again (a redelivery) records nothing
    refused = dataclasses.replace(answer, step="book_hotel", idempotency_key="s1:book_hotel",
                                  status=ResultStatus.FAILED, error_type="NoRoom", detail=None)
    assert [(describe(e), getattr(e, "detail", None)) for e in run.send(refused).events][:2] == [
        ("OperatorAction", "book_hotel"), ("StepFailed book_hotel 1", None)]


def _completed(run: SagaRun) -> None:
    run.start()
    for step in TRIP.order:
        run.ok(step)


def _purged(run: SagaRun) -> None:
    _completed(run)
    purged = purged_event(run.saga, [], run.now, "ops")
    run.take(Decision(events=(purged,), state=apply_event(TRIP, run.saga, purged)))


REPLAYED_IN: list[tuple[str, SagaDefinition | None, Callable[[SagaRun], object]]] = [
    ("a running saga", TRIP, lambda run: run.start()),
    ("a completed saga", TRIP, _completed),
    ("a rejected saga", None, lambda run: run.start("no_such_type")),
    ("a quarantined saga", TRIP, lambda run: (run.start(), run.take(quarantine(TRIP, run.saga, "poison", "m-1",
                                                                                 run.now)))),
    ("a purged saga", TRIP, _purged),
]


@pytest.mark.parametrize(("given", "definition", "history"), REPLAYED_IN, ids=[r[0] for r in REPLAYED_IN])
def test_a_dead_letter_replayed_is_recorded_whatever_the_saga_status(
        given: str, definition: SagaDefinition | None, history: Callable[[SagaRun], object]) -> None:
    run = SagaRun(definition)
    history(run)
    before = run.saga
    decision = run.operate(Lever.DLQ_REPLAY, reason="letter 0:7 from saga.control 1:3 to saga.control")
    [action] = decision.events
    assert isinstance(action, ev.OperatorAction), given
    assert (action.action, action.operator, action.detail) == (
        Lever.DLQ_REPLAY, "ops", "letter 0:7 from saga.control 1:3 to saga.control")
    assert decision.commands == () and decision.dead_letter is None
    assert run.saga.status is before.status and run.saga.steps == before.steps
    [refused] = run.operate(Lever.DLQ_REPLAY, reason=None).events
    assert isinstance(refused, ev.OperatorActionRefused) and refused.reason.startswith("DlqReplay needs a reason")


def test_a_cancel_records_who_asked_whether_it_applies_or_not() -> None:
    run = SagaRun(TRIP)
    run.start()
    [requested, *_] = run.send(CancelSaga(saga_id="s1", reason="customer changed plans", operator="lee")).events
    assert isinstance(requested, ev.SagaCancelRequested) and requested.operator == "lee"
    [refused] = run.send(CancelSaga(saga_id="s1", reason="again", operator="max")).events
    assert isinstance(refused, ev.SagaCancelRefused) and (refused.operator, refused.reason) == (
        "max", "cancel already requested")


def test_a_lever_from_the_cli_records_the_login_name_when_no_operator_is_given(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import os
    import pwd

    import typer

    from saga_orchestrator.cli.context import operator_or_login

    monkeypatch.setenv("USER", "kim")
    assert (operator_or_login(" ana "), operator_or_login(None), operator_or_login("")) == ("ana", "kim", "kim")
    monkeypatch.delenv("USER")
    monkeypatch.setenv("LOGNAME", "lou")
    assert operator_or_login(None) == "lou"
    monkeypatch.delenv("LOGNAME")
    assert operator_or_login(None) == pwd.getpwuid(os.getuid()).pw_name  # a container sets neither

    def no_account(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_account)
    with pytest.raises(typer.Exit) as stopped:
        operator_or_login(None)
    assert stopped.value.exit_code == 2 and "--operator is needed" in capsys.readouterr().err
