"""A delivery on a participant's command topic, read before any transaction: the StepCommand (and the saga
input it carries) or WithdrawStep it holds, checked for what no store could key on or hold; or why it cannot be
run, and the DeadLetter row that parks it."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ...infra.logging import saga_trace
from ...outbox.dead_letter_row import dead_letter_message
from ...outbox.table import OutboxMessage
from ...schemas import wire
from ...schemas.codec import WireError
from ...schemas.headers import MESSAGE_ID, SAGA_ID, SAGA_TYPE, TRACEPARENT, valid_traceparent
from ...schemas.ids import forward_key
from ...schemas.limits import MAX_MESSAGE_ID_BYTES, id_problem, nul_field
from ...schemas.message_types import CommandKind, StepCommand, WithdrawStep
from ...schemas.records import ConsumedRecord
from ...schemas.registry import default_registry
from ...schemas.topics import Topics
from .outcome import ReceivedCommand
from .participant import Participant

log = logging.getLogger(__name__)


def decode_command(participant: str, record: ConsumedRecord, message_id: str
                   ) -> tuple[ReceivedCommand, dict[str, Any]]:
    """Decode a StepCommand and its embedded saga input; raises on anything malformed, including ids no
    store can key on and texts Postgres cannot hold (they would fail every redelivery's transaction)."""
    command = _step_command(participant, record, message_id)
    if isinstance(command, WithdrawStep):
        raise WireError("a WithdrawStep where a StepCommand was expected")
    input_type, saga_input = _saga_input(command)
    return _received(command, record, message_id, input_type), saga_input


def _step_command(participant: str, record: ConsumedRecord, message_id: str) -> StepCommand | WithdrawStep:
    """The StepCommand (its input not read yet) or WithdrawStep of ``record``, its ids checked."""
    if record.value is None:
        raise WireError("empty value (tombstone) where a StepCommand was expected")
    command = wire.decode_participant_command(record.value, participant=participant, message_id=message_id)
    problem = (("saga_id is empty" if not command.saga_id else None)
               or id_problem(command.saga_id, "saga_id")
               or id_problem(command.idempotency_key, "idempotency_key", MAX_MESSAGE_ID_BYTES))
    if isinstance(command, WithdrawStep) and command.idempotency_key != forward_key(command.saga_id, command.step):
        problem = problem or (f"a WithdrawStep of key {command.idempotency_key!r} for step {command.step!r} of saga "
                              f"{command.saga_id!r}: only that step's own forward key may be withdrawn")
    field = nul_field({f.name: getattr(command, f.name) for f in dataclasses.fields(command) if f.name != "input"})
    if problem or field:
        raise WireError(problem or f"{field} contains a NUL character")
    return command


def _saga_input(command: StepCommand) -> tuple[str, dict[str, Any]]:
    """The saga input a command carries: its record's full name and its fields."""
    input_type, saga_input = default_registry().decode(command.input)
    field = nul_field(saga_input)
    if field:
        raise WireError(f"{field} contains a NUL character")
    return input_type, saga_input


def _received(command: StepCommand, record: ConsumedRecord, message_id: str, input_type: str) -> ReceivedCommand:
    return ReceivedCommand(
        saga_id=command.saga_id,
        saga_type=command.saga_type,
        step=command.step,
        action=command.action,
        kind=command.kind,
        idempotency_key=command.idempotency_key,
        attempt=command.attempt,
        input_type=input_type,
        message_id=message_id,
        traceparent=valid_traceparent(record.header(TRACEPARENT)),
        step_outputs=MappingProxyType(dict(command.step_outputs)),
        expires_at=command.expires_at,
        timeout_ms=command.timeout_ms,
    )


def _received_withdrawal(withdrawal: WithdrawStep, record: ConsumedRecord, message_id: str) -> ReceivedCommand:
    return ReceivedCommand(
        saga_id=withdrawal.saga_id, saga_type=withdrawal.saga_type, step=withdrawal.step, action=withdrawal.action,
        kind=CommandKind.FORWARD, idempotency_key=withdrawal.idempotency_key, attempt=withdrawal.attempt,
        input_type="", message_id=message_id, traceparent=valid_traceparent(record.header(TRACEPARENT)),
        withdrawal=True, withdrawn_because=withdrawal.reason,
    )


@dataclass(frozen=True)
class ParsedDelivery:
    """A delivery checked before any transaction: the command to run; or (``command`` None) why it can only be
    dead-lettered; or (``command`` and ``reason``) why it is answered ``Unprocessable`` and dead-lettered: its
    input record cannot be read here."""

    message_id: str
    command: ReceivedCommand | None = None
    saga_input: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    superseded: bool = False  # a forward command withdrawn later in its own batch: it neither runs nor answers

    @property
    def runnable(self) -> bool:
        return self.command is not None and not self.reason and not self.command.withdrawal


def parse_delivery(participant: Participant, record: ConsumedRecord) -> ParsedDelivery:
    """Decode and check one delivery; anything unusable gets the reason it goes to the DLQ instead."""
    message_id = record.header(MESSAGE_ID) or record.position_id
    if record.unreadable is not None:
        return ParsedDelivery(message_id, reason=record.unreadable)
    try:
        reason = id_problem(message_id, "message_id header", MAX_MESSAGE_ID_BYTES)
        command = _step_command(participant.name, record, message_id)
    except Exception as exc:  # anything undecodable is a poison message: park it, never crash
        return ParsedDelivery(message_id, reason=f"undecodable StepCommand: {type(exc).__name__}: {exc}")
    reason = reason or key_problem(record, command.saga_id)
    if reason:
        return ParsedDelivery(message_id, reason=reason)
    if isinstance(command, WithdrawStep):
        return ParsedDelivery(message_id, _received_withdrawal(command, record, message_id))
    try:
        input_type, saga_input = _saga_input(command)
    except Exception as exc:  # the command is readable, its input is not: answered, so the saga moves on
        received = _received(command, record, message_id, input_type="")
        return ParsedDelivery(message_id, received, reason=(
            f"participant {participant.name} cannot read the command's input record ({type(exc).__name__}: "
            f"{exc}); its schema must be in the worker's SAGA_SCHEMA_PATH"))
    return ParsedDelivery(message_id, _received(command, record, message_id, input_type), saga_input)


def park(participant: Participant, topics: Topics, parsed: ParsedDelivery, record: ConsumedRecord,
         now_ms: int) -> OutboxMessage:
    """The DeadLetter outbox row of an unusable delivery (logged)."""
    saga_id = record.header(SAGA_ID)
    with saga_trace(valid_traceparent(record.header(TRACEPARENT))):
        log.warning("dead-lettered a command", extra={"participant": participant.name, "saga_id": saga_id,
                                                      "message_id": parsed.message_id, "reason": parsed.reason})
    return dead_letter_message(topics.dlq, record, reason=parsed.reason, consumer=participant.consumer_name,
                               now_ms=now_ms, saga_id=saga_id, saga_type=record.header(SAGA_TYPE))


def key_problem(record: ConsumedRecord, saga_id: str) -> str | None:
    """A command's Kafka key must be its saga id (checked for consumed records, whose key is known)."""
    if not record.has_position or record.key == saga_id.encode():
        return None
    if record.key is None:
        return "missing Kafka key: the key must be the saga id (UTF-8)"
    return f"Kafka key {record.key[:600]!r} differs from saga_id {saga_id!r}"
