"""Where a saga is stuck (the read model's current_step, step_failures, last_error), from its state alone."""

from __future__ import annotations

import pytest

from saga_orchestrator.orchestrator.domain.model import (
    TIMEOUT,
    SagaState,
    SagaStatus,
    StepState,
    StepStatus,
    StepTrouble,
    trouble,
)

S = StepStatus


def step(name: str, status: StepStatus, attempt: int = 1, compensation_attempt: int = 0, *,
         error: str | None = None, unknown: bool = False) -> StepState:
    return StepState(name=name, idempotency_key=f"k-{name}", compensation_key=f"c-{name}", status=status,
                     attempt=attempt, compensation_attempt=compensation_attempt, outcome_unknown=unknown,
                     last_error_type=error)


def saga(*steps: StepState) -> SagaState:
    return SagaState(saga_id="s-1", saga_type="trip", definition_version=1, tenant_id=None, input=b"",
                     status=SagaStatus.RUNNING, steps={s.name: s for s in steps}, last_seq=1, started_at=0,
                     updated_at=0)


@pytest.mark.parametrize(("steps", "expected"), [
    # nothing in flight
    ((step("a", S.SUCCEEDED), step("b", S.PENDING, 0)), None),
    # a first attempt in flight: the step it waits on, no failure yet
    ((step("a", S.SUCCEEDED), step("b", S.RUNNING)), StepTrouble("b", 0, None)),
    # the third attempt sent after two failures of one error
    ((step("a", S.RUNNING, 3, error="CardDeclined"),), StepTrouble("a", 2, "CardDeclined")),
    # waiting on the backoff of attempt 4 after a timeout
    ((step("a", S.RETRY_SCHEDULED, 4, error="Old", unknown=True),), StepTrouble("a", 3, TIMEOUT)),
    # the latest attempt timed out: it counts
    ((step("a", S.TIMED_OUT, 2, unknown=True),), StepTrouble("a", 2, TIMEOUT)),
    # failed for good on its first attempt
    ((step("a", S.FAILED, 1, error="OutOfStock"),), StepTrouble("a", 1, "OutOfStock")),
    # the step that failed most wins over one in flight
    ((step("a", S.RUNNING, 1), step("b", S.RUNNING, 5, error="Busy")), StepTrouble("b", 4, "Busy")),
    # among equals, the first in the definition's order
    ((step("a", S.RUNNING, 2, error="X"), step("b", S.RUNNING, 2, error="Y")), StepTrouble("a", 1, "X")),
    # a compensation counts its own attempts, not the forward ones
    ((step("a", S.COMPENSATION_RETRY_SCHEDULED, 3, 6, error="LedgerDown"),), StepTrouble("a", 5, "LedgerDown")),
    ((step("a", S.COMPENSATION_TIMED_OUT, 1, 2),), StepTrouble("a", 2, TIMEOUT)),
    ((step("a", S.COMPENSATION_FAILED, 1, 1, error="Refused"),), StepTrouble("a", 1, "Refused")),
    # done ones never count, however many attempts they took
    ((step("a", S.SUCCEEDED, 9, error="Busy"), step("b", S.COMPENSATED, 1, 7)), None),
])
def test_the_step_a_saga_is_stuck_on(steps: tuple[StepState, ...], expected: StepTrouble | None) -> None:
    assert trouble(saga(*steps)) == expected
