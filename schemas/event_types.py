"""Saga events as published on saga.events: facts in the past tense, one frozen dataclass per event type.

Each class name equals the Avro record name in ``schemas/events`` (namespace ``saga.v1.events``) and each
field equals an Avro field, so the wire mapping is mechanical.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class Event:
    """Fields every saga event carries."""

    saga_id: str
    seq: int
    definition_version: int
    occurred_at: int  # epoch milliseconds


@dataclass(frozen=True, kw_only=True)
class SagaStarted(Event):
    saga_type: str
    tenant_id: str | None
    input: bytes
    traceparent: str | None = None  # W3C trace context of the StartSaga: every message of the saga carries it
    definition_fingerprint: str | None = None  # the shape it started on (SagaDefinition.fingerprint); None before 0.3


@dataclass(frozen=True, kw_only=True)
class SagaRejected(Event):
    saga_type: str | None
    reason: str


@dataclass(frozen=True, kw_only=True)
class StepCommandSent(Event):
    step: str
    attempt: int
    idempotency_key: str
    message_id: str
    timeout_at: int


@dataclass(frozen=True, kw_only=True)
class StepSucceeded(Event):
    step: str
    attempt: int
    output: bytes | None = None


@dataclass(frozen=True, kw_only=True)
class StepFailed(Event):
    step: str
    attempt: int
    error_type: str
    error_message: str | None
    retryable: bool


@dataclass(frozen=True, kw_only=True)
class StepTimedOut(Event):
    step: str
    attempt: int


@dataclass(frozen=True, kw_only=True)
class SignalAwaited(Event):
    """A step that waits for ``signal`` began to wait (no command is sent), until ``timeout_at``."""

    step: str
    signal: str
    attempt: int
    timeout_at: int


@dataclass(frozen=True, kw_only=True)
class SignalReceived(Event):
    """A SignalSaga the saga took: a step waiting for ``signal`` goes on with ``payload`` as its output."""

    signal_id: str
    signal: str
    payload: bytes
    sender: str | None = None


@dataclass(frozen=True, kw_only=True)
class SignalRefused(Event):
    """A SignalSaga the saga did not take, and why; nothing else changed."""

    signal_id: str
    signal: str
    sender: str | None
    reason: str


@dataclass(frozen=True, kw_only=True)
class StepRetryScheduled(Event):
    step: str
    attempt: int  # the attempt that will be sent
    due_at: int


@dataclass(frozen=True, kw_only=True)
class StepWithdrawn(Event):
    """A WithdrawStep was sent for the step's forward attempt in flight (``timeout_at``: when it is sent again
    unanswered; None where nothing waits for its answer)."""

    step: str
    attempt: int
    idempotency_key: str
    message_id: str
    reason: str
    timeout_at: int | None = None


@dataclass(frozen=True, kw_only=True)
class StepSkipped(Event):
    step: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class CompensationSent(Event):
    step: str
    attempt: int
    idempotency_key: str
    message_id: str
    timeout_at: int


@dataclass(frozen=True, kw_only=True)
class StepCompensated(Event):
    step: str
    attempt: int


@dataclass(frozen=True, kw_only=True)
class CompensationFailed(Event):
    step: str
    attempt: int
    error_type: str
    error_message: str | None
    retryable: bool


@dataclass(frozen=True, kw_only=True)
class CompensationTimedOut(Event):
    step: str
    attempt: int


@dataclass(frozen=True, kw_only=True)
class CompensationRetryScheduled(Event):
    step: str
    attempt: int
    due_at: int


@dataclass(frozen=True, kw_only=True)
class SagaCompensationStarted(Event):
    reason: str
    failed_step: str | None


@dataclass(frozen=True, kw_only=True)
class SagaCancelRequested(Event):
    reason: str
    operator: str | None = None


@dataclass(frozen=True, kw_only=True)
class SagaCancelRefused(Event):
    reason: str
    operator: str | None = None


@dataclass(frozen=True, kw_only=True)
class OperatorAction(Event):
    action: str
    operator: str | None
    detail: str | None


@dataclass(frozen=True, kw_only=True)
class OperatorActionRefused(Event):
    """An operator's lever could not apply to the saga as it stood (``reason``); nothing else changed."""

    action: str
    step: str | None
    operator: str | None
    reason: str


@dataclass(frozen=True, kw_only=True)
class SagaQuarantined(Event):
    """The saga cannot go on until an operator acts (``reason``); ``message_id`` names the message that met it."""

    reason: str
    message_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class SagaReleased(Event):
    """An operator released a quarantined saga."""

    operator: str | None = None
    detail: str | None = None


@dataclass(frozen=True, kw_only=True)
class PatchTaken(Event):
    """The saga reached the point of ``patch`` (steps added in place after it started) and takes the patched
    path; it runs on the shape ``definition_fingerprint`` from here on."""

    patch: str
    definition_fingerprint: str


@dataclass(frozen=True, kw_only=True)
class SagaMigrated(Event):
    """An operator moved the running saga from ``from_version`` of its definition to ``to_version`` (of shape
    ``to_fingerprint``): every later event is decided by that version. Itself decided under ``from_version``."""

    from_version: int
    to_version: int
    to_fingerprint: str
    operator: str | None = None
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class SagaCompleted(Event):
    pass


@dataclass(frozen=True, kw_only=True)
class SagaFailed(Event):
    reason: str
    failed_step: str | None


@dataclass(frozen=True, kw_only=True)
class SagaCompensated(Event):
    reason: str
    failed_step: str | None


@dataclass(frozen=True, kw_only=True)
class SagaCompensationFailed(Event):
    step: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class SagaCancelled(Event):
    reason: str


@dataclass(frozen=True, kw_only=True)
class SagaTerminated(Event):
    """An operator ended the saga as it stood, without compensating (settled by hand)."""

    reason: str


@dataclass(frozen=True, kw_only=True)
class SagaCompletedWithFailures(Event):
    failed_steps: tuple[str, ...] = field(default=())


@dataclass(frozen=True, kw_only=True)
class SagaPurged(Event):
    """Events 1..purged_through_seq of an ended saga were deleted (retention); this stands in for them."""

    saga_type: str
    final_status: str
    ended_at: int
    purged_through_seq: int
    purged_digest: str
    operator: str | None = None


TERMINAL_EVENTS: tuple[type[Event], ...] = (
    SagaCompleted,
    SagaFailed,
    SagaCompensated,
    SagaCompensationFailed,
    SagaCancelled,
    SagaCompletedWithFailures,
    SagaTerminated,
)

EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (
        SagaStarted,
        SagaRejected,
        StepCommandSent,
        StepSucceeded,
        StepFailed,
        StepTimedOut,
        StepRetryScheduled,
        StepSkipped,
        StepWithdrawn,
        SignalAwaited,
        SignalReceived,
        SignalRefused,
        CompensationSent,
        StepCompensated,
        CompensationFailed,
        CompensationTimedOut,
        CompensationRetryScheduled,
        SagaCompensationStarted,
        SagaCancelRequested,
        SagaCancelRefused,
        OperatorAction,
        OperatorActionRefused,
        SagaQuarantined,
        SagaReleased,
        PatchTaken,
        SagaMigrated,
        *TERMINAL_EVENTS,
        SagaPurged,
    )
}
