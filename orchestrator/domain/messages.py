"""What the core reacts to: the contract's incoming messages, records that are none, and the durable timers
it arms itself.

The messages that travel on Kafka (StartSaga, CancelSaga, ResumeCompensation, ReleaseSaga, OperateSaga,
StepResult) and the
commands the core emits (StepCommand) are the contract's, in ``schemas.message_types``; timers (``builder.Timer``,
armed by a decision) never leave the orchestrator.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...schemas.message_types import (
    CancelSaga,
    OperateSaga,
    ReleaseSaga,
    ResumeCompensation,
    SignalSaga,
    StartSaga,
    StepResult,
)
from .builder import Timer


@dataclass(frozen=True, kw_only=True)
class TimerFired:
    """Incoming: a durable timer came due."""

    timer: Timer

    @property
    def saga_id(self) -> str:
        return self.timer.saga_id


@dataclass(frozen=True, kw_only=True)
class RejectedRecord:
    """Incoming: a consumed record that is no acceptable message (undecodable, on the wrong topic, an unknown
    saga type, ...), refused at the door for ``reason``. It is dead-lettered, and recorded as SagaRejected in
    the stream of the saga it names when its saga id is usable (``saga_id`` None: it names none)."""

    saga_id: str | None
    saga_type: str | None
    reason: str


IncomingMessage = (StartSaga | CancelSaga | StepResult | TimerFired | ResumeCompensation | ReleaseSaga
                   | OperateSaga | SignalSaga | RejectedRecord)
