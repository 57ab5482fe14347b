"""The participant's side of the turn-back fence and of a step's clock, on a real Postgres.

- A WithdrawStep fences the forward key (the command does not run when it comes later, also in the same batch)
  and answers whether the command had run: its recorded success, or FAILED Withdrawn; a deferred wait is
  withdrawn with it, and a late answer is refused saying why.
- A forward command picked up after its ``expires_at`` is answered Expired, not run and not recorded, so the
  next attempt runs; a handler that runs past the command's ``timeout_ms`` is cancelled, its change rolled back,
  and answered HandlerTimedOut; a deferred answer that does not come within it is answered AnswerTimedOut.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import asyncpg
import pytest

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.participants.kit.ddl import ensure_participant_schema
from saga_orchestrator.participants.kit.deferred import answer_overdue, complete, why_not_awaiting
from saga_orchestrator.participants.kit.handler_calls import HANDLER_TIMED_OUT
from saga_orchestrator.participants.kit.handling import EXPIRED, Disposition, handle_commands
from saga_orchestrator.participants.kit.ledger import ANSWER_TIMED_OUT, WITHDRAWN, awaiting
from saga_orchestrator.participants.kit.outcome import Deferred, Outcome, ReceivedCommand, Succeeded
from saga_orchestrator.participants.kit.participant import Participant
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.ids import forward_key
from saga_orchestrator.schemas.message_types import CommandKind, StepCommand, WithdrawStep
from saga_orchestrator.schemas.registry import default_registry
from tests.integration.test_participants import TOPICS, TRIP, delivered, replies

pytestmark = pytest.mark.integration

SCHEMA = "fencetest"


async def book(conn: asyncpg.Connection, command: ReceivedCommand, trip: Mapping[str, Any]) -> Outcome:
    await conn.execute(f"INSERT INTO {SCHEMA}.bookings VALUES ($1, $2)", command.saga_id, command.attempt)
    if trip["destination"] == "Slowtown":
        await asyncio.sleep(5)  # an external call that hangs
    return Succeeded(f"booked by attempt {command.attempt}".encode())


async def ask(conn: asyncpg.Connection, command: ReceivedCommand, trip: Mapping[str, Any]) -> Outcome:
    return Deferred()


DESK = Participant(
    name="desk", schema=SCHEMA, handlers={"book": book, "ask": ask},
    business_ddl=(f"CREATE TABLE IF NOT EXISTS {SCHEMA}.bookings (saga_id text, attempt int)",))


@pytest.fixture(scope="module")
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, 4)
    await ensure_participant_schema(pool, DESK)
    yield pool
    await pool.close()


def _saga() -> str:
    return f"fence-{uuid.uuid4().hex[:10]}"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _forward(saga_id: str, action: str = "book", attempt: int = 1, expires_in_ms: int = 60_000,
             timeout_ms: int | None = 2_000, **trip: Any) -> tuple[bytes, dict[str, bytes]]:
    step = action
    command = StepCommand(
        saga_id=saga_id, saga_type="trip", step=step, participant=DESK.name, action=action,
        kind=CommandKind.FORWARD, idempotency_key=forward_key(saga_id, step), attempt=attempt,
        input=default_registry().encode("saga.v1.trip.TripRequest", {**TRIP, **trip}),
        message_id=f"{saga_id}:command:{attempt}", expires_at=_now_ms() + expires_in_ms, timeout_ms=timeout_ms)
    return wire.encode_command(command), {"message_id": command.message_id.encode(), "saga_id": saga_id.encode()}


def _withdrawal(saga_id: str, action: str = "book", attempt: int = 1,
                key: str | None = None) -> tuple[bytes, dict[str, bytes]]:
    withdrawal = WithdrawStep(saga_id=saga_id, saga_type="trip", step=action, participant=DESK.name, action=action,
                              idempotency_key=key or forward_key(saga_id, action), attempt=attempt,
                              reason="the saga turned back: cancel requested", message_id=f"{saga_id}:withdraw")
    return wire.encode_withdraw(withdrawal), {"message_id": withdrawal.message_id.encode(),
                                              "saga_id": saga_id.encode()}


async def _deliver(pool: asyncpg.Pool, *messages: tuple[bytes, dict[str, bytes]]) -> list[Disposition]:
    return await handle_commands(pool, DESK, TOPICS, [delivered(DESK, *message) for message in messages])


async def _answers(pool: asyncpg.Pool, saga_id: str) -> list[tuple[str, int, str, str | None, str]]:
    """(kind, attempt, status, error type, message id) of every StepResult the participant wrote for the saga."""
    return [(r["result"]["kind"], r["result"]["attempt"], r["result"]["status"], r["result"]["error_type"],
             r["message_id"]) for r in await replies(pool, SCHEMA, saga_id) if r["name"] == "saga.v1.StepResult"]


async def _bookings(pool: asyncpg.Pool, saga_id: str) -> list[int]:
    return [row["attempt"] for row in await pool.fetch(f"SELECT attempt FROM {SCHEMA}.bookings WHERE saga_id = $1",
                                                       saga_id)]


async def test_a_withdrawal_before_the_command_came_fences_it_and_answers_withdrawn(pool: asyncpg.Pool) -> None:
    saga_id = _saga()
    assert await _deliver(pool, _withdrawal(saga_id)) == [Disposition.WITHDRAWN]
    assert await _deliver(pool, _forward(saga_id)) == [Disposition.FENCED]  # it came late: it does not run
    assert await _bookings(pool, saga_id) == []
    assert await _answers(pool, saga_id) == [
        ("FORWARD", 1, "FAILED", WITHDRAWN, f"{saga_id}:book:withdrawn:1"),
        ("FORWARD", 1, "FAILED", WITHDRAWN, f"{saga_id}:book:reply:1")]


async def test_a_withdrawal_after_the_command_ran_answers_its_success(pool: asyncpg.Pool) -> None:
    saga_id = _saga()
    assert await _deliver(pool, _forward(saga_id)) == [Disposition.RECORDED]
    assert await _deliver(pool, _withdrawal(saga_id)) == [Disposition.WITHDRAWN]
    assert await _bookings(pool, saga_id) == [1]  # it ran: the saga compensates it (or reports it)
    withdrawn = [r["result"] for r in await replies(pool, SCHEMA, saga_id)][-1]
    assert (withdrawn["status"], withdrawn["output"]) == ("SUCCEEDED", b"booked by attempt 1")


async def test_a_command_withdrawn_later_in_its_own_batch_never_runs(pool: asyncpg.Pool) -> None:
    saga_id = _saga()  # the participant was down: the command and its withdrawal wait, and come together
    dispositions = await _deliver(pool, _forward(saga_id), _forward(saga_id, attempt=2),
                                  _withdrawal(saga_id, attempt=2))
    assert dispositions == [Disposition.FENCED, Disposition.FENCED, Disposition.WITHDRAWN]
    assert await _bookings(pool, saga_id) == []
    assert await _answers(pool, saga_id) == [("FORWARD", 2, "FAILED", WITHDRAWN, f"{saga_id}:book:withdrawn:2")]


async def test_a_withdrawal_of_another_steps_key_is_dead_lettered(pool: asyncpg.Pool) -> None:
    saga_id = _saga()
    forged = _withdrawal(saga_id, key=forward_key("someone-else", "book"))
    assert await _deliver(pool, forged) == [Disposition.DEAD_LETTERED]
    assert await _deliver(pool, _forward(saga_id)) == [Disposition.RECORDED]


async def test_a_command_picked_up_after_it_expired_does_not_run_and_the_next_attempt_does(
        pool: asyncpg.Pool) -> None:
    saga_id = _saga()
    assert await _deliver(pool, _forward(saga_id, expires_in_ms=-5_000)) == [Disposition.EXPIRED]
    assert await _bookings(pool, saga_id) == []
    [(kind, attempt, status, error, _)] = await _answers(pool, saga_id)
    assert (kind, attempt, status, error) == ("FORWARD", 1, "FAILED", EXPIRED)
    [expired] = [r["result"] for r in await replies(pool, SCHEMA, saga_id)]
    assert expired["retryable"] is True and "after the attempt expired: not run" in expired["error_message"]
    assert await _deliver(pool, _forward(saga_id, attempt=2)) == [Disposition.RECORDED]  # nothing was recorded
    assert await _bookings(pool, saga_id) == [2]


async def test_a_handler_that_runs_past_its_time_is_cancelled_and_rolled_back(pool: asyncpg.Pool) -> None:
    saga_id = _saga()
    started = time.monotonic()
    assert await _deliver(pool, _forward(saga_id, timeout_ms=300, destination="Slowtown")) == [Disposition.TRANSIENT]
    assert time.monotonic() - started < 3  # cancelled at 0.3 s, not after the handler's 5 s
    assert await _bookings(pool, saga_id) == []  # its insert was rolled back
    [(kind, attempt, status, error, _)] = await _answers(pool, saga_id)
    assert (kind, attempt, status, error) == ("FORWARD", 1, "FAILED", HANDLER_TIMED_OUT)
    assert await _deliver(pool, _forward(saga_id, attempt=2)) == [Disposition.RECORDED]  # the key stayed free


async def test_a_withdrawn_wait_for_a_person_is_gone_and_a_late_answer_is_refused_saying_why(
        pool: asyncpg.Pool) -> None:
    saga_id = _saga()
    assert await _deliver(pool, _forward(saga_id, "ask", timeout_ms=86_400_000)) == [Disposition.AWAITING]
    assert [a.saga_id for a in await awaiting(pool, DESK, saga_id)] == [saga_id]
    assert await _deliver(pool, _withdrawal(saga_id, "ask")) == [Disposition.WITHDRAWN]
    assert await awaiting(pool, DESK, saga_id) == []
    key = forward_key(saga_id, "ask")
    async with pool.acquire() as conn, conn.transaction():
        assert not await complete(conn, DESK, TOPICS, key, Succeeded(b"ok"), operator="ana")
    why = await why_not_awaiting(pool, DESK, key)
    assert why.startswith(f"{key} was withdrawn at ") and "its saga turned back" in why
    assert [error for *_, error, _ in await _answers(pool, saga_id)] == [WITHDRAWN]


async def test_a_deferred_answer_that_does_not_come_in_time_is_answered_answer_timed_out(pool: asyncpg.Pool) -> None:
    saga_id = _saga()
    assert await _deliver(pool, _forward(saga_id, "ask", timeout_ms=200)) == [Disposition.AWAITING]
    await asyncio.sleep(0.3)
    assert await answer_overdue(pool, DESK, TOPICS) >= 1
    assert await awaiting(pool, DESK, saga_id) == []
    assert [error for *_, error, _ in await _answers(pool, saga_id)] == [ANSWER_TIMED_OUT]
    key = forward_key(saga_id, "ask")
    why = await why_not_awaiting(pool, DESK, key)
    assert why.startswith(f"{key} timed out at ") and "within its step's timeout" in why
    assert await _deliver(pool, _forward(saga_id, "ask", timeout_ms=200)) == [Disposition.DUPLICATE]
