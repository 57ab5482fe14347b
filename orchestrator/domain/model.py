"""The saga state model: the saga and step statuses with their legal-transition tables, and what a saga's
history says, as frozen dataclasses (built by ``evolve``).

``fold`` checks every status change against the tables, so a bug in ``decide`` (or a tampered history)
surfaces as IllegalTransition instead of a saga quietly doing something impossible.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar

from ...schemas.message_types import Lever

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

UNSETTLED_STATUSES: frozenset[SagaStatus] = frozenset(
    status for status, moves in SAGA_TRANSITIONS.items()
    if status is not None and status is not SagaStatus.REJECTED
    and moves - {SagaStatus.PURGED, SagaStatus.QUARANTINED})
"""Where a decision may still move a saga on (a reply, a timer, a release, a resume, a redrive): RUNNING,
COMPENSATING, FAILED, COMPENSATION_FAILED and QUARANTINED. A deploy must go on deciding these by the shape they
started on. (A REJECTED saga id starts afresh, on the latest version.)"""

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

_Model = TypeVar("_Model", "StepState", "SagaState")

RESUME_COMPENSATION = "ResumeCompensation"
"""OperatorAction.action of an operator resuming a COMPENSATION_FAILED saga."""

RELEASE = "ReleaseSaga"
"""OperatorActionRefused.action of a ReleaseSaga of a saga that is not quarantined (an applied one is
SagaReleased)."""

RECORDED_ONLY: frozenset[str] = frozenset({Lever.DLQ_REPLAY})
"""Levers that change nothing and are recorded (OperatorAction) whatever the saga's status, quarantined, rejected
or purged too: an operator's act that happened elsewhere, kept in the saga's history."""

ANSWER = "Answer"
"""OperatorAction.action of a person's answer to a deferred command (a StepResult with an ``operator``, as
``saga answer`` sends it), recorded just before the outcome it gave; its detail is the step and why."""


@dataclass(frozen=True, kw_only=True)
class StepState:
    """What the history says about one step."""

    name: str
    idempotency_key: str
    compensation_key: str
    status: StepStatus = StepStatus.PENDING
    attempt: int = 0  # latest forward attempt sent or scheduled
    compensation_attempt: int = 0  # latest compensation attempt sent or scheduled
    outcome_unknown: bool = False  # latest attempt timed out: it may still have taken effect
    last_error_type: str | None = None
    last_error_message: str | None = None
    output: bytes | None = None
    waived: bool = False  # SKIPPED by an operator after it was sent: counts as done for its dependents
    attempt_base: int = 0  # attempts spent before the latest Redrive: the retry policy counts the ones after it
    unspent: int = 0  # attempts answered Expired (no worker picked them up in time): the retry policy skips them
    withdrawals: int = 0  # WithdrawStep sent for its latest attempt (the first, and each one sent again)
    landed_late: bool = False  # took effect after the saga turned back and has no undo: a human must act
    waiting_until: int | None = None  # a step waiting for a signal: when its wait ends without it (epoch ms)

    @property
    def spent(self) -> int:
        """The attempts the retry policy counts: those since the latest Redrive that a worker started on."""
        return self.attempt - self.attempt_base - self.unspent


@dataclass(frozen=True, kw_only=True)
class SagaState:
    """What the history says about one saga."""

    saga_id: str
    saga_type: str
    definition_version: int  # 0 for a saga that was rejected before it started
    tenant_id: str | None
    input: bytes
    status: SagaStatus
    steps: Mapping[str, StepState]
    last_seq: int
    started_at: int
    updated_at: int
    pivot_passed: bool = False
    cancel_requested: bool = False
    cancel_reason: str | None = None
    failure_reason: str | None = None  # why the saga unwound or failed
    failed_step: str | None = None  # the forward step whose failure ended or unwound the saga
    compensation_failed_step: str | None = None
    compensation_failure_reason: str | None = None
    traceparent: str | None = None  # from SagaStarted: the trace context every message of the saga carries
    # The shape it runs on: from SagaStarted, then from each PatchTaken (None: started before 0.3).
    definition_fingerprint: str | None = None
    quarantined_from: SagaStatus | None = None  # while QUARANTINED: the status a release puts it back to
    quarantine_reason: str | None = None
    paused: bool = False  # an operator's Pause: nothing is sent and no timer acts until Unpause
    forced_compensation: bool = False  # an operator's ForceCompensate: undoing past the pivot was asked for
    signals: Mapping[str, tuple[str, bytes]] = field(default_factory=dict)  # taken: name -> (signal id, payload)
    signal_ids: frozenset[str] = frozenset()  # every signal id seen, taken or refused: a second one changes nothing

    @property
    def is_terminal(self) -> bool:
        """True when the saga reached a terminal status."""
        return self.status.is_terminal

    @property
    def reason(self) -> str | None:
        """The most relevant human-readable reason for the saga's current status."""
        if self.status is SagaStatus.QUARANTINED:
            return self.quarantine_reason
        if self.status is SagaStatus.COMPENSATION_FAILED:
            return self.compensation_failure_reason
        if self.status is SagaStatus.CANCELLED:
            return self.cancel_reason
        return self.failure_reason

    def step(self, name: str) -> StepState:
        """The state of step ``name``."""
        return self.steps[name]


# Where a saga is stuck, for the read model: the console's *wedged* view and bulk selections by error read this
# from ``saga_summary`` (``current_step``, ``step_failures``, ``last_error``); it is a projection of the state,
# rebuilt with the rest of the summary.
TIMEOUT = "timeout"
"""``last_error`` of a step whose latest attempt timed out (its outcome is unknown)."""

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


def state_bytes(state: SagaState) -> int:
    """An estimate of the memory a folded state takes: its input, outputs and texts, and a fixed overhead for
    the objects around them (a four-step trip state with a tiny input measures about 2 kB, as estimated)."""
    steps = sum(320 + len(step.output or b"") + len(step.last_error_message or "") for step in state.steps.values())
    texts = sum(len(text or "") for text in (state.failure_reason, state.cancel_reason, state.quarantine_reason,
                                             state.compensation_failure_reason))
    return 700 + len(state.input) + steps + texts


_FIELDS = {cls: frozenset(f.name for f in fields(cls)) for cls in (StepState, SagaState)}


def evolved(model: _Model, **changes: Any) -> _Model:
    """``dataclasses.replace`` for the two state models, without re-running ``__init__``.

    The fold replaces a state a few times per event, and ``replace`` (field introspection plus a frozen
    ``__init__`` that sets every field through ``object.__setattr__``) was the orchestrator's largest single
    cost. The models have no ``__post_init__`` or derived fields, so copying the attribute dict is the
    same thing. Unknown field names are refused, as ``replace`` refuses them.
    """
    unknown = changes.keys() - _FIELDS[type(model)]
    if unknown:
        raise TypeError(f"{type(model).__name__} has no field(s) {sorted(unknown)}")
    copy = object.__new__(type(model))
    attributes = vars(copy)
    attributes.update(vars(model))
    attributes.update(changes)
    return copy
