"""Patch markers: steps added in place while sagas of the version run. A trip that reaches the point takes the
patched path and records so; one that went past it keeps its path; a trip started on the patched shape takes it
with no record. The deploy check, the replay check, ``diff`` and ``check --patch`` all see the same shapes."""

from __future__ import annotations

import dataclasses

import pytest

from bench.trip_changes import CHECK_BEFORE_CHARGE, FRAUD_CHECK_PATCH, FRAUD_CHECKED
from saga_orchestrator.operations.versions import OldPath, ShapeCounts, VersionCounts, on_old_path
from saga_orchestrator.orchestrator.domain.changes import Verdict, diff, verdict
from saga_orchestrator.orchestrator.domain.definition import UNLIMITED_RETRY, DefinitionRegistry, SagaDefinition, Step
from saga_orchestrator.orchestrator.domain.deploys import RunningShape, stranded
from saga_orchestrator.orchestrator.domain.errors import DefinitionError, HistoryMismatch, ShapeChanged
from saga_orchestrator.orchestrator.domain.replay_check import Outcome, check_history
from saga_orchestrator.orchestrator.domain.state import SagaStatus, StepStatus, fold
from saga_orchestrator.participants.trip import TRIP
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.testing.history import SagaRun

PATCH = FRAUD_CHECK_PATCH


def _events(run: SagaRun, kind: type[ev.Event]) -> list[ev.Event]:
    return [event for event in run.events if isinstance(event, kind)]


def _sent(run: SagaRun) -> list[str]:
    return [command.step for command in run.sent]


def _ran(definition: SagaDefinition, saga_id: str, *succeeded: str) -> SagaRun:
    """A saga of ``definition`` started, then each step of ``succeeded`` answered with a success, in turn."""
    run = SagaRun(definition, saga_id=saga_id)
    run.start()
    for step in succeeded:
        run.ok(step)
    return run


def _deploy(run: SagaRun, definition: SagaDefinition) -> None:
    """The deploy: the orchestrator folds the saga's history with the new code and decides its next message."""
    run.definition = definition
    run._state = fold(definition, run.events)


def _bookings_done_on(definition: SagaDefinition, saga_id: str) -> SagaRun:
    run = _ran(TRIP, saga_id, "book_flight")
    _deploy(run, definition)
    run.ok("book_hotel")
    return run


def test_a_marker_keeps_the_shape_the_version_had_and_its_name_is_not_part_of_it() -> None:
    assert FRAUD_CHECKED.patches == (PATCH,)
    assert dict(FRAUD_CHECKED.shapes) == {FRAUD_CHECKED.fingerprint: frozenset(), TRIP.fingerprint: {PATCH}}
    assert FRAUD_CHECKED.shape(frozenset({PATCH})) == TRIP.shape()
    assert FRAUD_CHECKED.fingerprint == CHECK_BEFORE_CHARGE.fingerprint  # removing the marker keeps the full shape
    assert FRAUD_CHECKED.lacking(None) == frozenset({PATCH})  # a saga that recorded no shape lacks every patch
    assert FRAUD_CHECKED.lacking("0123456789abcdef") is None
    assert TRIP.patches == () and dict(TRIP.shapes) == {TRIP.fingerprint: frozenset()}


def test_a_patch_needs_a_step_after_it_and_cannot_hold_the_pivot() -> None:
    at_the_end = Step(name="receipt", participant="notification", command="send_itinerary",
                      depends_on=("send_itinerary",), patch="receipt", retry=UNLIMITED_RETRY)
    with pytest.raises(DefinitionError, match="no step follows the steps of patch 'receipt'"):
        dataclasses.replace(TRIP, steps=(*TRIP.steps, at_the_end))
    with pytest.raises(DefinitionError, match="the pivot cannot be added behind a patch marker"):
        dataclasses.replace(TRIP.step("charge_card"), patch="p")
    with pytest.raises(DefinitionError, match="free of ':'"):
        dataclasses.replace(TRIP.step("book_flight"), patch="a:b")


def test_a_trip_that_reaches_the_point_takes_the_patch_and_records_it() -> None:
    run = _bookings_done_on(FRAUD_CHECKED, "reaches")
    taken = _events(run, ev.PatchTaken)
    assert taken == [ev.PatchTaken(saga_id="reaches", seq=taken[0].seq, definition_version=1,
                                   occurred_at=run.now, patch=PATCH, definition_fingerprint=FRAUD_CHECKED.fingerprint)]
    assert _sent(run)[-1] == "fraud_check" and "charge_card" not in _sent(run)
    assert run.saga.definition_fingerprint == FRAUD_CHECKED.fingerprint
    run.ok("fraud_check")
    run.ok("charge_card")
    run.ok("send_itinerary")
    assert run.status() is SagaStatus.COMPLETED
    assert _sent(run) == ["book_flight", "book_hotel", "fraud_check", "charge_card", "send_itinerary"]
    assert len(_events(run, ev.PatchTaken)) == 1


def test_a_flagged_card_turns_a_patched_trip_back_before_anything_is_charged() -> None:
    run = _bookings_done_on(FRAUD_CHECKED, "flagged")
    run.fail("fraud_check", "CardFlagged")
    assert run.status() is SagaStatus.COMPENSATING
    run.comp_ok("book_flight")
    run.comp_ok("book_hotel")
    assert run.status() is SagaStatus.COMPENSATED and "charge_card" not in _sent(run)


def test_a_trip_past_the_point_keeps_its_path_and_never_runs_the_check() -> None:
    run = _ran(TRIP, "past", "book_flight", "book_hotel")
    assert _sent(run)[-1] == "charge_card"
    _deploy(run, FRAUD_CHECKED)
    run.ok("charge_card")
    skipped = _events(run, ev.StepSkipped)
    assert [e.step for e in skipped] == ["fraud_check"] and f"patch {PATCH}" in skipped[0].reason  # type: ignore[attr-defined]
    assert run.saga.steps["fraud_check"].waived and not _events(run, ev.PatchTaken)
    run.ok("send_itinerary")
    assert run.status() is SagaStatus.COMPLETED
    assert "fraud_check" not in _sent(run)
    assert run.saga.definition_fingerprint == TRIP.fingerprint  # still the shape it started on


def test_a_trip_past_the_point_that_turns_back_undoes_what_it_did_and_not_the_skipped_check() -> None:
    run = _ran(TRIP, "past-declined", "book_flight", "book_hotel")
    _deploy(run, FRAUD_CHECKED)
    run.fail("charge_card", "Declined")
    assert run.status() is SagaStatus.COMPENSATING
    run.comp_ok("book_flight")
    run.comp_ok("book_hotel")
    assert run.status() is SagaStatus.COMPENSATED
    assert run.saga.steps["fraud_check"].status is StepStatus.SKIPPED


def test_a_trip_started_on_the_patched_shape_takes_the_check_with_no_record() -> None:
    run = _ran(FRAUD_CHECKED, "new", "book_flight", "book_hotel", "fraud_check", "charge_card", "send_itinerary")
    assert run.status() is SagaStatus.COMPLETED and not _events(run, ev.PatchTaken)
    assert _sent(run) == ["book_flight", "book_hotel", "fraud_check", "charge_card", "send_itinerary"]


def test_a_patched_history_folds_only_where_the_patch_is_declared() -> None:
    run = _bookings_done_on(FRAUD_CHECKED, "folds")
    assert fold(FRAUD_CHECKED, run.events).definition_fingerprint == FRAUD_CHECKED.fingerprint
    # The marker removed too early (the deploy check would have refused it), or the patch still deploying: a
    # shape the registered definition lacks, which another instance may serve.
    with pytest.raises(ShapeChanged, match="PatchTaken") as taken:
        fold(TRIP, run.events)
    assert taken.value.fingerprint == FRAUD_CHECKED.fingerprint
    started_patched = _ran(FRAUD_CHECKED, "started-patched")
    with pytest.raises(ShapeChanged) as started:
        fold(TRIP, started_patched.events)
    assert started.value.fingerprint == FRAUD_CHECKED.fingerprint
    # A patch the saga's shape does not lack, onto a shape the definition has: the history does not fit it.
    forged = [dataclasses.replace(event, patch="other") if isinstance(event, ev.PatchTaken) else event
              for event in run.events]
    with pytest.raises(HistoryMismatch, match="does not follow from its shape"):
        fold(FRAUD_CHECKED, forged)


def test_the_deploy_check_lets_a_patch_in_and_refuses_the_same_edit_unmarked() -> None:
    running = [RunningShape("trip", 1, TRIP.fingerprint, 200)]
    assert stranded(DefinitionRegistry([FRAUD_CHECKED]), running, {TRIP.fingerprint: TRIP.shape()}) == []
    problems = stranded(DefinitionRegistry([CHECK_BEFORE_CHARGE]), running, {TRIP.fingerprint: TRIP.shape()})
    assert len(problems) == 1 and "step 'fraud_check' added before pivot 'charge_card'" in problems[0]
    # The marker removed while trips that lack it still run: refused the same way.
    taken = [RunningShape("trip", 1, FRAUD_CHECKED.fingerprint, 5), *running]
    assert len(stranded(DefinitionRegistry([CHECK_BEFORE_CHARGE]), taken, {TRIP.fingerprint: TRIP.shape()})) == 1


def test_the_replay_check_passes_a_patch_and_says_which_trips_take_it() -> None:
    deployed, candidate = DefinitionRegistry([TRIP]), DefinitionRegistry([FRAUD_CHECKED])
    waiting, flight_booked = _ran(TRIP, "waiting"), _ran(TRIP, "flight-booked", "book_flight")
    past = _ran(TRIP, "past", "book_flight", "book_hotel")
    verdicts = {run.saga_id: check_history(deployed, candidate, run.events) for run in (waiting, flight_booked, past)}
    assert {saga_id: v.outcome for saga_id, v in verdicts.items()} == {
        "waiting": Outcome.SAME, "flight-booked": Outcome.TAKES_PATCH, "past": Outcome.SAME}
    assert not any(v.failed for v in verdicts.values())
    assert verdicts["flight-booked"].detail.startswith("success of book_hotel attempt 1: candidate ")
    detail = verdicts["flight-booked"].detail
    assert "PatchTaken" in detail and "FORWARD fraud_check" in detail
    unmarked = check_history(deployed, DefinitionRegistry([CHECK_BEFORE_CHARGE]), past.events)
    assert unmarked.outcome is Outcome.DIFFERENT and "fraud_check" in unmarked.detail
    # After the deploy, the patched trip checks the same against itself, the patch taken or not.
    taken = _bookings_done_on(FRAUD_CHECKED, "taken")
    assert check_history(candidate, candidate, taken.events).outcome is Outcome.SAME


def test_diff_calls_a_change_behind_a_marker_safe_and_the_same_change_unmarked_a_patch() -> None:
    marked = diff(TRIP, FRAUD_CHECKED)
    assert verdict(marked) is Verdict.SAFE and marked
    assert all(change.what.endswith("behind patch 'fraud-check'") for change in marked)
    assert verdict(diff(TRIP, CHECK_BEFORE_CHARGE)) is Verdict.PATCH


def test_check_patch_counts_the_running_trips_whose_shape_lacks_it() -> None:
    counts = [VersionCounts("trip", 1, 12, 40, (ShapeCounts(None, 1, 0), ShapeCounts(TRIP.fingerprint, 7, 30),
                                                ShapeCounts(FRAUD_CHECKED.fingerprint, 4, 10))),
              VersionCounts("trip", 2, 3, 0, (ShapeCounts("ffffffffffffffff", 3, 0),))]
    registry = DefinitionRegistry([FRAUD_CHECKED])
    assert on_old_path(registry, counts, PATCH) == [OldPath("trip", 1, None, 1),
                                                    OldPath("trip", 1, TRIP.fingerprint, 7)]
    ended = [VersionCounts("trip", 1, 0, 40, (ShapeCounts(TRIP.fingerprint, 0, 40),))]
    assert on_old_path(registry, ended, PATCH) == []
    with pytest.raises(ValueError, match="no deployed definition declares patch 'other' \\(declared: fraud-check\\)"):
        on_old_path(registry, counts, "other")
