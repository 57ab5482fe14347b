"""Outgoing Kafka messages of the orchestrator, as outbox rows (topic, key, value, headers, message id)."""

from __future__ import annotations

from ..outbox.message import OutboxMessage
from ..schemas.topics import Topics
from . import wire
from .domain.events import Event
from .domain.limits import MAX_MESSAGE_ID_BYTES, MAX_SAGA_ID_BYTES, id_problem
from .domain.messages import StepCommand
from .envelope import RawRecord


def _headers(message_id: str, causation_id: str | None, saga_id: str | None,
             saga_type: str | None, traceparent: str | None = None) -> dict[str, str]:
    headers = {"message_id": message_id}
    if traceparent:
        headers["traceparent"] = traceparent
    if causation_id:
        headers["causation_id"] = causation_id
    if saga_id is not None:
        headers["saga_id"] = saga_id
    if saga_type:
        headers["saga_type"] = saga_type
    return headers


def event_message(topics: Topics, event: Event, body: bytes, saga_type: str | None,
                  causation_id: str, traceparent: str | None = None) -> OutboxMessage:
    """The outbox row that publishes ``event`` on saga.events (message id frozen: ``{saga}:event:{seq}``)."""
    message_id = f"{event.saga_id}:event:{event.seq}"
    return OutboxMessage(topic=topics.events, key=event.saga_id, value=body,
                         headers=_headers(message_id, causation_id, event.saga_id, saga_type, traceparent),
                         message_id=message_id)


def command_message(topics: Topics, command: StepCommand, causation_id: str,
                    traceparent: str | None = None) -> OutboxMessage:
    """The outbox row that sends ``command`` to its participant's commands topic."""
    return OutboxMessage(topic=topics.commands(command.participant), key=command.saga_id,
                         value=wire.encode_command(command),
                         headers=_headers(command.message_id, causation_id, command.saga_id, command.saga_type,
                                          traceparent),
                         message_id=command.message_id)


def dead_letter_message(topics: Topics, raw: RawRecord, reason: str, saga_id: str | None,
                        consumer: str, now_ms: int) -> OutboxMessage:
    """The outbox row that parks ``raw`` on saga.dlq with the reason and its original bytes and headers.

    The row always fits the topic: the letter sheds what is too large (``wire.encode_dead_letter``), and its
    key and headers carry only usable ids (the raw record's may be anything).
    """
    message_id = f"dlq:{raw.topic}:{raw.partition}:{raw.offset}"
    letter = wire.DeadLetter(
        source_topic=raw.topic, source_partition=raw.partition, source_offset=raw.offset, consumer=consumer,
        reason=reason, failed_at=now_ms, saga_id=saga_id, original_key=raw.key, original_value=raw.value,
        original_headers=raw.headers,
    )
    saga_id = _usable(saga_id)
    causation_id = _usable(raw.header("message_id"), MAX_MESSAGE_ID_BYTES)
    key = saga_id if saga_id is not None else _usable((raw.key or b"").decode("utf-8", errors="replace")) or ""
    return OutboxMessage(topic=topics.dlq, key=key, value=wire.encode_dead_letter(letter),
                         headers=_headers(message_id, causation_id, saga_id, None),
                         message_id=message_id)


def _usable(text: str | None, limit: int = MAX_SAGA_ID_BYTES) -> str | None:
    return text if text is not None and id_problem(text, "id", limit) is None else None
