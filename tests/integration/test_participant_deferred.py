"""Deferred answers on a real Postgres: a handler that asks a human replies nothing, redeliveries wait and move
the awaited attempt on, and the answer given later is recorded and replied once, one by one and in batches."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import asyncpg
import pytest

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.participants.kit.ddl import ensure_participant_schema
from saga_orchestrator.participants.kit.deferred import complete
from saga_orchestrator.participants.kit.handling import Disposition, handle_command, handle_commands
from saga_orchestrator.participants.kit.ledger import awaiting, prune_processed_commands
from saga_orchestrator.participants.kit.outcome import Deferred, Failed, Outcome, ReceivedCommand, Succeeded
from saga_orchestrator.participants.kit.participant import Participant
from tests.integration.test_participants import TOPICS, command, delivered, new_saga_id, processed, replies

pytestmark = pytest.mark.integration


async def ask_a_human(conn: asyncpg.Connection, command: ReceivedCommand, trip: Mapping[str, Any]) -> Outcome:
    await conn.execute("INSERT INTO deferredtest.requests (idempotency_key, saga_id) VALUES ($1, $2)",
                       command.idempotency_key, command.saga_id)
    return Deferred()


async def book_at_once(conn: asyncpg.Connection, command: ReceivedCommand, trip: Mapping[str, Any]) -> Outcome:
    return Succeeded(b"booked")


DESK = Participant(
    name="flight", schema="deferredtest", handlers={"book_flight": ask_a_human, "cancel_flight": book_at_once},
    business_ddl=("CREATE TABLE IF NOT EXISTS deferredtest.requests (idempotency_key text PRIMARY KEY,"
                  " saga_id text NOT NULL)",))


@pytest.fixture(scope="module")
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, 4)
    await ensure_participant_schema(pool, DESK)
    yield pool
    await pool.close()


Message = tuple[bytes, dict[str, bytes]]


async def _one_by_one(pool: asyncpg.Pool, messages: Sequence[Message]) -> list[Disposition]:
    return [await handle_command(pool, DESK, TOPICS, delivered(DESK, value, headers)) for value, headers in messages]


async def _batched(pool: asyncpg.Pool, messages: Sequence[Message]) -> list[Disposition]:
    return await handle_commands(pool, DESK, TOPICS, [delivered(
        "flight", value, headers) for value, headers in messages])


async def _answer(pool: asyncpg.Pool, key: str, outcome: Succeeded | Failed, operator: str | None = None) -> bool:
    async with pool.acquire() as conn, conn.transaction():
        return await complete(conn, DESK, TOPICS, key, outcome, operator=operator, detail=operator and "by phone")


@pytest.mark.parametrize("deliver", [_one_by_one, _batched], ids=["one by one", "in a batch"])
async def test_a_deferred_command_waits_for_its_answer_then_answers_every_redelivery(
        pool: asyncpg.Pool, deliver: Any) -> None:
    saga_id, other = new_saga_id(), new_saga_id()
    key = f"{saga_id}:flight"

    def attempt(n: int, saga: str = saga_id, action: str = "book_flight") -> Message:
        return command(saga, "flight", action, attempt=n)

    assert await deliver(pool, [attempt(1), attempt(1, other, "cancel_flight")]) == [
        Disposition.AWAITING, Disposition.RECORDED]
    assert await deliver(pool, [attempt(2)]) == [Disposition.AWAITING]  # the step's retry: still waiting
    assert await replies(pool, "deferredtest", saga_id) == []
    [waiting] = await awaiting(pool, DESK, saga_id)
    assert (waiting.idempotency_key, waiting.step, waiting.attempt) == (key, "flight", 2)
    [record] = await processed(pool, "deferredtest", saga_id)
    assert record["status"] == "AWAITING"

    assert await _answer(pool, key, Succeeded(b'{"seat": "12A"}'), operator="pat")
    assert not await _answer(pool, key, Failed("Late", "answered twice"))  # answered already
    assert await awaiting(pool, DESK, saga_id) == []
    assert await deliver(pool, [attempt(3)]) == [Disposition.DUPLICATE]  # the answer, recorded, answers again
    answers = [(r["result"]["attempt"], r["result"]["status"], r["result"]["output"], r["result"]["operator"],
                r["result"]["detail"]) for r in await replies(pool, "deferredtest", saga_id)]
    # Who answered travels with the answer; a redelivery's copy of it names nobody (the saga recorded it once).
    assert answers == [(2, "SUCCEEDED", b'{"seat": "12A"}', "pat", "by phone"),
                       (3, "SUCCEEDED", b'{"seat": "12A"}', None, None)]
    assert await pool.fetchval("SELECT count(*) FROM deferredtest.requests WHERE saga_id = $1", saga_id) == 1


async def test_a_definitive_refusal_is_a_failed_reply_and_a_transient_one_is_not_an_answer(pool: asyncpg.Pool) -> None:
    saga_id = new_saga_id()
    key = f"{saga_id}:flight"
    assert await _one_by_one(pool, [command(saga_id, "flight", "book_flight")]) == [Disposition.AWAITING]
    with pytest.raises(ValueError, match="definitive"):
        await _answer(pool, key, Failed("Busy", "ask later", retryable=True))
    assert await _answer(pool, key, Failed("Rejected", "manager said no"))
    [reply] = await replies(pool, "deferredtest", saga_id)
    assert (reply["result"]["status"], reply["result"]["error_type"]) == ("FAILED", "Rejected")
    assert reply["headers"]["causation_id"] == f"{saga_id}:command:1"


async def test_retention_keeps_a_key_still_awaiting_its_answer(pool: asyncpg.Pool) -> None:
    saga_id = new_saga_id()
    assert await _one_by_one(pool, [command(saga_id, "flight", "book_flight")]) == [Disposition.AWAITING]
    await pool.execute("UPDATE deferredtest.processed_commands SET processed_at = now() - interval '30 days'"
                       " WHERE saga_id = $1", saga_id)
    await prune_processed_commands(pool, DESK.schema, 3600)
    [record] = await processed(pool, "deferredtest", saga_id)
    assert record["status"] == "AWAITING"


@pytest.mark.parametrize("deliver", [_one_by_one, _batched], ids=["one by one", "in a batch"])
async def test_a_compensation_withdraws_the_wait_and_a_later_answer_is_refused(
        pool: asyncpg.Pool, deliver: Any) -> None:
    saga_id = new_saga_id()
    assert await deliver(pool, [command(saga_id, "flight", "book_flight")]) == [Disposition.AWAITING]
    undo = command(saga_id, "flight", "cancel_flight", compensate=True)
    assert await deliver(pool, [undo]) == [Disposition.RECORDED]
    assert await awaiting(pool, DESK, saga_id) == []
    assert not await _answer(pool, f"{saga_id}:flight", Succeeded(b"too late"))
    forward = [r for r in await processed(pool, "deferredtest", saga_id) if r["kind"] == "FORWARD"]
    assert [(r["status"], r["error_type"]) for r in forward] == [("COMPENSATED", "Withdrawn")]
    assert [r["result"]["kind"] for r in await replies(pool, "deferredtest", saga_id)] == ["COMPENSATE"]


async def _shards_of_replies(pool: asyncpg.Pool, schema: str, saga_id: str) -> list[int]:
    return [row["shard"] for row in await pool.fetch(
        f"SELECT shard FROM {schema}.outbox WHERE message_key = $1 ORDER BY id", saga_id)]


@pytest.mark.parametrize("batched", [False, True], ids=["one by one", "in a batch"])
async def test_a_deferred_answer_goes_to_the_shard_of_its_commands_partition(pool: asyncpg.Pool,
                                                                            batched: bool) -> None:
    """The worker that owns the command's partition relays the answer given later, as it relays the others."""
    saga_id = new_saga_id()
    first = delivered(DESK, *command(saga_id, "flight", "book_flight", attempt=1), partition=5, offset=1,
                      key=saga_id.encode())
    if batched:
        assert await handle_commands(pool, DESK, TOPICS, [first]) == [Disposition.AWAITING]
    else:
        assert await handle_command(pool, DESK, TOPICS, first) == Disposition.AWAITING
    retry = delivered(DESK, *command(saga_id, "flight", "book_flight", attempt=2), partition=5, offset=2,
                      key=saga_id.encode())
    assert await handle_commands(pool, DESK, TOPICS, [retry]) == [Disposition.AWAITING]
    assert await _answer(pool, f"{saga_id}:flight", Succeeded(b"booked"))
    assert await _shards_of_replies(pool, "deferredtest", saga_id) == [5]


async def test_a_wait_recorded_before_shards_existed_is_answered_in_shard_zero(database_url: str) -> None:
    """A participant table made before the ``shard`` column gets it at the next start; its waits answer in
    shard 0, as every outbox row written before shards."""
    old = Participant(name="flight", schema="deferredold", handlers=DESK.handlers, business_ddl=DESK.business_ddl)
    pool = await create_pool(database_url, 2)
    try:
        await pool.execute("DROP SCHEMA IF EXISTS deferredold CASCADE")
        await ensure_participant_schema(pool, old)
        await pool.execute("ALTER TABLE deferredold.awaiting_commands DROP COLUMN shard")
        saga_id = new_saga_id()
        await pool.execute(
            "INSERT INTO deferredold.awaiting_commands (idempotency_key, saga_id, saga_type, step, kind, action,"
            " attempt, command_message_id) VALUES ($1, $2, 'trip', 'flight', 'FORWARD', 'book_flight', 1, 'm-1')",
            f"{saga_id}:flight", saga_id)
        await pool.execute(
            "INSERT INTO deferredold.processed_commands (idempotency_key, saga_id, step, kind, action, attempt,"
            " status) VALUES ($1, $2, 'flight', 'FORWARD', 'book_flight', 1, 'AWAITING')", f"{saga_id}:flight",
            saga_id)
        await ensure_participant_schema(pool, old)
        async with pool.acquire() as conn, conn.transaction():
            assert await complete(conn, old, TOPICS, f"{saga_id}:flight", Succeeded(b"booked"))
        assert await _shards_of_replies(pool, "deferredold", saga_id) == [0]
    finally:
        await pool.execute("DROP SCHEMA IF EXISTS deferredold CASCADE")
        await pool.close()
