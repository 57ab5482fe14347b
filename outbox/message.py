"""The unit an outbox holds: one Kafka record to publish after the writing transaction commits."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OutboxMessage:
    """A record for ``topic`` with Kafka key ``key``.

    ``message_id`` travels as the ``message_id`` header and stays the same if the relay publishes the row
    twice (after a crash), so consumers dedupe on it. ``available_at`` (epoch ms) delays publication until
    then; ``None`` means as soon as the transaction commits.
    """

    topic: str
    key: str
    value: bytes
    headers: dict[str, str]
    message_id: str
    available_at: int | None = None
