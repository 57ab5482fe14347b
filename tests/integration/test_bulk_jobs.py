"""Bulk jobs on a real Postgres: the dry run counts what the selection matches; a job's runner queues one control
command per saga in saga.outbox, at its rate by the rows' own timestamps, goes on after a runner dies mid-way
(two runners at once included) without sending any saga two commands, is passed over by sagas that left the
selection, and stops when cancelled."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations import bulk_jobs
from saga_orchestrator.operations.bulk_jobs import BulkJobError, BulkRunner, Selection
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.store.operations.bulk_jobs import PostgresBulkJobs as Jobs
from saga_orchestrator.orchestrator.store.postgres import migrate
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.partitioning import partition_for
from saga_orchestrator.schemas.topics import Topics
from tests.e2e.harness import run_refused, saga_cli

pytestmark = pytest.mark.integration

REGISTRY = DefinitionRegistry([TRIP])
TOPICS = Topics("bulk-test.")


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on the module's database, with no saga, outbox row or bulk job."""
    opened = await create_pool(database_url, 6)
    await migrate(opened)
    await opened.execute("TRUNCATE saga.saga_summary, saga.outbox, saga.bulk_jobs RESTART IDENTITY")
    yield opened
    await opened.close()


async def _sagas(pool: asyncpg.Pool, prefix: str, n: int, status: str = "RUNNING", *, idle: timedelta = timedelta(0),
                 step: str | None = "charge_card", error: str | None = None, tenant: str | None = None,
                 later: timedelta = timedelta(0)) -> list[str]:
    """``n`` trip sagas in the read model, ``prefix-000``..., in ``status``, started and last updated ``idle``
    ago (or ``later`` from now), stuck at ``step`` (its last error ``error``)."""
    ids = [f"{prefix}-{i:03d}" for i in range(n)]
    at = datetime.now(UTC) - idle + later
    await pool.executemany(
        "INSERT INTO saga.saga_summary (saga_id, saga_type, tenant_id, status, started_at, updated_at, last_seq,"
        " current_step, step_failures, last_error) VALUES ($1, 'trip', $2, $3, $4, $4, 3, $5, $6, $7)",
        [(saga_id, tenant, status, at, step, 1 if error else 0, error) for saga_id in ids])
    return ids


async def _commands(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await pool.fetch(
        "SELECT message_key, value, message_id, topic, shard, created_at FROM saga.outbox ORDER BY id")
    return rows


async def _until(pool: asyncpg.Pool, job_id: int, done: int) -> None:
    for _ in range(300):
        if (await pool.fetchval("SELECT done FROM saga.bulk_jobs WHERE id = $1", job_id)) >= done:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"bulk job {job_id} did not reach {done} done")


async def test_the_dry_run_counts_each_criterion_and_shows_a_few_ids(pool: asyncpg.Pool) -> None:
    waiting = await _sagas(pool, "wait", 12, idle=timedelta(hours=3), error="Declined", tenant="acme")
    await _sagas(pool, "fresh", 3, error="timeout")
    await _sagas(pool, "hotel", 2, step="book_hotel", tenant="acme")
    await _sagas(pool, "done", 4, "COMPLETED", step=None)

    async def counted(**criteria: object) -> int:
        return (await bulk_jobs.count(Jobs(pool), Selection(**criteria), REGISTRY)).total  # type: ignore[arg-type]

    found = await bulk_jobs.count(Jobs(pool), Selection(statuses=("RUNNING",), older_than_s=7200), REGISTRY, sample=5)
    assert (found.total, found.sample) == (12, waiting[:5])
    assert await counted(saga_type="trip") == 21
    assert await counted(statuses=("RUNNING", "COMPLETED")) == 21
    assert await counted(tenant="acme") == 14
    assert await counted(error="timeout") == 3
    assert await counted(error="Declined", older_than_s=60) == 12
    assert await counted(participant="payment") == 15
    assert await counted(participant="hotel", statuses=("RUNNING",)) == 2
    assert await counted(participant="flight") == 0
    with pytest.raises(BulkJobError, match="no saga matches"):
        await bulk_jobs.start(Jobs(pool), Selection(participant="flight"), REGISTRY, action="Terminate",
                              operator="ana", reason="r")


async def test_a_job_goes_on_after_its_runner_dies_and_sends_each_saga_one_command_at_its_rate(
        pool: asyncpg.Pool, database_url: str) -> None:
    ids = await _sagas(pool, "r", 40)
    rate = 20.0  # batches of 5, a quarter second apart: about two seconds
    job = await bulk_jobs.start(Jobs(pool), Selection(statuses=("RUNNING",)), REGISTRY, action="Terminate",
                                operator="ana", reason="settled by phone", rate_per_s=rate)
    assert (job.status, job.total, job.done) == ("RUNNING", 40, 0)

    first = await create_pool(database_url, 2)
    dying_runner = BulkRunner(Jobs(first), REGISTRY, TOPICS, topic_partitions=3)
    dying = asyncio.create_task(dying_runner.chore().run(asyncio.Event()))
    await _until(pool, job.id, 15)
    dying.cancel()  # wherever it is, perhaps inside a batch's transaction
    with contextlib.suppress(asyncio.CancelledError):
        await dying
    first.terminate()
    midway = await bulk_jobs.job(Jobs(pool), job.id)
    assert midway is not None and midway.status == "RUNNING" and 15 <= midway.done < 40
    assert midway.last_saga_id == ids[midway.done - 1]

    stop = asyncio.Event()
    pools = [await create_pool(database_url, 2) for _ in range(2)]  # two instances take over at once
    runners = [asyncio.create_task(BulkRunner(Jobs(p), REGISTRY, TOPICS, topic_partitions=3).chore().run(stop))
               for p in pools]
    await _until(pool, job.id, 40)
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*runners)
    for p in pools:
        await p.close()

    ended = await bulk_jobs.job(Jobs(pool), job.id)
    assert ended is not None
    assert (ended.status, ended.done, ended.failed, ended.last_saga_id) == ("DONE", 40, 0, ids[-1])
    assert ended.finished_at_ms is not None
    rows = await _commands(pool)
    assert sorted(row["message_key"] for row in rows) == ids  # every saga once: nothing twice, nothing missed
    assert {row["message_id"] for row in rows} == {f"bulk:{job.id}:{saga_id}" for saga_id in ids}
    assert {row["topic"] for row in rows} == {"bulk-test.saga.control"}
    assert all(row["shard"] == partition_for(row["message_key"].encode(), (0, 1, 2)) for row in rows)
    command = wire.decode_operate(rows[0]["value"])
    assert (command.action, command.operator, command.reason) == ("Terminate", f"ana (bulk job {job.id})",
                                                                  "settled by phone")

    # The rate, by the outbox rows' own timestamps: no batch went before the rate allowed it, the restart too.
    batches: dict[datetime, int] = {}
    for row in rows:
        batches[row["created_at"]] = batches.get(row["created_at"], 0) + 1
    times = sorted(batches)
    assert max(batches.values()) <= 5 and len(times) >= 8
    sent = 0
    for at in times:
        assert sent <= rate * (at - times[0]).total_seconds() + 1e-6, (sent, at - times[0])
        sent += batches[at]
    assert (times[-1] - times[0]).total_seconds() >= (40 - 5) / rate


async def test_a_saga_that_left_the_selection_or_came_after_the_job_is_passed_over(pool: asyncpg.Pool) -> None:
    ids = await _sagas(pool, "s", 6)
    job = await bulk_jobs.start(Jobs(pool), Selection(statuses=("RUNNING",)), REGISTRY, action="RetryNow",
                                step="charge_card", operator="bo", reason="bank is back", rate_per_s=100)
    await pool.execute("UPDATE saga.saga_summary SET status = 'COMPLETED' WHERE saga_id = $1", ids[2])
    await _sagas(pool, "t", 2, later=timedelta(seconds=1))  # started after the job: not in it
    runner = BulkRunner(Jobs(pool), REGISTRY, TOPICS)
    assert await runner.run_batch() == 5  # one batch (25 at this rate) takes every saga left, and ends the job
    assert await runner.run_batch() is None
    ended = await bulk_jobs.job(Jobs(pool), job.id)
    assert ended is not None and (ended.status, ended.total, ended.done) == ("DONE", 6, 5)
    rows = await _commands(pool)
    assert [row["message_key"] for row in rows] == [saga_id for saga_id in ids if saga_id != ids[2]]
    assert {wire.decode_operate(row["value"]).step for row in rows} == {"charge_card"}


async def test_a_cancelled_job_sends_nothing_more(pool: asyncpg.Pool) -> None:
    await _sagas(pool, "c", 10)
    job = await bulk_jobs.start(Jobs(pool), Selection(saga_type="trip"), REGISTRY, action="Pause", operator="cy",
                                reason="carrier strike", rate_per_s=4)  # one saga a quarter second
    stop = asyncio.Event()
    running = asyncio.create_task(BulkRunner(Jobs(pool), REGISTRY, TOPICS).chore().run(stop))
    await _until(pool, job.id, 2)
    cancelled = await bulk_jobs.cancel(Jobs(pool), job.id, "dee")
    assert (cancelled.status, cancelled.cancelled_by) == ("CANCELLED", "dee")
    await asyncio.sleep(1.0)  # four more batches' time
    stop.set()
    await running
    after = await bulk_jobs.job(Jobs(pool), job.id)
    assert after is not None and (after.status, after.done) == ("CANCELLED", cancelled.done)
    assert len(await _commands(pool)) == cancelled.done < 10
    with pytest.raises(BulkJobError, match=f"bulk job {job.id} already ended CANCELLED"):
        await bulk_jobs.cancel(Jobs(pool), job.id, "dee")
    with pytest.raises(BulkJobError, match="no bulk job 999"):
        await bulk_jobs.cancel(Jobs(pool), 999, "dee")


async def test_a_job_its_runner_cannot_read_fails_with_the_reason(pool: asyncpg.Pool) -> None:
    await _sagas(pool, "f", 2)
    job = await bulk_jobs.start(Jobs(pool), Selection(participant="payment"), REGISTRY, action="Terminate",
                                operator="ed", reason="r")
    without_trip = BulkRunner(Jobs(pool), DefinitionRegistry(), TOPICS)
    assert await without_trip.run_batch() == 0
    failed = await bulk_jobs.job(Jobs(pool), job.id)
    assert failed is not None and failed.status == "FAILED" and failed.done == 0
    assert failed.error is not None and failed.error.startswith("no saga type has a step served by participant")
    assert await _commands(pool) == []


async def test_the_command_line_counts_starts_shows_and_refuses_bad_input(pool: asyncpg.Pool,
                                                                          database_url: str) -> None:
    await _sagas(pool, "cli", 3, idle=timedelta(hours=3))
    current = Settings(database_url=database_url)
    counted = await saga_cli(current, "bulk", "count", "--state", "running", "--older-than", "2h")
    assert counted.returncode == 0, counted.stdout + counted.stderr
    assert "3 sagas match (state RUNNING, not updated for 7200 s)" in counted.stdout
    assert "cli-000, cli-001, cli-002" in counted.stdout

    started = await saga_cli(current, "bulk", "start", "terminate", "--type", "trip", "--operator", "fay",
                             "--reason", "settled", "--rate", "5", "--yes")
    assert started.returncode == 0, started.stdout + started.stderr
    assert "3 sagas match" in started.stdout and "bulk job 1 started" in started.stdout
    shown = await saga_cli(current, "bulk", "show", "1")
    assert shown.returncode == 0 and "RUNNING" in shown.stdout and "done 0 of 3" in shown.stdout, shown.stdout
    listed = await saga_cli(current, "bulk", "list")
    assert listed.returncode == 0 and "Terminate" in listed.stdout and "fay" in listed.stdout, listed.stdout
    cancelled = await saga_cli(current, "bulk", "cancel", "1", "--operator", "gil")
    assert cancelled.returncode == 0 and "cancelled after 0 of 3" in cancelled.stdout, cancelled.stdout

    assert "--older-than '2 hours' is not a duration" in run_refused(current, "bulk", "count", "--older-than",
                                                                     "2 hours")
    assert "'STUCK' is not a saga state" in run_refused(current, "bulk", "count", "--state", "stuck")
    assert "a selection needs at least one of" in run_refused(current, "bulk", "count")
    assert "unknown action 'explode'" in run_refused(current, "bulk", "start", "explode", "--type", "trip",
                                                     "--operator", "a", "--reason", "r")
    assert "RetryNow acts on one step" in run_refused(current, "bulk", "start", "retry-now", "--type", "trip",
                                                      "--operator", "a", "--reason", "r", "--yes")
    assert "no bulk job 7" in run_refused(current, "bulk", "show", "7")
    assert "already ended CANCELLED" in run_refused(current, "bulk", "cancel", "1", "--operator", "gil")
