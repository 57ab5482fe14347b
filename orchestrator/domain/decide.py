"""``decide``: one incoming message + the folded state -> a Decision (new events, commands, timers).

Pure and deterministic: no clock (``now`` is passed in), no randomness (backoff jitter is a hash), no I/O.
Handling the same message twice against the state the first handling produced yields an empty Decision:
duplicate replies, stale replies and stale timers are recognised from the state alone.
"""

from __future__ import annotations

from ...schemas import event_types as ev
from ...schemas.message_types import (
    CancelSaga,
    OperateSaga,
    ReleaseSaga,
    ResumeCompensation,
    SignalSaga,
    StartSaga,
    StepResult,
)
from .builder import (
    DEADLINE_TIMER_ID,
    Decision,
    DecisionBuilder,
    TimerKind,
    live_timer_ids,
    pivot_blocks_cancel,
    withdraw,
)
from .definition import SagaDefinition
from .errors import HistoryMismatch, InvalidMessage, UnknownDefinition
from .levers import operate, refuse
from .messages import IncomingMessage, RejectedRecord, TimerFired
from .model import RECORDED_ONLY, RELEASE, RESUME_COMPENSATION, TIMED_OUT_ERROR, SagaState, SagaStatus
from .on_reply import handle_step_result, handle_timer_fired
from .on_signal import handle_signal, refuse_signal
from .progress import advance, cancel, deadline_reason, resend_open

__all__ = ["DUPLICATE_START_REASON", "TIMED_OUT_ERROR", "Decision", "decide"]

DUPLICATE_START_REASON = "duplicate StartSaga: saga already exists"


def decide(
    definition: SagaDefinition | None, state: SagaState | None, message: IncomingMessage, now: int,
    migrate_to: SagaDefinition | None = None,
) -> Decision:
    """Decide what ``message`` changes for the saga in ``state`` (None: no events yet), at time ``now``.

    ``definition`` is the saga's own definition (``DefinitionRegistry.for_history``) for an existing saga,
    or, for a StartSaga when there is no saga or only refusals (REJECTED), the definition it starts on
    (``starting.start_definition``: the version it names, else the latest of its type not draining); None when it
    may not start (the start is then refused with SagaRejected).

    ``migrate_to``: for an OperateSaga Migrate, the definition of the version it names, from the caller's registry
    (None: not registered, and the lever is refused saying so); ignored for every other message.

    Every new event gets the next seq, the saga's definition version and ``occurred_at=now``. Commands and
    timers follow from the events (a StepCommandSent / CompensationSent is a command plus a timeout timer,
    a *RetryScheduled is a retry timer).

    A RejectedRecord, and any message but StartSaga or a timer when there is no saga, is dead-lettered
    (``Decision.dead_letter``); a RejectedRecord naming a usable saga id is also recorded as SagaRejected in
    that saga's stream.

    Raises InvalidMessage for a reply naming an unknown step or a foreign idempotency key, UnknownDefinition
    when a started saga comes without its definition, HistoryMismatch when definition and state disagree.
    """
    if isinstance(message, RejectedRecord):
        return _reject(definition, state, message, now)
    if isinstance(message, StartSaga):
        return _start(definition, state, message, now)
    if isinstance(message, SignalSaga) and (starts := message.start()) is not None and (
            state is None or state.status is SagaStatus.REJECTED):
        return _signal_with_start(definition, state, message, starts, now)
    if state is None:
        if isinstance(message, TimerFired):
            return Decision()  # the saga is gone (purged meanwhile): its timer changes nothing
        return Decision(dead_letter=f"no saga {message.saga_id!r}: {type(message).__name__} has nothing to act on")
    if message.saga_id != state.saga_id:
        raise InvalidMessage(f"message for saga {message.saga_id!r} given the state of {state.saga_id!r}")
    if isinstance(message, OperateSaga) and message.action in RECORDED_ONLY:
        b = DecisionBuilder(definition, state, now, state.saga_id)  # recorded whatever the status
        operate(b, message)
        return b.build()
    if state.status is SagaStatus.QUARANTINED:
        return _while_quarantined(definition, state, message, now)
    if state.status in (SagaStatus.REJECTED, SagaStatus.PURGED):
        # Nothing runs: a cancel or a lever is refused and recorded, everything else changes nothing.
        b = DecisionBuilder(None, state, now, state.saga_id)
        if isinstance(message, CancelSaga):
            _cancel(b, message)
        elif isinstance(message, OperateSaga):
            refuse(b, message, f"saga is {state.status}: nothing runs")
        elif isinstance(message, SignalSaga):
            refuse_signal(b, message, f"saga is {state.status}: nothing runs")
        return b.build()
    if definition is None:
        raise UnknownDefinition(
            f"saga {state.saga_id!r} runs on {state.saga_type!r} v{state.definition_version}, "
            "which is not registered"
        )
    if (definition.saga_type, definition.version) != (state.saga_type, state.definition_version):
        raise HistoryMismatch(
            f"saga {state.saga_id!r} runs on {state.saga_type!r} v{state.definition_version}, "
            f"not on {definition.saga_type!r} v{definition.version}"
        )
    b = DecisionBuilder(definition, state, now, state.saga_id)
    if isinstance(message, CancelSaga):
        _cancel(b, message)
    elif isinstance(message, ResumeCompensation):
        _resume(b, message)
    elif isinstance(message, StepResult):
        handle_step_result(b, message)
    elif isinstance(message, ReleaseSaga):  # not quarantined: nothing to release, recorded as refused
        b.record(ev.OperatorActionRefused(**b.base(), action=RELEASE, step=None, operator=message.operator,
                                          reason=f"saga is {state.status}, not quarantined: nothing to release"))
    elif isinstance(message, OperateSaga):
        operate(b, message, migrate_to)
    elif isinstance(message, SignalSaga):
        handle_signal(b, message)
    elif message.timer.kind is TimerKind.SAGA_DEADLINE:
        _deadline(b, definition, message.timer.timer_id)
    else:
        handle_timer_fired(b, message)
    return b.build()


def quarantine(definition: SagaDefinition | None, state: SagaState, reason: str, message_id: str | None,
               now: int) -> Decision:
    """The saga cannot go on (``reason``: what the message ``message_id`` met, which no retry mends): record
    SagaQuarantined and dead-letter the message. Its timers stop (none is live while it is quarantined); only
    a ReleaseSaga moves it on."""
    b = DecisionBuilder(definition, state, now, state.saga_id)
    b.record(ev.SagaQuarantined(**b.base(), reason=reason, message_id=message_id))
    return b.build(dead_letter=reason)


def quarantine_unfolded(saga_id: str, last_seq: int, definition_version: int, reason: str,
                        message_id: str | None, now: int) -> Decision:
    """``quarantine`` for a saga whose history cannot be folded (it needs a definition that is not deployed, or
    it does not fit its definition): SagaQuarantined after its last event, and no state (None)."""
    event = ev.SagaQuarantined(saga_id=saga_id, seq=last_seq + 1, definition_version=definition_version,
                               occurred_at=now, reason=reason, message_id=message_id)
    return Decision(events=(event,), dead_letter=reason)


def _while_quarantined(definition: SagaDefinition | None, state: SagaState, message: IncomingMessage,
                       now: int) -> Decision:
    """A quarantined saga takes a ReleaseSaga and nothing else: its timers do nothing, every other message is
    dead-lettered (a release sends every open step again, whose replies come again)."""
    if isinstance(message, TimerFired):
        return Decision(state=state)
    if not isinstance(message, ReleaseSaga):
        return Decision(state=state, dead_letter=(
            f"saga {state.saga_id!r} is quarantined ({state.quarantine_reason}); release it with "
            f"`saga release {state.saga_id}` once the cause is fixed"))
    b = DecisionBuilder(definition, state, now, state.saga_id)
    b.record(ev.SagaReleased(**b.base(), operator=message.operator, detail=message.detail))
    if b.saga.status in (SagaStatus.RUNNING, SagaStatus.COMPENSATING):
        resend_open(b)
        advance(b)
    return b.build()


def _reject(
    definition: SagaDefinition | None, state: SagaState | None, message: RejectedRecord, now: int
) -> Decision:
    """Dead-letter the record; record SagaRejected when it names a saga (which it changes in nothing else)."""
    if message.saga_id is None:
        return Decision(dead_letter=message.reason, state=state)
    if state is not None and message.saga_id != state.saga_id:
        raise InvalidMessage(f"message for saga {message.saga_id!r} given the state of {state.saga_id!r}")
    b = DecisionBuilder(definition, state, now, message.saga_id)
    version = state.definition_version if state is not None else 0
    b.record(ev.SagaRejected(**b.base(definition_version=version), saga_type=message.saga_type,
                             reason=message.reason))
    return b.build(dead_letter=message.reason)


def _signal_with_start(definition: SagaDefinition | None, state: SagaState | None, signal: SignalSaga,
                       start: StartSaga, now: int) -> Decision:
    """No saga of the signal's id yet: start it (``definition``: the latest of the signal's saga type), then take
    the signal as if it had come right after the StartSaga."""
    b = DecisionBuilder(definition, state, now, signal.saga_id)
    _started(b, definition, state, start)
    if b.saga.status is SagaStatus.RUNNING:
        handle_signal(b, signal)
    else:
        refuse_signal(b, signal, "its saga did not start (see the SagaRejected before this)")
    return b.build()


def _start(
    definition: SagaDefinition | None, state: SagaState | None, message: StartSaga, now: int
) -> Decision:
    b = DecisionBuilder(definition, state, now, message.saga_id)
    _started(b, definition, state, message)
    return b.build()


def _started(b: DecisionBuilder, definition: SagaDefinition | None, state: SagaState | None,
             message: StartSaga) -> None:
    if state is not None and state.status is not SagaStatus.REJECTED:
        # The saga id is taken: record the refusal, leave the saga as it is.
        b.record(ev.SagaRejected(**b.base(), saga_type=message.saga_type, reason=DUPLICATE_START_REASON))
        return
    # No saga yet, or only refused messages so far (nothing started): this StartSaga may start it.
    if definition is None:
        reason = (f"unknown saga type {message.saga_type!r}" if message.definition_version is None else
                  f"saga type {message.saga_type!r} takes no starts on v{message.definition_version}")
        b.record(ev.SagaRejected(**b.base(definition_version=0), saga_type=message.saga_type, reason=reason))
        return
    if definition.saga_type != message.saga_type:
        raise InvalidMessage(
            f"StartSaga of type {message.saga_type!r} given the definition of {definition.saga_type!r}"
        )
    if message.definition_version not in (None, definition.version):
        raise InvalidMessage(f"StartSaga naming v{message.definition_version} of {message.saga_type!r} given the "
                             f"definition of v{definition.version}")
    b.record(
        ev.SagaStarted(
            **b.base(definition_version=definition.version),
            saga_type=message.saga_type,
            tenant_id=message.tenant_id,
            input=message.input,
            traceparent=message.traceparent,
            definition_fingerprint=definition.fingerprint,
        )
    )
    advance(b)


def _cancel(b: DecisionBuilder, message: CancelSaga) -> None:
    refusal = _cancel_refusal(b)
    if refusal is not None:
        b.record(ev.SagaCancelRefused(**b.base(), reason=refusal, operator=message.operator))
        return
    cancel(b, message.reason, message.operator)


def _deadline(b: DecisionBuilder, definition: SagaDefinition, timer_id: str) -> None:
    """The deadline came while the saga had not passed its pivot: it turns back at once, whatever its steps'
    timeouts and retries, as by a CancelSaga; every attempt in flight is withdrawn. A pivot without undo in flight
    is withdrawn first, and its participant's answer decides: had it run, the saga goes on (past its pivot the
    deadline no longer applies); had it not, it turns back (``progress``)."""
    if timer_id != DEADLINE_TIMER_ID or timer_id not in live_timer_ids(definition, b.state):
        return  # passed the pivot, unwinding, cancelled or ended meanwhile
    pivot = definition.pivot
    if pivot is not None and pivot_blocks_cancel(definition, b.saga):
        withdraw(b, pivot.name, deadline_reason(definition), wait=True)
        return
    refusal = _cancel_refusal(b)
    if refusal is None:
        cancel(b, deadline_reason(definition), None)


def _cancel_refusal(b: DecisionBuilder) -> str | None:
    state = b.saga
    if state.is_terminal:
        return f"saga already {state.status}"
    if state.cancel_requested:
        return "cancel already requested"
    if state.status is SagaStatus.COMPENSATING:
        return f"saga is already compensating ({state.failure_reason})"
    pivot = b.defn.pivot
    if pivot is None:
        return None
    if state.pivot_passed:
        return f"pivot step {pivot.name} already succeeded; the saga only moves forward"
    if pivot_blocks_cancel(b.defn, state):
        return f"pivot step {pivot.name} is in flight and has no compensation; the saga only moves forward"
    return None


def _resume(b: DecisionBuilder, message: ResumeCompensation) -> None:
    state = b.saga
    if state.status is not SagaStatus.COMPENSATION_FAILED:  # nothing to resume: recorded as refused, who asked too
        b.record(ev.OperatorActionRefused(**b.base(), action=RESUME_COMPENSATION, step=None,
                                          operator=message.operator,
                                          reason=f"saga is {state.status}: only a COMPENSATION_FAILED saga can be "
                                                 "resumed"))
        return
    b.record(
        ev.OperatorAction(
            **b.base(), action=RESUME_COMPENSATION, operator=message.operator, detail=message.detail
        )
    )
    resend_open(b)
    advance(b)
