"""Bulk jobs (``operations.ports.BulkJobStore``): the Postgres adapter over ``<schema>.bulk_jobs``,
``<schema>.saga_summary`` and the outbox, and the memory adapter over a ``MemoryStore``'s read model and outbox."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import orjson

from ....infra.db import check_identifier, datetime_to_ms
from ....operations.bulk_jobs import BulkJob, BulkJobError, Count, Criteria, NewJob, Selection
from ....operations.ports import BatchWork
from ....outbox.table import write_outbox
from ...ports import SagaSummaryRow
from ..memory import MemoryStore
from .reads import filter_sql, matches


@dataclass(frozen=True)
class Where:
    """A parameterised SQL condition over ``saga_summary``: ``sql`` names its parameters from ``$first`` on,
    ``params`` are their values in order."""

    sql: str
    params: list[Any] = field(default_factory=list)


def where(criteria: Criteria, as_of: str = "now()", first: int = 1) -> Where:
    """The condition on a ``saga_summary`` row that ``criteria`` puts, as seen at ``as_of`` (a trusted SQL
    expression: ``now()`` for a dry run, the job's start for its batches): the saga started by then and, when an
    age is given, was last updated that long before then (``reads.filter_sql``). No value enters the SQL text."""
    sql, params = filter_sql(criteria.filter, as_of, first, started_by=True)
    return Where(sql, params)


class PostgresBulkJobs:
    """``BulkJobStore`` on the orchestrator's database (``pool``), its tables in ``schema``."""

    def __init__(self, pool: asyncpg.Pool, schema: str = "saga") -> None:
        self._pool = pool
        check_identifier(schema)
        self._jobs, self._summary, self._outbox = f"{schema}.bulk_jobs", f"{schema}.saga_summary", f"{schema}.outbox"

    async def count(self, criteria: Criteria, sample: int) -> Count:
        async with self._pool.acquire() as conn:
            return await self._count(conn, where(criteria), sample)

    async def _count(self, conn: asyncpg.Connection, condition: Where, sample: int) -> Count:
        total = await conn.fetchval(f"SELECT count(*) FROM {self._summary} WHERE {condition.sql}", *condition.params)
        ids = await conn.fetch(f"SELECT saga_id FROM {self._summary} WHERE {condition.sql} ORDER BY saga_id"
                               f" LIMIT ${len(condition.params) + 1}", *condition.params, sample)
        return Count(int(total), [row["saga_id"] for row in ids])

    async def create(self, job: NewJob, criteria: Criteria) -> BulkJob | None:
        async with self._pool.acquire() as conn, conn.transaction():
            matched = await self._count(conn, where(criteria), 0)
            if not matched.total:
                return None
            row = await conn.fetchrow(
                f"INSERT INTO {self._jobs} (operator, reason, action, step, selection, rate_per_s, total,"
                " definition_version) VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8) RETURNING *",
                job.operator, job.reason, job.action, job.step, orjson.dumps(criteria.selection.to_json()).decode(),
                job.rate_per_s, matched.total, job.definition_version)
        return _job(row)

    async def jobs(self, limit: int) -> list[BulkJob]:
        rows = await self._pool.fetch(f"SELECT * FROM {self._jobs} ORDER BY id DESC LIMIT $1", limit)
        return [_job(row) for row in rows]

    async def job(self, job_id: int) -> BulkJob | None:
        row = await self._pool.fetchrow(f"SELECT * FROM {self._jobs} WHERE id = $1", job_id)
        return None if row is None else _job(row)

    async def cancel(self, job_id: int, operator: str) -> BulkJob | None:
        row = await self._pool.fetchrow(
            f"UPDATE {self._jobs} SET status = 'CANCELLED', cancelled_by = $2, finished_at = now(),"
            " updated_at = now() WHERE id = $1 AND status = 'RUNNING' RETURNING *", job_id, operator)
        return None if row is None else _job(row)

    async def seconds_to_next(self) -> float | None:
        wait_s = await self._pool.fetchval(
            f"SELECT extract(epoch FROM min(not_before) - clock_timestamp()) FROM {self._jobs}"
            " WHERE status = 'RUNNING'")
        return None if wait_s is None else float(wait_s)

    async def run_batch(self, work: BatchWork) -> int | None:
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT * FROM {self._jobs} WHERE status = 'RUNNING' AND not_before <= now()"
                " ORDER BY not_before, id LIMIT 1 FOR UPDATE SKIP LOCKED")
            if row is None:
                return None
            return await self._batch(conn, row, work)

    async def _batch(self, conn: asyncpg.Connection, row: asyncpg.Record, work: BatchWork) -> int:
        job = _job(row)
        try:
            condition = where(work.criteria(job), as_of="$1", first=2)
        except BulkJobError as error:
            await conn.execute(f"UPDATE {self._jobs} SET status = 'FAILED', error = $2, finished_at = now(),"
                               " updated_at = now() WHERE id = $1", job.id, str(error))
            work.ended(job, str(error))
            return 0
        n = len(condition.params) + 2
        size = work.size(job)
        sagas = await conn.fetch(
            f"SELECT saga_id, saga_type FROM {self._summary} WHERE {condition.sql} AND saga_id > ${n}"
            f" ORDER BY saga_id LIMIT ${n + 1}", row["created_at"], *condition.params, job.last_saga_id, size)
        messages = work.commands(job, [(saga["saga_id"], saga["saga_type"]) for saga in sagas])
        await write_outbox(conn, self._outbox, messages, work.shards(messages))
        finished = len(sagas) < size
        await conn.execute(
            f"UPDATE {self._jobs} SET last_saga_id = $2, done = done + $3, failed = failed + $4,"
            " not_before = now() + make_interval(secs => $5), updated_at = now(),"
            " status = CASE WHEN $6 THEN 'DONE' ELSE status END, finished_at = CASE WHEN $6 THEN now() END"
            " WHERE id = $1",
            job.id, sagas[-1]["saga_id"] if sagas else job.last_saga_id, len(messages),
            len(sagas) - len(messages), len(sagas) / job.rate_per_s, finished)
        if finished:
            work.ended(dataclasses.replace(job, done=job.done + len(messages),
                                           failed=job.failed + len(sagas) - len(messages)), None)
        return len(messages)


def _job(row: asyncpg.Record) -> BulkJob:
    try:
        selection: Selection | None = Selection.from_json(orjson.loads(row["selection"]))
    except (BulkJobError, orjson.JSONDecodeError):
        selection = None
    finished = row["finished_at"]
    return BulkJob(id=row["id"], operator=row["operator"], reason=row["reason"], action=row["action"],
                   step=row["step"], selection=selection, rate_per_s=row["rate_per_s"], status=row["status"],
                   total=row["total"], done=row["done"], failed=row["failed"], refused=row["refused"],
                   last_saga_id=row["last_saga_id"],
                   error=row["error"], created_at_ms=datetime_to_ms(row["created_at"]),
                   updated_at_ms=datetime_to_ms(row["updated_at"]),
                   finished_at_ms=None if finished is None else datetime_to_ms(finished),
                   cancelled_by=row["cancelled_by"], definition_version=row.get("definition_version"))


class MemoryBulkJobs:
    """``BulkJobStore`` over a ``MemoryStore``: sagas from its read model (``summaries``), commands into its
    outbox, times by its clock; the jobs are kept here. One runner at a time (no row locks)."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._jobs: dict[int, BulkJob] = {}
        self._not_before_ms: dict[int, int] = {}
        self._ids = itertools.count(1)

    async def count(self, criteria: Criteria, sample: int) -> Count:
        matched = self._matching(criteria, self._store.clock_ms())
        return Count(len(matched), [row.saga_id for row in matched[:sample]])

    async def create(self, job: NewJob, criteria: Criteria) -> BulkJob | None:
        now = self._store.clock_ms()
        total = len(self._matching(criteria, now))
        if not total:
            return None
        created = BulkJob(id=next(self._ids), operator=job.operator, reason=job.reason, action=job.action,
                          step=job.step, selection=criteria.selection, rate_per_s=job.rate_per_s, status="RUNNING",
                          total=total, done=0, failed=0, refused=0, last_saga_id="", error=None, created_at_ms=now,
                          updated_at_ms=now, finished_at_ms=None, cancelled_by=None,
                          definition_version=job.definition_version)
        self._jobs[created.id] = created
        self._not_before_ms[created.id] = now
        return created

    async def jobs(self, limit: int) -> list[BulkJob]:
        return [self._jobs[job_id] for job_id in sorted(self._jobs, reverse=True)[:limit]]

    async def job(self, job_id: int) -> BulkJob | None:
        return self._jobs.get(job_id)

    async def cancel(self, job_id: int, operator: str) -> BulkJob | None:
        found = self._jobs.get(job_id)
        if found is None or found.status != "RUNNING":
            return None
        now = self._store.clock_ms()
        return self._put(dataclasses.replace(found, status="CANCELLED", cancelled_by=operator, finished_at_ms=now,
                                             updated_at_ms=now))

    async def seconds_to_next(self) -> float | None:
        due = [self._not_before_ms[job.id] for job in self._jobs.values() if job.status == "RUNNING"]
        return None if not due else (min(due) - self._store.clock_ms()) / 1000

    async def run_batch(self, work: BatchWork) -> int | None:
        now = self._store.clock_ms()
        due = sorted((self._not_before_ms[job.id], job.id) for job in self._jobs.values()
                     if job.status == "RUNNING" and self._not_before_ms[job.id] <= now)
        if not due:
            return None
        job = self._jobs[due[0][1]]
        try:
            criteria = work.criteria(job)
        except BulkJobError as error:
            self._put(dataclasses.replace(job, status="FAILED", error=str(error), finished_at_ms=now,
                                          updated_at_ms=now))
            work.ended(job, str(error))
            return 0
        size = work.size(job)
        sagas = [row for row in self._matching(criteria, job.created_at_ms) if row.saga_id > job.last_saga_id][:size]
        messages = work.commands(job, [(row.saga_id, row.saga_type) for row in sagas])
        work.shards(messages)  # one shard in memory: the store's outbox is one ordered list
        for message in messages:
            self._store.outbox.append((self._store.next_outbox_id, message))
            self._store.next_outbox_id += 1
        finished = len(sagas) < size
        moved = self._put(dataclasses.replace(
            job, last_saga_id=sagas[-1].saga_id if sagas else job.last_saga_id, done=job.done + len(messages),
            failed=job.failed + len(sagas) - len(messages), updated_at_ms=now,
            status="DONE" if finished else job.status, finished_at_ms=now if finished else None))
        self._not_before_ms[job.id] = now + round(len(sagas) / job.rate_per_s * 1000)
        if finished:
            work.ended(moved, None)
        return len(messages)

    def _put(self, job: BulkJob) -> BulkJob:
        self._jobs[job.id] = job
        return job

    def _matching(self, criteria: Criteria, as_of_ms: int) -> list[SagaSummaryRow]:
        selection = criteria.filter
        rows = [row for row in self._store.summaries.values() if matches(row, selection, as_of_ms, started_by=True)]
        return sorted(rows, key=lambda row: row.saga_id)
