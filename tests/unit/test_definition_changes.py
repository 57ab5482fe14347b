"""What a change to the trip's definition means for trips already running: one case per kind of change, each
with the verdict it gets, the same changes of shape from two stored shapes alone, and the fingerprint agreeing
with the verdicts (a SAFE-only diff keeps it, any other changes it)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from saga_orchestrator.orchestrator.domain.changes import Change, Verdict, diff, diff_shapes, verdict
from saga_orchestrator.orchestrator.domain.definition import (
    Condition,
    Expiry,
    FailureMode,
    RetryPolicy,
    SagaDefinition,
    Step,
)
from saga_orchestrator.orchestrator.domain.errors import DefinitionError
from saga_orchestrator.participants.trip.definition import TRIP

SAFE, PATCH, VERSION = Verdict.SAFE, Verdict.PATCH, Verdict.VERSION
FOREVER = RetryPolicy(max_attempts=None)  # what a step after the pivot must have
CONTINUING = dataclasses.replace(TRIP, failure_mode=FailureMode.CONTINUE)
WITH_DEADLINE = dataclasses.replace(TRIP, deadline_ms=60_000)
WITH_SIGNAL = dataclasses.replace(TRIP, signals=(("approval", "saga.v1.trip.Approval"),))


def _steps(definition: SagaDefinition, name: str, **changes: Any) -> SagaDefinition:
    steps = tuple(dataclasses.replace(step, **changes) if step.name == name else step for step in definition.steps)
    return dataclasses.replace(definition, steps=steps)


def _with(definition: SagaDefinition, *added: Step, drop: str = "", signals: tuple[tuple[str, str], ...] | None = None,
          **depends_on: tuple[str, ...]) -> SagaDefinition:
    """``definition`` with steps added, one dropped, the dependencies of some replaced and, given, other signals;
    built in one go, as only the result needs to be a valid definition."""
    steps = tuple(dataclasses.replace(step, depends_on=depends_on[step.name]) if step.name in depends_on else step
                  for step in definition.steps if step.name != drop)
    return dataclasses.replace(definition, steps=(*steps, *added),
                               signals=definition.signals if signals is None else signals)


def _approval(on_expiry: Expiry = Expiry.FAIL, signal: str = "approval") -> SagaDefinition:
    """The trip waiting for an approval before the charge."""
    signals = (("approval", "saga.v1.trip.Approval"), ("second_approval", "saga.v1.trip.Approval"))
    wait = Step(name="approve", participant="", command="", signal=signal, on_expiry=on_expiry,
                depends_on=("book_flight",))
    return _with(TRIP, wait, signals=signals, charge_card=("approve", "book_hotel"))


FRAUD_CHECK = Step(name="fraud_check", participant="payment", command="check", depends_on=("book_flight", "book_hotel"))
RECEIPT = Step(name="print_receipt", participant="notification", command="print", depends_on=("charge_card",),
               retry=FOREVER)
SURVEY = Step(name="survey", participant="notification", command="survey", depends_on=("send_itinerary",),
              retry=FOREVER)
CAR = Step(name="book_car", participant="car", command="book_car", compensation="cancel_car")
SUPPORT = Step(name="notify_support", participant="notification", command="alert", depends_on=("send_itinerary",),
               run_if=Condition.ON_FAILURE, retry=FOREVER)
NO_PIVOT = _steps(TRIP, "charge_card", pivot=False)

Case = Callable[[], tuple[SagaDefinition, SagaDefinition]]
CASES: dict[str, tuple[Case, list[tuple[str | None, Verdict]]]] = {
    # policy
    "a retry policy": (lambda: (TRIP, _steps(TRIP, "book_hotel", retry=RetryPolicy(max_attempts=9))),
                       [("book_hotel", SAFE)]),
    "an undo's retry policy": (lambda: (TRIP, _steps(TRIP, "book_hotel", compensation_retry=FOREVER)),
                               [("book_hotel", SAFE)]),
    "a timeout": (lambda: (TRIP, _steps(TRIP, "book_hotel", timeout_ms=1)), [("book_hotel", SAFE)]),
    "an undo's timeout": (lambda: (TRIP, _steps(TRIP, "book_hotel", compensation_timeout_ms=1)),
                          [("book_hotel", SAFE)]),
    "skippable": (lambda: (TRIP, _steps(TRIP, "book_hotel", skippable=True)), [("book_hotel", SAFE)]),
    "the deadline's length": (lambda: (WITH_DEADLINE, dataclasses.replace(WITH_DEADLINE, deadline_ms=30_000)),
                              [(None, SAFE)]),
    "searchable fields": (lambda: (TRIP, dataclasses.replace(TRIP, searchable=("customer_id",))), [(None, SAFE)]),
    "the input schema's name": (lambda: (TRIP, dataclasses.replace(TRIP, input_schema="saga.v2.trip.TripRequest")),
                                [(None, SAFE)]),
    "the declaration order": (lambda: (TRIP, dataclasses.replace(TRIP, steps=tuple(reversed(TRIP.steps)))),
                              [(None, SAFE)]),
    "the version alone": (lambda: (TRIP, dataclasses.replace(TRIP, version=TRIP.version + 1)), []),
    # a patch marker
    "a step added before the pivot": (lambda: (TRIP, _with(TRIP, FRAUD_CHECK, charge_card=("fraud_check",))),
                                      [("charge_card", PATCH), ("fraud_check", PATCH)]),
    "a root step added before the pivot": (
        lambda: (TRIP, _with(TRIP, CAR, charge_card=("book_car", "book_flight", "book_hotel"))),
        [("book_car", PATCH), ("charge_card", PATCH)]),
    "a step added after the pivot": (lambda: (TRIP, _with(TRIP, RECEIPT, send_itinerary=("print_receipt",))),
                                     [("print_receipt", PATCH), ("send_itinerary", PATCH)]),
    "a step added after everything": (lambda: (TRIP, _with(TRIP, SURVEY)), [("survey", PATCH)]),
    "a new branch": (lambda: (CONTINUING, _with(CONTINUING, SUPPORT)), [("notify_support", PATCH)]),
    "a signal declared": (lambda: (TRIP, WITH_SIGNAL), [(None, PATCH)]),
    # a new version
    "a step removed": (lambda: (TRIP, _with(TRIP, drop="send_itinerary")), [("send_itinerary", VERSION)]),
    "a step removed before the pivot": (lambda: (TRIP, _with(TRIP, drop="book_hotel", charge_card=("book_flight",))),
                                        [("book_hotel", VERSION), ("charge_card", VERSION)]),
    "a step renamed": (
        lambda: (TRIP, _with(TRIP, dataclasses.replace(TRIP.step("book_hotel"), name="reserve_hotel"),
                             drop="book_hotel", charge_card=("book_flight", "reserve_hotel"))),
        [("book_hotel", VERSION), ("charge_card", VERSION)]),
    "a participant": (lambda: (TRIP, _steps(TRIP, "book_hotel", participant="hotels")), [("book_hotel", VERSION)]),
    "a command": (lambda: (TRIP, _steps(TRIP, "book_hotel", command="reserve_hotel")), [("book_hotel", VERSION)]),
    "an undo": (lambda: (TRIP, _steps(TRIP, "book_hotel", compensation="release_hotel")), [("book_hotel", VERSION)]),
    "an undo removed": (lambda: (TRIP, _steps(TRIP, "book_hotel", compensation=None)), [("book_hotel", VERSION)]),
    "an undo added": (lambda: (TRIP, _steps(TRIP, "send_itinerary", compensation="retract")),
                      [("send_itinerary", VERSION)]),
    "a dependency on an existing step": (lambda: (TRIP, _steps(TRIP, "book_hotel", depends_on=("book_flight",))),
                                         [("book_hotel", VERSION)]),
    "a redundant dependency": (lambda: (TRIP, _steps(TRIP, "send_itinerary", depends_on=("charge_card", "book_hotel"))),
                               [("send_itinerary", VERSION)]),
    "a step inserted that drops a dependency": (
        lambda: (NO_PIVOT, _with(NO_PIVOT, dataclasses.replace(FRAUD_CHECK, depends_on=("book_flight",)),
                                 charge_card=("fraud_check",))),
        [("charge_card", VERSION), ("fraud_check", PATCH)]),
    "the pivot moved": (lambda: (TRIP, _steps(NO_PIVOT, "send_itinerary", pivot=True)), [(None, VERSION)]),
    "the pivot removed": (lambda: (TRIP, NO_PIVOT), [(None, VERSION)]),
    "the pivot added": (lambda: (NO_PIVOT, TRIP), [(None, VERSION)]),
    "a pivot step added": (lambda: (NO_PIVOT, _with(NO_PIVOT, dataclasses.replace(SURVEY, pivot=True))),
                           [(None, VERSION), ("survey", PATCH)]),
    "a condition": (lambda: (TRIP, _steps(TRIP, "send_itinerary", run_if=Condition.ALWAYS)),
                    [("send_itinerary", VERSION)]),
    "the failure mode": (lambda: (TRIP, CONTINUING), [(None, VERSION)]),
    "compensate_on_continue": (lambda: (CONTINUING, dataclasses.replace(CONTINUING, compensate_on_continue=True)),
                               [(None, VERSION)]),
    "a deadline added": (lambda: (TRIP, WITH_DEADLINE), [(None, VERSION)]),
    "a deadline removed": (lambda: (WITH_DEADLINE, TRIP), [(None, VERSION)]),
    "a signal removed": (lambda: (WITH_SIGNAL, TRIP), [(None, VERSION)]),
    "a signal's record": (
        lambda: (WITH_SIGNAL, dataclasses.replace(TRIP, signals=(("approval", "saga.v2.trip.Approval"),))),
        [(None, VERSION)]),
    "a wait's expiry": (lambda: (_approval(Expiry.FAIL), _approval(Expiry.GO_ON)), [("approve", VERSION)]),
    "a wait's signal": (lambda: (_approval(), _approval(signal="second_approval")), [("approve", VERSION)]),
    # several at once: saga-level first, then by step name
    "several": (lambda: (TRIP, _steps(dataclasses.replace(CONTINUING, searchable=()), "book_flight", timeout_ms=9,
                                      command="reserve_flight")),
                [(None, VERSION), (None, SAFE), ("book_flight", VERSION), ("book_flight", SAFE)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_change_gets_its_verdict(case: str) -> None:
    make, expected = CASES[case]
    old, new = make()
    assert [(change.step, change.verdict) for change in diff(old, new)] == expected


def test_the_lines_name_the_steps() -> None:
    inserted = _with(TRIP, FRAUD_CHECK, charge_card=("fraud_check",))
    assert [change.what for change in diff(TRIP, inserted)] == [
        "step 'charge_card' now depends on fraud_check (was book_flight, book_hotel)",
        "step 'fraud_check' added before pivot 'charge_card' (depends on book_flight, book_hotel)",
    ]
    assert [change.what for change in diff(TRIP, _with(TRIP, SURVEY))] == [
        "step 'survey' added after pivot 'charge_card' (depends on send_itinerary)"]
    assert [change.what for change in diff(CONTINUING, _with(CONTINUING, SUPPORT))] == [
        "step 'notify_support' added after pivot 'charge_card', a branch that runs ON_FAILURE "
        "(depends on send_itinerary)"]
    retried = _steps(TRIP, "book_hotel", retry=dataclasses.replace(TRIP.step("book_hotel").retry, max_attempts=9))
    assert [change.what for change in diff(TRIP, retried)] == [
        "retry policy of step 'book_hotel' changed (max_attempts 3 -> 9)"]
    renamed = CASES["a step renamed"][0]()
    assert diff(*renamed)[0].what == "step 'book_hotel' renamed to 'reserve_hotel'"
    assert [change.what for change in diff(TRIP, _steps(NO_PIVOT, "send_itinerary", pivot=True))] == [
        "pivot moved from 'charge_card' to 'send_itinerary'"]


@pytest.mark.parametrize("case", list(CASES))
def test_stored_shapes_alone_give_the_same_changes_of_shape(case: str) -> None:
    old, new = CASES[case][0]()
    stored_old, stored_new = (json.loads(json.dumps(definition.shape())) for definition in (old, new))
    assert diff_shapes(stored_old, stored_new) == [change for change in diff(old, new) if change.verdict is not SAFE]


@pytest.mark.parametrize("case", list(CASES))
def test_the_fingerprint_changes_exactly_when_the_verdict_is_more_than_safe(case: str) -> None:
    old, new = CASES[case][0]()
    assert (verdict(diff(old, new)) is SAFE) == (old.fingerprint == new.fingerprint)


def test_equal_definitions_differ_in_nothing() -> None:
    assert diff(TRIP, TRIP) == [] and diff_shapes(TRIP.shape(), TRIP.shape()) == []
    assert verdict([]) is SAFE


def test_the_verdict_is_the_worst_change() -> None:
    safe, patch, version = (Change(None, "x", v) for v in (SAFE, PATCH, VERSION))
    assert verdict([safe, safe]) is SAFE
    assert verdict([safe, patch, safe]) is PATCH
    assert verdict([patch, version, safe]) is VERSION and verdict([version, patch]) is VERSION


def test_a_shape_key_it_does_not_know_needs_a_new_version() -> None:
    old, new = TRIP.shape(), TRIP.shape()
    new["steps"]["book_hotel"]["region"] = "eu"
    new["priority"] = 2
    assert [(c.step, c.verdict) for c in diff_shapes(old, new)] == [(None, VERSION), ("book_hotel", VERSION)]


def test_two_saga_types_are_not_compared() -> None:
    with pytest.raises(DefinitionError, match="cannot compare"):
        diff(TRIP, dataclasses.replace(TRIP, saga_type="cruise"))
