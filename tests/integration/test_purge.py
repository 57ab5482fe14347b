"""``saga purge`` (retention) on a real Postgres: ended sagas give up their events for one SagaPurged each,
the rest is untouched, and a purged saga id still refuses a second start."""

from __future__ import annotations

import time
import uuid

import asyncpg
import pytest

from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.reprojection import reproject
from saga_orchestrator.orchestrator.domain.retention import purged_digest
from saga_orchestrator.orchestrator.inbound import Envelope
from saga_orchestrator.orchestrator.retention import purge_batch
from saga_orchestrator.orchestrator.service import SagaService
from saga_orchestrator.orchestrator.store.postgres import PostgresStore
from saga_orchestrator.participants.trip.definition import trip_definitions
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import Event, SagaPurged, SagaRejected
from saga_orchestrator.schemas.message_types import StartSaga
from saga_orchestrator.schemas.topics import Topics
from saga_orchestrator.testing.history import SagaRun
from tests.e2e.harness import saga_cli
from tests.integration.recorded import record
from tests.trip_runs import trip_run

pytestmark = pytest.mark.integration

TOPICS = Topics("purge-test.")
NOW = int(time.time() * 1000)
LONG_AGO = NOW - 40 * 86_400_000


async def _record(store: PostgresStore, run: SagaRun) -> None:
    await record(store, run)
    await store.pool.execute("INSERT INTO saga.timers (saga_id, timer_id, kind, step, attempt, due_at)"
                             " VALUES ($1, 'STEP_TIMEOUT:x:1', 'STEP_TIMEOUT', 'x', 1, now())", run.saga_id)


async def _stream(pool: asyncpg.Pool, saga_id: str) -> list[Event]:
    rows = await pool.fetch("SELECT body FROM saga.events WHERE saga_id = $1 ORDER BY seq", saga_id)
    return [wire.decode_event(row["body"]) for row in rows]


async def test_ended_sagas_are_purged_in_batches_and_nothing_else(store: PostgresStore, database_url: str) -> None:
    pool = store.pool
    runs = {kind: trip_run(kind, f"{kind}-{uuid.uuid4().hex[:6]}", LONG_AGO)
            for kind in ("completed", "compensated", "rejected", "running")}
    runs["recent"] = trip_run("completed", f"recent-{uuid.uuid4().hex[:6]}", NOW - 1000)
    for run in runs.values():
        await _record(store, run)
    bodies = {kind: [wire.encode_event(e) for e in run.events] for kind, run in runs.items()}

    dry = await saga_cli(Settings(database_url=database_url), "purge", "--ended-before", "30d", "--dry-run")
    assert dry.returncode == 0 and "3 sagas ended before the cutoff" in dry.stdout, dry.stdout + dry.stderr

    purged: list[str] = []
    skip: set[str] = set()
    while True:  # two per transaction
        done, looked_at = await purge_batch(store, trip_definitions(), TOPICS, ended_before_ms=NOW - 30 * 86_400_000,
                                            now_ms=NOW, operator="ops", limit=2, skip=skip)
        purged += done
        if looked_at < 2:
            break
    assert sorted(purged) == sorted(runs[kind].saga_id for kind in ("completed", "compensated", "rejected"))
    for kind in ("completed", "compensated", "rejected"):
        run = runs[kind]
        [event] = await _stream(pool, run.saga_id)
        assert isinstance(event, SagaPurged)
        assert (event.seq, event.final_status, event.operator) == (len(run.events) + 1, run.saga.status.value, "ops")
        assert event.purged_digest == purged_digest(bodies[kind])
        summary = await store.get_summary(run.saga_id)
        assert summary is not None and (summary.status, summary.last_seq) == ("PURGED", event.seq)
        assert not await pool.fetchval("SELECT count(*) FROM saga.timers WHERE saga_id = $1", run.saga_id)
    published = await pool.fetch("SELECT message_key, value FROM saga.outbox WHERE topic = $1", TOPICS.events)
    assert sorted(row["message_key"] for row in published) == sorted(purged)
    for kind in ("running", "recent"):
        assert [wire.encode_event(e) for e in await _stream(pool, runs[kind].saga_id)] == bodies[kind]
    assert (await reproject(store, trip_definitions(), dry_run=True)).repaired == 0  # read model = fold

    # A purged saga id is not free again: a second start is refused and recorded after the SagaPurged.
    service = SagaService(store, trip_definitions(), TOPICS, lambda: NOW)
    completed = runs["completed"].saga_id
    await service.handle(Envelope(StartSaga(saga_id=completed, saga_type="trip", tenant_id=None, input=b"x"),
                                  "restart-1"))
    assert [type(e).__name__ for e in await _stream(pool, completed)] == ["SagaPurged", "SagaRejected"]
    assert isinstance((await _stream(pool, completed))[-1], SagaRejected)
    again, looked_at = await purge_batch(store, trip_definitions(), TOPICS, ended_before_ms=NOW - 30 * 86_400_000,
                                         now_ms=NOW)
    assert again == [] and looked_at == 0  # a purged saga is not purged twice
