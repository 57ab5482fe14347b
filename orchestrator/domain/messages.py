"""Messages the core reacts to (incoming) and the commands it emits (outgoing).

Field names follow the Avro records in ``schemas/`` so adapters map them mechanically.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class CommandKind(StrEnum):
    FORWARD = "FORWARD"
    COMPENSATE = "COMPENSATE"


class ResultStatus(StrEnum):
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class TimerKind(StrEnum):
    STEP_TIMEOUT = "STEP_TIMEOUT"
    STEP_RETRY = "STEP_RETRY"
    COMPENSATION_TIMEOUT = "COMPENSATION_TIMEOUT"
    COMPENSATION_RETRY = "COMPENSATION_RETRY"
    SAGA_DEADLINE = "SAGA_DEADLINE"


@dataclass(frozen=True, kw_only=True)
class StartSaga:
    """Incoming: start a saga (topic saga.start)."""

    saga_id: str
    saga_type: str
    tenant_id: str | None
    input: bytes
    traceparent: str | None = None  # the W3C trace context of its record (a header, not in the Avro body)


@dataclass(frozen=True, kw_only=True)
class CancelSaga:
    """Incoming: cancel a saga (topic saga.control)."""

    saga_id: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """Incoming: a participant's reply to a StepCommand (topic <participant>.results)."""

    saga_id: str
    step: str
    kind: CommandKind
    idempotency_key: str
    attempt: int
    status: ResultStatus
    retryable: bool = False
    error_type: str | None = None
    error_message: str | None = None
    output: bytes | None = None


@dataclass(frozen=True, kw_only=True)
class Timer:
    """A durable timer the orchestrator's scheduler fires at ``due_at`` (epoch ms)."""

    saga_id: str
    kind: TimerKind
    step: str
    attempt: int
    due_at: int

    @property
    def timer_id(self) -> str:
        return f"{self.kind}:{self.step}:{self.attempt}"


@dataclass(frozen=True, kw_only=True)
class TimerFired:
    """Incoming: a durable timer came due."""

    timer: Timer

    @property
    def saga_id(self) -> str:
        return self.timer.saga_id


@dataclass(frozen=True, kw_only=True)
class ResumeCompensation:
    """Incoming: an operator asks a COMPENSATION_FAILED saga to try its compensations again."""

    saga_id: str
    operator: str | None
    detail: str | None


IncomingMessage = StartSaga | CancelSaga | StepResult | TimerFired | ResumeCompensation


@dataclass(frozen=True, kw_only=True)
class StepCommand:
    """Outgoing: a command for a participant (topic <participant>.commands).

    ``participant`` and ``message_id`` travel outside the Avro body (topic name and header).
    """

    saga_id: str
    saga_type: str
    step: str
    participant: str
    action: str
    kind: CommandKind
    idempotency_key: str
    attempt: int
    input: bytes
    message_id: str
    step_outputs: tuple[tuple[str, bytes], ...] = ()  # (step, output) of its upstream steps, sorted
