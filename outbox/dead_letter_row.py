"""The outbox row that parks a consumed record on ``saga.dlq``: every service dead-letters through it."""

from __future__ import annotations

from ..schemas import wire
from ..schemas.headers import MESSAGE_ID, message_headers
from ..schemas.ids import dead_letter_message_id
from ..schemas.limits import MAX_MESSAGE_ID_BYTES, usable_id
from ..schemas.message_types import DeadLetter
from ..schemas.records import ConsumedRecord
from .table import OutboxMessage


def dead_letter_message(dlq_topic: str, record: ConsumedRecord, *, reason: str, consumer: str, now_ms: int,
                        saga_id: str | None = None, saga_type: str | None = None) -> OutboxMessage:
    """The ``saga.v1.DeadLetter`` of ``record``: why ``consumer`` could not handle it, with its original key,
    value and headers and where it came from.

    The row always fits the topic: the letter sheds what is too large (``wire.encode_dead_letter``), and its
    key and headers carry only usable ids (the record's own may be anything). Its causation id is the
    record's ``message_id`` header, or its position when it has no usable one.
    """
    saga_id = usable_id(saga_id)
    message_id = dead_letter_message_id(record.position_id)
    letter = DeadLetter(
        source_topic=record.topic, source_partition=record.partition, source_offset=record.offset,
        consumer=consumer, reason=reason, failed_at=now_ms, saga_id=saga_id, original_key=record.key,
        original_value=record.value, original_headers=record.headers,
    )
    causation_id = usable_id(record.header(MESSAGE_ID), MAX_MESSAGE_ID_BYTES) or record.position_id
    key = saga_id if saga_id is not None else usable_id((record.key or b"").decode("utf-8", "replace")) or ""
    headers = message_headers(message_id, causation_id=causation_id, saga_id=saga_id, saga_type=usable_id(saga_type))
    return OutboxMessage(topic=dlq_topic, key=key, value=wire.encode_dead_letter(letter), headers=headers,
                         message_id=message_id)
