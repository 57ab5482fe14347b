"""A participant's ledger of the commands it handled: every statement on ``<schema>.processed_commands`` and
``<schema>.awaiting_commands``.

``processed_commands`` holds one row per idempotency key: PENDING while its transaction runs, then the
outcome a redelivery is answered with (SUCCEEDED, a definitive FAILED, or AWAITING while a deferred answer is
outstanding); a transient failure leaves no row, so a later attempt does the work. ``awaiting_commands`` holds
the commands whose answer comes later (``deferred.complete``), with what that answer needs.

Rows are deleted a retention after their command was handled (``record_pruner``): a command comes again after
a worker crash or a rebalance (seconds later), when the orchestrator retries a step whose reply it has not seen
(within that step's retry schedule), or when a consumer group whose offsets expired reads ``<p>.commands`` from
the beginning: never once the topic has dropped it. Compensations look the business record up, not this one.
A key still awaiting its deferred answer is kept, however old.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from ...infra.chores import CHORE_EVERY_S, DELETE_BATCH, Chore, delete_older_sql, delete_older_than
from ...outbox.table import OutboxMessage, insert_params, insert_sql
from ...schemas.ids import forward_key
from ...schemas.message_types import CommandKind
from .outcome import Failed, Outcome, ReceivedCommand, Succeeded
from .participant import Participant

AWAITING = "AWAITING"
FENCED = "COMPENSATED"
"""Status of a forward key whose step the saga compensated before the forward had an outcome here (or after
it failed): a tombstone. It is never taken up again, so a forward command that arrives later (a replay, a
zombie relay, a partition move) is answered FAILED with its error type and does not run."""
COMPENSATED = "Compensated"
"""error_type of the answer a fenced forward command gets."""
WITHDRAWN = "Withdrawn"
"""error_type of a fenced deferred command: its saga compensated the step before it was answered; and of the answer
to a WithdrawStep of a forward command that had not run here (``withdraw_forwards``)."""
ANSWER_TIMED_OUT = "AnswerTimedOut"
"""error_type of a deferred command whose answer did not come within the step's timeout (``expire_awaiting``)."""


def processed_commands_sql(schema: str) -> str:
    """DDL of ``<schema>.processed_commands``: one row per idempotency key that reached a final outcome."""
    return f"""
CREATE TABLE IF NOT EXISTS {schema}.processed_commands (
    idempotency_key text PRIMARY KEY,
    saga_id text NOT NULL,
    step text NOT NULL,
    kind text NOT NULL,
    action text NOT NULL,
    attempt integer NOT NULL,
    status text NOT NULL,
    error_type text,
    error_message text,
    output bytea,
    processed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS processed_commands_saga_id_idx ON {schema}.processed_commands (saga_id);
CREATE INDEX IF NOT EXISTS processed_commands_processed_at_idx ON {schema}.processed_commands (processed_at);
"""


def awaiting_commands_sql(schema: str) -> str:
    """DDL of ``<schema>.awaiting_commands``: the commands whose handler deferred its answer, with what the
    answer needs (the latest attempt, the saga type, the causation id and trace context of the command, and
    the outbox shard of its reply: the partition the command came from). Idempotent; adds ``shard`` to a
    table made before it (whose waits answer in shard 0)."""
    return f"""
CREATE TABLE IF NOT EXISTS {schema}.awaiting_commands (
    idempotency_key text PRIMARY KEY,
    saga_id text NOT NULL,
    saga_type text NOT NULL,
    step text NOT NULL,
    kind text NOT NULL,
    action text NOT NULL,
    attempt integer NOT NULL,
    command_message_id text NOT NULL,
    traceparent text,
    deferred_at timestamptz NOT NULL DEFAULT now(),
    shard integer NOT NULL DEFAULT 0,
    answer_by timestamptz
);
ALTER TABLE {schema}.awaiting_commands ADD COLUMN IF NOT EXISTS shard integer NOT NULL DEFAULT 0;
ALTER TABLE {schema}.awaiting_commands ADD COLUMN IF NOT EXISTS answer_by timestamptz;
CREATE INDEX IF NOT EXISTS awaiting_commands_saga_id_idx ON {schema}.awaiting_commands (saga_id);
CREATE INDEX IF NOT EXISTS awaiting_commands_answer_by_idx ON {schema}.awaiting_commands (answer_by);
"""


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

    @property
    def fenced(self) -> bool:
        """A tombstone: the saga compensated this forward step, so the command must not run."""
        return self.status == FENCED

    @property
    def result_status(self) -> str:
        """The StepResult status this record answers with (a tombstone answers FAILED)."""
        return "FAILED" if self.fenced else self.status


# A key's recorded outcome answers every redelivery of its attempt. A definitive failure is taken up again by
# a later attempt of the key (a retry after a timeout, or `saga resume` or `saga redrive` once a human fixed the
# cause): a failure left no business change (its savepoint was rolled back), so running the handler again cannot
# apply anything twice. A recorded success answers every attempt, forever.
async def claim(conn: asyncpg.Connection, participant: Participant, commands: Sequence[ReceivedCommand]) -> set[str]:
    """Insert a PENDING row per key; returns the keys inserted now (or taken up again: a recorded failure and
    a later attempt). A key held by a concurrent transaction makes the insert wait for that one's commit,
    after which the key counts as recorded."""
    if not commands:
        return set()
    # Sorted by key: concurrent batches of two workers lock the keys in one order (no deadlock).
    rows = sorted(commands, key=lambda c: c.idempotency_key)
    claimed = await conn.fetch(
        f"""INSERT INTO {participant.processed_table} AS p
                (idempotency_key, saga_id, step, kind, action, attempt, status)
            SELECT k, s, st, kd, a, at, 'PENDING'
            FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[])
                 AS c(k, s, st, kd, a, at)
            ON CONFLICT (idempotency_key) DO UPDATE
            SET attempt = EXCLUDED.attempt, status = 'PENDING', error_type = NULL, error_message = NULL,
                output = NULL, processed_at = now()
            WHERE p.status = 'FAILED' AND p.attempt < EXCLUDED.attempt
            RETURNING idempotency_key""",
        [c.idempotency_key for c in rows], [c.saga_id for c in rows], [c.step for c in rows],
        [c.kind.value for c in rows], [c.action for c in rows], [c.attempt for c in rows],
    )
    return {row["idempotency_key"] for row in claimed}


async def recorded(conn: asyncpg.Connection, participant: Participant, keys: Sequence[str]) -> dict[str, RecordedReply]:
    """The recorded replies of keys handled before (redeliveries)."""
    if not keys:
        return {}
    rows = await conn.fetch(
        f"""SELECT idempotency_key, status, error_type, error_message, output FROM {participant.processed_table}
            WHERE idempotency_key = ANY($1::text[])""",
        list(keys),
    )
    found = {row["idempotency_key"]: RecordedReply(row["status"], row["error_type"], row["error_message"],
                                                   row["output"]) for row in rows}
    missing = set(keys) - found.keys()
    if missing:  # another holder rolled its claim back between our two statements
        raise RuntimeError(f"idempotency keys {sorted(missing)[:5]} vanished; retry delivery")
    return found


async def settle(conn: asyncpg.Connection, participant: Participant, transient: Sequence[str],
                 final: Sequence[tuple[str, RecordedReply]], replies: Sequence[OutboxMessage],
                 shards: Sequence[int]) -> None:
    """Free the keys of transient failures, record the final outcome of the others and queue every reply,
    in one statement (data-modifying CTEs; the reply rows get ids in ``replies`` order, each in its shard of
    ``shards``: the partition its command came from)."""
    table = participant.processed_table
    await conn.execute(
        f"""WITH freed AS (DELETE FROM {table} WHERE idempotency_key = ANY($1::text[])),
            recorded AS (UPDATE {table} AS p SET status = f.status, error_type = f.error_type,
                                error_message = f.error_message, output = f.output
                         FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[])
                              AS f(idempotency_key, status, error_type, error_message, output)
                         WHERE p.idempotency_key = f.idempotency_key)
            {insert_sql(participant.outbox_table, 7, shard_parameter=13)}""",
        list(transient),
        [key for key, _ in final], [r.status for _, r in final], [r.error_type for _, r in final],
        [r.error_message for _, r in final], [r.output for _, r in final],
        *insert_params(replies),
        list(shards),
    )


async def await_answers(conn: asyncpg.Connection, participant: Participant,
                        commands: Sequence[tuple[ReceivedCommand, int]]) -> None:
    """Record ``commands`` (each with the outbox shard its answer goes to: the partition it came from) as
    awaiting their answer; for one already waiting, a later attempt becomes the one the answer will carry."""
    if not commands:
        return
    waiting = [command for command, _ in commands]
    await conn.execute(
        f"""INSERT INTO {participant.awaiting_table} AS a (idempotency_key, saga_id, saga_type, step, kind, action,
                                                         attempt, command_message_id, traceparent, shard, answer_by)
            SELECT k, s, t, st, kd, a, at, m, tp, sh, now() + ms * interval '1 millisecond'
            FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                        $7::int[], $8::text[], $9::text[], $10::int[], $11::bigint[])
                 AS c(k, s, t, st, kd, a, at, m, tp, sh, ms)
            ON CONFLICT (idempotency_key) DO UPDATE
            SET attempt = EXCLUDED.attempt, command_message_id = EXCLUDED.command_message_id,
                traceparent = EXCLUDED.traceparent, shard = EXCLUDED.shard
            WHERE EXCLUDED.attempt > a.attempt""",
        [c.idempotency_key for c in waiting], [c.saga_id for c in waiting], [c.saga_type for c in waiting],
        [c.step for c in waiting], [c.kind.value for c in waiting], [c.action for c in waiting],
        [c.attempt for c in waiting], [c.message_id for c in waiting], [c.traceparent for c in waiting],
        [shard for _, shard in commands], [c.timeout_ms for c in waiting],
    )


async def withdraw(conn: asyncpg.Connection, participant: Participant,
                   compensations: Sequence[ReceivedCommand]) -> None:
    """The saga is undoing these steps: fence their forward keys with a tombstone (FENCED) unless the forward
    succeeded here (then the compensation undoes it, and a later forward gets that success again). A forward
    that was awaiting a deferred answer no longer does (WITHDRAWN: a later answer is refused); one with no
    record, or a failed one, is answered COMPENSATED from now on instead of running."""
    commands = [c for c in compensations if c.kind is CommandKind.COMPENSATE]
    if not commands:
        return
    keys = [forward_key(c.saga_id, c.step) for c in commands]
    await conn.execute(
        f"""WITH gone AS (DELETE FROM {participant.awaiting_table} WHERE idempotency_key = ANY($1::text[])
                          RETURNING idempotency_key)
            INSERT INTO {participant.processed_table} AS p
                (idempotency_key, saga_id, step, kind, action, attempt, status, error_type, error_message)
            SELECT k, s, st, 'FORWARD', '', 0, '{FENCED}',
                   CASE WHEN k IN (SELECT idempotency_key FROM gone) THEN '{WITHDRAWN}' ELSE '{COMPENSATED}' END,
                   'the saga compensated this step: its forward command does not run'
            FROM unnest($1::text[], $2::text[], $3::text[]) AS c(k, s, st)
            ON CONFLICT (idempotency_key) DO UPDATE
            SET status = EXCLUDED.status, error_type = EXCLUDED.error_type, error_message = EXCLUDED.error_message,
                output = NULL, processed_at = now()
            WHERE p.status IN ('FAILED', '{AWAITING}')""",
        keys, [c.saga_id for c in commands], [c.step for c in commands],
    )


async def withdraw_forwards(conn: asyncpg.Connection, participant: Participant,
                            withdrawals: Sequence[ReceivedCommand], reason: Sequence[str]) -> dict[str, RecordedReply]:
    """The saga no longer wants these forward commands (WithdrawStep): fence each key (FENCED), so a delivery of
    the command that comes later does not run, and return what answers each withdrawal. A command that ran here
    keeps its success, answered SUCCEEDED (the saga compensates it, or reports it); a definitive failure is
    fenced, answered with that failure; a command awaiting its deferred answer no longer does, and one that never
    came or never ran gets a tombstone: both answer FAILED Withdrawn. A key held by a concurrent transaction (the
    command running now) is decided once that one committed."""
    if not withdrawals:
        return {}
    keys = [w.idempotency_key for w in withdrawals]
    await conn.execute(
        f"""WITH gone AS (DELETE FROM {participant.awaiting_table} WHERE idempotency_key = ANY($1::text[]))
            INSERT INTO {participant.processed_table} AS p
                (idempotency_key, saga_id, step, kind, action, attempt, status, error_type, error_message)
            SELECT k, s, st, 'FORWARD', a, at, '{FENCED}', '{WITHDRAWN}', r
            FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::text[]) AS c(k, s, st, a, at, r)
            ON CONFLICT (idempotency_key) DO UPDATE
            SET status = '{FENCED}',
                error_type = CASE WHEN p.status = 'FAILED' THEN p.error_type ELSE EXCLUDED.error_type END,
                error_message = CASE WHEN p.status = 'FAILED' THEN p.error_message ELSE EXCLUDED.error_message END,
                output = NULL, processed_at = now()
            WHERE p.status IN ('FAILED', '{AWAITING}')""",
        keys, [w.saga_id for w in withdrawals], [w.step for w in withdrawals], [w.action for w in withdrawals],
        [w.attempt for w in withdrawals], list(reason),
    )
    return await recorded(conn, participant, keys)  # a statement of its own: it sees what a concurrent one committed


async def expire_awaiting(conn: asyncpg.Connection, participant: Participant,
                          limit: int = 100) -> list[tuple[ReceivedCommand, int]]:
    """Deferred commands whose answer did not come by its time (the step's timeout from the command's pickup):
    no longer awaiting, recorded FAILED AnswerTimedOut (pending the caller's commit); each with the outbox shard of
    its answer. A late answer is refused from then on."""
    rows = await conn.fetch(
        f"""WITH due AS (DELETE FROM {participant.awaiting_table}
                         WHERE idempotency_key IN (SELECT idempotency_key FROM {participant.awaiting_table}
                                                   WHERE answer_by < now() ORDER BY answer_by LIMIT $1
                                                   FOR UPDATE SKIP LOCKED)
                         RETURNING *),
            recorded AS (UPDATE {participant.processed_table} AS p
                         SET status = 'FAILED', error_type = '{ANSWER_TIMED_OUT}',
                             error_message = 'no answer came within the step''s timeout', processed_at = now()
                         FROM due WHERE p.idempotency_key = due.idempotency_key AND p.status = '{AWAITING}')
            SELECT * FROM due""",
        limit,
    )
    return [(_awaited(row), row["shard"]) for row in rows]


def _awaited(row: asyncpg.Record) -> ReceivedCommand:
    return ReceivedCommand(
        saga_id=row["saga_id"], saga_type=row["saga_type"], step=row["step"], action=row["action"],
        kind=CommandKind(row["kind"]), idempotency_key=row["idempotency_key"], attempt=row["attempt"],
        input_type="", message_id=row["command_message_id"], traceparent=row["traceparent"],
    )


async def take_awaiting(conn: asyncpg.Connection, participant: Participant,
                        idempotency_key: str) -> tuple[ReceivedCommand, int] | None:
    """The command ``idempotency_key`` awaits an answer for, and the outbox shard of that answer, no longer
    awaiting (pending the caller's commit); None when it awaits none (unknown, or answered already)."""
    row = await conn.fetchrow(
        f"DELETE FROM {participant.awaiting_table} WHERE idempotency_key = $1 RETURNING *", idempotency_key)
    if row is None:
        return None
    return _awaited(row), row["shard"]


async def record_answer(conn: asyncpg.Connection, participant: Participant, idempotency_key: str,
                        reply: RecordedReply) -> None:
    """Record the answer given later to an awaited command, under its key."""
    await conn.execute(
        f"""UPDATE {participant.processed_table}
            SET status = $2, error_type = $3, error_message = $4, output = $5, processed_at = now()
            WHERE idempotency_key = $1""",
        idempotency_key, reply.status, reply.error_type, reply.error_message, reply.output,
    )


@dataclass(frozen=True)
class AwaitingCommand:
    """A command whose answer is outstanding."""

    idempotency_key: str
    saga_id: str
    step: str
    action: str
    attempt: int
    deferred_at_ms: int
    answer_by_ms: int | None = None  # when it is answered AnswerTimedOut without a person's answer


AWAITING_COLUMNS = ("idempotency_key, saga_id, step, action, attempt,"
                    " (extract(epoch FROM deferred_at) * 1000)::bigint AS deferred_at_ms,"
                    " (extract(epoch FROM answer_by) * 1000)::bigint AS answer_by_ms")
"""An awaiting-commands row as the fields of an ``AwaitingCommand``, in a SELECT list."""


async def awaiting(conn: asyncpg.Connection | asyncpg.Pool, participant: Participant,
                   saga_id: str | None = None) -> list[AwaitingCommand]:
    """The commands awaiting an answer (of one saga, when given), oldest first."""
    rows = await conn.fetch(
        f"""SELECT {AWAITING_COLUMNS} FROM {participant.awaiting_table} WHERE $1::text IS NULL OR saga_id = $1
            ORDER BY deferred_at, idempotency_key""",
        saga_id,
    )
    return [AwaitingCommand(**dict(row)) for row in rows]


def _prune_sql(schema: str) -> str:
    return delete_older_sql(f"{schema}.processed_commands", ("idempotency_key",), "processed_at",
                            also=f"status <> '{AWAITING}'")


async def prune_processed_commands(pool: asyncpg.Pool, schema: str, retention_s: float,
                                   batch: int = DELETE_BATCH) -> int:
    """Delete ``<schema>.processed_commands`` rows handled more than ``retention_s`` ago; how many."""
    return await delete_older_than(pool, _prune_sql(schema), retention_s, batch)


def record_pruner(pool: asyncpg.Pool, schema: str, retention_s: float, every_s: float = CHORE_EVERY_S) -> Chore:
    """The chore pruning a participant's idempotency records every ``every_s``."""
    return Chore("idempotency record pruning", lambda: prune_processed_commands(pool, schema, retention_s),
                 every_s, schema=schema, retention_s=retention_s)
