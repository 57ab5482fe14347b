"""The store port of the operations wing: what its use-cases read and write, not how a database provides it.

Each Protocol is sized to the use-case that calls it. Adapters: ``orchestrator.store.operations`` (one module per
concern, each with its Postgres and its memory adapter); both pass the same contract suite
(``tests/contract/``). Times are epoch milliseconds, as in ``orchestrator.ports``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..outbox.table import OutboxMessage

if TYPE_CHECKING:  # the use-case's own values; it imports this module
    from .bulk_jobs import BulkJob, Count, Criteria, NewJob

# -- reads of the console and the command line; the console's sessions; verify's snapshot; table signals --

# -- levers, the operator audit, bulk jobs, dead letters --


@dataclass(frozen=True)
class AuditEntry:
    """One row of the operator audit: who (``operator``) did what (``action``) to what (``target``, e.g. "saga
    t-1"), with what (``detail``) and what came of it (``outcome``); ``at_ms``: when it was written (0 before)."""

    operator: str
    action: str
    target: str
    detail: Mapping[str, Any]
    outcome: str
    at_ms: int = 0


class AuditStore(Protocol):
    """The operator audit: every action taken through the console or its API, refused ones too."""

    async def record(self, entry: AuditEntry) -> None:
        """Add ``entry`` (its time is the store's now)."""

    async def entries(self, limit: int) -> list[AuditEntry]:
        """The latest ``limit`` entries, newest first."""


class LeverStore(AuditStore, Protocol):
    """What a lever writes: its control commands into the orchestrator's outbox (its relay publishes them on
    saga.control) and its audit entry."""

    async def queue_lever(self, entry: AuditEntry, commands: Sequence[OutboxMessage], shards: Sequence[int]) -> None:
        """Write ``entry`` and ``commands`` (in outbox ``shards``, one per command) in one transaction: a lever is
        never published unaudited nor audited unpublished. Nothing is written when it raises."""


class BatchWork(Protocol):
    """What a bulk job's batch needs of its use-case (``operations.bulk_jobs.BulkRunner``), asked by the store
    inside the batch's transaction."""

    def criteria(self, job: BulkJob) -> Criteria:
        """What the job selects; BulkJobError fails the job with its message."""

    def size(self, job: BulkJob) -> int:
        """How many sagas the job's next batch takes."""

    def commands(self, job: BulkJob, sagas: Sequence[tuple[str, str]]) -> list[OutboxMessage]:
        """The outbox rows for ``sagas`` ((saga id, saga type)); fewer when some cannot be written."""

    def shards(self, messages: Sequence[OutboxMessage]) -> list[int]:
        """The outbox shard of each row."""

    def ended(self, job: BulkJob, error: str | None) -> None:
        """The batch ended the job: DONE, or FAILED with ``error``."""


class BulkJobStore(Protocol):
    """Bulk jobs and the sagas they select, from the read model."""

    async def count(self, criteria: Criteria, sample: int) -> Count:
        """How many sagas started by now match ``criteria``, and the first ``sample`` ids in saga id order."""

    async def create(self, job: NewJob, criteria: Criteria) -> BulkJob | None:
        """Record a RUNNING job, its total what ``criteria`` matches now (in the same transaction); None, and
        nothing recorded, when nothing matches."""

    async def jobs(self, limit: int) -> list[BulkJob]:
        """The latest ``limit`` jobs, newest first."""

    async def job(self, job_id: int) -> BulkJob | None:
        """Job ``job_id``, or None."""

    async def cancel(self, job_id: int, operator: str) -> BulkJob | None:
        """Mark RUNNING job ``job_id`` CANCELLED by ``operator``; None when there is no RUNNING job of that id."""

    async def run_batch(self, work: BatchWork) -> int | None:
        """In one transaction: take the RUNNING job that is due first (one instance per job at a time), the
        next ``work.size`` sagas matching its criteria as of its start after its cursor, queue ``work.commands``
        in the outbox, move the cursor, the counts and the time the next batch may go (the batch's size over the
        job's rate), DONE when the batch was short. A job whose criteria fail is FAILED with the error. How
        many commands were queued; None when no job was due."""

    async def seconds_to_next(self) -> float | None:
        """How long until the earliest RUNNING job is due (negative: overdue); None when none runs."""
