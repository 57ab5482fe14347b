"""Replies and timers: how a participant's answer, or its absence, changes a saga.

Part of ``decide``; every function here records facts on the builder and lets ``advance`` move on.
"""

from __future__ import annotations

from ...schemas import event_types as ev
from ...schemas.ids import compensation_key, forward_key
from ...schemas.limits import OUTPUT_REFUSED
from ...schemas.message_types import CommandKind, ResultStatus, StepResult
from .builder import (
    DecisionBuilder,
    TimerKind,
    expire_wait,
    live_timer_ids,
    output_problem,
    schedule_compensation_retry,
    schedule_step_retry,
    send_step,
    withdraw,
)
from .errors import InvalidMessage
from .messages import TimerFired
from .model import ANSWER, EXPIRED_ERROR, TIMED_OUT_ERROR, SagaStatus, StepStatus
from .progress import advance, cancel, deadline_reason, retry_compensation


def handle_step_result(b: DecisionBuilder, result: StepResult) -> None:
    definition = b.defn
    if not definition.has_step(result.step):
        raise InvalidMessage(f"saga {b.saga_id!r} has no step {result.step!r} (reply {result.kind})")
    forward = result.kind is CommandKind.FORWARD
    expected_key = (forward_key if forward else compensation_key)(b.saga_id, result.step)
    if result.idempotency_key != expected_key:
        raise InvalidMessage(
            f"reply for {result.step!r} ({result.kind}) carries key {result.idempotency_key!r}, "
            f"expected {expected_key!r}"
        )
    if forward:
        _forward_result(b, result)
    else:
        _compensation_result(b, result)
    advance(b)


def _forward_result(b: DecisionBuilder, result: StepResult) -> None:
    state = b.saga
    step = state.steps[result.step]
    if state.status not in (SagaStatus.RUNNING, SagaStatus.COMPENSATING, SagaStatus.COMPENSATION_FAILED):
        return  # the saga ended: late replies change nothing
    if result.status is ResultStatus.SUCCEEDED:
        # Any attempt's success counts while the step is open: all attempts share one idempotency key,
        # so they are one operation. This is how an unknown outcome (timeout) resolves, and a withdrawal that
        # came too late.
        open_statuses = (StepStatus.RUNNING, StepStatus.TIMED_OUT, StepStatus.RETRY_SCHEDULED,
                         StepStatus.WITHDRAWING)
        if not (step.status in open_statuses and 1 <= result.attempt <= step.attempt):
            return
        _answered_by(b, result)
        problem = output_problem(b.defn, state, step.name, result.output)
        if problem is None:
            b.record(
                ev.StepSucceeded(**b.base(), step=step.name, attempt=result.attempt, output=result.output)
            )
            return
        # It took effect, but nothing can carry its output on: failed for good, and undone when unwinding.
        b.record(ev.StepFailed(**b.base(), step=step.name, attempt=result.attempt, error_type=OUTPUT_REFUSED,
                               error_message=problem, retryable=False))
        return
    if (step.status not in (StepStatus.RUNNING, StepStatus.TIMED_OUT, StepStatus.WITHDRAWING)
            or result.attempt != step.attempt):
        return  # a failure of an attempt we no longer wait for
    _answered_by(b, result)
    error_type = result.error_type or "UnknownError"
    b.record(
        ev.StepFailed(
            **b.base(),
            step=step.name,
            attempt=result.attempt,
            error_type=error_type,
            error_message=result.error_message,
            retryable=result.retryable,
        )
    )
    # While unwinding a known failure settles the step: it did not happen, nothing to undo or retry (a withdrawn
    # attempt that had not run answers so too).
    if state.status is not SagaStatus.RUNNING:
        return
    if step.status is StepStatus.WITHDRAWING:  # the pivot the deadline withdrew had not run: the saga turns back
        cancel(b, deadline_reason(b.defn), None)
        return
    if error_type == EXPIRED_ERROR:  # no worker picked it up in time: it never ran, and it does not count
        if b.saga.paused:
            b.record(ev.StepRetryScheduled(**b.base(), step=step.name, attempt=result.attempt + 1, due_at=b.now))
        else:
            send_step(b, step.name, result.attempt + 1)
        return
    # The budget counts the attempts a worker started on since the step's latest Redrive.
    policy = b.defn.step(step.name).retry
    if policy.should_retry(b.saga.steps[step.name].spent, result.retryable, error_type):
        schedule_step_retry(b, step.name, result.attempt)


def _compensation_result(b: DecisionBuilder, result: StepResult) -> None:
    state = b.saga
    step = state.steps[result.step]
    if state.status not in (SagaStatus.COMPENSATING, SagaStatus.COMPENSATION_FAILED):
        return
    if result.status is ResultStatus.SUCCEEDED:
        open_statuses = (
            StepStatus.COMPENSATING,
            StepStatus.COMPENSATION_TIMED_OUT,
            StepStatus.COMPENSATION_RETRY_SCHEDULED,
            StepStatus.COMPENSATION_FAILED,
        )
        if step.status in open_statuses and 1 <= result.attempt <= step.compensation_attempt:
            _answered_by(b, result)
            b.record(ev.StepCompensated(**b.base(), step=step.name, attempt=result.attempt))
        return
    if (
        step.status not in (StepStatus.COMPENSATING, StepStatus.COMPENSATION_TIMED_OUT)
        or result.attempt != step.compensation_attempt
    ):
        return
    _answered_by(b, result)
    error_type = result.error_type or "UnknownError"
    b.record(
        ev.CompensationFailed(
            **b.base(),
            step=step.name,
            attempt=result.attempt,
            error_type=error_type,
            error_message=result.error_message,
            retryable=result.retryable,
        )
    )
    if state.status is SagaStatus.COMPENSATING:  # a frozen saga only records what arrives
        _after_compensation_failure(b, step.name, result.attempt, result.retryable, error_type)


def _answered_by(b: DecisionBuilder, result: StepResult) -> None:
    """A person gave this reply (a deferred command's answer, ``result.operator``), and it is taken: record who,
    and why, just before the outcome it gives."""
    if result.operator is not None:
        detail = ": ".join(part for part in (result.step, result.detail) if part)
        b.record(ev.OperatorAction(**b.base(), action=ANSWER, operator=result.operator, detail=detail))


def _after_compensation_failure(
    b: DecisionBuilder, name: str, attempt: int, retryable: bool, error_type: str
) -> None:
    if b.defn.step(name).compensation_retry.should_retry(attempt, retryable, error_type):
        schedule_compensation_retry(b, name, attempt)
        return
    message = b.saga.steps[name].last_error_message
    error = f"{error_type}: {message}" if message else error_type
    reason = f"compensation of {name} failed for good: {error}; a human must act"
    b.record(ev.SagaCompensationFailed(**b.base(), step=name, reason=reason))


def handle_timer_fired(b: DecisionBuilder, fired: TimerFired) -> None:
    timer = fired.timer
    if timer.timer_id not in live_timer_ids(b.definition, b.state):
        return  # answered, superseded, or the saga moved on
    name, attempt = timer.step, timer.attempt
    step = b.defn.step(name)
    if timer.kind is TimerKind.STEP_TIMEOUT and step.waits:
        expire_wait(b, name)
    elif timer.kind is TimerKind.STEP_TIMEOUT:
        # No answer yet: whether a worker picked the command up is not known here, so no attempt is spent and
        # none is sent. The participant answers every command it picks up: its outcome, HandlerTimedOut when the
        # handler overran the step's timeout (that attempt counts), or Expired when it was picked up after this
        # (it did not run, and the next attempt goes at once). The saga's deadline bounds the wait.
        b.record(ev.StepTimedOut(**b.base(), step=name, attempt=attempt))
        if b.saga.status is SagaStatus.COMPENSATING:  # a saga that turned back before withdrawals existed
            withdraw(b, name, f"the saga turned back: {b.saga.failure_reason}", wait=True)
    elif timer.kind is TimerKind.STEP_RETRY:
        if b.saga.status is SagaStatus.COMPENSATING:  # nothing goes forward once the saga turned back
            withdraw(b, name, f"the saga turned back: {b.saga.failure_reason}", wait=True)
        else:
            send_step(b, name, attempt)
    elif timer.kind is TimerKind.WITHDRAWAL_TIMEOUT:
        withdraw(b, name, f"the saga turned back: {b.saga.failure_reason}" if b.saga.status is SagaStatus.COMPENSATING
                 else "the saga's deadline passed", wait=True)
    elif timer.kind is TimerKind.COMPENSATION_TIMEOUT:
        b.record(ev.CompensationTimedOut(**b.base(), step=name, attempt=attempt))
        if step.compensation_retry.allows_attempt(attempt + 1):
            schedule_compensation_retry(b, name, attempt)
        else:
            b.record(
                ev.CompensationFailed(
                    **b.base(),
                    step=name,
                    attempt=attempt,
                    error_type=TIMED_OUT_ERROR,
                    error_message=f"no reply within {step.compensation_timeout_ms} ms, {attempt} attempt(s)",
                    retryable=False,
                )
            )
            _after_compensation_failure(b, name, attempt, False, TIMED_OUT_ERROR)
    else:
        retry_compensation(b, name, attempt)
    advance(b)
