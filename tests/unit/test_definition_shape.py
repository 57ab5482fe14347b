"""A definition's shape and its fingerprint: what a running saga's path depends on, hashed the same way in every
process, changed by every change of shape and by no change of policy."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from saga_orchestrator.orchestrator.domain.definition import (
    Condition,
    DefinitionRegistry,
    Expiry,
    FailureMode,
    RetryPolicy,
    SagaDefinition,
    Step,
)
from saga_orchestrator.orchestrator.domain.errors import ShapeChanged
from saga_orchestrator.orchestrator.domain.state import fold
from saga_orchestrator.orchestrator.inbound import Envelope
from saga_orchestrator.orchestrator.service import Outcome, SagaService
from saga_orchestrator.orchestrator.store.memory import MemoryStore
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import Event
from saga_orchestrator.schemas.ids import forward_key
from saga_orchestrator.schemas.message_types import CommandKind, ResultStatus, StartSaga, StepResult
from saga_orchestrator.schemas.topics import Topics

TRIP_FINGERPRINT = "22d3cb3b43477877"
"""The reference trip's fingerprint: a change of this value is a change of every running trip's recorded shape."""


def _steps(definition: SagaDefinition, name: str, **changes: Any) -> SagaDefinition:
    steps = tuple(dataclasses.replace(step, **changes) if step.name == name else step for step in definition.steps)
    return dataclasses.replace(definition, steps=steps)


def _added_before_charge(definition: SagaDefinition) -> SagaDefinition:
    check = Step(name="fraud_check", participant="payment", command="check",
                 depends_on=("book_flight", "book_hotel"))
    steps = tuple(dataclasses.replace(step, depends_on=("fraud_check",)) if step.name == "charge_card" else step
                  for step in definition.steps)
    return dataclasses.replace(definition, steps=(*steps, check))


def test_the_trips_fingerprint_is_a_golden_value() -> None:
    assert TRIP.fingerprint == TRIP_FINGERPRINT


@pytest.mark.parametrize("seed", ["0", "1", "random"])
def test_the_fingerprint_is_the_same_in_another_process(seed: str) -> None:
    code = "from saga_orchestrator.participants.trip.definition import TRIP; print(TRIP.fingerprint)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": seed})
    assert out.stdout.strip() == TRIP_FINGERPRINT


SHAPE_CHANGES: dict[str, Callable[[SagaDefinition], SagaDefinition]] = {
    "a step added before the pivot": _added_before_charge,
    "a step's participant": lambda d: _steps(d, "book_hotel", participant="hotels"),
    "a step's command": lambda d: _steps(d, "book_hotel", command="reserve_hotel"),
    "a step's undo": lambda d: _steps(d, "book_hotel", compensation="release_hotel"),
    "an undo removed": lambda d: _steps(d, "book_hotel", compensation=None),
    "a dependency": lambda d: _steps(d, "book_hotel", depends_on=("book_flight",)),
    "the failure mode": lambda d: dataclasses.replace(d, failure_mode=FailureMode.CONTINUE),
    "a condition": lambda d: dataclasses.replace(_steps(d, "send_itinerary", run_if=Condition.ALWAYS)),
    "a deadline added": lambda d: dataclasses.replace(d, deadline_ms=60_000),
    "a signal declared": lambda d: dataclasses.replace(d, signals=(("approval", "saga.v1.trip.Approval"),)),
}


@pytest.mark.parametrize("change", sorted(SHAPE_CHANGES))
def test_every_change_of_shape_changes_the_fingerprint(change: str) -> None:
    changed = SHAPE_CHANGES[change](TRIP)
    assert changed.fingerprint != TRIP.fingerprint and changed.shape() != TRIP.shape()


POLICY_CHANGES: dict[str, Callable[[SagaDefinition], SagaDefinition]] = {
    "a retry policy": lambda d: _steps(d, "book_hotel", retry=RetryPolicy(max_attempts=9)),
    "a timeout": lambda d: _steps(d, "book_hotel", timeout_ms=1, compensation_timeout_ms=2),
    "skippable": lambda d: _steps(d, "book_hotel", skippable=True),
    "searchable fields": lambda d: dataclasses.replace(d, searchable=("customer_id",)),
    "the declaration order": lambda d: dataclasses.replace(d, steps=tuple(reversed(d.steps))),
    "the version": lambda d: dataclasses.replace(d, version=d.version + 1),
}


@pytest.mark.parametrize("change", sorted(POLICY_CHANGES))
def test_a_change_of_policy_keeps_the_fingerprint(change: str) -> None:
    assert POLICY_CHANGES[change](TRIP).fingerprint == TRIP.fingerprint


def test_a_waits_expiry_is_part_of_its_shape() -> None:
    def approval(on_expiry: Expiry) -> SagaDefinition:
        return SagaDefinition(saga_type="loan", version=1, input_schema="saga.v1.loan.Request",
                              signals=(("approval", "saga.v1.loan.Approval"),),
                              steps=(Step(name="score", participant="risk", command="score"),
                                     Step(name="approve", participant="", command="", signal="approval",
                                          on_expiry=on_expiry, depends_on=("score",))))
    assert approval(Expiry.GO_ON).fingerprint != approval(Expiry.FAIL).fingerprint


def _service(store: MemoryStore, definition: SagaDefinition) -> SagaService:
    return SagaService(store, DefinitionRegistry([definition]), Topics(), lambda: 1_700_000_000_000)


def _flight_booked(saga_id: str) -> Envelope:
    reply = StepResult(saga_id=saga_id, step="book_flight", kind=CommandKind.FORWARD,
                       idempotency_key=forward_key(saga_id, "book_flight"), attempt=1, status=ResultStatus.SUCCEEDED)
    return Envelope(message=reply, message_id=f"reply-{saga_id}")


async def test_a_saga_is_decided_only_by_the_shape_it_started_on() -> None:
    store = MemoryStore()
    started = _service(store, TRIP)
    start = StartSaga(saga_id="s-1", saga_type="trip", tenant_id=None, input=b"")
    assert await started.handle(Envelope(message=start, message_id="start-s-1", start_input={})) is Outcome.APPLIED
    assert store.summaries["s-1"].definition_fingerprint == TRIP.fingerprint
    assert store.summaries["s-1"].definition_version == 1
    # v1 edited in place (a check before the charge) and deployed: the running saga does not take the new path.
    edited = _service(store, _added_before_charge(TRIP))
    # Its history does not fold with the edited v1: the saga is quarantined, the reply kept for after a release.
    assert await edited.handle(_flight_booked("s-1")) is Outcome.DEAD_LETTERED
    summary = store.summaries["s-1"]
    assert summary.status == "QUARANTINED"
    assert summary.reason is not None and "ShapeChanged" in summary.reason and TRIP.fingerprint in summary.reason
    with pytest.raises(ShapeChanged, match=r"started on 'trip' v1 of shape 22d3cb3b43477877"):
        fold(_added_before_charge(TRIP), started_events(store, "s-1")[:1])


async def test_a_change_of_policy_leaves_running_sagas_on_their_way() -> None:
    store = MemoryStore()
    start = StartSaga(saga_id="s-2", saga_type="trip", tenant_id=None, input=b"")
    assert await _service(store, TRIP).handle(Envelope(message=start, message_id="start-s-2", start_input={})) \
        is Outcome.APPLIED
    patient = _service(store, POLICY_CHANGES["a retry policy"](TRIP))
    assert await patient.handle(_flight_booked("s-2")) is Outcome.APPLIED
    assert store.summaries["s-2"].status == "RUNNING"


def started_events(store: MemoryStore, saga_id: str) -> list[Event]:
    return [wire.decode_event(stored.body) for stored in store.events[saga_id]]
