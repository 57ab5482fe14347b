"""Outbox messages a participant writes: StepResult replies and DeadLetter records."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...orchestrator import wire
from ...orchestrator.domain.limits import MAX_MESSAGE_ID_BYTES, MAX_SAGA_ID_BYTES, id_problem
from ...outbox.message import OutboxMessage
from ...schemas.registry import SchemaRegistry
from .outcome import Deferred, Failed, Outcome, ReceivedCommand, Succeeded

STEP_COMMAND = "saga.v1.StepCommand"
STEP_RESULT = "saga.v1.StepResult"
DEAD_LETTER = "saga.v1.DeadLetter"

HeaderValue = bytes | str | None
HeadersArg = Mapping[str, HeaderValue] | Sequence[tuple[str, HeaderValue]] | None


def header_pairs(headers: HeadersArg) -> list[tuple[str, bytes | None]]:
    """Kafka headers as (key, raw bytes) pairs, whatever shape the client handed them over in."""
    if headers is None:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    pairs: list[tuple[str, bytes | None]] = []
    for key, value in items:
        pairs.append((key, value.encode() if isinstance(value, str) else value))
    return pairs


def header_text(pairs: Sequence[tuple[str, bytes | None]], name: str) -> str | None:
    """The last value of header ``name`` as text, or None when absent or not UTF-8."""
    for key, value in reversed(pairs):
        if key == name and value is not None:
            try:
                return value.decode()
            except UnicodeDecodeError:
                return None
    return None


AWAITING = "AWAITING"


def reply_message_id(idempotency_key: str, attempt: int) -> str:
    """Frozen format of a participant reply's message id: one per (key, attempt) delivery."""
    return f"{idempotency_key}:reply:{attempt}"


@dataclass(frozen=True)
class RecordedReply:
    """The final outcome stored with an idempotency key, replayed on redelivery."""

    status: str  # SUCCEEDED | FAILED, or AWAITING while a deferred answer is outstanding
    error_type: str | None
    error_message: str | None
    output: bytes | None

    @classmethod
    def of(cls, outcome: Outcome) -> RecordedReply:
        if isinstance(outcome, Succeeded):
            return cls("SUCCEEDED", None, None, outcome.output)
        if isinstance(outcome, Failed):
            return cls("FAILED", outcome.error_type, outcome.message, None)
        return cls(AWAITING, None, None, None)

    @property
    def awaiting(self) -> bool:
        """The handler deferred its answer: there is nothing to reply yet."""
        return self.status == AWAITING


def step_result_message(
    registry: SchemaRegistry,
    command: ReceivedCommand,
    results_topic: str,
    reply: RecordedReply,
    *,
    retryable: bool = False,
    available_at: int | None = None,
) -> OutboxMessage:
    """The ``saga.v1.StepResult`` answering ``command`` (this delivery's attempt), as an outbox row."""
    value = registry.encode(
        STEP_RESULT,
        {
            "saga_id": command.saga_id,
            "step": command.step,
            "kind": command.kind.value,
            "idempotency_key": command.idempotency_key,
            "attempt": command.attempt,
            "status": reply.status,
            "retryable": retryable,
            "error_type": reply.error_type,
            "error_message": reply.error_message,
            "output": reply.output,
        },
    )
    message_id = reply_message_id(command.idempotency_key, command.attempt)
    return OutboxMessage(
        topic=results_topic,
        key=command.saga_id,
        value=value,
        headers={
            "message_id": message_id,
            "causation_id": command.message_id,
            "saga_id": command.saga_id,
            "saga_type": command.saga_type,
            **({"traceparent": command.traceparent} if command.traceparent else {}),
        },
        message_id=message_id,
        available_at=available_at,
    )


def outcome_message(
    registry: SchemaRegistry, command: ReceivedCommand, results_topic: str, outcome: Outcome, now_ms: int
) -> OutboxMessage:
    """Reply for a freshly handled command, honouring the outcome's reply delay (never for ``Deferred``)."""
    if isinstance(outcome, Deferred):
        raise ValueError("a deferred command is answered later, by participants.kit.deferred.complete")
    delay = outcome.reply_delay_ms
    return step_result_message(
        registry,
        command,
        results_topic,
        RecordedReply.of(outcome),
        retryable=isinstance(outcome, Failed) and outcome.retryable,
        available_at=now_ms + delay if delay > 0 else None,
    )


@dataclass(frozen=True, kw_only=True)
class Delivery:
    """Where a Kafka message came from; partition/offset are -1 when the caller does not know them."""

    topic: str
    partition: int = -1
    offset: int = -1
    key: bytes | None = None


def dead_letter_message(
    registry: SchemaRegistry,
    *,
    dlq_topic: str,
    consumer: str,
    reason: str,
    delivery: Delivery,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
    now_ms: int,
) -> OutboxMessage:
    """A ``saga.v1.DeadLetter`` carrying the rejected message's bytes, headers and key.

    The row always fits the DLQ topic: the letter sheds what is too large (``wire.encode_dead_letter``), and
    only usable ids from the message's headers reach the row's key and headers.
    """
    saga_id = _usable(header_text(headers, "saga_id"))
    if delivery.offset >= 0:
        message_id = f"dlq:{delivery.topic}:{delivery.partition}:{delivery.offset}"
        fallback_id = f"{delivery.topic}:{delivery.partition}:{delivery.offset}"
    else:  # no offset known (direct call): a content hash keeps the id stable across retries
        digest = hashlib.sha256(value or b"").hexdigest()[:32]
        message_id = f"dlq:{delivery.topic}:{digest}"
        fallback_id = f"{delivery.topic}:{digest}"
    letter = wire.DeadLetter(
        source_topic=delivery.topic, source_partition=delivery.partition, source_offset=delivery.offset,
        consumer=consumer, reason=reason, failed_at=now_ms, saga_id=saga_id, original_key=delivery.key,
        original_value=value, original_headers=tuple(headers),
    )
    out_headers = {
        "message_id": message_id,
        "causation_id": _usable(header_text(headers, "message_id"), MAX_MESSAGE_ID_BYTES) or fallback_id,
    }
    if saga_id is not None:
        out_headers["saga_id"] = saga_id
    saga_type = _usable(header_text(headers, "saga_type"))
    if saga_type is not None:
        out_headers["saga_type"] = saga_type
    key = saga_id if saga_id is not None else _usable((delivery.key or b"").decode("utf-8", "replace")) or ""
    return OutboxMessage(topic=dlq_topic, key=key, value=wire.encode_dead_letter(letter, registry),
                         headers=out_headers, message_id=message_id)


def _usable(text: str | None, limit: int = MAX_SAGA_ID_BYTES) -> str | None:
    return text if text is not None and id_problem(text, "id", limit) is None else None
