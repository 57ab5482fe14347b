"""One command that fails every time (a business change that breaks a constraint only at commit) cannot stop a
participant worker: the batch is handled a command at a time, the poisoned one is dead-lettered with its bytes
and answered with a definitive failure, and every other command of the batch is handled (real Postgres)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import asyncpg
import pytest

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.participants.host import ParticipantHost
from saga_orchestrator.participants.kit.ddl import ensure_participant_schema
from saga_orchestrator.participants.kit.handling import UNPROCESSABLE, Disposition
from saga_orchestrator.participants.kit.outcome import Outcome, ReceivedCommand, Succeeded
from saga_orchestrator.participants.kit.participant import Participant
from tests.integration.test_participants import command, delivered, new_saga_id, replies

pytestmark = pytest.mark.integration

# The deferred foreign key is checked at COMMIT, after every handler returned: the failure is the whole
# batch's transaction, and it comes back on every redelivery of that command.
DDL = (
    "CREATE TABLE IF NOT EXISTS poisonous.parents (id text PRIMARY KEY)",
    """CREATE TABLE IF NOT EXISTS poisonous.children (
        saga_id text PRIMARY KEY,
        parent  text NOT NULL REFERENCES poisonous.parents (id) DEFERRABLE INITIALLY DEFERRED)""",
)


async def book(conn: asyncpg.Connection, command: ReceivedCommand, saga_input: Mapping[str, Any]) -> Outcome:
    parent = "missing" if saga_input["customer_id"] == "poison" else "p-1"
    await conn.execute("INSERT INTO poisonous.children VALUES ($1, $2) ON CONFLICT DO NOTHING", command.saga_id, parent)
    return Succeeded()


POISONOUS = Participant(name="poisonous", schema="poisonous", handlers={"book": book}, business_ddl=DDL)


@pytest.fixture(scope="module")
async def host(database_url: str) -> AsyncIterator[ParticipantHost]:
    pool = await create_pool(database_url, 4)
    await ensure_participant_schema(pool, POISONOUS)
    await pool.execute("INSERT INTO poisonous.parents VALUES ('p-1') ON CONFLICT DO NOTHING")
    await pool.close()
    settings = Settings(database_url=database_url, kafka_bootstrap_servers="127.0.0.1:1", saga_poison_attempts=2,
                        saga_participant_retention_hours=0)
    host = ParticipantHost(POISONOUS, settings)
    yield host
    await host.stop()


async def test_a_command_that_fails_every_time_is_dead_lettered_and_the_batch_goes_on(
        host: ParticipantHost) -> None:
    healthy = [new_saga_id() for _ in range(3)]
    poisoned = new_saga_id()
    batch = [delivered(POISONOUS, *command(saga_id, "step", "book", customer_id="poison" if saga_id == poisoned
                                           else "c-1"))
             for saga_id in (healthy[0], poisoned, *healthy[1:])]
    dispositions = await asyncio.wait_for(host.process_batch(batch), 60)
    assert dispositions == [Disposition.RECORDED, Disposition.DEAD_LETTERED, Disposition.RECORDED,
                            Disposition.RECORDED]
    pool = await host.start()
    kept = {row["saga_id"] for row in await pool.fetch("SELECT saga_id FROM poisonous.children")}
    assert set(healthy) <= kept and poisoned not in kept
    rows = await replies(pool, "poisonous", poisoned)
    assert [row["name"] for row in rows] == ["saga.v1.StepResult", "saga.v1.DeadLetter"]
    result, letter = rows[0]["result"], rows[1]["result"]
    assert (result["status"], result["error_type"]) == ("FAILED", UNPROCESSABLE)
    assert "ForeignKeyViolationError" in letter["reason"] and letter["original_value"] == batch[1].value
    # A redelivery gets the recorded failure, not another try.
    assert await asyncio.wait_for(host.process_batch([batch[1]]), 60) == [Disposition.DUPLICATE]
