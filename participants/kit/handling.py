"""Handle the StepCommand deliveries that arrived together: dedupe by idempotency key, change business data,
reply via the outbox, all in ONE local transaction; a lone command is a batch of one.

The recorded outcomes (``ledger``), the business changes and the replies commit (or vanish) together; the
caller acknowledges the deliveries only after this returns. Redelivery is normal and harmless: a recorded key
gets its recorded reply again. The bookkeeping costs a fixed number of statements (claim every key, read the
replies of keys already recorded, record the outcomes and write every reply).

Each handler runs once per delivery, in a savepoint of its own (set together with the release of the one
before, one round trip per handler): a handler that fails is rolled back to its savepoint, alone, and the
others' changes stay. A transaction with one handler call (a lone command, at low rates nearly all of them)
takes no savepoint: when that call fails, the transaction is rolled back and run again without it, its outcome
recorded as it was (``_Redo``). A batch handler runs in one savepoint for all its calls; its failed calls must have
changed nothing (``Participant``), and only when it raises (or an output is over its limit) are its calls run
again one at a time, each in a savepoint. A failure ``infra.failures`` calls the platform's (Postgres away,
out of disk) or a conflict leaves the transaction: the caller waits, or retries at once, and every handler
of the batch runs again, its earlier run rolled back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import groupby
from types import MappingProxyType
from typing import Any

import asyncpg
from opentelemetry.trace import SpanKind, Status, StatusCode

from ...infra import tracing
from ...infra.failures import Fault, classify
from ...infra.faults import crash_point
from ...infra.logging import saga_trace
from ...outbox.dead_letter_row import dead_letter_message
from ...outbox.table import OutboxMessage, write_outbox
from ...schemas import wire
from ...schemas.codec import WireError
from ...schemas.headers import MESSAGE_ID, SAGA_ID, SAGA_TYPE, TRACEPARENT, valid_traceparent
from ...schemas.ids import forward_key
from ...schemas.limits import (
    MAX_ERROR_MESSAGE_CHARS,
    MAX_MESSAGE_ID_BYTES,
    MAX_STEP_OUTPUT_BYTES,
    OUTPUT_TOO_LARGE,
    clip_text,
    id_problem,
    nul_field,
)
from ...schemas.message_types import CommandKind, StepCommand, WithdrawStep
from ...schemas.records import ConsumedRecord
from ...schemas.registry import default_registry
from ...schemas.topics import Topics
from . import ledger
from .ledger import RecordedReply
from .outcome import Deferred, Failed, Outcome, ReceivedCommand, Succeeded
from .participant import BatchHandler, Call, Participant
from .replies import outcome_message, step_result_message

log = logging.getLogger(__name__)

EXPIRED = "Expired"
"""error_type of the answer to a forward command picked up after its ``expires_at``: it did not run (retryable: the
orchestrator sends the next attempt, which this one does not spend)."""
HANDLER_TIMED_OUT = "HandlerTimedOut"
"""error_type of the answer to a forward command whose handler ran past the command's ``timeout_ms``: its change is
rolled back (retryable: the attempt counts, as the saga's retry policy says)."""

UNPROCESSABLE = "Unprocessable"
"""error_type of the definitive failure a command gets when this worker cannot read its input record (a
misconfigured worker: the record's schema is not in its SAGA_SCHEMA_PATH), or when handling it failed every time
for a reason that is no outage (``dead_letter_poisoned``): nothing it did was kept."""


MAX_SAVEPOINTS = 60
"""Handler calls per transaction, each in a savepoint: a transaction with more than 64 subtransactions that
wrote overflows every backend's cache of them (``PGPROC_MAX_CACHED_SUBXIDS``), and visibility checks elsewhere
then read ``pg_subtrans`` until it ends."""


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
    reason = reason or _key_problem(record, command.saga_id)
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


def _key_problem(record: ConsumedRecord, saga_id: str) -> str | None:
    """A command's Kafka key must be its saga id (checked for consumed records, whose key is known)."""
    if not record.has_position or record.key == saga_id.encode():
        return None
    if record.key is None:
        return "missing Kafka key: the key must be the saga id (UTF-8)"
    return f"Kafka key {record.key[:600]!r} differs from saga_id {saga_id!r}"


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
    """Deliveries with distinct keys, in one transaction (two when its one handler call failed: ``_Redo``)."""
    async with pool.acquire() as conn:
        try:
            async with conn.transaction():
                done = await _handle(conn, participant, topics, clock, batch, parsed)
        except _Redo as redo:
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
                  redo: _Redo | None = None) -> list[Done]:
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
    outcomes = await _run_handlers(conn, participant, [(p.command, p.saga_input) for p in fresh
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


class _Redo(Exception):
    """The one handler call of a transaction failed, with no savepoint of its own: the transaction is rolled back
    (nothing of the handler stays) and run again with what was learned. ``outcomes``: the failed single handler's
    outcome, recorded without running it again; ``one_by_one``: the batch handler's commands are run one at a
    time, each in a savepoint."""

    def __init__(self, outcomes: Mapping[str, Outcome] | None = None, one_by_one: bool = False) -> None:
        super().__init__("redo the transaction without the failed handler call")
        self.outcomes = dict(outcomes or {})
        self.one_by_one = one_by_one


class _Savepoints:
    """The savepoint of each handler call in a transaction: setting one releases the one before in the same
    round trip; undoing rolls back to the latest, which stays set. A transaction with one handler call needs
    none (``needed`` False): a failure rolls the transaction back (``_Redo``)."""

    def __init__(self, conn: asyncpg.Connection, needed: bool) -> None:
        self._conn = conn
        self.needed = needed
        self._set = False

    async def set(self) -> None:
        if self.needed:
            await self._conn.execute("RELEASE SAVEPOINT handler; SAVEPOINT handler" if self._set
                                     else "SAVEPOINT handler")
            self._set = True

    async def undo(self, redo: _Redo) -> None:
        """Roll the failed call back: to its savepoint, or (none needed) the whole transaction, by raising
        ``redo``."""
        if not self.needed:
            raise redo
        await self._conn.execute("ROLLBACK TO SAVEPOINT handler")


async def _run_handlers(conn: asyncpg.Connection, participant: Participant, calls: Sequence[Call],
                        redo: _Redo | None = None) -> dict[str, Outcome]:
    """Run each call's handler once, in order, each in its own savepoint (a failed one leaves no trace, the
    others stay); consecutive calls of one action go to its batch handler, when it has one, in one savepoint.
    Calls whose outcome ``redo`` holds are not run again."""
    known = redo.outcomes if redo is not None else {}
    runs = []
    for action, group in groupby([call for call in calls if call[0].idempotency_key not in known],
                                 key=lambda call: call[0].action):
        run = list(group)
        many = participant.batch_handlers.get(action)
        batched = (many is not None and len(run) > 1 and not (redo is not None and redo.one_by_one)
                   and all(participant.reads(command) for command, _ in run))
        runs.append((run, many if batched else None))
    # A call refused before it runs (an unknown action, an input it does not read) changes nothing: no savepoint.
    handler_calls = sum(1 if many is not None else sum(_runs(participant, command) for command, _ in run)
                        for run, many in runs)
    savepoints = _Savepoints(conn, needed=handler_calls > 1)
    outcomes: dict[str, Outcome] = dict(known)
    for run, many in runs:
        results = await _run_batch(conn, savepoints, participant, many, run) if many is not None else None
        if results is None:
            results = [await _run_one(conn, savepoints, participant, command, saga_input)
                       for command, saga_input in run]
        for (command, _), outcome in zip(run, results, strict=True):
            outcomes[command.idempotency_key] = outcome
    return outcomes


def _runs(participant: Participant, command: ReceivedCommand) -> bool:
    """Whether ``command``'s handler runs (it has one, and it reads the command's input)."""
    return participant.handler(command.action) is not None and participant.reads(command)


async def _run_batch(conn: asyncpg.Connection, savepoints: _Savepoints, participant: Participant,
                     many: BatchHandler, run: Sequence[Call]) -> list[Outcome] | None:
    """A batch handler's outcomes for ``run``, or None when it must be run a call at a time (it raised, gave
    the wrong number of outcomes, or an output is over its limit): its changes are then rolled back."""
    await savepoints.set()
    problem = None
    started_ns = time.time_ns() if tracing.enabled() else 0
    limit = _limit(max((command.timeout_ms or 0 for command, _ in run), default=0) or None)
    try:
        async with limit:
            given = list(await many(conn, run))
    except Exception as exc:
        if not limit.expired() and classify(exc) is not Fault.RECORD:
            raise
        given, problem = [], ("ran past its commands' time" if limit.expired()
                              else f"raised {type(exc).__name__}: {exc}")
    results = [within_limits(outcome) for outcome in given]
    if problem is None and len(results) != len(run):
        problem = f"returned {len(results)} outcomes for {len(run)} commands"
    if problem is None and any(limited is not outcome and isinstance(limited, Failed)
                               for outcome, limited in zip(given, results, strict=True)):
        problem = "gave an output over its limit"
    if problem is None:
        if started_ns:  # one call for all: a span of it in each command's saga trace
            tracing.spans_over("participant.handle", [
                (command.traceparent, _handled(participant, command, outcome))
                for (command, _), outcome in zip(run, results, strict=True)], started_ns, time.time_ns(),
                kind=SpanKind.CONSUMER)
        return results
    log.warning("batch handler failed, running its commands one at a time",
                extra={"participant": participant.name, "action": run[0][0].action, "commands": len(run),
                       "saga_ids": [command.saga_id for command, _ in run][:20], "error": problem})
    await savepoints.undo(_Redo(one_by_one=True))
    return None


async def _run_one(conn: asyncpg.Connection, savepoints: _Savepoints, participant: Participant,
                   command: ReceivedCommand, saga_input: Mapping[str, Any]) -> Outcome:
    """Run one handler in its savepoint; a failure rolls its business change back."""
    if not _runs(participant, command):
        if participant.handler(command.action) is None:
            return Failed("UnknownAction", f"{participant.name} has no action {command.action!r}")
        return Failed("UnsupportedInput", f"{participant.name} cannot read input {command.input_type}")
    handler = participant.handler(command.action)
    assert handler is not None
    await savepoints.set()
    with tracing.span("participant.handle", command.traceparent, SpanKind.CONSUMER) as span:
        limit = _limit(command.timeout_ms)
        try:
            async with limit:
                outcome = within_limits(await handler(conn, command, saga_input))
        except Exception as exc:
            if limit.expired():  # the handler overran its time, and what cancelling it raised is no fault of its own
                outcome = _overran([command])
            elif classify(exc) is not Fault.RECORD:
                raise  # the platform is away, or a concurrent writer won: the batch is tried again, unacknowledged
            # A handler bug or a data problem of this command: the step's failure, retryable, so a later attempt
            # (the saga's retry policy, with its backoff) gets a fresh chance.
            else:
                log.exception(
                    "handler raised", extra={"participant": participant.name, "saga_id": command.saga_id,
                                             "action": command.action, "idempotency_key": command.idempotency_key},
                )
                outcome = Failed("ParticipantError", f"{type(exc).__name__}: {exc}", retryable=True)
        if span.is_recording():
            span.set_attributes(_handled(participant, command, outcome))
            if isinstance(outcome, Failed):
                span.set_status(Status(StatusCode.ERROR, f"{outcome.error_type}: {outcome.message}"))
    if isinstance(outcome, Failed):
        # A failed step must leave no business trace, and its handler does not run again.
        await savepoints.undo(_Redo({command.idempotency_key: outcome}))
    return outcome


def _limit(timeout_ms: int | None) -> asyncio.Timeout:
    """The time a handler may take once its command was picked up (none when the command names none)."""
    return asyncio.timeout(None if timeout_ms is None else timeout_ms / 1000)


def _overran(commands: Sequence[ReceivedCommand]) -> Failed:
    """The outcome of a handler call that ran past its command's time: cancelled, its change rolled back."""
    command = commands[0]
    log.warning("handler ran past its time: cancelled", extra={
        "participant": command.step, "saga_id": command.saga_id, "action": command.action,
        "idempotency_key": command.idempotency_key, "timeout_ms": command.timeout_ms})
    return Failed(HANDLER_TIMED_OUT, f"the handler ran past the step's {command.timeout_ms} ms and was cancelled; "
                                     "its change was rolled back", retryable=True)


def _handled(participant: Participant, command: ReceivedCommand, outcome: Outcome) -> dict[str, str | int]:
    """The attributes of a ``participant.handle`` span: who handled which step of which saga, and the outcome."""
    return {"saga.id": command.saga_id, "saga.type": command.saga_type, "saga.step": command.step,
            "participant": participant.name, "participant.action": command.action, "saga.command": command.kind,
            "saga.attempt": command.attempt, "participant.outcome": type(outcome).__name__,
            **({"participant.error_type": outcome.error_type} if isinstance(outcome, Failed) else {})}


def within_limits(outcome: Outcome) -> Outcome:
    """``outcome`` as the kit replies it: an output over MAX_STEP_OUTPUT_BYTES becomes the definitive failure
    OUTPUT_TOO_LARGE (the caller rolls the change back, so nothing took effect), and an error message is cut to
    MAX_ERROR_MESSAGE_CHARS."""
    if isinstance(outcome, Succeeded) and outcome.output is not None and len(outcome.output) > MAX_STEP_OUTPUT_BYTES:
        return Failed(OUTPUT_TOO_LARGE, f"the handler's output of {len(outcome.output)} bytes is over the "
                      f"{MAX_STEP_OUTPUT_BYTES} a step output may have; its change was rolled back")
    if isinstance(outcome, Failed) and len(outcome.message) > MAX_ERROR_MESSAGE_CHARS:
        return dataclasses.replace(outcome, message=clip_text(outcome.message) or "")
    return outcome


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
