"""Answers that come later: a handler returns ``Deferred`` (say, it asked a human), and ``complete`` answers
the command afterwards, from any process, in the caller's own transaction.

While a command waits, its idempotency key is recorded as AWAITING and the command is kept in the ledger
(``<schema>.awaiting_commands``); a redelivery (a retry after the step's timeout) sends nothing and only moves
the awaited attempt on, so the answer carries the attempt the orchestrator waits for. ``complete`` records the
final outcome under the key and writes the reply into the participant's outbox, where its relay finds it.
The step's ``timeout_ms`` and retries bound how long the saga waits. When the saga compensates the step
before it was answered, the wait is withdrawn (its key fenced, error type ``Withdrawn``): a later answer is
refused, and so is a later delivery of the command.
``ledger.awaiting`` lists what is outstanding. A person's answer names who gave it (``operator``).

The answer must come within the step's timeout from the command's pickup (the command's ``timeout_ms``): past
it, ``answer_timeouts`` (a worker's chore) answers the command FAILED ``AnswerTimedOut`` and a later answer is
refused, as it is once the saga withdrew the step (``why_not_awaiting`` says which).
"""

from __future__ import annotations

import time
from dataclasses import replace

import asyncpg

from ...infra.chores import Chore
from ...outbox.table import write_outbox
from ...schemas.limits import MAX_STEP_OUTPUT_BYTES, clip_text
from ...schemas.topics import Topics
from . import ledger
from .outcome import Failed, Succeeded
from .participant import Participant
from .replies import outcome_message


async def complete(conn: asyncpg.Connection, participant: Participant, topics: Topics, idempotency_key: str,
                   outcome: Succeeded | Failed, *, operator: str | None = None, detail: str | None = None) -> bool:
    """Answer a deferred command with ``outcome`` in ``conn``'s transaction (open one to make a business change
    in the same commit); False when the key is not awaiting an answer (unknown, or answered already). A typed
    action's answer is read against its output model and encoded as its record: ValueError, nothing recorded, for
    one that does not fit.

    ``operator`` (and ``detail``: why) name the person who gave the answer: the reply carries them and the
    orchestrator records them in the saga's history (OperatorAction ``Answer``, just before the outcome). A
    redelivered command is answered from the ledger, without them: the saga recorded them once already."""
    if isinstance(outcome, Failed) and outcome.retryable:
        raise ValueError("a deferred answer is definitive: give Succeeded or a non-retryable Failed")
    if isinstance(outcome, Succeeded) and outcome.output is not None and len(outcome.output) > MAX_STEP_OUTPUT_BYTES:
        raise ValueError(f"the output of {len(outcome.output)} bytes is over the {MAX_STEP_OUTPUT_BYTES} a step "
                         "output may have: give a smaller one, or a Failed")
    if isinstance(outcome, Failed):
        outcome = replace(outcome, message=clip_text(outcome.message) or "")
    async with conn.transaction():  # a savepoint inside the caller's transaction
        awaiting = await ledger.take_awaiting(conn, participant, idempotency_key)
        if awaiting is None:
            return False
        command, shard = awaiting  # the partition the command came from: its worker relays the answer
        reader = participant.answers.get(command.action)
        if reader is not None and isinstance(outcome, Succeeded):  # a typed answer: refused whole if it misfits
            outcome = replace(outcome, output=reader(outcome.output))
        await ledger.record_answer(conn, participant, idempotency_key, ledger.RecordedReply.of(outcome))
        reply = outcome_message(command, topics.results(participant.name), outcome, time.time_ns() // 1_000_000,
                                operator=operator, detail=detail)
        await write_outbox(conn, participant.outbox_table, [reply], [shard])
    return True


ANSWER_TIMEOUT_EVERY_S = 1.0
"""How often a worker looks for deferred commands whose answer is overdue (an index lookup when none is)."""


async def answer_overdue(pool: asyncpg.Pool, participant: Participant, topics: Topics) -> int:
    """Answer every deferred command whose answer did not come in time FAILED AnswerTimedOut; how many."""
    async with pool.acquire() as conn, conn.transaction():
        overdue = await ledger.expire_awaiting(conn, participant)
        if not overdue:
            return 0
        failed = Failed(ledger.ANSWER_TIMED_OUT, "no answer came within the step's timeout")
        now = time.time_ns() // 1_000_000
        replies = [outcome_message(command, topics.results(participant.name), failed, now) for command, _ in overdue]
        await write_outbox(conn, participant.outbox_table, replies, [shard for _, shard in overdue])
    return len(overdue)


def answer_timeouts(pool: asyncpg.Pool, participant: Participant, topics: Topics,
                    every_s: float = ANSWER_TIMEOUT_EVERY_S) -> Chore:
    """The chore answering a participant's overdue deferred commands (``answer_overdue``) every ``every_s``."""
    return Chore("deferred answer timeouts", lambda: answer_overdue(pool, participant, topics), every_s,
                 participant=participant.name)


async def why_not_awaiting(conn: asyncpg.Connection | asyncpg.Pool, participant: Participant,
                           idempotency_key: str) -> str:
    """Why no answer is awaited under ``idempotency_key``, in one line (for a refused answer)."""
    row = await conn.fetchrow(f"SELECT status, error_type, processed_at FROM {participant.processed_table} "
                              "WHERE idempotency_key = $1", idempotency_key)
    if row is None:
        return f"no command of {participant.name} has the key {idempotency_key!r}"
    at = row["processed_at"].strftime("%Y-%m-%d %H:%M:%S UTC")
    if row["status"] == ledger.FENCED:
        return f"{idempotency_key} was withdrawn at {at}: its saga turned back, so it no longer waits for an answer"
    if row["error_type"] == ledger.ANSWER_TIMED_OUT:
        return f"{idempotency_key} timed out at {at}: no answer came within its step's timeout"
    return f"{idempotency_key} was answered already ({row['status']} at {at})"
