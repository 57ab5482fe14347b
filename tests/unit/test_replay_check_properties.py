"""A change ``changes.diff`` calls safe for running sagas leaves every running trip's next decision the same, or
(behind a patch marker) takes the patch where the trip stands; a patched trip never runs the check after its
charge."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.trip_changes import CHECK_BEFORE_CHARGE, FRAUD_CHECKED, NO_CHARGE, STEP_AFTER_CHARGE
from saga_orchestrator.orchestrator.domain.builder import TimerKind
from saga_orchestrator.orchestrator.domain.changes import Verdict, diff, verdict
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry, SagaDefinition, Step
from saga_orchestrator.orchestrator.domain.model import SagaStatus, StepStatus
from saga_orchestrator.orchestrator.domain.replay_check import Outcome, check_history
from saga_orchestrator.orchestrator.domain.state import fold
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas.message_types import CommandKind
from saga_orchestrator.testing.history import SagaRun


def _step_edit(name: str, **changes: object) -> SagaDefinition:
    return dataclasses.replace(TRIP, steps=tuple(
        dataclasses.replace(step, **changes) if step.name == name else step for step in TRIP.steps))  # type: ignore[arg-type]


def _reordered() -> SagaDefinition:
    return dataclasses.replace(TRIP, steps=tuple(reversed(TRIP.steps)))


EDITS: dict[str, Callable[[], SagaDefinition]] = {
    "hotel timeout": lambda: _step_edit("book_hotel", timeout_ms=9_000),
    "charge undo timeout": lambda: _step_edit("charge_card", compensation_timeout_ms=1_000),
    "flight backoff": lambda: _step_edit("book_flight", retry=dataclasses.replace(
        TRIP.step("book_flight").retry, initial_backoff_ms=1_000)),
    "hotel skippable": lambda: _step_edit("book_hotel", skippable=True),
    "declaration order": _reordered,
    "input schema renamed": lambda: dataclasses.replace(TRIP, input_schema="saga.v1.trip.Trip"),
    "not searchable": lambda: dataclasses.replace(TRIP, searchable=()),
    "check before charge": lambda: CHECK_BEFORE_CHARGE,
    "check before charge, behind a marker": lambda: FRAUD_CHECKED,
    "step after charge": lambda: STEP_AFTER_CHARGE,
    "no charge": lambda: NO_CHARGE,
    "hotel on another participant": lambda: _step_edit("book_hotel", participant="lodging"),
    "flight without undo": lambda: dataclasses.replace(TRIP, steps=(
        *(step for step in TRIP.steps if step.name != "book_flight"),
        Step(name="book_flight", participant="flight", command="book_flight"))),
}


def random_trip(data: st.DataObject) -> SagaRun:
    """A trip moved by up to 6 random messages: replies (success, failure, retryable failure) to what is in
    flight, and due timers."""
    run = SagaRun(TRIP, saga_id="random")
    run.start()
    for _ in range(data.draw(st.integers(0, 6), label="moves")):
        if run.saga.is_terminal:
            break
        moves: list[Callable[[], object]] = []
        for step in run.saga.steps.values():
            if step.status is StepStatus.RUNNING:
                moves += [partial(run.ok, step.name), partial(run.fail, step.name),
                          partial(run.fail, step.name, "Unavailable", True)]
            elif step.status is StepStatus.COMPENSATING:
                moves.append(partial(run.comp_ok, step.name))
        for timer in list(run.armed.values()):
            if timer.kind is not TimerKind.SAGA_DEADLINE:
                moves.append(partial(run.fire, timer.kind, timer.step, timer.attempt))
        if not moves:
            break
        data.draw(st.sampled_from(moves), label="move")()
    return run


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edit=st.sampled_from(sorted(EDITS)), data=st.data())
def test_a_safe_change_decides_every_running_trip_the_same(edit: str, data: st.DataObject) -> None:
    candidate = EDITS[edit]()
    run = random_trip(data)
    found = check_history(DefinitionRegistry([TRIP]), DefinitionRegistry([candidate]), run.events)
    if run.saga.is_terminal:
        assert found.outcome is Outcome.SKIPPED
    elif verdict(diff(TRIP, candidate)) is Verdict.SAFE:
        allowed = {Outcome.SAME, Outcome.TAKES_PATCH} if candidate.patches else {Outcome.SAME}
        assert found.outcome in allowed, found.detail
    else:
        assert found.outcome is not Outcome.SKIPPED


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_trip_running_when_the_patch_is_deployed_runs_the_check_before_its_charge_or_not_at_all(
        data: st.DataObject) -> None:
    run = random_trip(data)
    charge_was_sent = run.saga.steps["charge_card"].status is not StepStatus.PENDING
    run.definition = FRAUD_CHECKED  # the deploy: the orchestrator folds the history with the patched trip
    run._state = fold(FRAUD_CHECKED, run.events)
    for _ in range(40):  # every step in flight succeeds, every due timer fires, until the trip ends
        if run.saga.is_terminal:
            break
        flying = [s.name for s in run.saga.steps.values() if s.status is StepStatus.RUNNING]
        undoing = [s.name for s in run.saga.steps.values() if s.status is StepStatus.COMPENSATING]
        if flying:
            run.ok(flying[0])
        elif undoing:
            run.comp_ok(undoing[0])
        elif run.armed:
            timer = min(run.armed.values(), key=lambda t: t.due_at)
            run.fire(timer.kind, timer.step, timer.attempt)
        else:
            break
    sent = [command.step for command in run.sent if command.kind is CommandKind.FORWARD]
    if "fraud_check" in sent and "charge_card" in sent:
        assert sent.index("fraud_check") < sent.index("charge_card"), sent
    if charge_was_sent:
        assert "fraud_check" not in sent, sent
    elif run.saga.status is SagaStatus.COMPLETED:
        assert "fraud_check" in sent, sent
