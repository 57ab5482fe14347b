"""Handle one StepCommand delivery: dedupe by idempotency key, change business data, reply via outbox.

Everything for one delivery happens in ONE local Postgres transaction, so the recorded outcome, the
business change and the reply commit (or vanish) together; the caller acknowledges the Kafka message
only after this returns. Redelivery is normal and harmless: a recorded key gets its recorded reply again.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import asyncpg

from ...infra.faults import crash_point
from ...outbox.dead_letters import dead_letter_message
from ...outbox.table import OutboxMessage, write_outbox
from ...schemas import wire
from ...schemas.codec import WireError
from ...schemas.headers import MESSAGE_ID, SAGA_ID, SAGA_TYPE, TRACEPARENT, valid_traceparent
from ...schemas.limits import MAX_MESSAGE_ID_BYTES, id_problem, nul_field
from ...schemas.records import ConsumedRecord
from ...schemas.registry import default_registry
from ...schemas.topics import Topics
from .deferred import await_answers, withdraw
from .outcome import Deferred, Failed, Outcome, ReceivedCommand
from .participant import Participant
from .replies import RecordedReply, outcome_message, step_result_message

log = logging.getLogger(__name__)

# Errors that mean the connection or server is unusable, not that the handler failed.
_DATABASE_GONE = (
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.InterfaceError,
    OSError,
)


class Disposition(StrEnum):
    """What happened to one delivery (for logs, metrics and tests)."""

    RECORDED = "recorded"  # handled; the final outcome (success or definitive failure) is recorded
    TRANSIENT = "transient"  # retryable failure replied; nothing recorded, business change rolled back
    DUPLICATE = "duplicate"  # key already recorded: the recorded reply was sent again
    DEAD_LETTERED = "dead_lettered"  # undecodable: a DeadLetter went to the DLQ topic
    AWAITING = "awaiting"  # the handler deferred its answer (or it is still outstanding): nothing replied


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Undo(Exception):
    """Raised inside the handler's savepoint to roll back its business change, carrying the outcome."""

    def __init__(self, outcome: Failed) -> None:
        super().__init__(outcome.error_type)
        self.outcome = outcome


def decode_command(participant: str, record: ConsumedRecord, message_id: str
                   ) -> tuple[ReceivedCommand, dict[str, Any]]:
    """Decode a StepCommand and its embedded saga input; raises on anything malformed, including ids no
    store can key on and texts Postgres cannot hold (they would fail every redelivery's transaction)."""
    if record.value is None:
        raise WireError("empty value (tombstone) where a StepCommand was expected")
    command = wire.decode_command(record.value, participant=participant, message_id=message_id)
    input_type, saga_input = default_registry().decode(command.input)
    problem = (("saga_id is empty" if not command.saga_id else None)
               or id_problem(command.saga_id, "saga_id")
               or id_problem(command.idempotency_key, "idempotency_key", MAX_MESSAGE_ID_BYTES))
    field = (nul_field({f.name: getattr(command, f.name) for f in dataclasses.fields(command) if f.name != "input"})
             or nul_field(saga_input))
    if problem or field:
        raise WireError(problem or f"{field} contains a NUL character")
    received = ReceivedCommand(
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
    )
    return received, saga_input


async def handle_command(
    pool: asyncpg.Pool,
    participant: Participant,
    topics: Topics,
    record: ConsumedRecord,
    *,
    clock: Callable[[], int] = _now_ms,
) -> Disposition:
    """Process one delivery of a command for ``participant``; never raises for a bad message.

    Raises only when Postgres is unreachable (the caller retries the same delivery, unacknowledged).
    """
    parsed = parse_delivery(participant, record)
    if parsed.command is None:
        dead_letter = park(participant, topics, parsed, record, clock())
        async with pool.acquire() as conn, conn.transaction():
            await write_outbox(conn, participant.outbox_table, [dead_letter])
        return Disposition.DEAD_LETTERED
    command, saga_input = parsed.command, parsed.saga_input

    results_topic = topics.results(participant.name)
    async with pool.acquire() as conn, conn.transaction():
        claimed = await conn.fetchval(
            f"""INSERT INTO {participant.processed_table} AS p
                    (idempotency_key, saga_id, step, kind, action, attempt, status)
                VALUES ($1, $2, $3, $4, $5, $6, 'PENDING')
                {REOPEN_FAILED_ON_A_LATER_ATTEMPT}
                RETURNING true""",
            command.idempotency_key, command.saga_id, command.step, command.kind.value,
            command.action, command.attempt,
        )
        if not claimed:
            # A concurrent holder of the key made this INSERT wait for its commit; the row is final now.
            row = await conn.fetchrow(
                f"""SELECT status, error_type, error_message, output
                    FROM {participant.processed_table} WHERE idempotency_key = $1""",
                command.idempotency_key,
            )
            if row is None:  # the other holder rolled back its claim between our two statements
                raise RuntimeError(f"idempotency key {command.idempotency_key} vanished; retry delivery")
            recorded = RecordedReply(row["status"], row["error_type"], row["error_message"], row["output"])
            if recorded.awaiting:  # still outstanding: the answer will carry this attempt
                await await_answers(conn, participant, [command])
                _log_outcome(participant, command, Disposition.AWAITING, recorded.status, None)
                return Disposition.AWAITING
            reply = step_result_message(command, results_topic, recorded)
            await write_outbox(conn, participant.outbox_table, [reply])
            _log_outcome(participant, command, Disposition.DUPLICATE, recorded.status, recorded.error_type)
            return Disposition.DUPLICATE

        await withdraw(conn, participant, [command])
        outcome = await _run_in_savepoint(conn, participant, command, saga_input)
        transient = isinstance(outcome, Failed) and outcome.retryable
        if transient:
            # Not recorded: the key stays free so a later attempt does the work.
            await conn.execute(
                f"DELETE FROM {participant.processed_table} WHERE idempotency_key = $1",
                command.idempotency_key,
            )
        else:
            recorded = RecordedReply.of(outcome)
            await conn.execute(
                f"""UPDATE {participant.processed_table}
                    SET status = $2, error_type = $3, error_message = $4, output = $5
                    WHERE idempotency_key = $1""",
                command.idempotency_key, recorded.status, recorded.error_type,
                recorded.error_message, recorded.output,
            )
        if isinstance(outcome, Deferred):
            await await_answers(conn, participant, [command])
        else:
            reply = outcome_message(command, results_topic, outcome, clock())
            await write_outbox(conn, participant.outbox_table, [reply])
    # Committed: the business change and the reply row exist, nothing is published or acknowledged yet.
    crash_point("participant.after_commit")
    disposition = (Disposition.TRANSIENT if transient else
                   Disposition.AWAITING if isinstance(outcome, Deferred) else Disposition.RECORDED)
    error_type = outcome.error_type if isinstance(outcome, Failed) else None
    _log_outcome(participant, command, disposition, RecordedReply.of(outcome).status, error_type)
    return disposition


# A key's recorded outcome answers every redelivery of its attempt. A definitive failure is taken up again by
# a later attempt of the key (a retry after a timeout, or `saga resume` after a human fixed the cause): a
# failure left no business change (its savepoint was rolled back), so running the handler again cannot apply
# anything twice. A recorded success answers every attempt, forever. (The INSERT names its table ``p``.)
REOPEN_FAILED_ON_A_LATER_ATTEMPT = """ON CONFLICT (idempotency_key) DO UPDATE
                SET attempt = EXCLUDED.attempt, status = 'PENDING', error_type = NULL, error_message = NULL,
                    output = NULL, processed_at = now()
                WHERE p.status = 'FAILED' AND p.attempt < EXCLUDED.attempt"""


@dataclass(frozen=True)
class ParsedDelivery:
    """A delivery checked before any transaction: the command to run, or (``command`` None) why not."""

    message_id: str
    command: ReceivedCommand | None = None
    saga_input: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


def parse_delivery(participant: Participant, record: ConsumedRecord) -> ParsedDelivery:
    """Decode and check one delivery; anything unusable gets the reason it goes to the DLQ instead."""
    message_id = record.header(MESSAGE_ID) or record.position_id
    try:
        reason = id_problem(message_id, "message_id header", MAX_MESSAGE_ID_BYTES)
        command, saga_input = decode_command(participant.name, record, message_id)
    except Exception as exc:  # anything undecodable is a poison message: park it, never crash
        return ParsedDelivery(message_id, reason=f"undecodable StepCommand: {type(exc).__name__}: {exc}")
    reason = reason or _key_problem(record, command.saga_id)
    if reason:
        return ParsedDelivery(message_id, reason=reason)
    return ParsedDelivery(message_id, command, saga_input)


def park(participant: Participant, topics: Topics, parsed: ParsedDelivery, record: ConsumedRecord,
         now_ms: int) -> OutboxMessage:
    """The DeadLetter outbox row of an unusable delivery (logged)."""
    saga_id = record.header(SAGA_ID)
    log.warning("dead-lettered a command", extra={"participant": participant.name, "saga_id": saga_id,
                                                  "message_id": parsed.message_id, "reason": parsed.reason})
    return dead_letter_message(topics.dlq, record, reason=parsed.reason, consumer=participant.consumer_name,
                               now_ms=now_ms, saga_id=saga_id, saga_type=record.header(SAGA_TYPE))


def _key_problem(record: ConsumedRecord, saga_id: str) -> str | None:
    """A command's Kafka key must be its saga id (checked for consumed records, whose key is known)."""
    if not record.has_position or record.key == saga_id.encode():
        return None
    if record.key is None:
        return "missing Kafka key: the key must be the saga id (UTF-8)"
    return f"Kafka key {record.key[:600]!r} differs from saga_id {saga_id!r}"


async def _run_in_savepoint(
    conn: asyncpg.Connection,
    participant: Participant,
    command: ReceivedCommand,
    saga_input: Mapping[str, Any],
) -> Outcome:
    """Run the handler in a savepoint; any failure rolls its business change back."""
    handler = participant.handler(command.action)
    if handler is None:
        return Failed("UnknownAction", f"{participant.name} has no action {command.action!r}")
    if not participant.reads(command):
        return Failed("UnsupportedInput", f"{participant.name} cannot read input {command.input_type}")
    try:
        async with conn.transaction():
            outcome = await handler(conn, command, saga_input)
            if isinstance(outcome, Failed):
                raise _Undo(outcome)  # a failed step must leave no business trace
        return outcome
    except _Undo as undo:
        return undo.outcome
    except _DATABASE_GONE:
        raise  # the database is gone: the delivery is retried, unacknowledged
    except Exception as exc:  # a handler bug or a data conflict: transient, so a retry gets a fresh chance
        log.exception(
            "handler raised", extra={"participant": participant.name, "saga_id": command.saga_id,
                                     "action": command.action, "idempotency_key": command.idempotency_key},
        )
        return Failed("ParticipantError", f"{type(exc).__name__}: {exc}", retryable=True)


def _log_outcome(
    participant: Participant,
    command: ReceivedCommand,
    disposition: Disposition,
    status: str,
    error_type: str | None,
) -> None:
    # A command that simply succeeded is routine (DEBUG); failures, duplicates and dead letters are not.
    level = logging.DEBUG if disposition is Disposition.RECORDED and status == "SUCCEEDED" else logging.INFO
    if not log.isEnabledFor(level):
        return
    log.log(
        level, "command %s", disposition.value,
        extra={
            "participant": participant.name,
            "saga_id": command.saga_id,
            "saga_type": command.saga_type,
            "step": command.step,
            "action": command.action,
            "idempotency_key": command.idempotency_key,
            "attempt": command.attempt,
            "status": status,
            "error_type": error_type,
            "disposition": disposition.value,
        },
    )
