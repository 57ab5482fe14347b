"""Handle a batch of StepCommand deliveries in ONE local transaction: the worker's fast path.

The effect is that of ``handle_command`` on each delivery in turn — same business changes, recorded
outcomes, replies (in delivery order) and dispositions — but the batch commits (or vanishes) as a whole, so
the caller acknowledges every delivery of the batch after the commit. The bookkeeping costs a fixed
number of statements (claim every key, read the replies of keys already recorded, record the outcomes,
write every reply). Handlers first run without savepoints; when one fails, the batch is rolled back and
run again with each handler in its own savepoint, so a failed step leaves no trace.

A batch in which one idempotency key appears twice (a redelivery next to its original) is handed to
``handle_command`` one delivery at a time: the second must see what the first did.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from itertools import groupby
from typing import Any, TypeVar

import asyncpg

from ...infra.faults import crash_point
from ...outbox.table import OutboxMessage, insert_params, insert_sql
from ...schemas.records import ConsumedRecord
from ...schemas.topics import Topics
from .deferred import await_answers, withdraw
from .handle import (
    _DATABASE_GONE,
    REOPEN_FAILED_ON_A_LATER_ATTEMPT,
    Disposition,
    ParsedDelivery,
    _log_outcome,
    _now_ms,
    _run_in_savepoint,
    handle_command,
    park,
    parse_delivery,
)
from .outcome import Deferred, Failed, Outcome, ReceivedCommand
from .participant import Call, Participant
from .replies import RecordedReply, outcome_message, step_result_message


async def handle_commands(
    pool: asyncpg.Pool,
    participant: Participant,
    topics: Topics,
    batch: Sequence[ConsumedRecord],
    *,
    clock: Callable[[], int] = _now_ms,
) -> list[Disposition]:
    """Process deliveries for ``participant`` in one transaction; one disposition per delivery, in order.

    Raises only when Postgres is unreachable (the caller retries the whole batch, unacknowledged).
    """
    parsed = [parse_delivery(participant, record) for record in batch]
    keys = [p.command.idempotency_key for p in parsed if p.command is not None]
    if len(set(keys)) < len(keys):
        return [await handle_command(pool, participant, topics, record, clock=clock) for record in batch]
    async with pool.acquire() as conn:
        try:
            async with conn.transaction():
                done = await _handle(conn, participant, topics, clock, batch, parsed, careful=False)
        except _Careful:
            # A handler failed: its business change must go while the others' stay, which takes a
            # savepoint per handler. The optimistic pass is rolled back (as a crash before the commit would
            # have done); this pass runs every handler in its own savepoint.
            async with conn.transaction():
                done = await _handle(conn, participant, topics, clock, batch, parsed, careful=True)
    # Committed: the business changes and the reply rows exist, nothing is published or acknowledged yet.
    crash_point("participant.after_commit")
    for disposition, logged, answer, error_type in done:
        if logged is not None and answer is not None:
            _log_outcome(participant, logged, disposition, answer.status, error_type)
    return [disposition for disposition, *_ in done]


T = TypeVar("T")


class _Careful(Exception):
    """A handler failed in the optimistic pass (no savepoints): the batch must be redone with them."""


Done = tuple[Disposition, ReceivedCommand | None, RecordedReply | None, str | None]


async def _handle(conn: asyncpg.Connection, participant: Participant, topics: Topics,
                  clock: Callable[[], int], batch: Sequence[ConsumedRecord], parsed: Sequence[ParsedDelivery],
                  careful: bool) -> list[Done]:
    """Everything of the batch inside the open transaction; ``careful`` runs each handler in a savepoint,
    else a failing handler raises ``_Careful``."""
    table = participant.processed_table
    results_topic = topics.results(participant.name)
    replies: list[OutboxMessage] = []
    done: list[Done] = []
    commands = [p.command for p in parsed if p.command is not None]
    claimed = await _claim(conn, table, commands)
    recorded = await _recorded(conn, table, [c.idempotency_key for c in commands if c.idempotency_key not in claimed])
    transient: list[str] = []
    final: list[tuple[str, RecordedReply]] = []
    awaited: list[ReceivedCommand] = []
    calls = [(p.command, p.saga_input) for p in parsed
             if p.command is not None and p.command.idempotency_key in claimed]
    await withdraw(conn, participant, [command for command, _ in calls])
    outcomes = await (_run_each_in_savepoint if careful else _run_bare)(conn, participant, calls)
    for item, check in zip(batch, parsed, strict=True):
        command = check.command
        if command is None:
            replies.append(park(participant, topics, check, item, clock()))
            done.append((Disposition.DEAD_LETTERED, None, None, None))
        elif command.idempotency_key not in claimed:
            reply = recorded[command.idempotency_key]
            if reply.awaiting:  # still outstanding: the answer will carry this attempt
                awaited.append(command)
                done.append((Disposition.AWAITING, command, reply, None))
                continue
            replies.append(step_result_message(command, results_topic, reply))
            done.append((Disposition.DUPLICATE, command, reply, reply.error_type))
        else:
            outcome = outcomes[command.idempotency_key]
            done.append(_settled(outcome, command, transient, final, awaited))
            if not isinstance(outcome, Deferred):
                replies.append(outcome_message(command, results_topic, outcome, clock()))
    await _settle(conn, participant, transient, final, replies)
    await await_answers(conn, participant, awaited)
    return done


def _settled(outcome: Outcome, command: ReceivedCommand, transient: list[str],
             final: list[tuple[str, RecordedReply]], awaited: list[ReceivedCommand]) -> Done:
    """Sort a freshly handled command's outcome into what ``_settle`` and ``await_answers`` write."""
    recorded = RecordedReply.of(outcome)
    if isinstance(outcome, Failed) and outcome.retryable:
        transient.append(command.idempotency_key)  # not recorded: a later attempt does the work
        return Disposition.TRANSIENT, command, recorded, outcome.error_type
    final.append((command.idempotency_key, recorded))
    if isinstance(outcome, Deferred):
        awaited.append(command)
        return Disposition.AWAITING, command, recorded, None
    return Disposition.RECORDED, command, recorded, outcome.error_type if isinstance(outcome, Failed) else None


async def _run_each_in_savepoint(conn: asyncpg.Connection, participant: Participant,
                                 calls: Sequence[Call]) -> dict[str, Outcome]:
    """Each handler in its own savepoint, in order: a failed one leaves no trace, the others stay."""
    return {command.idempotency_key: await _run_in_savepoint(conn, participant, command, saga_input)
            for command, saga_input in calls}


async def _run_bare(conn: asyncpg.Connection, participant: Participant, calls: Sequence[Call]) -> dict[str, Outcome]:
    """Run the handlers without savepoints (two round trips fewer per command), consecutive commands of one
    action through its batch handler when it has one; any failure raises ``_Careful``."""
    outcomes: dict[str, Outcome] = {}
    for action, group in groupby(calls, key=lambda call: call[0].action):
        run = list(group)
        many = participant.batch_handlers.get(action)
        if many is not None and len(run) > 1 and all(participant.reads(command) for command, _ in run):
            results = await _guarded(many(conn, run))
            if len(results) != len(run):
                raise _Careful(f"batch handler {action} returned {len(results)} outcomes for {len(run)} commands")
        else:
            results = [await _run_one_bare(conn, participant, command, saga_input) for command, saga_input in run]
        for (command, _), outcome in zip(run, results, strict=True):
            if isinstance(outcome, Failed):
                raise _Careful(outcome.error_type)
            outcomes[command.idempotency_key] = outcome
    return outcomes


async def _run_one_bare(conn: asyncpg.Connection, participant: Participant, command: ReceivedCommand,
                        saga_input: Mapping[str, Any]) -> Outcome:
    # participant.handler: the single handler, or the batch handler given a batch of one.
    handler = participant.handler(command.action)
    if handler is None or not participant.reads(command):
        return await _run_in_savepoint(conn, participant, command, saga_input)  # refused before any change
    return await _guarded(handler(conn, command, saga_input))


async def _guarded(pending: Awaitable[T]) -> T:
    """Await a handler: a lost database propagates (the batch is retried), any other error means the batch
    is redone carefully."""
    try:
        return await pending
    except _DATABASE_GONE:
        raise
    except Exception as exc:
        raise _Careful(repr(exc)) from exc


async def _claim(conn: asyncpg.Connection, table: str, commands: Sequence[ReceivedCommand]) -> set[str]:
    """Insert a PENDING row per key; returns the keys inserted now (or taken up again: a recorded failure and
    a later attempt). A key held by a concurrent transaction makes the insert wait for that one's commit,
    after which the key counts as recorded."""
    if not commands:
        return set()
    # Sorted by key: concurrent batches of two workers lock the keys in one order (no deadlock).
    rows = sorted(commands, key=lambda c: c.idempotency_key)
    claimed = await conn.fetch(
        f"""INSERT INTO {table} AS p (idempotency_key, saga_id, step, kind, action, attempt, status)
            SELECT k, s, st, kd, a, at, 'PENDING'
            FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[])
                 AS c(k, s, st, kd, a, at)
            {REOPEN_FAILED_ON_A_LATER_ATTEMPT}
            RETURNING idempotency_key""",
        [c.idempotency_key for c in rows], [c.saga_id for c in rows], [c.step for c in rows],
        [c.kind.value for c in rows], [c.action for c in rows], [c.attempt for c in rows],
    )
    return {row["idempotency_key"] for row in claimed}


async def _recorded(conn: asyncpg.Connection, table: str, keys: Sequence[str]) -> dict[str, RecordedReply]:
    """The recorded replies of keys handled before (redeliveries)."""
    if not keys:
        return {}
    rows = await conn.fetch(
        f"""SELECT idempotency_key, status, error_type, error_message, output FROM {table}
            WHERE idempotency_key = ANY($1::text[])""",
        list(keys),
    )
    found = {row["idempotency_key"]: RecordedReply(row["status"], row["error_type"], row["error_message"],
                                                   row["output"]) for row in rows}
    missing = set(keys) - found.keys()
    if missing:  # another holder rolled its claim back between our two statements
        raise RuntimeError(f"idempotency keys {sorted(missing)[:5]} vanished; retry delivery")
    return found


async def _settle(conn: asyncpg.Connection, participant: Participant, transient: Sequence[str],
                  final: Sequence[tuple[str, RecordedReply]], replies: Sequence[OutboxMessage]) -> None:
    """Free the keys of transient failures, record the final outcome of the others and queue every reply,
    in one statement (data-modifying CTEs; the reply rows get ids in ``replies`` order)."""
    table = participant.processed_table
    await conn.execute(
        f"""WITH freed AS (DELETE FROM {table} WHERE idempotency_key = ANY($1::text[])),
            recorded AS (UPDATE {table} AS p SET status = f.status, error_type = f.error_type,
                                error_message = f.error_message, output = f.output
                         FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[])
                              AS f(idempotency_key, status, error_type, error_message, output)
                         WHERE p.idempotency_key = f.idempotency_key)
            {insert_sql(participant.outbox_table, 7)}""",
        list(transient),
        [key for key, _ in final], [r.status for _, r in final], [r.error_type for _, r in final],
        [r.error_message for _, r in final], [r.output for _, r in final],
        *insert_params(replies),
    )
