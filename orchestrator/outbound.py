"""Outgoing Kafka messages of the orchestrator, as outbox rows (topic, key, value, headers, message id)."""

from __future__ import annotations

from orchestrator import wire
from orchestrator.domain.events import Event
from orchestrator.domain.messages import StepCommand
from orchestrator.envelope import RawRecord
from outbox.message import OutboxMessage
from schemas.codec import default_registry
from schemas.topics import Topics

DEAD_LETTER_SCHEMA = "saga.v1.DeadLetter"


def _headers(message_id: str, causation_id: str | None, saga_id: str | None,
             saga_type: str | None) -> dict[str, str]:
    headers = {"message_id": message_id}
    if causation_id:
        headers["causation_id"] = causation_id
    if saga_id is not None:
        headers["saga_id"] = saga_id
    if saga_type:
        headers["saga_type"] = saga_type
    return headers


def event_message(topics: Topics, event: Event, body: bytes, saga_type: str | None,
                  causation_id: str) -> OutboxMessage:
    """The outbox row that publishes ``event`` on saga.events (message id frozen: ``{saga}:event:{seq}``)."""
    message_id = f"{event.saga_id}:event:{event.seq}"
    return OutboxMessage(topic=topics.events, key=event.saga_id, value=body,
                         headers=_headers(message_id, causation_id, event.saga_id, saga_type),
                         message_id=message_id)


def command_message(topics: Topics, command: StepCommand, causation_id: str) -> OutboxMessage:
    """The outbox row that sends ``command`` to its participant's commands topic."""
    return OutboxMessage(topic=topics.commands(command.participant), key=command.saga_id,
                         value=wire.encode_command(command),
                         headers=_headers(command.message_id, causation_id, command.saga_id, command.saga_type),
                         message_id=command.message_id)


def dead_letter_message(topics: Topics, raw: RawRecord, reason: str, saga_id: str | None,
                        consumer: str, now_ms: int) -> OutboxMessage:
    """The outbox row that parks ``raw`` on saga.dlq with the reason and its original bytes and headers."""
    message_id = f"dlq:{raw.topic}:{raw.partition}:{raw.offset}"
    record = {
        "source_topic": raw.topic,
        "source_partition": raw.partition,
        "source_offset": raw.offset,
        "consumer": consumer,
        "reason": reason,
        "saga_id": saga_id,
        "original_key": raw.key,
        "original_value": raw.value,
        "original_headers": [{"key": key, "value": value} for key, value in raw.headers],
        "failed_at": now_ms,
    }
    key = saga_id if saga_id is not None else (raw.key or b"").decode("utf-8", errors="replace")
    return OutboxMessage(topic=topics.dlq, key=key,
                         value=default_registry().encode(DEAD_LETTER_SCHEMA, record),
                         headers=_headers(message_id, raw.header("message_id"), saga_id, None),
                         message_id=message_id)
