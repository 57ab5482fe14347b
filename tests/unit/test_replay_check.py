"""``replay_check``: a running trip's next decision on the deployed trip and on changed ones."""

from __future__ import annotations

import dataclasses

from bench.trip_changes import CHECK_BEFORE_CHARGE, FLIGHT_ONLY, NO_CHARGE, PATIENT, STEP_AFTER_CHARGE
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry, SagaDefinition
from saga_orchestrator.orchestrator.domain.replay_check import Outcome, ReplayVerdict, check_history, probes
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.testing.history import SagaRun

DEPLOYED = DefinitionRegistry([TRIP])


def waiting_on_bookings() -> SagaRun:
    run = SagaRun(TRIP, saga_id="waiting")
    run.start()
    return run


def flight_booked() -> SagaRun:
    run = waiting_on_bookings()
    run.ok("book_flight")
    return run


def past_the_charge() -> SagaRun:
    run = SagaRun(TRIP, saga_id="charged")
    run.start()
    run.ok("book_flight")
    run.ok("book_hotel")
    run.ok("charge_card")
    return run


def checked(candidate: SagaDefinition | DefinitionRegistry, run: SagaRun) -> ReplayVerdict:
    registry = candidate if isinstance(candidate, DefinitionRegistry) else DefinitionRegistry([candidate])
    return check_history(DEPLOYED, registry, run.events)


def test_the_deployed_trip_itself_decides_every_running_trip_the_same() -> None:
    for run in (waiting_on_bookings(), flight_booked(), past_the_charge()):
        assert checked(TRIP, run) == ReplayVerdict(run.saga_id, Outcome.SAME)


def test_a_policy_change_decides_the_same() -> None:
    retrying = waiting_on_bookings()
    retrying.fail("book_hotel", "Unavailable", retryable=True)
    for run in (waiting_on_bookings(), flight_booked(), past_the_charge(), retrying):
        assert checked(PATIENT, run).outcome is Outcome.SAME


def test_a_check_before_the_charge_changes_what_the_last_booking_leads_to() -> None:
    verdict = checked(CHECK_BEFORE_CHARGE, flight_booked())
    assert verdict.outcome is Outcome.DIFFERENT
    assert verdict.detail.startswith("success of book_hotel attempt 1:")
    assert "FORWARD charge_card" in verdict.detail and "FORWARD fraud_check" in verdict.detail


def test_a_check_before_the_charge_would_run_it_after_the_charge_of_a_trip_past_it() -> None:
    verdict = checked(CHECK_BEFORE_CHARGE, past_the_charge())
    assert verdict.outcome is Outcome.DIFFERENT
    assert verdict.detail == ("advance: deployed does nothing; candidate StepCommandSent(fraud_check), "
                              "FORWARD fraud_check")


def test_a_step_after_the_charge_changes_what_a_trip_past_the_charge_does_next() -> None:
    verdict = checked(STEP_AFTER_CHARGE, past_the_charge())
    assert verdict.outcome is Outcome.DIFFERENT
    assert "advance" in verdict.detail and "send_receipt" in verdict.detail


def test_the_charge_removed_does_not_fit_a_trip_past_the_charge() -> None:
    verdict = checked(NO_CHARGE, past_the_charge())
    assert verdict.outcome is Outcome.WOULD_NOT_FOLD
    assert "charge_card" in verdict.detail


def test_the_charge_removed_changes_what_the_last_booking_leads_to() -> None:
    assert checked(NO_CHARGE, flight_booked()).outcome is Outcome.DIFFERENT


def test_a_version_not_deployed_any_more_would_not_fold() -> None:
    verdict = checked(FLIGHT_ONLY, waiting_on_bookings())
    assert verdict == ReplayVerdict("waiting", Outcome.WOULD_NOT_FOLD, "trip v1 not deployed (candidate has: v2)")
    assert checked(DefinitionRegistry([TRIP, FLIGHT_ONLY]), waiting_on_bookings()).outcome is Outcome.SAME


def test_ended_and_never_started_sagas_are_skipped() -> None:
    run = past_the_charge()
    run.ok("send_itinerary")
    assert checked(NO_CHARGE, run).outcome is Outcome.SKIPPED
    assert check_history(DEPLOYED, DEPLOYED, []).outcome is Outcome.SKIPPED


def test_a_compensating_trip_is_probed_on_its_undo() -> None:
    run = flight_booked()
    run.fail("book_hotel", "NoRooms")
    assert run.saga.steps["book_flight"].status.value == "COMPENSATING"
    names = [name for name, _ in probes(TRIP, run.saga, TRIP, run.saga)]
    assert "success of book_flight undo attempt 1" in names and "failure of book_flight undo attempt 1" in names
    assert checked(TRIP, run).outcome is Outcome.SAME
    patient_undo = dataclasses.replace(TRIP, steps=tuple(
        dataclasses.replace(step, compensation_timeout_ms=9_000) if step.name == "book_flight" else step
        for step in TRIP.steps))
    assert checked(patient_undo, run).outcome is Outcome.SAME
