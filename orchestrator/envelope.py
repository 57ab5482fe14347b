"""Incoming Kafka records as the orchestrator sees them: raw bytes plus, once parsed, a core message."""

from __future__ import annotations

from dataclasses import dataclass, field

from .domain.messages import IncomingMessage, Timer, TimerFired, TimerKind
from .ports import TimerRow


@dataclass(frozen=True)
class RawRecord:
    """The original bytes of a consumed record, kept so a rejected one can be dead-lettered intact."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()

    def header(self, name: str) -> str | None:
        """The first header called ``name`` as text, or None when absent or not UTF-8."""
        for key, value in self.headers:
            if key == name and value is not None:
                try:
                    return value.decode("utf-8")
                except UnicodeDecodeError:
                    return None
        return None

    @property
    def position_id(self) -> str:
        """Identity of a record that carries no message_id header (frozen format)."""
        return f"{self.topic}:{self.partition}:{self.offset}"


@dataclass(frozen=True)
class Envelope:
    """A parsed message ready for the core, with the id the inbox dedupes on."""

    message: IncomingMessage
    message_id: str
    raw: RawRecord | None = None


@dataclass(frozen=True)
class Rejection:
    """A record that cannot be handled: it goes to the dead-letter topic with ``reason``."""

    raw: RawRecord
    reason: str
    saga_id: str | None = None
    saga_type: str | None = None
    message_id: str = field(default="")


def timer_envelope(row: TimerRow) -> Envelope:
    """A due timer as a message; its id makes a second firing (another instance, a crash) a duplicate."""
    timer = Timer(saga_id=row.saga_id, kind=TimerKind(row.kind), step=row.step, attempt=row.attempt,
                  due_at=row.due_at_ms)
    return Envelope(message=TimerFired(timer=timer), message_id=f"timer:{row.saga_id}:{row.timer_id}")
