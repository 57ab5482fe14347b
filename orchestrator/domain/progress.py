"""Moving a saga on after its facts were recorded: dispatch ready steps, unwind, or finish.

``advance`` looks only at the state, never at the message that led there, so every path (a reply, a timer,
a cancel, an operator's resume) moves the saga on by the same rules.
"""

from __future__ import annotations

from ...schemas import event_types as ev
from .builder import (
    DecisionBuilder,
    await_signal,
    in_flight,
    needs_resolution,
    schedule_compensation_retry,
    send_compensation,
    send_step,
    to_undo,
    withdraw,
)
from .definition import Condition, FailureMode, SagaDefinition
from .model import COMPENSATION_IN_PROGRESS, FORWARD_SETTLED, SagaState, SagaStatus, StepStatus


def advance(b: DecisionBuilder) -> None:
    """Record whatever the current state calls for next (possibly nothing; nothing while paused)."""
    if b.saga.paused:
        return
    if b.saga.status is SagaStatus.RUNNING:
        _advance_forward(b)
    if b.saga.status is SagaStatus.COMPENSATING:  # also right after the forward part started unwinding
        _advance_compensation(b)


def _advance_forward(b: DecisionBuilder) -> None:
    definition, state = b.defn, b.saga
    if any(step.status is StepStatus.WITHDRAWING for step in state.steps.values()):
        return  # the deadline withdrew the pivot: its participant's answer decides which way the saga goes
    if definition.patches:
        _settle_patches(b)
    failed = failed_steps(definition, state)
    if failed and definition.failure_mode is FailureMode.FAIL_FAST:
        _fail_fast(b, failed[0])
        return
    for name in definition.order:  # topological: a step's dependencies are settled before it is looked at
        if b.saga.steps[name].status is not StepStatus.PENDING:
            continue
        verdict = _readiness(definition, b.saga, name)
        if verdict is True and definition.step(name).waits:
            await_signal(b, name)
        elif verdict is True:  # its first attempt, or after a Redrive the one after those it spent
            send_step(b, name, b.saga.steps[name].attempt + 1)
        elif isinstance(verdict, str):
            b.record(ev.StepSkipped(**b.base(), step=name, reason=verdict))
    if all(s.status in FORWARD_SETTLED for s in b.saga.steps.values()):
        _finish_forward(b)


def _settle_patches(b: DecisionBuilder) -> None:
    """For each patch the saga's shape lacks (``SagaDefinition.patches``): when it went past the patch (a step
    after the patch's steps left PENDING while they did not), skip those steps, so it keeps its path; when it
    reaches the patch (one of its steps could be decided now), record that it takes the patched path, which
    ``_advance_forward`` then follows like any other."""
    definition = b.defn
    for patch in sorted(definition.lacking(b.saga.definition_fingerprint) or ()):
        added = definition.patch_steps(patch)
        if any(b.saga.steps[name].status is not StepStatus.PENDING for name in added):
            continue  # settled already: skipped as passed, or run after a PatchTaken
        if any(b.saga.steps[name].status is not StepStatus.PENDING for name in definition.patch_followers(patch)):
            for name in added:
                b.record(ev.StepSkipped(**b.base(), step=name, reason=(
                    f"added behind patch {patch} after the saga went past this point: it keeps the path it "
                    "started on")))
        elif any(_readiness(definition, b.saga, name) is not False for name in added):
            lacking = (definition.lacking(b.saga.definition_fingerprint) or frozenset()) - {patch}
            b.record(ev.PatchTaken(**b.base(), patch=patch,
                                   definition_fingerprint=definition.shape_fingerprint(lacking)))


def _readiness(definition: SagaDefinition, state: SagaState, name: str) -> bool | str:
    """True: dispatch now; False: wait for dependencies; a string: skip, for that reason."""
    step = definition.step(name)
    deps = {d: state.steps[d].status for d in step.depends_on}
    if any(status not in FORWARD_SETTLED for status in deps.values()):
        return False
    if step.run_if is Condition.ALWAYS:
        return True
    if step.run_if is Condition.ON_FAILURE:
        upstream_failed = sorted(
            u for u in definition.upstream(name) if state.steps[u].status is StepStatus.FAILED
        )
        return True if upstream_failed else "no step it depends on failed"
    blocking = [d for d in step.depends_on if deps[d] is not StepStatus.SUCCEEDED and not state.steps[d].waived]
    if not blocking:
        return True
    return f"dependency {blocking[0]} {deps[blocking[0]].lower()}"


def failed_steps(definition: SagaDefinition, state: SagaState) -> tuple[str, ...]:
    """Steps whose forward part failed for good, in topological order."""
    return tuple(n for n in definition.order if state.steps[n].status is StepStatus.FAILED)


def _describe_failure(state: SagaState, name: str) -> str:
    step = state.steps[name]
    detail = f"{step.last_error_type}: {step.last_error_message}" if step.last_error_message else ""
    return f"step {name} failed ({detail or step.last_error_type})"


def _fail_fast(b: DecisionBuilder, name: str) -> None:
    state = b.saga
    pivot = b.defn.pivot
    if state.pivot_passed and pivot is not None:
        reason = (
            f"{_describe_failure(state, name)} after pivot step {pivot.name} succeeded; the saga only "
            "moves forward, a human must act"
        )
        b.record(ev.SagaFailed(**b.base(), reason=reason, failed_step=name))
        return
    unwind(b, _describe_failure(state, name), name)


def _finish_forward(b: DecisionBuilder) -> None:
    definition, state = b.defn, b.saga
    failed = failed_steps(definition, state)
    if not failed:
        b.record(ev.SagaCompleted(**b.base()))
    elif definition.compensate_on_continue and not state.pivot_passed:
        reason = "; ".join(_describe_failure(state, n) for n in failed)
        unwind(b, reason, failed[0])
    else:
        b.record(ev.SagaCompletedWithFailures(**b.base(), failed_steps=failed))


def deadline_reason(definition: SagaDefinition) -> str:
    """The reason a saga cancelled by its deadline gives."""
    assert definition.deadline_ms is not None
    return f"deadline of {definition.deadline_ms / 1000:g} s passed"


def cancel(b: DecisionBuilder, reason: str, operator: str | None) -> None:
    """The cancel (an operator's, a client's, or the deadline's) is accepted: recorded, and the saga turns back."""
    b.record(ev.SagaCancelRequested(**b.base(), reason=reason, operator=operator))
    unwind(b, f"cancel requested: {reason}", None)
    advance(b)


def unwind(b: DecisionBuilder, reason: str, failed_step: str | None) -> None:
    """Turn the saga back: start compensating, withdrawing every forward attempt still in flight (none is sent or
    scheduled from here on), or end the saga at once when there is nothing to undo or wait for: CANCELLED for a
    cancel, else COMPENSATED (a business outcome: the saga turned back, and nothing it did needed undoing)."""
    definition = b.defn
    for name in definition.order:  # a wait for a signal is over: nothing was sent, nothing needs undoing
        if b.saga.steps[name].status is StepStatus.AWAITING_SIGNAL:
            b.record(ev.StepSkipped(**b.base(), step=name,
                                    reason=f"no longer awaited: the saga turned back ({reason})"))
    state = b.saga
    flying = [name for name in definition.order if in_flight(state.steps[name])]
    undo = any(to_undo(definition, s) for s in state.steps.values())
    if undo or flying:
        b.record(ev.SagaCompensationStarted(**b.base(), reason=reason, failed_step=failed_step))
        for name in flying:
            withdraw(b, name, f"the saga turned back: {reason}", wait=True)
    elif state.cancel_requested:
        b.record(ev.SagaCancelled(**b.base(), reason=state.cancel_reason or reason))
    else:
        b.record(ev.SagaCompensated(**b.base(), reason=f"{reason}; nothing needed undoing", failed_step=failed_step))


def pending_undo(definition: SagaDefinition, state: SagaState, name: str) -> bool:
    """True while step ``name`` still needs undoing, is being undone, or may still need it (its outcome open).
    A step without an undo never needs it: its upstream steps are undone without waiting for it."""
    step = state.steps[name]
    if definition.step(name).compensation is None:
        return False
    if needs_resolution(definition, step) or step.status in COMPENSATION_IN_PROGRESS:
        return True
    return to_undo(definition, step)


def compensation_wave(definition: SagaDefinition, state: SagaState) -> tuple[str, ...]:
    """Steps to undo (``to_undo``) none of whose dependents still needs undoing (or may still need it).

    Reverse-topological order; a wave runs in parallel.
    """
    return tuple(
        name
        for name in reversed(definition.order)
        if to_undo(definition, state.steps[name])
        and not any(pending_undo(definition, state, d) for d in definition.downstream(name))
    )


def retry_compensation(b: DecisionBuilder, name: str, attempt: int) -> None:
    """Send ``attempt`` of step ``name``'s compensation (a retry that came due, or a resume), unless a
    dependent still needs undoing: one that succeeded after this undo began (its reply came late) is undone
    first, as a wave would have, and this attempt is scheduled for after the policy's backoff, again and again
    until the dependent is undone."""
    definition, state = b.defn, b.saga
    waiting = [d for d in definition.downstream(name) if pending_undo(definition, state, d)]
    if not waiting:
        send_compensation(b, name, attempt)
        return
    for dependent in waiting:
        step = state.steps[dependent]
        if to_undo(definition, step) and step.status not in COMPENSATION_IN_PROGRESS:
            send_compensation(b, dependent, step.compensation_attempt + 1)
    schedule_compensation_retry(b, name, attempt - 1)


def _advance_compensation(b: DecisionBuilder) -> None:
    definition, state = b.defn, b.saga
    if any(s.status in COMPENSATION_IN_PROGRESS for s in state.steps.values()):
        return  # the current wave has not drained yet
    wave = compensation_wave(definition, state)
    for name in wave:
        send_compensation(b, name, state.steps[name].compensation_attempt + 1)
    if wave or any(needs_resolution(definition, s) for s in state.steps.values()):
        return
    landed = [name for name in definition.order if state.steps[name].landed_late]
    if landed:  # undone as far as it can be; what took effect after the turn-back and has no undo needs a human
        one = len(landed) == 1
        b.record(ev.SagaFailed(**b.base(), failed_step=landed[0], reason=(
            f"{', '.join(landed)} took effect, as {'its participant' if one else 'their participants'} said only "
            f"after the saga turned back ({state.failure_reason}), and {'has' if one else 'have'} no undo; a "
            "human must act")))
    elif state.cancel_requested:
        b.record(ev.SagaCancelled(**b.base(), reason=state.cancel_reason or "cancel requested"))
    else:
        reason = state.failure_reason or "compensated"
        if not any(s.status is StepStatus.COMPENSATED for s in state.steps.values()):
            reason = f"{reason}; nothing needed undoing"
        b.record(ev.SagaCompensated(**b.base(), reason=reason, failed_step=state.failed_step))


def resend_open(b: DecisionBuilder) -> None:
    """Timers were ignored while the saga waited for a human (or were stopped): re-send everything still open,
    each as a new attempt under the same key (a retry that was due keeps its attempt); a withdrawal again. While
    the saga turns back nothing goes forward: a step still in flight is withdrawn instead. Nothing while paused:
    Unpause sends it."""
    if b.saga.paused:
        return
    unwinding = b.saga.status is SagaStatus.COMPENSATING
    for name in reversed(b.defn.order):  # the order compensation waves use
        step = b.saga.steps[name]
        if step.status is StepStatus.COMPENSATION_RETRY_SCHEDULED:
            retry_compensation(b, name, step.compensation_attempt)
        elif step.status in (
            StepStatus.COMPENSATING,
            StepStatus.COMPENSATION_TIMED_OUT,
            StepStatus.COMPENSATION_FAILED,
        ):
            retry_compensation(b, name, step.compensation_attempt + 1)
        elif step.status is StepStatus.AWAITING_SIGNAL and b.saga.status is SagaStatus.RUNNING:
            await_signal(b, name, until=step.waiting_until)  # its timer was ignored: armed again, for what is left
        elif step.status is StepStatus.WITHDRAWING or (unwinding and in_flight(step)):
            withdraw(b, name, f"the saga turned back: {b.saga.failure_reason}", wait=True)
        elif not unwinding and b.saga.status is SagaStatus.RUNNING and (
                step.status in (StepStatus.RUNNING, StepStatus.TIMED_OUT, StepStatus.RETRY_SCHEDULED)):
            retry_due = step.status is StepStatus.RETRY_SCHEDULED
            send_step(b, name, step.attempt if retry_due else step.attempt + 1)
