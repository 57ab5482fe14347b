"""Outgoing Kafka messages of the orchestrator, as outbox rows (topic, key, value, headers, message id)."""

from __future__ import annotations

from ..outbox.table import OutboxMessage
from ..schemas import wire
from ..schemas.event_types import Event
from ..schemas.headers import message_headers
from ..schemas.ids import event_message_id
from ..schemas.message_types import StepCommand
from ..schemas.topics import Topics


def event_message(topics: Topics, event: Event, body: bytes, saga_type: str | None,
                  causation_id: str, traceparent: str | None = None) -> OutboxMessage:
    """The outbox row that publishes ``event`` on saga.events."""
    message_id = event_message_id(event.saga_id, event.seq)
    return OutboxMessage(topic=topics.events, key=event.saga_id, value=body,
                         headers=message_headers(message_id, causation_id=causation_id, saga_id=event.saga_id,
                                                 saga_type=saga_type, traceparent=traceparent),
                         message_id=message_id)


def command_message(topics: Topics, command: StepCommand, causation_id: str,
                    traceparent: str | None = None) -> OutboxMessage:
    """The outbox row that sends ``command`` to its participant's commands topic."""
    return OutboxMessage(topic=topics.commands(command.participant), key=command.saga_id,
                         value=wire.encode_command(command),
                         headers=message_headers(command.message_id, causation_id=causation_id,
                                                 saga_id=command.saga_id, saga_type=command.saga_type,
                                                 traceparent=traceparent),
                         message_id=command.message_id)
