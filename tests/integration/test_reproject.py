"""``saga reproject`` rebuilds the saga_summary read model from the event store, on a real Postgres."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.reprojection import reproject
from saga_orchestrator.orchestrator.store.postgres import PostgresStore
from saga_orchestrator.participants.trip.definition import trip_definitions
from saga_orchestrator.schemas import wire
from tests.e2e.harness import saga_cli
from tests.integration.recorded import record
from tests.trip_runs import trip_run

pytestmark = pytest.mark.integration


async def _rows(pool: asyncpg.Pool) -> dict[str, tuple[str, int]]:
    rows = await pool.fetch("SELECT saga_id, status, last_seq FROM saga.saga_summary")
    return {row["saga_id"]: (row["status"], row["last_seq"]) for row in rows}


async def test_reproject_repairs_missing_and_wrong_rows_removes_orphans_and_keeps_newer_rows(
        store: PostgresStore, database_url: str) -> None:
    pool = store.pool
    runs = {name: trip_run("completed", f"{name}-{uuid.uuid4().hex[:6]}")
            for name in ("lost", "wrong", "newer", "fine")}
    for run in runs.values():
        await record(store, run)
    ids = {name: run.saga_id for name, run in runs.items()}
    await pool.execute("DELETE FROM saga.saga_summary WHERE saga_id = $1", ids["lost"])
    await pool.execute("UPDATE saga.saga_summary SET status = 'RUNNING' WHERE saga_id = $1", ids["wrong"])
    # As if the orchestrator recorded more events after the reprojection read the stream: not to be undone.
    await pool.execute("UPDATE saga.saga_summary SET last_seq = 99 WHERE saga_id = $1", ids["newer"])
    await pool.execute("INSERT INTO saga.saga_summary (saga_id, saga_type, status, started_at, updated_at, last_seq)"
                       " VALUES ('orphan', 'trip', 'RUNNING', now(), now(), 3)")
    before = await _rows(pool)
    settings = Settings(database_url=database_url)

    dry = await reproject(store, trip_definitions(), dry_run=True)
    assert (dry.sagas, dry.repaired, dry.removed, dry.unfoldable) == (4, 2, 1, [])
    assert await _rows(pool) == before

    done = await saga_cli(settings, "reproject")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rows that were repaired (missing or wrong) │ 2" in " ".join(done.stdout.split())
    completed = ("COMPLETED", runs["fine"].saga.last_seq)
    assert await _rows(pool) == {ids["lost"]: completed, ids["wrong"]: completed, ids["newer"]: ("COMPLETED", 99),
                                 ids["fine"]: completed}
    assert (await reproject(store, trip_definitions())).repaired == 0
    assert await _rows(pool) == {ids["lost"]: completed, ids["wrong"]: completed, ids["newer"]: ("COMPLETED", 99),
                                 ids["fine"]: completed}


async def test_a_saga_that_cannot_be_folded_is_reported_and_left_alone(store: PostgresStore,
                                                                       database_url: str) -> None:
    cruise = trip_run("running", f"cruise-{uuid.uuid4().hex[:6]}")
    await record(store, cruise)
    await store.pool.execute("UPDATE saga.events SET body = $2 WHERE saga_id = $1 AND seq = 2", cruise.saga_id,
                              wire.encode_event(cruise.events[0]))  # seq 2 now says seq 1: a broken history
    done = await saga_cli(Settings(database_url=database_url), "reproject")
    assert done.returncode == 1
    assert cruise.saga_id in done.stdout
