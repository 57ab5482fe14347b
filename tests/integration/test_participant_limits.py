"""A handler whose output is over the step-output limit gets the definitive failure OutputTooLarge, and its
business change is rolled back, alone or in a batch (real Postgres)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import asyncpg
import pytest

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.participants.kit.ddl import ensure_participant_schema
from saga_orchestrator.participants.kit.handling import Disposition, handle_commands
from saga_orchestrator.participants.kit.outcome import Outcome, ReceivedCommand, Succeeded
from saga_orchestrator.participants.kit.participant import Call, Participant
from saga_orchestrator.schemas.limits import MAX_STEP_OUTPUT_BYTES, OUTPUT_TOO_LARGE
from tests.integration.test_participants import TOPICS, command, delivered, new_saga_id, replies

pytestmark = pytest.mark.integration

DDL = ("CREATE TABLE IF NOT EXISTS bulky.notes (saga_id text PRIMARY KEY)",)


def _output(saga_input: Mapping[str, Any]) -> bytes:
    size = MAX_STEP_OUTPUT_BYTES + 1 if saga_input["customer_id"] == "bulky" else 10
    return b"o" * size


async def note(conn: asyncpg.Connection, command: ReceivedCommand, saga_input: Mapping[str, Any]) -> Outcome:
    await conn.execute("INSERT INTO bulky.notes VALUES ($1)", command.saga_id)
    return Succeeded(_output(saga_input))


async def note_many(conn: asyncpg.Connection, calls: Sequence[Call]) -> list[Outcome]:
    await conn.executemany("INSERT INTO bulky.notes VALUES ($1)", [(c.saga_id,) for c, _ in calls])
    return [Succeeded(_output(saga_input)) for _, saga_input in calls]


BULKY = Participant(name="bulky", schema="bulky", handlers={"note": note}, batch_handlers={"note": note_many},
                    business_ddl=DDL)


@pytest.fixture(scope="module")
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, 4)
    await ensure_participant_schema(pool, BULKY)
    yield pool
    await pool.close()


@pytest.mark.parametrize("batched", [False, True])
async def test_an_oversize_output_is_a_definitive_failure_that_leaves_no_change(pool: asyncpg.Pool,
                                                                                batched: bool) -> None:
    fine, bulky = new_saga_id(), new_saga_id()
    records = [delivered(BULKY, *command(saga_id, "step", "note", customer_id=who))
               for saga_id, who in ((fine, "c-1"), (bulky, "bulky"))]
    if batched:
        dispositions = await handle_commands(pool, BULKY, TOPICS, records)
    else:
        dispositions = [(await handle_commands(pool, BULKY, TOPICS, [record]))[0] for record in records]
    assert dispositions == [Disposition.RECORDED, Disposition.RECORDED]
    kept = {row["saga_id"] for row in await pool.fetch("SELECT saga_id FROM bulky.notes")}
    assert fine in kept and bulky not in kept
    [reply] = await replies(pool, "bulky", bulky)
    assert (reply["result"]["status"], reply["result"]["error_type"]) == ("FAILED", OUTPUT_TOO_LARGE)
    assert reply["result"]["output"] is None
    [ok] = await replies(pool, "bulky", fine)
    assert ok["result"]["status"] == "SUCCEEDED" and ok["result"]["output"] == b"o" * 10
