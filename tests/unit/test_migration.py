"""Moving a running saga to another version of its definition (the Migrate lever), in the pure core: which sagas
``migration_problem`` refuses and why, what the lever records, and that the saga then runs, and folds, by the
target version."""

from __future__ import annotations

import dataclasses

import pytest

from bench.trip_changes import CHECK_BEFORE_CHARGE_V2, FLIGHT_ONLY, RECEIPT_V2
from saga_orchestrator.operations import bulk_jobs, definition_migration
from saga_orchestrator.operations.bulk_jobs import BulkJobError, Selection
from saga_orchestrator.orchestrator.domain.decide import decide, quarantine
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry, RetryPolicy, SagaDefinition
from saga_orchestrator.orchestrator.domain.errors import HistoryMismatch, ShapeChanged
from saga_orchestrator.orchestrator.domain.migration import migration_problem
from saga_orchestrator.orchestrator.domain.replay_check import Outcome as ReplayOutcome
from saga_orchestrator.orchestrator.domain.replay_check import check_history
from saga_orchestrator.orchestrator.domain.state import SagaStatus, StepStatus, fold
from saga_orchestrator.orchestrator.store.operations.reads import MemoryReads
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.message_types import Lever, OperateSaga
from saga_orchestrator.testing import SagaEnvironment
from saga_orchestrator.testing.history import SagaRun, event_names


def _v2(name: str, **changes: str) -> SagaDefinition:
    """The trip as v2 with step ``name``'s participant, command or undo changed as given."""
    steps = tuple(dataclasses.replace(s, **changes) if s.name == name else s for s in TRIP.steps)  # type: ignore[arg-type]
    return dataclasses.replace(TRIP, version=2, steps=steps)


def _charging() -> SagaRun:
    """A v1 trip whose flight and hotel are booked and whose charge is in flight."""
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    run.ok("book_hotel")
    assert run.saga.steps["charge_card"].status is StepStatus.RUNNING
    return run


def _booking() -> SagaRun:
    """A v1 trip whose flight is booked and whose hotel is in flight."""
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    return run


@pytest.mark.parametrize(("target", "said"), [
    (FLIGHT_ONLY, "step book_hotel is SUCCEEDED in the saga, and v2 has no step book_hotel"),
    (_v2("book_flight", command="reserve_flight"),
     "step book_flight is SUCCEEDED in the saga, and v2 sends 'reserve_flight' to 'flight' instead of 'book_flight' "
     "to 'flight'"),
    (_v2("book_hotel", compensation="release_hotel"),
     "step book_hotel is SUCCEEDED in the saga, and v2 undoes it by 'release_hotel' instead of 'cancel_hotel'"),
    (_v2("charge_card", participant="billing"),
     "step charge_card is RUNNING in the saga, and v2 sends 'charge_card' to 'billing' instead of 'charge_card' to "
     "'payment'"),
    (CHECK_BEFORE_CHARGE_V2,
     "step fraud_check of v2 would come before step charge_card, which the saga already ran: fraud_check would "
     "never run"),
    (dataclasses.replace(RECEIPT_V2, saga_type="cruise"),
     "v2 is a definition of saga type 'cruise', the saga is 'trip'"),
    (TRIP, "the saga already runs on trip v1"),
])
def test_a_saga_whose_past_does_not_fit_the_target_is_refused_naming_the_step(target: SagaDefinition,
                                                                               said: str) -> None:
    assert migration_problem(_charging().saga, TRIP, target) == said


def test_an_ended_or_quarantined_saga_is_refused() -> None:
    run = _charging()
    quarantined = quarantine(TRIP, run.saga, "a bad reply", None, run.now).state
    assert quarantined is not None and quarantined.status is SagaStatus.QUARANTINED
    assert migration_problem(quarantined, TRIP, RECEIPT_V2) == (
        "saga is QUARANTINED: only a RUNNING saga moves to another version")
    run.ok("charge_card")
    run.ok("send_itinerary")
    said = migration_problem(run.saga, TRIP, RECEIPT_V2)
    assert said == "saga is COMPLETED: only a RUNNING saga moves to another version"


def test_a_step_added_ahead_of_where_the_saga_stands_is_accepted_when_nothing_after_it_ran() -> None:
    assert migration_problem(_booking().saga, TRIP, CHECK_BEFORE_CHARGE_V2) is None
    assert migration_problem(_charging().saga, TRIP, RECEIPT_V2) is None


def test_migrate_records_the_action_and_the_migration_and_the_saga_runs_on_the_target() -> None:
    run = _booking()
    decision = run.migrate(CHECK_BEFORE_CHARGE_V2, reason="fraud checks for all trips")
    assert event_names(decision) == ["OperatorAction", "SagaMigrated"]
    action, migrated = decision.events
    assert isinstance(action, ev.OperatorAction) and isinstance(migrated, ev.SagaMigrated)
    assert (action.action, action.detail) == (Lever.MIGRATE, "v1 to v2: fraud checks for all trips")
    assert (migrated.definition_version, migrated.from_version, migrated.to_version, migrated.to_fingerprint,
            migrated.operator, migrated.reason) == (1, 1, 2, CHECK_BEFORE_CHARGE_V2.fingerprint, "ops",
                                                    "fraud checks for all trips")
    assert (run.saga.definition_version, run.saga.definition_fingerprint) == (2, CHECK_BEFORE_CHARGE_V2.fingerprint)
    assert run.saga.steps["fraud_check"].status is StepStatus.PENDING
    assert event_names(run.ok("book_hotel"))[-1] == "StepCommandSent fraud_check 1"
    assert all(e.definition_version == 2 for e in run.events[migrated.seq:])
    assert event_names(run.ok("fraud_check"))[-1] == "StepCommandSent charge_card 1"
    run.ok("charge_card")
    run.ok("send_itinerary")
    assert run.status() is SagaStatus.COMPLETED


def test_a_step_the_target_has_ready_is_sent_at_once() -> None:
    run = _charging()
    run.ok("charge_card")  # the itinerary is in flight
    assert event_names(run.migrate(RECEIPT_V2)) == ["OperatorAction", "SagaMigrated", "StepCommandSent send_receipt 1"]
    run.ok("send_itinerary")
    run.ok("send_receipt")
    assert run.status() is SagaStatus.COMPLETED


def test_a_paused_saga_moves_and_sends_the_target_s_steps_when_unpaused() -> None:
    run = _charging()
    run.ok("charge_card")
    run.operate(Lever.PAUSE)
    assert event_names(run.migrate(RECEIPT_V2)) == ["OperatorAction", "SagaMigrated"]
    assert "StepCommandSent send_receipt 1" in event_names(run.operate(Lever.UNPAUSE))


@pytest.mark.parametrize(("target", "version", "said"), [
    (None, 7, "no definition trip v7 is registered in this orchestrator"),
    (RECEIPT_V2, None, "Migrate needs the version to move to (definition_version)"),
    (CHECK_BEFORE_CHARGE_V2, 2, "step fraud_check of v2 would come before step charge_card, which the saga already "
                                "ran: fraud_check would never run"),
])
def test_a_refused_migration_is_recorded_with_why_and_changes_nothing(target: SagaDefinition | None,
                                                                       version: int | None, said: str) -> None:
    run = _charging()
    before = run.saga
    message = OperateSaga(saga_id="s1", action=Lever.MIGRATE, step=None, operator="ops", reason=None,
                          definition_version=version)
    decision = run.take(decide(TRIP, run.state, message, run.now, target))
    [refused] = decision.events
    assert isinstance(refused, ev.OperatorActionRefused) and refused.reason == said
    assert (run.saga.definition_version, run.saga.steps) == (1, before.steps)


def test_a_migrated_history_folds_by_its_last_version_and_no_other() -> None:
    run = _charging()
    run.migrate(RECEIPT_V2)
    run.ok("charge_card")
    registry = DefinitionRegistry([TRIP, RECEIPT_V2])
    assert registry.for_history(run.events) is RECEIPT_V2
    assert fold(RECEIPT_V2, run.events) == run.saga
    with pytest.raises(HistoryMismatch):
        fold(TRIP, run.events)
    edited = dataclasses.replace(RECEIPT_V2, steps=(*RECEIPT_V2.steps[:-1], dataclasses.replace(
        RECEIPT_V2.steps[-1], command="send_receipt")))
    with pytest.raises(ShapeChanged):
        fold(edited, run.events)
    assert registry.for_history(run.events[:3]) is TRIP


def test_the_migration_travels_on_the_wire() -> None:
    run = _charging()
    run.migrate(RECEIPT_V2, reason="receipts")
    migrated = run.events[-2] if isinstance(run.events[-2], ev.SagaMigrated) else run.events[-1]
    assert isinstance(migrated, ev.SagaMigrated)
    assert wire.decode_event(wire.encode_event(migrated)) == migrated
    order = OperateSaga(saga_id="s1", action=Lever.MIGRATE, step=None, operator="ops", reason=None,
                        definition_version=2)
    assert wire.decode_operate(wire.encode_operate(order)) == order


# --- through the orchestrator's service, as a bulk job (the test kit's memory adapters) ----------------------


async def test_a_migration_job_moves_the_running_trips_and_refuses_the_one_unwinding() -> None:
    env = SagaEnvironment(TRIP, RECEIPT_V2)
    env.definitions.drain("trip", 2)  # new trips start on v1, as before v2 was deployed
    env.stop("hotel")  # the trips wait on their hotel
    ids = [await env.start("trip", SCENARIOS["happy"].trip(f"t-{n}"), saga_id=f"t-{n}") for n in range(3)]
    await env.cancel("t-0")  # unwinding: it waits for the hotel's answer to the withdrawal
    reads = MemoryReads(env.store)

    planned = await definition_migration.plan(reads, env.definitions, "trip", 1, 2)
    assert [(item.saga_id, item.problem) for item in planned] == [
        ("t-0", "saga is COMPENSATING: only a RUNNING saga moves to another version"), ("t-1", None), ("t-2", None)]

    job = await env.bulk_run(definition_migration.selection("trip", 1), Lever.MIGRATE, "receipts for all",
                             definition_version=2)
    assert job.done == 3
    found = await definition_migration.outcome(reads, job, ids)
    assert (sorted(found.migrated), found.refused) == (
        ["t-1", "t-2"], [("t-0", "saga is COMPENSATING: only a RUNNING saga moves to another version")])
    assert {saga_id: env.store.summaries[saga_id].definition_version for saga_id in ids} == {"t-0": 1, "t-1": 2,
                                                                                              "t-2": 2}
    await env.start_participant("hotel")
    results = {saga_id: await env.result(saga_id) for saga_id in ids}
    assert {saga_id: result.status for saga_id, result in results.items()} == {
        "t-0": "CANCELLED", "t-1": "COMPLETED", "t-2": "COMPLETED"}
    assert "send_receipt" in results["t-1"].succeeded and "send_receipt" not in results["t-0"].succeeded
    for saga_id in ids:  # the stored history folds by the version it ended on
        history = env.history(saga_id)
        assert fold(env.definitions.for_history(history), history) == env.state(saga_id)


def test_the_replay_check_takes_a_migrated_saga_by_the_version_it_moved_to() -> None:
    run = _charging()
    run.migrate(RECEIPT_V2)
    deployed = DefinitionRegistry([TRIP, RECEIPT_V2])
    assert check_history(deployed, deployed, run.events).outcome is ReplayOutcome.SAME
    patient = dataclasses.replace(RECEIPT_V2, steps=tuple(
        dataclasses.replace(step, retry=RetryPolicy(max_attempts=9)) if step.name == "book_hotel" else step
        for step in RECEIPT_V2.steps))  # policy only: its shape, which the history pins, stays
    assert check_history(deployed, DefinitionRegistry([TRIP, patient]), run.events).outcome is ReplayOutcome.SAME
    verdict = check_history(deployed, DefinitionRegistry([TRIP]), run.events)
    assert verdict.outcome is ReplayOutcome.WOULD_NOT_FOLD and "trip v2 not deployed" in verdict.detail


def test_a_migration_job_selects_by_version_and_needs_both_versions_deployed() -> None:
    chosen = definition_migration.selection("trip", 1)
    assert Selection.from_json(chosen.to_json()) == chosen
    assert chosen.describe() == "type trip, version 1, state COMPENSATING or RUNNING"
    with pytest.raises(BulkJobError, match="name the type too"):
        Selection(definition_version=1)
    with pytest.raises(BulkJobError, match="saga definitions migrate"):
        bulk_jobs.check_job(Lever.MIGRATE, None, "ana", "receipts", 1.0)
    with pytest.raises(BulkJobError, match="only Migrate names a definition version"):
        bulk_jobs.check_job(Lever.PAUSE, None, "ana", "hold", 1.0, definition_version=2)
    with pytest.raises(BulkJobError, match=r"trip v2 is not deployed \(deployed: v1\)"):
        definition_migration.target(DefinitionRegistry([TRIP]), "trip", 1, 2)
    with pytest.raises(BulkJobError, match="already run on trip v1"):
        definition_migration.target(DefinitionRegistry([TRIP]), "trip", 1, 1)
