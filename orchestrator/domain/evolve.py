"""Apply one event to a saga state: the per-event functions behind ``fold``.

Strict on purpose: a history that does not fit the definition raises HistoryMismatch, an impossible status
change raises IllegalTransition (tables in ``status.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...schemas import event_types as ev
from ...schemas.ids import compensation_key, forward_key
from ...schemas.limits import OUTPUT_REFUSED
from ...schemas.message_types import Lever
from .definition import SagaDefinition
from .errors import HistoryMismatch, IllegalTransition, ShapeChanged
from .model import (
    EXPIRED_ERROR,
    RECORDED_ONLY,
    RESUME_COMPENSATION,
    TIMED_OUT_ERROR,
    SagaState,
    SagaStatus,
    StepState,
    StepStatus,
    evolved,
    is_step_transition_valid,
    is_transition_valid,
)

_Def = SagaDefinition | None


def apply_event(definition: SagaDefinition | None, state: SagaState | None, event: ev.Event) -> SagaState:
    """The state after one more event; checks seq, saga id, version, step names and transitions."""
    if state is None:
        if isinstance(event, ev.SagaPurged):  # a purged history starts here, at any seq
            _check_saga_transition(event, None, SagaStatus.PURGED)
            return _purged_stream(event)
        if event.seq != 1:
            raise HistoryMismatch(f"saga {event.saga_id!r}: history starts at seq {event.seq}, not 1")
        if isinstance(event, ev.SagaStarted):
            return _started(definition, None, event)
        if isinstance(event, ev.SagaRejected):
            _check_saga_transition(event, None, SagaStatus.REJECTED)
            return SagaState(
                saga_id=event.saga_id,
                saga_type=event.saga_type or "",
                definition_version=event.definition_version,
                tenant_id=None,
                input=b"",
                status=SagaStatus.REJECTED,
                steps={},
                last_seq=1,
                started_at=event.occurred_at,
                updated_at=event.occurred_at,
            )
        raise HistoryMismatch(
            f"saga {event.saga_id!r}: history starts with {type(event).__name__}, not SagaStarted"
        )
    if event.saga_id != state.saga_id:
        raise HistoryMismatch(f"event of saga {event.saga_id!r} in the history of {state.saga_id!r}")
    if event.seq != state.last_seq + 1:
        raise HistoryMismatch(f"saga {state.saga_id!r}: seq {event.seq} follows {state.last_seq}")
    if isinstance(event, ev.SagaStarted):
        # Only after refusals (REJECTED): a valid StartSaga may follow messages that were all refused.
        return _started(definition, state, event)
    if event.definition_version != state.definition_version:
        raise HistoryMismatch(
            f"saga {state.saga_id!r}: {type(event).__name__} seq {event.seq} was decided under version "
            f"{event.definition_version}, the saga runs on version {state.definition_version}"
        )
    handler = _HANDLERS.get(type(event))
    if handler is None:
        raise HistoryMismatch(f"saga {state.saga_id!r}: unexpected {type(event).__name__} seq {event.seq}")
    # A refused StartSaga / cancel changes nothing, so it needs no definition (the StartSaga may even name
    # an unknown type); everything else of a started saga does.
    needs_definition = not (isinstance(event, ev.SagaRejected | ev.SagaCancelRefused | ev.SagaPurged
                                       | ev.SagaQuarantined | ev.SagaReleased | ev.OperatorActionRefused
                                       | ev.SignalRefused)
                            or (isinstance(event, ev.OperatorAction) and event.action in RECORDED_ONLY))
    if needs_definition and state.status is not SagaStatus.REJECTED and definition is None:
        raise HistoryMismatch(f"saga {state.saga_id!r}: {type(event).__name__} needs the saga's definition")
    moved = evolved(state, last_seq=event.seq, updated_at=event.occurred_at)
    return handler(definition, moved, event)


def _started(definition: SagaDefinition | None, state: SagaState | None, event: ev.SagaStarted) -> SagaState:
    if definition is None:
        raise HistoryMismatch(f"saga {event.saga_id!r} started as {event.saga_type!r}; no definition given")
    # A later version of its type: the saga was migrated to it (its SagaMigrated checks the shape, ``fold`` that
    # the history does migrate to it).
    migrated = definition.saga_type == event.saga_type and definition.version > event.definition_version
    if (definition.saga_type, definition.version) != (event.saga_type, event.definition_version) and not migrated:
        raise HistoryMismatch(
            f"saga {event.saga_id!r} started as {event.saga_type!r} v{event.definition_version}, "
            f"folded with {definition.saga_type!r} v{definition.version}"
        )
    if (event.definition_fingerprint is not None and definition.lacking(event.definition_fingerprint) is None
            and not migrated):
        raise ShapeChanged(
            f"saga {event.saga_id!r} started on {event.saga_type!r} v{event.definition_version} of shape "
            f"{event.definition_fingerprint}; the registered v{definition.version} has shape {definition.fingerprint}: "
            "its steps, dependencies, pivot, undos, conditions or failure mode changed under it (deploy such a "
            "change as a new version)",
            event.definition_fingerprint,
        )
    if state is not None and state.status is not SagaStatus.REJECTED:  # a redriven FAILED saga does not restart
        raise IllegalTransition(f"saga {event.saga_id!r}: SagaStarted seq {event.seq} would move it from "
                                f"{state.status} to {SagaStatus.RUNNING}: a saga starts once")
    _check_saga_transition(event, None if state is None else state.status, SagaStatus.RUNNING)
    steps = {
        name: StepState(
            name=name,
            idempotency_key=forward_key(event.saga_id, name),
            compensation_key=compensation_key(event.saga_id, name),
        )
        for name in definition.order
    }
    return SagaState(
        saga_id=event.saga_id,
        saga_type=event.saga_type,
        definition_version=event.definition_version,
        tenant_id=event.tenant_id,
        input=event.input,
        traceparent=event.traceparent,
        definition_fingerprint=event.definition_fingerprint,
        status=SagaStatus.RUNNING,
        steps=steps,
        last_seq=event.seq,
        started_at=event.occurred_at if state is None else state.started_at,
        updated_at=event.occurred_at,
    )


def _check_saga_transition(event: ev.Event, current: SagaStatus | None, new: SagaStatus) -> None:
    if not is_transition_valid(current, new):
        raise IllegalTransition(
            f"saga {event.saga_id!r}: {type(event).__name__} seq {event.seq} would move it from "
            f"{current or 'nothing'} to {new}"
        )


def _to_status(state: SagaState, event: ev.Event, new: SagaStatus, **changes: Any) -> SagaState:
    _check_saga_transition(event, state.status, new)
    return evolved(state, status=new, **changes)


def _step(state: SagaState, event: ev.Event, name: str, new: StepStatus, **changes: Any) -> SagaState:
    """Move step ``name`` to ``new``, checking the step table."""
    current = state.steps.get(name)
    if current is None:
        raise HistoryMismatch(
            f"saga {state.saga_id!r}: {type(event).__name__} seq {event.seq} names unknown step {name!r}"
        )
    if not is_step_transition_valid(current.status, new):
        raise IllegalTransition(
            f"saga {state.saga_id!r}: {type(event).__name__} seq {event.seq} would move step {name!r} "
            f"from {current.status} to {new}"
        )
    steps = dict(state.steps)
    steps[name] = evolved(current, status=new, **changes)
    return evolved(state, steps=steps)


def _on_saga_rejected(d: _Def, s: SagaState, e: ev.SagaRejected) -> SagaState:
    return s  # a duplicate StartSaga was refused: the saga itself is unchanged


def _on_saga_purged(d: _Def, s: SagaState, e: ev.SagaPurged) -> SagaState:
    if s.status.value != e.final_status:
        raise HistoryMismatch(f"saga {s.saga_id!r}: SagaPurged says it ended {e.final_status}, the history says "
                              f"{s.status}")
    _check_saga_transition(e, s.status, SagaStatus.PURGED)
    return _purged_stream(e)  # the same state whether the earlier events are still there or not


def _purged_stream(e: ev.SagaPurged) -> SagaState:
    """The state a purged history starts in: how it ended is all that is left."""
    if e.purged_through_seq != e.seq - 1:
        raise HistoryMismatch(f"saga {e.saga_id!r}: SagaPurged seq {e.seq} purged through {e.purged_through_seq}")
    return SagaState(saga_id=e.saga_id, saga_type=e.saga_type, definition_version=e.definition_version,
                     tenant_id=None, input=b"", status=SagaStatus.PURGED, steps={}, last_seq=e.seq,
                     started_at=e.ended_at, updated_at=e.occurred_at,
                     failure_reason=f"ended {e.final_status}; events 1-{e.purged_through_seq} purged")


def _on_step_command_sent(d: _Def, s: SagaState, e: ev.StepCommandSent) -> SagaState:
    return _step(s, e, e.step, StepStatus.RUNNING, attempt=e.attempt)


def _on_step_succeeded(d: _Def, s: SagaState, e: ev.StepSucceeded) -> SagaState:
    # Taking effect while the saga turns back is harmless when an undo follows; without one, a human must act.
    late = s.status is SagaStatus.COMPENSATING and d is not None and d.step(e.step).compensation is None
    s = _step(s, e, e.step, StepStatus.SUCCEEDED, output=e.output, outcome_unknown=False, landed_late=late)
    if d is not None and d.step(e.step).pivot and s.status is SagaStatus.RUNNING:
        s = evolved(s, pivot_passed=True)
    return s


def _on_step_failed(d: _Def, s: SagaState, e: ev.StepFailed) -> SagaState:
    # A reply FAILED is a known outcome: the operation did not take effect under this key. Giving up after
    # the last attempt timed out is not: the step may have taken effect, so its outcome stays unknown and
    # an unwinding saga compensates it.
    before = s.steps.get(e.step)
    gave_up = e.error_type == TIMED_OUT_ERROR and before is not None and before.outcome_unknown
    # A success whose output the orchestrator refused did take effect.
    took_effect = gave_up or e.error_type == OUTPUT_REFUSED
    unspent = 0 if before is None else before.unspent
    return _step(
        s,
        e,
        e.step,
        StepStatus.FAILED,
        outcome_unknown=took_effect,
        last_error_type=e.error_type,
        last_error_message=e.error_message,
        unspent=unspent + 1 if e.error_type == EXPIRED_ERROR else unspent,
    )


def _on_step_timed_out(d: _Def, s: SagaState, e: ev.StepTimedOut) -> SagaState:
    return _step(s, e, e.step, StepStatus.TIMED_OUT, outcome_unknown=True)


def _on_step_retry_scheduled(d: _Def, s: SagaState, e: ev.StepRetryScheduled) -> SagaState:
    return _step(s, e, e.step, StepStatus.RETRY_SCHEDULED, attempt=e.attempt)


def _on_step_withdrawn(d: _Def, s: SagaState, e: ev.StepWithdrawn) -> SagaState:
    step = s.steps.get(e.step)
    if step is not None and step.status is StepStatus.SKIPPED:  # an operator's Skip: its attempt withdrawn too
        return s
    withdrawals = step.withdrawals + 1 if step is not None and step.status is StepStatus.WITHDRAWING else 1
    return _step(s, e, e.step, StepStatus.WITHDRAWING, attempt=e.attempt, withdrawals=withdrawals)


def _on_signal_awaited(d: _Def, s: SagaState, e: ev.SignalAwaited) -> SagaState:
    return _step(s, e, e.step, StepStatus.AWAITING_SIGNAL, attempt=e.attempt, waiting_until=e.timeout_at)


def _on_signal_received(d: _Def, s: SagaState, e: ev.SignalReceived) -> SagaState:
    return evolved(s, signals={**s.signals, e.signal: (e.signal_id, e.payload)},
                   signal_ids=s.signal_ids | {e.signal_id})


def _on_signal_refused(d: _Def, s: SagaState, e: ev.SignalRefused) -> SagaState:
    return evolved(s, signal_ids=s.signal_ids | {e.signal_id})


def _on_step_skipped(d: _Def, s: SagaState, e: ev.StepSkipped) -> SagaState:
    # A condition skips a step before it is sent; one skipped after it was sent was skipped by an operator; a
    # step of a patch the saga's shape lacks is skipped because the saga went past it: the last two count as
    # done for the step's dependents.
    waived = e.step in s.steps and s.steps[e.step].status is not StepStatus.PENDING
    if d is not None and d.has_step(e.step) and (patch := d.step(e.step).patch) is not None:
        waived = waived or patch in (d.lacking(s.definition_fingerprint) or ())
    return _step(s, e, e.step, StepStatus.SKIPPED, waived=waived)


def _on_patch_taken(d: _Def, s: SagaState, e: ev.PatchTaken) -> SagaState:
    assert d is not None  # apply_event checked it
    if d.lacking(e.definition_fingerprint) is None:  # a shape of this version deployed elsewhere, or not at all
        raise ShapeChanged(f"saga {s.saga_id!r}: PatchTaken seq {e.seq} takes patch {e.patch!r} onto shape "
                           f"{e.definition_fingerprint}, which the registered {d.saga_type!r} v{d.version} does not "
                           "have", e.definition_fingerprint)
    lacking = d.lacking(s.definition_fingerprint)
    if lacking is None or e.patch not in lacking or d.lacking(e.definition_fingerprint) != lacking - {e.patch}:
        raise HistoryMismatch(f"saga {s.saga_id!r}: PatchTaken seq {e.seq} takes patch {e.patch!r} onto shape "
                              f"{e.definition_fingerprint}, which does not follow from its shape "
                              f"{s.definition_fingerprint} in {d.saga_type!r} v{d.version}")
    return evolved(s, definition_fingerprint=e.definition_fingerprint)


def _on_compensation_sent(d: _Def, s: SagaState, e: ev.CompensationSent) -> SagaState:
    if d is not None and d.has_step(e.step) and d.step(e.step).compensation is None:
        raise HistoryMismatch(f"saga {e.saga_id!r}: CompensationSent seq {e.seq} undoes step {e.step!r}, which has "
                              f"no compensation in {d.saga_type!r} v{d.version}")
    return _step(s, e, e.step, StepStatus.COMPENSATING, compensation_attempt=e.attempt)


def _on_step_compensated(d: _Def, s: SagaState, e: ev.StepCompensated) -> SagaState:
    return _step(s, e, e.step, StepStatus.COMPENSATED)


def _on_compensation_failed(d: _Def, s: SagaState, e: ev.CompensationFailed) -> SagaState:
    return _step(
        s,
        e,
        e.step,
        StepStatus.COMPENSATION_FAILED,
        last_error_type=e.error_type,
        last_error_message=e.error_message,
    )


def _on_compensation_timed_out(d: _Def, s: SagaState, e: ev.CompensationTimedOut) -> SagaState:
    return _step(s, e, e.step, StepStatus.COMPENSATION_TIMED_OUT)


def _on_compensation_retry_scheduled(d: _Def, s: SagaState, e: ev.CompensationRetryScheduled) -> SagaState:
    return _step(s, e, e.step, StepStatus.COMPENSATION_RETRY_SCHEDULED, compensation_attempt=e.attempt)


def _on_saga_compensation_started(d: _Def, s: SagaState, e: ev.SagaCompensationStarted) -> SagaState:
    return _to_status(s, e, SagaStatus.COMPENSATING, failure_reason=e.reason, failed_step=e.failed_step)


def _on_saga_cancel_requested(d: _Def, s: SagaState, e: ev.SagaCancelRequested) -> SagaState:
    return evolved(s, cancel_requested=True, cancel_reason=e.reason)


def _on_saga_cancel_refused(d: _Def, s: SagaState, e: ev.SagaCancelRefused) -> SagaState:
    return s


def _on_operator_action(d: _Def, s: SagaState, e: ev.OperatorAction) -> SagaState:
    if e.action == RESUME_COMPENSATION:
        return _to_status(s, e, SagaStatus.COMPENSATING)
    if e.action in (Lever.PAUSE, Lever.UNPAUSE):
        return evolved(s, paused=e.action == Lever.PAUSE)
    if e.action == Lever.FORCE_COMPENSATE:
        return evolved(s, forced_compensation=True)
    if e.action == Lever.REDRIVE:
        return _redriven(s, e)
    return s


def _redriven(s: SagaState, e: ev.OperatorAction) -> SagaState:
    """A FAILED saga runs again: each step that failed for good is PENDING once more, its attempts so far spent
    (``attempt_base``), so the decision that recorded ``e`` sends it as its next attempt under its same key."""
    s = _to_status(s, e, SagaStatus.RUNNING, failure_reason=None, failed_step=None)
    for name, step in s.steps.items():
        if step.status is StepStatus.FAILED:
            s = _step(s, e, name, StepStatus.PENDING, attempt_base=step.attempt)
    return s


def _on_saga_migrated(d: _Def, s: SagaState, e: ev.SagaMigrated) -> SagaState:
    """The saga runs on ``e.to_version`` from here on: its steps are the target's (those it had keep their
    state; a step only the target has is PENDING). ``d`` is the target, or a later version it migrated to next."""
    assert d is not None  # apply_event asks for the definition
    if d.saga_type != s.saga_type or d.version < e.to_version:
        raise HistoryMismatch(f"saga {s.saga_id!r}: SagaMigrated seq {e.seq} moves it to {s.saga_type!r} "
                              f"v{e.to_version}, folded with {d.saga_type!r} v{d.version}")
    if d.version == e.to_version and d.lacking(e.to_fingerprint) is None:
        raise ShapeChanged(f"saga {s.saga_id!r} was migrated to {s.saga_type!r} v{e.to_version} of shape "
                           f"{e.to_fingerprint}; the registered v{d.version} has shape {d.fingerprint}",
                           e.to_fingerprint)
    if s.status is not SagaStatus.RUNNING:
        raise IllegalTransition(f"saga {s.saga_id!r}: SagaMigrated seq {e.seq} of a saga that is {s.status}")
    steps = {name: s.steps.get(name) or StepState(name=name, idempotency_key=forward_key(s.saga_id, name),
                                                  compensation_key=compensation_key(s.saga_id, name))
             for name in d.order}
    return evolved(s, definition_version=e.to_version, definition_fingerprint=e.to_fingerprint, steps=steps)


def _on_operator_action_refused(d: _Def, s: SagaState, e: ev.OperatorActionRefused) -> SagaState:
    return s


def _on_saga_quarantined(d: _Def, s: SagaState, e: ev.SagaQuarantined) -> SagaState:
    return _to_status(s, e, SagaStatus.QUARANTINED, quarantined_from=s.status, quarantine_reason=e.reason)


def _on_saga_released(d: _Def, s: SagaState, e: ev.SagaReleased) -> SagaState:
    if s.quarantined_from is None:
        raise HistoryMismatch(f"saga {s.saga_id!r}: SagaReleased seq {e.seq} of a saga that is not quarantined")
    return _to_status(s, e, s.quarantined_from, quarantined_from=None, quarantine_reason=None)


def _on_saga_completed(d: _Def, s: SagaState, e: ev.SagaCompleted) -> SagaState:
    return _to_status(s, e, SagaStatus.COMPLETED)


def _on_saga_failed(d: _Def, s: SagaState, e: ev.SagaFailed) -> SagaState:
    return _to_status(s, e, SagaStatus.FAILED, failure_reason=e.reason, failed_step=e.failed_step)


def _on_saga_compensated(d: _Def, s: SagaState, e: ev.SagaCompensated) -> SagaState:
    return _to_status(s, e, SagaStatus.COMPENSATED, failure_reason=e.reason, failed_step=e.failed_step)


def _on_saga_compensation_failed(d: _Def, s: SagaState, e: ev.SagaCompensationFailed) -> SagaState:
    if e.step not in s.steps:
        raise HistoryMismatch(f"saga {s.saga_id!r}: SagaCompensationFailed names unknown step {e.step!r}")
    return _to_status(
        s,
        e,
        SagaStatus.COMPENSATION_FAILED,
        compensation_failed_step=e.step,
        compensation_failure_reason=e.reason,
    )


def _on_saga_cancelled(d: _Def, s: SagaState, e: ev.SagaCancelled) -> SagaState:
    return _to_status(s, e, SagaStatus.CANCELLED, cancel_reason=s.cancel_reason or e.reason)


def _on_saga_terminated(d: _Def, s: SagaState, e: ev.SagaTerminated) -> SagaState:
    return _to_status(s, e, SagaStatus.TERMINATED, failure_reason=e.reason)


def _on_saga_completed_with_failures(d: _Def, s: SagaState, e: ev.SagaCompletedWithFailures) -> SagaState:
    unknown = [name for name in e.failed_steps if name not in s.steps]
    if unknown:
        raise HistoryMismatch(f"saga {s.saga_id!r}: SagaCompletedWithFailures names unknown steps {unknown}")
    return _to_status(s, e, SagaStatus.COMPLETED_WITH_FAILURES)


_Handler = Callable[[SagaDefinition | None, SagaState, Any], SagaState]
_HANDLERS: Mapping[type[ev.Event], _Handler] = {
    ev.SagaRejected: _on_saga_rejected,
    ev.StepCommandSent: _on_step_command_sent,
    ev.StepSucceeded: _on_step_succeeded,
    ev.StepFailed: _on_step_failed,
    ev.StepTimedOut: _on_step_timed_out,
    ev.StepRetryScheduled: _on_step_retry_scheduled,
    ev.StepSkipped: _on_step_skipped,
    ev.StepWithdrawn: _on_step_withdrawn,
    ev.SignalAwaited: _on_signal_awaited,
    ev.SignalReceived: _on_signal_received,
    ev.SignalRefused: _on_signal_refused,
    ev.CompensationSent: _on_compensation_sent,
    ev.StepCompensated: _on_step_compensated,
    ev.CompensationFailed: _on_compensation_failed,
    ev.CompensationTimedOut: _on_compensation_timed_out,
    ev.CompensationRetryScheduled: _on_compensation_retry_scheduled,
    ev.SagaCompensationStarted: _on_saga_compensation_started,
    ev.SagaCancelRequested: _on_saga_cancel_requested,
    ev.SagaCancelRefused: _on_saga_cancel_refused,
    ev.OperatorAction: _on_operator_action,
    ev.OperatorActionRefused: _on_operator_action_refused,
    ev.SagaQuarantined: _on_saga_quarantined,
    ev.SagaReleased: _on_saga_released,
    ev.PatchTaken: _on_patch_taken,
    ev.SagaMigrated: _on_saga_migrated,
    ev.SagaCompleted: _on_saga_completed,
    ev.SagaFailed: _on_saga_failed,
    ev.SagaCompensated: _on_saga_compensated,
    ev.SagaCompensationFailed: _on_saga_compensation_failed,
    ev.SagaCancelled: _on_saga_cancelled,
    ev.SagaCompletedWithFailures: _on_saga_completed_with_failures,
    ev.SagaTerminated: _on_saga_terminated,
    ev.SagaPurged: _on_saga_purged,
}
