"""Histories written into a real event store as the orchestrator would have left them (for the tests of the
operations that read it: reprojection, purge)."""

from __future__ import annotations

from saga_orchestrator.orchestrator.outbound import summary_of
from saga_orchestrator.orchestrator.ports import Writes
from saga_orchestrator.orchestrator.store.postgres import PostgresStore
from saga_orchestrator.schemas import wire
from saga_orchestrator.testing.history import SagaRun


async def record(store: PostgresStore, run: SagaRun) -> None:
    """The run's events and its (correct) summary row, in one transaction."""
    async with store.begin() as uow:
        await uow.conn.executemany(
            "INSERT INTO saga.events (saga_id, seq, event_type, body) VALUES ($1, $2, $3, $4)",
            [(e.saga_id, e.seq, type(e).__name__, wire.encode_event(e)) for e in run.events])
        await uow.write(Writes(summaries=[summary_of(run.saga)]))
