"""Saga and step statuses with their explicit legal-transition tables.

``fold`` checks every status change against these tables, so a bug in ``decide`` (or a tampered history)
surfaces as IllegalTransition instead of a saga quietly doing something impossible.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

TIMED_OUT_ERROR = "TimedOut"
"""error_type recorded when a step or compensation is given up after its attempts all timed out."""

EXPIRED_ERROR = "Expired"
"""error_type of a participant's answer to a forward command it picked up after the command's ``expires_at``: it
did not run, and the attempt does not count (the next is sent at once)."""

WITHDRAWN_ERROR = "Withdrawn"
"""error_type of a participant's answer to a withdrawal (WithdrawStep) of a forward command that had not run: it
never will."""


class SagaStatus(StrEnum):
    RUNNING = "RUNNING"
    COMPENSATING = "COMPENSATING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    COMPENSATED = "COMPENSATED"
    COMPENSATION_FAILED = "COMPENSATION_FAILED"
    CANCELLED = "CANCELLED"
    COMPLETED_WITH_FAILURES = "COMPLETED_WITH_FAILURES"
    REJECTED = "REJECTED"  # the saga id's history is only SagaRejected: nothing started (yet)
    PURGED = "PURGED"  # ended, and its events were deleted (retention): SagaPurged stands in for them
    QUARANTINED = "QUARANTINED"  # a message for it failed in a way no retry mends: it waits for an operator
    TERMINATED = "TERMINATED"  # an operator ended it as it stood, without compensating (settled by hand)

    @property
    def is_terminal(self) -> bool:
        """True when nothing moves the saga on by itself (COMPENSATION_FAILED waits for an operator)."""
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES: frozenset[SagaStatus] = frozenset(
    {
        SagaStatus.COMPLETED,
        SagaStatus.FAILED,
        SagaStatus.COMPENSATED,
        SagaStatus.COMPENSATION_FAILED,
        SagaStatus.CANCELLED,
        SagaStatus.COMPLETED_WITH_FAILURES,
        SagaStatus.REJECTED,
        SagaStatus.PURGED,
        SagaStatus.TERMINATED,
    }
)

# None is "no saga yet": the first event moves it to RUNNING (SagaStarted) or REJECTED (SagaRejected); a
# purged history starts with SagaPurged (PURGED).
_PURGE = frozenset({SagaStatus.PURGED})
_QUARANTINE = frozenset({SagaStatus.QUARANTINED})
_STARTED_TRANSITIONS: Mapping[SagaStatus, frozenset[SagaStatus]] = {
    SagaStatus.RUNNING: frozenset(
        {
            SagaStatus.COMPENSATING,
            SagaStatus.COMPLETED,
            SagaStatus.COMPLETED_WITH_FAILURES,
            SagaStatus.FAILED,  # a forward step failed for good after the pivot (a saga decided before
            # withdrawals existed also failed with nothing to undo)
            SagaStatus.COMPENSATED,  # turned back with nothing to undo and nothing in flight: a business outcome
            SagaStatus.CANCELLED,  # cancelled with nothing to undo and nothing in flight
            SagaStatus.TERMINATED,  # an operator's Terminate, here and from the two below
        }
    ),
    SagaStatus.COMPENSATING: frozenset(
        {
            SagaStatus.COMPENSATED,
            SagaStatus.COMPENSATION_FAILED,
            SagaStatus.CANCELLED,
            SagaStatus.FAILED,  # a step took effect after the turn-back and has no undo (before withdrawals
            # existed: in-flight steps resolved and nothing needed undoing after all)
            SagaStatus.TERMINATED,
        }
    ),
    SagaStatus.COMPENSATION_FAILED: frozenset({SagaStatus.COMPENSATING,  # an operator resumed it
                                               SagaStatus.TERMINATED}),
    SagaStatus.COMPLETED: _PURGE,
    # -> COMPENSATING: an operator's ForceCompensate; -> RUNNING: an operator's Redrive (no other event moves a
    # started saga to RUNNING: the fold takes SagaStarted only as a saga's first status); -> TERMINATED: an
    # operator settled it by hand
    SagaStatus.FAILED: _PURGE | {SagaStatus.COMPENSATING, SagaStatus.RUNNING, SagaStatus.TERMINATED},
    SagaStatus.COMPENSATED: _PURGE,
    SagaStatus.CANCELLED: _PURGE,
    SagaStatus.COMPLETED_WITH_FAILURES: _PURGE,
    SagaStatus.TERMINATED: _PURGE,
}
# A started saga may be quarantined from any status (its history or its definition may be what fails), and a
# release puts it back where it stood.
SAGA_TRANSITIONS: Mapping[SagaStatus | None, frozenset[SagaStatus]] = {
    None: frozenset({SagaStatus.RUNNING, SagaStatus.REJECTED, SagaStatus.PURGED}),
    **{status: moves | _QUARANTINE for status, moves in _STARTED_TRANSITIONS.items()},
    # Refusals start nothing: a valid StartSaga may still start a saga id whose messages were all refused.
    SagaStatus.REJECTED: frozenset({SagaStatus.RUNNING, SagaStatus.PURGED}),
    SagaStatus.PURGED: frozenset(),  # for good: a later StartSaga of the id is refused and recorded
    SagaStatus.QUARANTINED: frozenset(_STARTED_TRANSITIONS),
}

# The ends a saga can be purged from (not COMPENSATION_FAILED: it still waits for an operator).
PURGEABLE_STATUSES: frozenset[SagaStatus] = frozenset(
    status for status, moves in SAGA_TRANSITIONS.items() if status is not None and SagaStatus.PURGED in moves
)


def is_transition_valid(current: SagaStatus | None, new: SagaStatus) -> bool:
    """True when a saga may move from ``current`` (None: no saga yet) to ``new``."""
    return new in SAGA_TRANSITIONS[current]


class StepStatus(StrEnum):
    PENDING = "PENDING"  # not dispatched (yet)
    RUNNING = "RUNNING"  # command sent, waiting for the reply to ``attempt``
    AWAITING_SIGNAL = "AWAITING_SIGNAL"  # a step that waits for a signal: waiting, until ``StepState.waiting_until``
    TIMED_OUT = "TIMED_OUT"  # no reply in time: outcome unknown, nothing scheduled yet
    RETRY_SCHEDULED = "RETRY_SCHEDULED"  # waiting for the backoff timer of ``attempt``
    WITHDRAWING = "WITHDRAWING"  # ``attempt`` was withdrawn (the saga turned back): its participant says if it ran
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"  # failed and not retried
    SKIPPED = "SKIPPED"  # never ran (its condition did not hold), or an operator skipped it (StepState.waived)
    COMPENSATING = "COMPENSATING"  # compensation sent, waiting for the reply to ``compensation_attempt``
    COMPENSATION_TIMED_OUT = "COMPENSATION_TIMED_OUT"
    COMPENSATION_RETRY_SCHEDULED = "COMPENSATION_RETRY_SCHEDULED"
    COMPENSATED = "COMPENSATED"
    COMPENSATION_FAILED = "COMPENSATION_FAILED"  # failed and not retried: the saga needs a human


_S = StepStatus

STEP_TRANSITIONS: Mapping[StepStatus, frozenset[StepStatus]] = {
    _S.PENDING: frozenset({_S.RUNNING, _S.SKIPPED, _S.AWAITING_SIGNAL}),
    # AWAITING_SIGNAL -> SUCCEEDED: the signal came (or the wait expired and the step goes on without it); -> FAILED:
    # it expired and the step fails; -> SKIPPED: the saga turned back, or an operator skipped it; -> itself: a
    # release or a resume waits again
    _S.AWAITING_SIGNAL: frozenset({_S.SUCCEEDED, _S.FAILED, _S.SKIPPED, _S.AWAITING_SIGNAL}),
    # RUNNING -> RUNNING: an operator's resume re-sends an unanswered command under the same key
    # RUNNING / TIMED_OUT / RETRY_SCHEDULED -> SKIPPED: an operator's Skip of a skippable step that is stuck
    # RUNNING / TIMED_OUT / RETRY_SCHEDULED -> WITHDRAWING: the saga turned back while the step was in flight
    _S.RUNNING: frozenset({_S.RUNNING, _S.SUCCEEDED, _S.FAILED, _S.TIMED_OUT, _S.SKIPPED, _S.WITHDRAWING}),
    _S.TIMED_OUT: frozenset({_S.RETRY_SCHEDULED, _S.FAILED, _S.SUCCEEDED, _S.RUNNING, _S.SKIPPED, _S.WITHDRAWING}),
    # RETRY_SCHEDULED -> SUCCEEDED: a late success of an earlier attempt (same key, same operation); -> FAILED:
    # such a success whose output cannot be carried on
    _S.RETRY_SCHEDULED: frozenset({_S.RUNNING, _S.SUCCEEDED, _S.FAILED, _S.SKIPPED, _S.WITHDRAWING}),
    # WITHDRAWING -> WITHDRAWING: the withdrawal sent again, unanswered; -> SUCCEEDED / FAILED: its participant's
    # answer (it had run, with that outcome; or it had not, FAILED Withdrawn)
    _S.WITHDRAWING: frozenset({_S.WITHDRAWING, _S.SUCCEEDED, _S.FAILED}),
    # FAILED -> COMPENSATING: a step given up after its attempts timed out may have taken effect; unwinding
    # undoes it (a compensation of something that never happened is a no-op).
    # FAILED -> PENDING: an operator's Redrive of a FAILED saga (no other event moves a step back to PENDING); the
    # step is sent again as its next attempt, under its same key.
    # FAILED -> RUNNING: an attempt answered Expired (never run) is followed at once by the next one.
    _S.FAILED: frozenset({_S.RETRY_SCHEDULED, _S.COMPENSATING, _S.PENDING, _S.RUNNING}),
    _S.SUCCEEDED: frozenset({_S.COMPENSATING}),
    _S.SKIPPED: frozenset(),
    _S.COMPENSATING: frozenset(
        {_S.COMPENSATING, _S.COMPENSATED, _S.COMPENSATION_FAILED, _S.COMPENSATION_TIMED_OUT}
    ),
    _S.COMPENSATION_TIMED_OUT: frozenset(
        {_S.COMPENSATION_RETRY_SCHEDULED, _S.COMPENSATION_FAILED, _S.COMPENSATED, _S.COMPENSATING}
    ),
    # ... -> itself: a retry held while a dependent that succeeded late is undone first, due again
    _S.COMPENSATION_RETRY_SCHEDULED: frozenset({_S.COMPENSATION_RETRY_SCHEDULED, _S.COMPENSATING, _S.COMPENSATED}),
    _S.COMPENSATION_FAILED: frozenset({_S.COMPENSATION_RETRY_SCHEDULED, _S.COMPENSATING, _S.COMPENSATED}),
    _S.COMPENSATED: frozenset(),
}


def is_step_transition_valid(current: StepStatus, new: StepStatus) -> bool:
    """True when a step may move from ``current`` to ``new``."""
    return new in STEP_TRANSITIONS[current]


IN_FLIGHT: frozenset[StepStatus] = frozenset({_S.RUNNING, _S.TIMED_OUT})
"""A forward attempt sent and not answered (a step waiting on a retry after an unknown outcome is in flight too:
``builder.in_flight``)."""

FORWARD_SETTLED: frozenset[StepStatus] = frozenset({_S.SUCCEEDED, _S.FAILED, _S.SKIPPED})
"""Forward outcomes a dependent can be decided on (in a RUNNING saga FAILED is definitive)."""

COMPENSATION_IN_PROGRESS: frozenset[StepStatus] = frozenset(
    {_S.COMPENSATING, _S.COMPENSATION_TIMED_OUT, _S.COMPENSATION_RETRY_SCHEDULED, _S.COMPENSATION_FAILED}
)
"""Statuses of a compensation that was started and has not succeeded yet."""
