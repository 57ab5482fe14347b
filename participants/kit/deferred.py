"""Answers that come later: a handler returns ``Deferred`` (say, it asked a human), and ``complete`` answers
the command afterwards, from any process, in the caller's own transaction.

While a command waits, its idempotency key is recorded as AWAITING and the command sits in
``<schema>.awaiting_commands``; a redelivery (a retry after the step's timeout) sends nothing and only moves
the awaited attempt on, so the answer carries the attempt the orchestrator waits for. ``complete`` records the
final outcome under the key and writes the reply into the participant's outbox, where its relay finds it.
The step's ``timeout_ms`` and retries bound how long the saga waits. When the saga compensates the step
before it was answered, the wait is withdrawn (recorded as a ``Withdrawn`` failure): a later answer is refused.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from ...outbox.table import write_outbox
from ...schemas.ids import forward_key
from ...schemas.message_types import CommandKind
from ...schemas.topics import Topics
from .outcome import Failed, ReceivedCommand, Succeeded
from .participant import Participant
from .replies import RecordedReply, outcome_message


@dataclass(frozen=True)
class AwaitingCommand:
    """A command whose answer is outstanding."""

    idempotency_key: str
    saga_id: str
    step: str
    action: str
    attempt: int
    deferred_at_ms: int


async def await_answers(conn: asyncpg.Connection, participant: Participant,
                        commands: Sequence[ReceivedCommand]) -> None:
    """Record ``commands`` as awaiting their answer; for one already waiting, a later attempt becomes the one
    the answer will carry."""
    if not commands:
        return
    await conn.execute(
        f"""INSERT INTO {participant.awaiting_table} AS a (idempotency_key, saga_id, saga_type, step, kind, action,
                                                         attempt, command_message_id, traceparent)
            SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                                 $7::int[], $8::text[], $9::text[])
            ON CONFLICT (idempotency_key) DO UPDATE
            SET attempt = EXCLUDED.attempt, command_message_id = EXCLUDED.command_message_id,
                traceparent = EXCLUDED.traceparent
            WHERE EXCLUDED.attempt > a.attempt""",
        [c.idempotency_key for c in commands], [c.saga_id for c in commands], [c.saga_type for c in commands],
        [c.step for c in commands], [c.kind.value for c in commands], [c.action for c in commands],
        [c.attempt for c in commands], [c.message_id for c in commands], [c.traceparent for c in commands],
    )


WITHDRAWN = "Withdrawn"


async def withdraw(conn: asyncpg.Connection, participant: Participant,
                   compensations: Sequence[ReceivedCommand]) -> None:
    """The saga is undoing these steps: their forward commands no longer await an answer (nothing is replied;
    the orchestrator stopped waiting)."""
    keys = [forward_key(c.saga_id, c.step) for c in compensations if c.kind is CommandKind.COMPENSATE]
    if not keys:
        return
    await conn.execute(
        f"""WITH gone AS (DELETE FROM {participant.awaiting_table} WHERE idempotency_key = ANY($1::text[])
                          RETURNING idempotency_key)
            UPDATE {participant.processed_table} AS p
            SET status = 'FAILED', error_type = '{WITHDRAWN}', processed_at = now(),
                error_message = 'the saga compensated this step before it was answered'
            FROM gone WHERE p.idempotency_key = gone.idempotency_key""",
        keys,
    )


async def complete(conn: asyncpg.Connection, participant: Participant, topics: Topics, idempotency_key: str,
                   outcome: Succeeded | Failed) -> bool:
    """Answer a deferred command with ``outcome`` in ``conn``'s transaction (open one to make a business change
    in the same commit); False when the key is not awaiting an answer (unknown, or answered already)."""
    if isinstance(outcome, Failed) and outcome.retryable:
        raise ValueError("a deferred answer is definitive: give Succeeded or a non-retryable Failed")
    async with conn.transaction():  # a savepoint inside the caller's transaction
        row = await conn.fetchrow(
            f"DELETE FROM {participant.awaiting_table} WHERE idempotency_key = $1 RETURNING *", idempotency_key)
        if row is None:
            return False
        command = ReceivedCommand(
            saga_id=row["saga_id"], saga_type=row["saga_type"], step=row["step"], action=row["action"],
            kind=CommandKind(row["kind"]), idempotency_key=idempotency_key, attempt=row["attempt"],
            input_type="", message_id=row["command_message_id"], traceparent=row["traceparent"],
        )
        recorded = RecordedReply.of(outcome)
        await conn.execute(
            f"""UPDATE {participant.processed_table}
                SET status = $2, error_type = $3, error_message = $4, output = $5, processed_at = now()
                WHERE idempotency_key = $1""",
            idempotency_key, recorded.status, recorded.error_type, recorded.error_message, recorded.output,
        )
        reply = outcome_message(command, topics.results(participant.name),
                                outcome, time.time_ns() // 1_000_000)
        await write_outbox(conn, participant.outbox_table, [reply])
    return True


async def awaiting(conn: asyncpg.Connection | asyncpg.Pool, participant: Participant,
                   saga_id: str | None = None) -> list[AwaitingCommand]:
    """The commands awaiting an answer (of one saga, when given), oldest first."""
    rows = await conn.fetch(
        f"""SELECT idempotency_key, saga_id, step, action, attempt,
                   (extract(epoch FROM deferred_at) * 1000)::bigint AS deferred_at_ms
            FROM {participant.awaiting_table} WHERE $1::text IS NULL OR saga_id = $1
            ORDER BY deferred_at, idempotency_key""",
        saga_id,
    )
    return [AwaitingCommand(**dict(row)) for row in rows]
