"""Where a saga is stuck, for the read model: the unfinished step that failed or timed out most often.

The console's *wedged* view and bulk selections by error read this from ``saga_summary`` (``current_step``,
``step_failures``, ``last_error``); it is a projection of the state, rebuilt with the rest of the summary.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import SagaState, StepState
from .status import StepStatus

TIMEOUT = "timeout"
"""``last_error`` of a step whose latest attempt timed out (its outcome is unknown)."""

_S = StepStatus
# Status → (is it the forward action's or the compensation's attempts, does the latest attempt count as failed).
_UNFINISHED: dict[StepStatus, tuple[bool, bool]] = {
    _S.RUNNING: (False, False), _S.RETRY_SCHEDULED: (False, False), _S.TIMED_OUT: (False, True),
    _S.FAILED: (False, True), _S.COMPENSATING: (True, False), _S.COMPENSATION_RETRY_SCHEDULED: (True, False),
    _S.COMPENSATION_TIMED_OUT: (True, True), _S.COMPENSATION_FAILED: (True, True),
}


@dataclass(frozen=True)
class StepTrouble:
    """The step a saga waits on and how often it has failed or timed out so far (in its current direction)."""

    step: str
    failures: int
    error: str | None  # the latest failure's error type, TIMEOUT, or None before any failure


def trouble(state: SagaState) -> StepTrouble | None:
    """The unfinished (or failed-for-good) step with the most failed or timed-out attempts, the earliest in the
    definition's order among equals; None when no step is in flight or failed. A RUNNING attempt ``n`` or one
    scheduled as ``n`` follows ``n - 1`` failures; a TIMED_OUT or FAILED attempt ``n`` is the ``n``-th."""
    worst: StepTrouble | None = None
    for step in state.steps.values():
        found = _of(step)
        if found is not None and (worst is None or found.failures > worst.failures):
            worst = found
    return worst


def _of(step: StepState) -> StepTrouble | None:
    kind = _UNFINISHED.get(step.status)
    if kind is None:
        return None
    undoing, latest_failed = kind
    attempt = step.compensation_attempt if undoing else step.attempt
    failures = max(attempt - (0 if latest_failed else 1), 0)
    error = TIMEOUT if step.outcome_unknown or step.status in (_S.TIMED_OUT, _S.COMPENSATION_TIMED_OUT) \
        else step.last_error_type
    return StepTrouble(step.name, failures, error if failures else None)
