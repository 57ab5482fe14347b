"""The orchestrator's inbox forgets handled messages after the retention, on a real Postgres."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.orchestrator.retention import inbox_pruner
from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate

pytestmark = pytest.mark.integration

HOUR_S = 3600.0


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, 2)
    await migrate(pool)
    await pool.execute("TRUNCATE saga.inbox")
    try:
        yield pool
    finally:
        await pool.close()


async def _received(pool: asyncpg.Pool, ages_h: dict[str, float]) -> None:
    await pool.executemany(
        "INSERT INTO saga.inbox (consumer, message_id, received_at)"
        " VALUES ('orchestrator', $1, now() - make_interval(secs => $2))",
        [(message_id, age * HOUR_S) for message_id, age in ages_h.items()])


async def _left(pool: asyncpg.Pool) -> list[str]:
    return [row["message_id"] for row in await pool.fetch("SELECT message_id FROM saga.inbox ORDER BY 1")]


async def test_rows_older_than_the_retention_are_deleted_in_batches_and_newer_ones_kept(pool: asyncpg.Pool) -> None:
    await _received(pool, {**{f"old-{n}": 200 + n for n in range(7)}, "day-old": 24, "fresh": 0})
    assert await PostgresStore(pool).prune_inbox(168 * HOUR_S, batch=3) == 7
    assert await _left(pool) == ["day-old", "fresh"]
    assert await PostgresStore(pool).prune_inbox(168 * HOUR_S, batch=3) == 0
    assert await PostgresStore(pool).prune_inbox(12 * HOUR_S) == 1
    assert await _left(pool) == ["fresh"]


async def test_the_pruner_prunes_at_start_and_stops_when_asked(pool: asyncpg.Pool) -> None:
    await _received(pool, {"old": 200, "fresh": 0})
    pruner = inbox_pruner(PostgresStore(pool), 168 * HOUR_S, every_s=3600)
    stop = asyncio.Event()
    running = asyncio.create_task(pruner.run(stop))
    for _ in range(100):
        if pruner.done:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(running, 5)  # asleep for an hour, it still stops at once
    assert pruner.done == 1
    assert await _left(pool) == ["fresh"]


async def test_a_pruner_whose_database_calls_fail_keeps_running(pool: asyncpg.Pool) -> None:
    await pool.close()
    pruner = inbox_pruner(pool, HOUR_S, every_s=0.05)
    stop = asyncio.Event()
    running = asyncio.create_task(pruner.run(stop))
    await asyncio.sleep(0.3)
    assert not running.done()
    stop.set()
    await asyncio.wait_for(running, 5)
    assert pruner.done == 0
