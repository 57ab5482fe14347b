"""Histories written into a real event store as the orchestrator would have left them (for the tests of the
operations that read it: reprojection, purge)."""

from __future__ import annotations

import uuid

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.outbound import summary_of
from saga_orchestrator.orchestrator.ports import Writes
from saga_orchestrator.orchestrator.store.postgres import PostgresStore
from saga_orchestrator.participants.trip import TRIP
from saga_orchestrator.schemas import wire
from saga_orchestrator.testing.history import SagaRun


async def record(store: PostgresStore, run: SagaRun) -> None:
    """The run's events and its (correct) summary row, in one transaction."""
    async with store.begin() as uow:
        await uow.conn.executemany(
            "INSERT INTO saga.events (saga_id, seq, event_type, body) VALUES ($1, $2, $3, $4)",
            [(e.saga_id, e.seq, type(e).__name__, wire.encode_event(e)) for e in run.events])
        await uow.write(Writes(summaries=[summary_of(run.saga)]))


async def running_trip(settings: Settings, prefix: str) -> str:
    """A trip just started (its bookings in flight), recorded in the database of ``settings`` under a fresh id
    that begins with ``prefix``: a saga a lever can be pulled on. Its id."""
    run = SagaRun(TRIP, saga_id=f"{prefix}-{uuid.uuid4().hex[:8]}")
    run.start()
    pool = await create_pool(settings.dsn(), 1)
    try:
        await record(PostgresStore(pool), run)
    finally:
        await pool.close()
    return run.saga_id
