"""Retention on a real Postgres: the orchestrator's policy purges sagas ended long enough ago, and a participant
worker deletes idempotency records older than its retention."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from saga_orchestrator.infra.chores import Chore
from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.retention import RETENTION_OPERATOR, retention_policy
from saga_orchestrator.orchestrator.store.postgres import PostgresStore
from saga_orchestrator.participants.host import ParticipantHost
from saga_orchestrator.participants.kit.ddl import ensure_participant_schema
from saga_orchestrator.participants.kit.ledger import prune_processed_commands
from saga_orchestrator.participants.registry import get_participant
from saga_orchestrator.participants.trip.definition import trip_definitions
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import SagaPurged
from saga_orchestrator.schemas.topics import Topics
from tests.integration.recorded import record
from tests.trip_runs import trip_run

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000
HOUR_S = 3600.0
FLIGHT = get_participant("flight")


async def _run_once(chore: Chore) -> None:
    """Let ``chore`` do its first round (at start), then stop it."""
    stop = asyncio.Event()
    running = asyncio.create_task(chore.run(stop))
    for _ in range(200):
        if chore.done:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(running, 5)


async def test_the_retention_policy_purges_the_sagas_ended_before_its_window(store: PostgresStore) -> None:
    now = int(time.time() * 1000)
    runs = {kind: trip_run(kind, f"{kind}-{uuid.uuid4().hex[:6]}", now - 40 * DAY_MS)
            for kind in ("completed", "compensated", "running")}
    runs["recent"] = trip_run("completed", f"recent-{uuid.uuid4().hex[:6]}", now - 2 * DAY_MS)
    for run in runs.values():
        await record(store, run)

    policy = retention_policy(store, trip_definitions(), Topics("retention-test."), 30 * 86_400, every_s=3600)
    await _run_once(policy)

    assert policy.done == 2
    for kind, run in runs.items():
        bodies = await store.pool.fetch("SELECT body FROM saga.events WHERE saga_id = $1 ORDER BY seq", run.saga_id)
        events = [wire.decode_event(row["body"]) for row in bodies]
        if kind in ("completed", "compensated"):
            [purged] = events
            assert isinstance(purged, SagaPurged) and purged.operator == RETENTION_OPERATOR, kind
        else:
            assert len(events) == len(run.events), kind


@pytest.fixture
async def participant_pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, 2)
    await ensure_participant_schema(pool, FLIGHT)
    await pool.execute(f"TRUNCATE {FLIGHT.schema}.processed_commands")
    try:
        yield pool
    finally:
        await pool.close()


async def _processed(pool: asyncpg.Pool, ages_h: dict[str, float]) -> None:
    await pool.executemany(
        f"INSERT INTO {FLIGHT.schema}.processed_commands"
        " (idempotency_key, saga_id, step, kind, action, attempt, status, processed_at)"
        " VALUES ($1, 's', 'book_flight', 'FORWARD', 'book', 1, 'SUCCEEDED', now() - make_interval(secs => $2))",
        [(key, age * HOUR_S) for key, age in ages_h.items()])


async def _keys(pool: asyncpg.Pool) -> list[str]:
    rows = await pool.fetch(f"SELECT idempotency_key FROM {FLIGHT.schema}.processed_commands ORDER BY 1")
    return [row["idempotency_key"] for row in rows]


async def test_idempotency_records_older_than_the_retention_are_deleted(participant_pool: asyncpg.Pool) -> None:
    await _processed(participant_pool, {**{f"old-{n}": 200 + n for n in range(5)}, "day-old": 24, "fresh": 0})
    assert await prune_processed_commands(participant_pool, FLIGHT.schema, 168 * HOUR_S, batch=2) == 5
    assert await _keys(participant_pool) == ["day-old", "fresh"]
    assert await prune_processed_commands(participant_pool, FLIGHT.schema, 12 * HOUR_S) == 1
    assert await _keys(participant_pool) == ["fresh"]


async def test_a_participant_worker_prunes_its_records_once_started(participant_pool: asyncpg.Pool,
                                                                    database_url: str, kafka_bootstrap: str) -> None:
    await _processed(participant_pool, {"old": 200, "fresh": 0})
    settings = Settings(database_url=database_url, kafka_bootstrap_servers=kafka_bootstrap,
                        saga_participant_retention_hours=168)
    host = ParticipantHost(FLIGHT, settings)
    await host.start()
    try:
        for _ in range(100):
            if await _keys(participant_pool) == ["fresh"]:
                break
            await asyncio.sleep(0.05)
        assert await _keys(participant_pool) == ["fresh"]
    finally:
        await asyncio.wait_for(host.stop(), 10)  # the pruner, asleep for 10 minutes, stops at once
