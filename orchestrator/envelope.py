"""Incoming Kafka records as the orchestrator sees them: raw bytes plus, once parsed, a core message."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..schemas.records import ConsumedRecord
from .domain.messages import IncomingMessage, Timer, TimerFired, TimerKind
from .ports import TimerRow


@dataclass(frozen=True)
class Envelope:
    """A parsed message ready for the core, with the id the inbox dedupes on."""

    message: IncomingMessage
    message_id: str
    raw: ConsumedRecord | None = None


@dataclass(frozen=True)
class Rejection:
    """A record that cannot be handled: it goes to the dead-letter topic with ``reason``."""

    raw: ConsumedRecord
    reason: str
    saga_id: str | None = None
    saga_type: str | None = None
    message_id: str = field(default="")


def timer_envelope(row: TimerRow) -> Envelope:
    """A due timer as a message; its id makes a second firing (another instance, a crash) a duplicate."""
    timer = Timer(saga_id=row.saga_id, kind=TimerKind(row.kind), step=row.step, attempt=row.attempt,
                  due_at=row.due_at_ms)
    return Envelope(message=TimerFired(timer=timer), message_id=f"timer:{row.saga_id}:{row.timer_id}")
