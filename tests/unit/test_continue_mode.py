"""CONTINUE mode: independent steps keep running, dependents are skipped, ON_FAILURE / ALWAYS conditions,
and compensate_on_continue. Plus exact backoff due times through ``decide``."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from saga_orchestrator.orchestrator.domain.builder import TimerKind
from saga_orchestrator.orchestrator.domain.definition import Condition, FailureMode, RetryPolicy, SagaDefinition, Step
from saga_orchestrator.orchestrator.domain.state import SagaStatus, StepStatus
from saga_orchestrator.schemas.event_types import SagaCompletedWithFailures, StepRetryScheduled, StepSkipped
from saga_orchestrator.testing.history import Action, SagaRun, command_names, event_names


def _step(name: str, *deps: str, compensation: bool = True, run_if: Condition = Condition.ON_SUCCESS) -> Step:
    return Step(
        name=name,
        participant="batch",
        command=f"do_{name}",
        compensation=f"undo_{name}" if compensation else None,
        depends_on=deps,
        run_if=run_if,
    )


# a -> b -> alert (ON_FAILURE);  c;  report (ALWAYS) after b and c
BATCH = SagaDefinition(
    saga_type="batch",
    version=1,
    input_schema="saga.v1.batch.Batch",
    failure_mode=FailureMode.CONTINUE,
    steps=(
        _step("a"),
        _step("b", "a"),
        _step("c"),
        _step("alert", "b", compensation=False, run_if=Condition.ON_FAILURE),
        _step("report", "b", "c", compensation=False, run_if=Condition.ALWAYS),
    ),
)
BATCH_UNDO = replace(BATCH, saga_type="batch_undo", compensate_on_continue=True)


@dataclass(frozen=True)
class Case:
    id: str
    definition: SagaDefinition
    given: list[Action]
    when: Action
    events: list[str]
    commands: list[str]
    status: SagaStatus


def start() -> Action:
    return lambda r: r.start()


def ok(step: str) -> Action:
    return lambda r: r.ok(step)


def fail(step: str) -> Action:
    return lambda r: r.fail(step, "Broken")


def comp_ok(step: str) -> Action:
    return lambda r: r.comp_ok(step)


A_FAILED = [start(), fail("a")]
CASES = [
    Case("start: independent roots", BATCH, [], start(),
         ["SagaStarted", "StepCommandSent a 1", "StepCommandSent c 1"],
         ["batch.do_a FORWARD 1", "batch.do_c FORWARD 1"], SagaStatus.RUNNING),
    Case("failure skips dependents, runs the failure handler", BATCH, [start()], fail("a"),
         ["StepFailed a 1", "StepSkipped b", "StepCommandSent alert 1"], ["batch.do_alert FORWARD 1"],
         SagaStatus.RUNNING),
    Case("independent branch keeps going; ALWAYS step runs", BATCH, A_FAILED, ok("c"),
         ["StepSucceeded c 1", "StepCommandSent report 1"], ["batch.do_report FORWARD 1"],
         SagaStatus.RUNNING),
    Case("last step: completed with failures", BATCH, [*A_FAILED, ok("c"), ok("alert")], ok("report"),
         ["StepSucceeded report 1", "SagaCompletedWithFailures"], [], SagaStatus.COMPLETED_WITH_FAILURES),
    Case("success path skips the ON_FAILURE step", BATCH, [start(), ok("a"), ok("c")], ok("b"),
         ["StepSucceeded b 1", "StepSkipped alert", "StepCommandSent report 1"],
         ["batch.do_report FORWARD 1"], SagaStatus.RUNNING),
    Case("success path completes", BATCH, [start(), ok("a"), ok("c"), ok("b")], ok("report"),
         ["StepSucceeded report 1", "SagaCompleted"], [], SagaStatus.COMPLETED),
    Case("compensate_on_continue: undo what completed at the end", BATCH_UNDO,
         [*A_FAILED, ok("c"), ok("alert")], ok("report"),
         ["StepSucceeded report 1", "SagaCompensationStarted", "CompensationSent c 1"],
         ["batch.undo_c COMPENSATE 1"], SagaStatus.COMPENSATING),
    Case("compensate_on_continue: then compensated", BATCH_UNDO,
         [*A_FAILED, ok("c"), ok("alert"), ok("report")], comp_ok("c"),
         ["StepCompensated c 1", "SagaCompensated"], [], SagaStatus.COMPENSATED),
    Case("compensate_on_continue with nothing to undo: turned back, compensated", BATCH_UNDO,
         [*A_FAILED, fail("c"), ok("alert")], ok("report"),
         ["StepSucceeded report 1", "SagaCompensated"], [], SagaStatus.COMPENSATED),
    Case("cancel in continue mode: a waits for its in-flight dependent b, withdrawn", BATCH,
         [start(), ok("a"), ok("c")], lambda r: r.cancel(),
         ["SagaCancelRequested", "SagaCompensationStarted", "StepWithdrawn b 1", "CompensationSent c 1"],
         ["batch.do_b WITHDRAW 1", "batch.undo_c COMPENSATE 1"], SagaStatus.COMPENSATING),
    Case("in-flight dependent fails: a is undone next", BATCH,
         [start(), ok("a"), ok("c"), lambda r: r.cancel(), comp_ok("c")], fail("b"),
         ["StepFailed b 1", "CompensationSent a 1"], ["batch.undo_a COMPENSATE 1"], SagaStatus.COMPENSATING),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_transition(case: Case) -> None:
    run = SagaRun(case.definition)
    for action in case.given:
        action(run)
    decision = case.when(run)
    assert event_names(decision) == case.events
    assert command_names(decision) == case.commands
    assert run.saga.status is case.status


def test_skip_reasons_and_failed_steps_are_recorded() -> None:
    run = SagaRun(BATCH)
    run.start()
    skipped = run.fail("a").events[1]
    assert isinstance(skipped, StepSkipped) and skipped.reason == "dependency a failed"
    run.ok("c")
    run.ok("alert")
    end = run.ok("report").events[-1]
    assert isinstance(end, SagaCompletedWithFailures) and end.failed_steps == ("a",)
    steps = run.saga.steps
    assert [steps[n].status for n in BATCH.order] == [
        StepStatus.FAILED,
        StepStatus.SUCCEEDED,
        StepStatus.SKIPPED,
        StepStatus.SUCCEEDED,
        StepStatus.SUCCEEDED,
    ]


def test_skipping_cascades_through_skipped_dependencies() -> None:
    chain = SagaDefinition(
        saga_type="chain", version=1, input_schema="x", failure_mode=FailureMode.CONTINUE,
        steps=(_step("a"), _step("b", "a"), _step("c", "b"), _step("h", "c", run_if=Condition.ON_FAILURE)),
    )
    run = SagaRun(chain)
    run.start()
    expected = ["StepFailed a 1", "StepSkipped b", "StepSkipped c", "StepCommandSent h 1"]
    assert event_names(run.fail("a")) == expected


def test_retry_due_times_follow_the_policy() -> None:
    exact = Step(
        name="only", participant="p", command="go",
        retry=RetryPolicy(
            max_attempts=6, initial_backoff_ms=100, multiplier=3.0, max_backoff_ms=2000, jitter=0
        ),
    )
    run = SagaRun(SagaDefinition(saga_type="exact", version=1, steps=(exact,), input_schema="x"))
    run.start()
    delays = []
    for _ in range(5):
        failed_at = run.now
        scheduled = run.fail("only", "Busy", retryable=True).events[-1]
        assert isinstance(scheduled, StepRetryScheduled)
        delays.append(scheduled.due_at - failed_at)
        run.fire(TimerKind.STEP_RETRY, "only")
    assert delays == [100, 300, 900, 2000, 2000]
    assert event_names(run.fail("only", "Busy", retryable=True)) == ["StepFailed only 6", "SagaCompensated"]
