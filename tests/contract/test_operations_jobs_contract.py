"""One contract for the operations wing's lever, audit and bulk-job ports (``operations.ports``: ``LeverStore``,
``BulkJobStore``), run against both adapters (``orchestrator.store.operations``: memory and Postgres).

An adapter passes when a lever's audit entry and its commands are written together or not at all, the audit
reads back newest first, a selection counts and samples the read model as Postgres does, a job is recorded only
when something matches, cancels once, and its runner takes a batch at a time at the job's rate."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from saga_orchestrator.operations.bulk_jobs import BulkRunner, NewJob, Selection, criteria
from saga_orchestrator.operations.levers import control_row
from saga_orchestrator.operations.ports import AuditEntry, BulkJobStore, LeverStore
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.ports import SagaSummaryRow
from saga_orchestrator.orchestrator.store.memory import MemoryStore
from saga_orchestrator.orchestrator.store.operations.audit import MemoryLevers, PostgresLevers
from saga_orchestrator.orchestrator.store.operations.bulk_jobs import MemoryBulkJobs, PostgresBulkJobs
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas.topics import Topics

REGISTRY = DefinitionRegistry([TRIP])
TOPICS = Topics()


@dataclass
class Backend:
    """The two stores of one adapter, and how a test puts sagas in its read model and reads its outbox."""

    levers: LeverStore
    jobs: BulkJobStore
    add_saga: Callable[[str, str, timedelta, str | None], Awaitable[None]]  # id, status, idle, current step
    outbox_keys: Callable[[], Awaitable[list[str]]]


def _memory() -> Backend:
    store = MemoryStore()

    async def add_saga(saga_id: str, status: str, idle: timedelta, step: str | None) -> None:
        at = store.clock_ms() - int(idle.total_seconds() * 1000)
        store.summaries[saga_id] = SagaSummaryRow(saga_id=saga_id, saga_type="trip", tenant_id=None, status=status,
                                                  started_at_ms=at, updated_at_ms=at, last_seq=3, current_step=step)

    async def outbox_keys() -> list[str]:
        return [message.key for _, message in store.outbox]

    return Backend(MemoryLevers(store), MemoryBulkJobs(store), add_saga, outbox_keys)


def _postgres(pool: asyncpg.Pool) -> Backend:
    async def add_saga(saga_id: str, status: str, idle: timedelta, step: str | None) -> None:
        at = datetime.now(UTC) - idle
        await pool.execute(
            "INSERT INTO saga.saga_summary (saga_id, saga_type, status, started_at, updated_at, last_seq,"
            " current_step) VALUES ($1, 'trip', $2, $3, $3, 3, $4)", saga_id, status, at, step)

    async def outbox_keys() -> list[str]:
        return [row["message_key"] for row in await pool.fetch("SELECT message_key FROM saga.outbox ORDER BY id")]

    return Backend(PostgresLevers(pool), PostgresBulkJobs(pool), add_saga, outbox_keys)


@pytest.fixture(params=["memory", "postgres"])
async def backend(request: pytest.FixtureRequest, pg_pool: asyncpg.Pool) -> AsyncIterator[Backend]:
    if request.param == "memory":
        yield _memory()
        return
    pool = pg_pool
    await pool.execute("TRUNCATE saga.saga_summary, saga.outbox, saga.bulk_jobs, saga.operator_audit"
                       " RESTART IDENTITY")
    yield _postgres(pool)


def _entry(outcome: str, reason: str = "because") -> AuditEntry:
    return AuditEntry("ana", "Terminate", "saga t-1", {"step": None, "reason": reason}, outcome)


def _row(saga_id: str, message_id: str) -> list:  # type: ignore[type-arg]
    return [control_row(TOPICS, saga_id, b"body", message_id, "console:ana")]


async def test_the_audit_reads_back_newest_first_within_its_limit(backend: Backend) -> None:
    for n in range(3):
        await backend.levers.record(_entry(f"refused: {n}"))
    entries = await backend.levers.entries(2)
    assert [entry.outcome for entry in entries] == ["refused: 2", "refused: 1"]
    assert entries[0].detail == {"step": None, "reason": "because"} and entries[0].at_ms > 0


async def test_the_audit_pages_back_from_an_entry_by_its_number(backend: Backend) -> None:
    for n in range(5):
        await backend.levers.record(_entry(f"refused: {n}"))
    latest = await backend.levers.entries(2)
    assert latest[0].entry_id > latest[1].entry_id > 0
    older = await backend.levers.entries(2, latest[1].entry_id)
    assert [entry.outcome for entry in older] == ["refused: 2", "refused: 1"]
    assert [entry.outcome for entry in await backend.levers.entries(10, older[1].entry_id)] == ["refused: 0"]


async def test_a_lever_and_its_audit_entry_are_written_together(backend: Backend) -> None:
    await backend.levers.queue_lever(_entry("queued on saga.control"), _row("t-1", "m-1"), [0])
    assert await backend.outbox_keys() == ["t-1"]
    assert [entry.outcome for entry in await backend.levers.entries(10)] == ["queued on saga.control"]


async def test_a_lever_whose_audit_entry_cannot_be_written_is_not_queued(backend: Backend) -> None:
    with pytest.raises(Exception):  # noqa: B017 - each adapter says it its own way (ValueError, a Postgres error)
        await backend.levers.queue_lever(_entry("queued on saga.control", reason="nul\x00"), _row("t-2", "m-2"),
                                         [0])
    assert await backend.outbox_keys() == []
    assert await backend.levers.entries(10) == []


async def test_a_selection_counts_and_samples_the_read_model_in_saga_id_order(backend: Backend) -> None:
    for saga_id in ("s-3", "s-1", "s-2"):
        await backend.add_saga(saga_id, "RUNNING", timedelta(hours=3), "charge_card")
    await backend.add_saga("s-0", "RUNNING", timedelta(0), "book_hotel")
    await backend.add_saga("s-9", "COMPLETED", timedelta(hours=3), None)
    stuck = criteria(Selection(statuses=("RUNNING",), older_than_s=3600), REGISTRY)
    assert (await backend.jobs.count(stuck, 2)).total == 3
    assert (await backend.jobs.count(stuck, 2)).sample == ["s-1", "s-2"]
    paying = criteria(Selection(participant="payment"), REGISTRY)
    assert (await backend.jobs.count(paying, 10)).sample == ["s-1", "s-2", "s-3"]
    assert (await backend.jobs.count(criteria(Selection(tenant="acme"), REGISTRY), 10)).total == 0


async def test_a_job_is_recorded_only_when_something_matches_and_cancels_once(backend: Backend) -> None:
    ask = NewJob("Pause", None, "ana", "strike", 4.0)
    assert await backend.jobs.create(ask, criteria(Selection(statuses=("FAILED",)), REGISTRY)) is None
    assert await backend.jobs.jobs(10) == []
    await backend.add_saga("p-1", "RUNNING", timedelta(minutes=1), "charge_card")
    job = await backend.jobs.create(ask, criteria(Selection(statuses=("RUNNING",)), REGISTRY))
    assert job is not None and (job.status, job.total, job.done, job.action, job.operator) == (
        "RUNNING", 1, 0, "Pause", "ana")
    cancelled = await backend.jobs.cancel(job.id, "bo")
    assert cancelled is not None and (cancelled.status, cancelled.cancelled_by) == ("CANCELLED", "bo")
    assert cancelled.finished_at_ms is not None
    assert await backend.jobs.cancel(job.id, "bo") is None
    assert await backend.jobs.cancel(999, "bo") is None
    assert [found.id for found in await backend.jobs.jobs(10)] == [job.id]
    assert await backend.jobs.job(999) is None
    moving = await backend.jobs.create(NewJob("Migrate", None, "ana", "to v2", 4.0, definition_version=2),
                                       criteria(Selection(statuses=("RUNNING",)), REGISTRY))
    assert moving is not None and (await backend.jobs.job(moving.id)) == moving and moving.definition_version == 2


async def test_a_job_runs_a_batch_at_a_time_at_its_rate_and_ends_done(backend: Backend) -> None:
    for saga_id in ("r-1", "r-2", "r-3"):
        await backend.add_saga(saga_id, "RUNNING", timedelta(minutes=1), "charge_card")
    job = await backend.jobs.create(NewJob("Terminate", None, "ana", "settled", 8.0),
                                    criteria(Selection(statuses=("RUNNING",)), REGISTRY))
    assert job is not None
    runner = BulkRunner(backend.jobs, REGISTRY, TOPICS)  # batches of 2 at 8/s: the next one 250 ms later
    assert await backend.jobs.run_batch(runner) == 2
    assert await backend.jobs.run_batch(runner) is None  # held back by the rate
    wait_s = await backend.jobs.seconds_to_next()
    assert wait_s is not None and 0 < wait_s <= 0.25
    await asyncio.sleep(wait_s + 0.02)
    assert await backend.jobs.run_batch(runner) == 1
    ended = await backend.jobs.job(job.id)
    assert ended is not None and (ended.status, ended.done, ended.failed, ended.last_saga_id) == ("DONE", 3, 0, "r-3")
    assert await backend.outbox_keys() == ["r-1", "r-2", "r-3"]
    assert await backend.jobs.seconds_to_next() is None


async def test_a_job_whose_selection_no_longer_resolves_fails_with_why(backend: Backend) -> None:
    await backend.add_saga("f-1", "RUNNING", timedelta(minutes=1), "charge_card")
    job = await backend.jobs.create(NewJob("Terminate", None, "ana", "r", 10.0),
                                    criteria(Selection(participant="payment"), REGISTRY))
    assert job is not None
    assert await backend.jobs.run_batch(BulkRunner(backend.jobs, DefinitionRegistry(), TOPICS)) == 0
    failed = await backend.jobs.job(job.id)
    assert failed is not None and failed.status == "FAILED" and failed.done == 0
    assert failed.error is not None and failed.error.startswith("no saga type has a step served by participant")
    assert await backend.outbox_keys() == []
