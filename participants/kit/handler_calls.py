"""A participant's handler calls inside the transaction that records their outcomes: each call in a savepoint
of its own (a failed one is rolled back alone), a batch handler's calls in one; a transaction with one call takes
none and is run again without it when it fails (``Redo``). Each call is bounded by its command's time and its
outcome by the kit's limits (``within_limits``)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import Any

import asyncpg
from opentelemetry.trace import Status, StatusCode

from ...infra import tracing
from ...infra.failures import Fault, classify
from ...schemas.limits import MAX_ERROR_MESSAGE_CHARS, MAX_STEP_OUTPUT_BYTES, OUTPUT_TOO_LARGE, clip_text
from .outcome import Failed, Outcome, ReceivedCommand, Succeeded
from .participant import BatchHandler, Call, Participant

log = logging.getLogger(__name__)

MAX_SAVEPOINTS = 60
"""Handler calls per transaction, each in a savepoint: a transaction with more than 64 subtransactions that
wrote overflows every backend's cache of them (``PGPROC_MAX_CACHED_SUBXIDS``), and visibility checks elsewhere
then read ``pg_subtrans`` until it ends."""


HANDLER_TIMED_OUT = "HandlerTimedOut"
"""error_type of the answer to a forward command whose handler ran past the command's ``timeout_ms``: its change is
rolled back (retryable: the attempt counts, as the saga's retry policy says)."""

class Redo(Exception):
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
    none (``needed`` False): a failure rolls the transaction back (``Redo``)."""

    def __init__(self, conn: asyncpg.Connection, needed: bool) -> None:
        self._conn = conn
        self.needed = needed
        self._set = False

    async def set(self) -> None:
        if self.needed:
            await self._conn.execute("RELEASE SAVEPOINT handler; SAVEPOINT handler" if self._set
                                     else "SAVEPOINT handler")
            self._set = True

    async def undo(self, redo: Redo) -> None:
        """Roll the failed call back: to its savepoint, or (none needed) the whole transaction, by raising
        ``redo``."""
        if not self.needed:
            raise redo
        await self._conn.execute("ROLLBACK TO SAVEPOINT handler")


async def run_handlers(conn: asyncpg.Connection, participant: Participant, calls: Sequence[Call],
                        redo: Redo | None = None) -> dict[str, Outcome]:
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
        if tracing.tracer is not None:  # one call for all: a span of the unit in each command's saga trace
            for (command, _), outcome in zip(run, results, strict=True):
                tracing.open_span(command.traceparent, _handled(participant, command, outcome))
        return results
    log.warning("batch handler failed, running its commands one at a time",
                extra={"participant": participant.name, "action": run[0][0].action, "commands": len(run),
                       "saga_ids": [command.saga_id for command, _ in run][:20], "error": problem})
    await savepoints.undo(Redo(one_by_one=True))
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
    with tracing.unit_span(command.traceparent) as span:
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
        await savepoints.undo(Redo({command.idempotency_key: outcome}))
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
