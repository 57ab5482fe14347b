"""Handle the StepCommand deliveries that arrived together: dedupe by idempotency key, change business data,
reply via the outbox, all in ONE local transaction; a lone command is a batch of one.

The recorded outcomes (``ledger``), the business changes and the replies commit (or vanish) together; the
caller acknowledges the deliveries only after this returns. Redelivery is normal and harmless: a recorded key
gets its recorded reply again. The bookkeeping costs a fixed number of statements (claim every key, read the
replies of keys already recorded, record the outcomes and write every reply). Each delivery is read before the
transaction (``deliveries``); the handlers run inside it (``handler_calls``).

Each handler runs once per delivery, in a savepoint of its own (set together with the release of the one
before, one round trip per handler): a handler that fails is rolled back to its savepoint, alone, and the
others' changes stay. A transaction with one handler call (a lone command, at low rates nearly all of them)
takes no savepoint: when that call fails, the transaction is rolled back and run again without it, its outcome
recorded as it was (``Redo``). A batch handler runs in one savepoint for all its calls; its failed calls must have
changed nothing (``Participant``), and only when it raises (or an output is over its limit) are its calls run
again one at a time, each in a savepoint. A failure ``infra.failures`` calls the platform's (Postgres away,
out of disk) or a conflict leaves the transaction: the caller waits, or retries at once, and every handler
of the batch runs again, its earlier run rolled back.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from enum import StrEnum

import asyncpg

from ...infra.failures import Fault, classify
from ...infra.faults import crash_point
from ...infra.logging import saga_trace
from ...outbox.table import OutboxMessage, write_outbox
from ...schemas.ids import forward_key
from ...schemas.limits import clip_text
from ...schemas.message_types import CommandKind
from ...schemas.records import ConsumedRecord
from ...schemas.topics import Topics
from . import ledger
from .deliveries import ParsedDelivery, park, parse_delivery
from .handler_calls import MAX_SAVEPOINTS, Redo, run_handlers
from .ledger import RecordedReply
from .outcome import Deferred, Failed, Outcome, ReceivedCommand
from .participant import Participant
from .replies import outcome_message, step_result_message

log = logging.getLogger(__name__)

EXPIRED = "Expired"
"""error_type of the answer to a forward command picked up after its ``expires_at``: it did not run (retryable: the
orchestrator sends the next attempt, which this one does not spend)."""
UNPROCESSABLE = "Unprocessable"
"""error_type of the definitive failure a command gets when this worker cannot read its input record (a
misconfigured worker: the record's schema is not in its SAGA_SCHEMA_PATH), or when handling it failed every time
for a reason that is no outage (``dead_letter_poisoned``): nothing it did was kept."""


class Disposition(StrEnum):
    """What happened to one delivery (for logs, metrics and tests)."""

    RECORDED = "recorded"  # handled; the final outcome (success or definitive failure) is recorded
    TRANSIENT = "transient"  # retryable failure replied; nothing recorded, business change rolled back
    DUPLICATE = "duplicate"  # key already recorded: the recorded reply was sent again
    FENCED = "fenced"  # a forward whose step the saga compensated or withdrew: not run
    WITHDRAWN = "withdrawn"  # a WithdrawStep: the forward key fenced, and answered with whether it had run
    EXPIRED = "expired"  # a forward picked up after its expires_at: answered Expired, not run
    DEAD_LETTERED = "dead_lettered"  # undecodable: a DeadLetter went to the DLQ topic
    AWAITING = "awaiting"  # the handler deferred its answer (or it is still outstanding): nothing replied


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def handle_commands(
    pool: asyncpg.Pool,
    participant: Participant,
    topics: Topics,
    batch: Sequence[ConsumedRecord],
    *,
    clock: Callable[[], int] = _now_ms,
) -> list[Disposition]:
    """Process deliveries for ``participant``; one disposition per delivery, in order; never raises for a bad
    message (it is dead-lettered).

    The deliveries go in one transaction, except that a key given again (a redelivery next to its original)
    starts another one after it (the second must see what the first did), and so does the delivery after
    ``MAX_SAVEPOINTS`` handler calls. Raises what the transaction raised: ``infra.failures`` says whether the
    caller waits (the platform), retries at once (a conflict) or isolates a delivery (``infra.isolation``).
    """
    parsed = _superseded(participant, [parse_delivery(participant, record) for record in batch])
    dispositions: list[Disposition] = []
    for start, end in _runs_of_distinct_keys(parsed):
        dispositions += await _handle_run(pool, participant, topics, clock, batch[start:end], parsed[start:end])
    return dispositions


async def handle_command(pool: asyncpg.Pool, participant: Participant, topics: Topics, record: ConsumedRecord, *,
                         clock: Callable[[], int] = _now_ms) -> Disposition:
    """``handle_commands`` of one delivery: a lone command is a batch of one."""
    return (await handle_commands(pool, participant, topics, [record], clock=clock))[0]


async def dead_letter_poisoned(pool: asyncpg.Pool, participant: Participant, topics: Topics, record: ConsumedRecord,
                               error: BaseException, *, clock: Callable[[], int] = _now_ms) -> Disposition:
    """A delivery that failed every time it was handled on its own, for a reason that is no outage: dead-letter
    it with its bytes and the reason, and when its key has no outcome yet, record and reply the definitive
    failure UNPROCESSABLE so the saga moves on (the transactions that failed kept nothing)."""
    reason = clip_text(f"the command failed every time it was handled: {type(error).__name__}: {error}") or ""
    parsed = dataclasses.replace(parse_delivery(participant, record), reason=reason)
    rows = [park(participant, topics, parsed, record, clock())]
    shard = record.partition  # the rows of a command are relayed by the worker that owns its partition
    command = parsed.command
    try:
        async with pool.acquire() as conn, conn.transaction():
            if command is not None and command.idempotency_key in await ledger.claim(conn, participant, [command]):
                failed = Failed(UNPROCESSABLE, reason)
                reply = outcome_message(command, topics.results(participant.name), failed, clock())
                await ledger.settle(conn, participant, [], [(command.idempotency_key, RecordedReply.of(failed))],
                                    [reply, *rows], [shard] * (1 + len(rows)))
                return Disposition.DEAD_LETTERED
    except Exception as failure:
        if classify(failure) is not Fault.RECORD:
            raise  # the platform is away (wait), or a concurrent writer won (try again)
        # Recording the outcome fails too: the letter alone (the saga's timeout and retries take it on).
        log.error("could not record a failure for a dead-lettered command",
                  extra={"participant": participant.name, "saga_id": command.saga_id if command else None,
                         "error": repr(failure)})
    async with pool.acquire() as conn, conn.transaction():
        await write_outbox(conn, participant.outbox_table, rows, [shard] * len(rows))
    return Disposition.DEAD_LETTERED


def _superseded(participant: Participant, parsed: list[ParsedDelivery]) -> list[ParsedDelivery]:
    """``parsed``, each forward command that a WithdrawStep later in the same batch withdraws marked superseded:
    it was not picked up before the saga withdrew it, so it must not run (the withdrawal answers for its key)."""
    withdrawn = {delivery.command.idempotency_key: index for index, delivery in enumerate(parsed)
                 if delivery.command is not None and delivery.command.withdrawal}
    if not withdrawn:
        return parsed
    marked = []
    for index, delivery in enumerate(parsed):
        command = delivery.command
        if (command is not None and not command.withdrawal and command.kind is CommandKind.FORWARD
                and withdrawn.get(command.idempotency_key, -1) > index):
            log.info("forward command withdrawn before it ran", extra={
                "participant": participant.name, "saga_id": command.saga_id, "step": command.step,
                "attempt": command.attempt})
            delivery = dataclasses.replace(delivery, superseded=True)
        marked.append(delivery)
    return marked


def _runs_of_distinct_keys(parsed: Sequence[ParsedDelivery]) -> list[tuple[int, int]]:
    """(start, end) of consecutive deliveries in which no idempotency key is given twice, no forward command
    follows its own compensation (it must see the tombstone the compensation leaves), and at most
    ``MAX_SAVEPOINTS`` commands are to run."""
    runs: list[tuple[int, int]] = []
    start, keys, commands = 0, set[str](), 0
    for index, delivery in enumerate(parsed):
        command = None if delivery.superseded else delivery.command
        if command is not None and (command.idempotency_key in keys or commands == MAX_SAVEPOINTS):
            runs.append((start, index))
            start, keys, commands = index, set[str](), 0
        if command is not None:
            keys.add(command.idempotency_key)
            commands += 1
            if command.kind is CommandKind.COMPENSATE:
                keys.add(forward_key(command.saga_id, command.step))  # a later forward of it starts a new run
    if start < len(parsed):
        runs.append((start, len(parsed)))
    return runs


async def _handle_run(pool: asyncpg.Pool, participant: Participant, topics: Topics, clock: Callable[[], int],
                      batch: Sequence[ConsumedRecord], parsed: Sequence[ParsedDelivery]) -> list[Disposition]:
    """Deliveries with distinct keys, in one transaction (two when its one handler call failed: ``Redo``)."""
    async with pool.acquire() as conn:
        try:
            async with conn.transaction():
                done = await _handle(conn, participant, topics, clock, batch, parsed)
        except Redo as redo:
            async with conn.transaction():
                done = await _handle(conn, participant, topics, clock, batch, parsed, redo)
    # Committed: the business changes and the reply rows exist, nothing is published or acknowledged yet.
    crash_point("participant.after_commit", lambda: {"idempotency_keys": sorted(
        {logged.idempotency_key for _, logged, _, _ in done if logged is not None})})
    for disposition, logged, answer, error_type in done:
        if logged is not None and answer is not None:
            _log_outcome(participant, logged, disposition, answer.status, error_type)
    return [disposition for disposition, *_ in done]


Done = tuple[Disposition, ReceivedCommand | None, RecordedReply | None, str | None]


async def _handle(conn: asyncpg.Connection, participant: Participant, topics: Topics,
                  clock: Callable[[], int], batch: Sequence[ConsumedRecord], parsed: Sequence[ParsedDelivery],
                  redo: Redo | None = None) -> list[Done]:
    """Everything of the batch inside the open transaction (``redo``: what the rolled-back one learned)."""
    results_topic = topics.results(participant.name)
    replies: list[OutboxMessage] = []
    shards: list[int] = []  # of each reply: the partition its command came from (outbox.lease)
    done: list[Done] = []
    withdrawals = [p.command for p in parsed if p.command is not None and p.command.withdrawal and not p.reason]
    withdrawn = await ledger.withdraw_forwards(conn, participant, withdrawals,
                                               [w.withdrawn_because for w in withdrawals])
    commands = [p.command for p in parsed
                if p.command is not None and not p.command.withdrawal and not p.superseded]
    claimed = await ledger.claim(conn, participant, commands)
    recorded = await ledger.recorded(conn, participant,
                                     [c.idempotency_key for c in commands if c.idempotency_key not in claimed])
    transient: list[str] = []
    final: list[tuple[str, RecordedReply]] = []
    awaited: list[tuple[ReceivedCommand, int]] = []  # with the shard of the answer: the command's partition
    fresh = [p for p in parsed if p.command is not None and p.command.idempotency_key in claimed
             and not p.command.withdrawal and not p.superseded]
    now = clock()
    expired = {p.command.idempotency_key for p in fresh if p.command is not None and _expired(p.command, now)}
    await ledger.withdraw(conn, participant, [p.command for p in fresh if p.command is not None])
    outcomes = await run_handlers(conn, participant, [(p.command, p.saga_input) for p in fresh
                                                       if p.command is not None and p.runnable
                                                       and p.command.idempotency_key not in expired], redo)
    for item, check in zip(batch, parsed, strict=True):
        command = check.command
        if check.superseded:
            done.append((Disposition.FENCED, command, None, None))
            continue
        if command is not None and command.withdrawal and not check.reason:
            reply = withdrawn[command.idempotency_key]
            replies.append(step_result_message(command, results_topic, reply))
            shards.append(item.partition)
            done.append((Disposition.WITHDRAWN, command, reply, reply.error_type))
            continue
        if command is None or (check.reason and command.idempotency_key in claimed):
            # Unreadable: dead-lettered, and (when its key is readable, the first time) answered Unprocessable.
            replies.append(park(participant, topics, check, item, clock()))
            shards.append(item.partition)
        if command is None:
            done.append((Disposition.DEAD_LETTERED, None, None, None))
        elif command.idempotency_key not in claimed:
            reply = recorded[command.idempotency_key]
            if reply.awaiting:  # still outstanding: the answer will carry this attempt
                awaited.append((command, item.partition))
                done.append((Disposition.AWAITING, command, reply, None))
                continue
            replies.append(step_result_message(command, results_topic, reply))
            shards.append(item.partition)
            done.append((Disposition.FENCED if reply.fenced else Disposition.DUPLICATE, command, reply,
                         reply.error_type))
        elif command.idempotency_key in expired:
            expiry = Failed(EXPIRED, f"picked up {now - (command.expires_at or now)} ms after the attempt expired: "
                                     "not run", retryable=True)
            transient.append(command.idempotency_key)  # not recorded: a later attempt runs
            replies.append(outcome_message(command, results_topic, expiry, now))
            shards.append(item.partition)
            done.append((Disposition.EXPIRED, command, RecordedReply.of(expiry), EXPIRED))
        else:
            outcome = outcomes.get(command.idempotency_key) or Failed(UNPROCESSABLE, check.reason)
            settled = _settled(outcome, command, item.partition, transient, final, awaited)
            done.append((Disposition.DEAD_LETTERED, *settled[1:]) if check.reason else settled)
            if not isinstance(outcome, Deferred):
                replies.append(outcome_message(command, results_topic, outcome, clock()))
                shards.append(item.partition)
    await ledger.settle(conn, participant, transient, final, replies, shards)
    await ledger.await_answers(conn, participant, awaited)
    return done


def _expired(command: ReceivedCommand, now_ms: int) -> bool:
    """A forward command picked up after its attempt's time: it must not run (the next attempt does)."""
    return command.kind is CommandKind.FORWARD and command.expires_at is not None and now_ms > command.expires_at


def _settled(outcome: Outcome, command: ReceivedCommand, shard: int, transient: list[str],
             final: list[tuple[str, RecordedReply]], awaited: list[tuple[ReceivedCommand, int]]) -> Done:
    """Sort a freshly handled command's outcome into what ``ledger.settle`` and ``ledger.await_answers`` write."""
    recorded = RecordedReply.of(outcome)
    if isinstance(outcome, Failed) and outcome.retryable:
        transient.append(command.idempotency_key)  # not recorded: a later attempt does the work
        return Disposition.TRANSIENT, command, recorded, outcome.error_type
    final.append((command.idempotency_key, recorded))
    if isinstance(outcome, Deferred):
        awaited.append((command, shard))
        return Disposition.AWAITING, command, recorded, None
    return Disposition.RECORDED, command, recorded, outcome.error_type if isinstance(outcome, Failed) else None


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
    with saga_trace(command.traceparent):
        log.log(level, "command %s", disposition.value, extra={
            "participant": participant.name, "saga_id": command.saga_id, "saga_type": command.saga_type,
            "step": command.step, "action": command.action, "idempotency_key": command.idempotency_key,
            "attempt": command.attempt, "status": status, "error_type": error_type,
            "disposition": disposition.value})
