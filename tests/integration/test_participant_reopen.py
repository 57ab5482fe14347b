"""A recorded definitive failure answers redeliveries of its attempt; a later attempt of the key (a retry
after a timeout, `saga resume` after a human fixed the cause) runs the handler again. A recorded success
answers every attempt: the business change never happens twice. On a real Postgres, one delivery at a time
and in batches."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import asyncpg
import pytest

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.participants.kit.ddl import ensure_participant_schema
from saga_orchestrator.participants.kit.handling import Disposition, handle_command, handle_commands
from saga_orchestrator.participants.kit.outcome import Failed, Outcome, ReceivedCommand, Succeeded
from saga_orchestrator.participants.kit.participant import Participant
from tests.integration.test_participants import TOPICS, command, delivered, new_saga_id, processed, replies

pytestmark = pytest.mark.integration


async def cancel_unless_refused(conn: asyncpg.Connection, command: ReceivedCommand,
                                trip: Mapping[str, Any]) -> Outcome:
    """Refuses for good until an operator lifted the refusal for the saga (a row in ``lifted``)."""
    if not await conn.fetchval("SELECT true FROM reopentest.lifted WHERE saga_id = $1", command.saga_id):
        return Failed("CancellationRefused", "this fare cannot be cancelled")
    await conn.execute("INSERT INTO reopentest.cancelled (saga_id) VALUES ($1)", command.saga_id)
    return Succeeded()


FLIGHT_DESK = Participant(
    name="flight", schema="reopentest", handlers={"cancel_flight": cancel_unless_refused},
    business_ddl=("CREATE TABLE IF NOT EXISTS reopentest.lifted (saga_id text PRIMARY KEY)",
                  "CREATE TABLE IF NOT EXISTS reopentest.cancelled (saga_id text NOT NULL)"))


@pytest.fixture(scope="module")
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, 4)
    await ensure_participant_schema(pool, FLIGHT_DESK)
    yield pool
    await pool.close()


async def _one(pool: asyncpg.Pool, message: tuple[bytes, dict[str, bytes]]) -> Disposition:
    value, headers = message
    return await handle_command(pool, FLIGHT_DESK, TOPICS, delivered(FLIGHT_DESK, value, headers))


async def _batched(pool: asyncpg.Pool, message: tuple[bytes, dict[str, bytes]]) -> Disposition:
    value, headers = message
    incoming = delivered("flight", value, headers)
    return (await handle_commands(pool, FLIGHT_DESK, TOPICS, [incoming]))[0]


@pytest.mark.parametrize("deliver", [_one, _batched], ids=["one by one", "in a batch"])
async def test_a_refused_compensation_is_taken_up_again_by_a_later_attempt_and_done_once(
        pool: asyncpg.Pool, deliver: Any) -> None:
    saga_id = new_saga_id()

    def attempt(n: int) -> tuple[bytes, dict[str, bytes]]:
        return command(saga_id, "book_flight", "cancel_flight", compensate=True, attempt=n)

    async def outcomes() -> list[tuple[int, str, str | None]]:
        rows = await replies(pool, "reopentest", saga_id)
        return [(r["result"]["attempt"], r["result"]["status"], r["result"]["error_type"]) for r in rows]

    assert await deliver(pool, attempt(1)) is Disposition.RECORDED
    assert await deliver(pool, attempt(1)) is Disposition.DUPLICATE  # a redelivery: the recorded refusal
    assert await deliver(pool, attempt(2)) is Disposition.RECORDED  # taken up again, refused again
    await pool.execute("INSERT INTO reopentest.lifted (saga_id) VALUES ($1)", saga_id)  # a human fixed it
    assert await deliver(pool, attempt(2)) is Disposition.DUPLICATE  # still a redelivery of attempt 2
    assert await deliver(pool, attempt(3)) is Disposition.RECORDED  # `saga resume`: done now
    assert await deliver(pool, attempt(4)) is Disposition.DUPLICATE  # a success answers every attempt
    assert await deliver(pool, attempt(3)) is Disposition.DUPLICATE

    assert await outcomes() == [(1, "FAILED", "CancellationRefused"), (1, "FAILED", "CancellationRefused"),
                                (2, "FAILED", "CancellationRefused"), (2, "FAILED", "CancellationRefused"),
                                (3, "SUCCEEDED", None), (4, "SUCCEEDED", None), (3, "SUCCEEDED", None)]
    assert await pool.fetchval("SELECT count(*) FROM reopentest.cancelled WHERE saga_id = $1", saga_id) == 1
    records = {r["kind"]: r for r in await processed(pool, "reopentest", saga_id)}
    assert (records["COMPENSATE"]["attempt"], records["COMPENSATE"]["status"]) == (3, "SUCCEEDED")
    assert records["FORWARD"]["status"] == "COMPENSATED"  # the tombstone the first compensation left
