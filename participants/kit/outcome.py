"""What a participant handler receives and returns (pure data, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ...schemas.message_types import CommandKind


@dataclass(frozen=True, kw_only=True)
class ReceivedCommand:
    """A decoded ``saga.v1.StepCommand`` plus the delivery facts the kit needs for the reply."""

    saga_id: str
    saga_type: str
    step: str
    action: str
    kind: CommandKind
    idempotency_key: str
    attempt: int
    input_type: str  # full Avro name of the saga input record, e.g. saga.v1.trip.TripRequest
    message_id: str  # the command's message_id header: the causation id of the reply
    traceparent: str | None = None  # the command's W3C trace context header, passed on to the reply
    # Outputs of the steps it depends on (and, for a compensation, of its own forward step), by step name.
    step_outputs: Mapping[str, bytes] = field(default_factory=dict)
    expires_at: int | None = None  # a forward command picked up after this (epoch ms) is answered Expired, not run
    timeout_ms: int | None = None  # how long its handler (a deferred command: its answer) may take once picked up
    withdrawal: bool = False  # a WithdrawStep of the forward command under ``idempotency_key`` (``attempt``)
    withdrawn_because: str = ""  # a withdrawal's reason


@dataclass(frozen=True)
class Succeeded:
    """The business change is done; ``output`` is an optional participant-defined payload."""

    output: bytes | None = None
    reply_delay_ms: int = 0  # > 0 holds the reply back in the outbox (simulates a slow participant)


@dataclass(frozen=True)
class Failed:
    """The step did not happen. ``retryable`` = transient: not recorded, so a retry can do the work."""

    error_type: str
    message: str
    retryable: bool = False
    reply_delay_ms: int = 0


class StepFailed(Exception):
    """Raised by a typed handler (``kit.typed``) instead of returning ``Failed``: the step fails, for good unless
    ``retryable``, and the handler's changes are rolled back. (So a handler's return type names only its
    output.)"""

    def __init__(self, error_type: str, message: str = "", *, retryable: bool = False) -> None:
        super().__init__(f"{error_type}: {message}" if message else error_type)
        self.error_type = error_type
        self.message = message or error_type
        self.retryable = retryable

    def outcome(self) -> Failed:
        return Failed(self.error_type, self.message, self.retryable)


@dataclass(frozen=True)
class Deferred:
    """The handler made its change (e.g. recorded a request for a human) and the answer comes later, through
    ``participants.kit.deferred.complete``. No reply is sent now; a redelivery of the command waits too."""


Outcome = Succeeded | Failed | Deferred


@dataclass(frozen=True)
class Proceed:
    """Verdict of a pure business rule: go ahead with the change (optionally delaying the reply)."""

    reply_delay_ms: int = 0


Verdict = Proceed | Failed
