"""What every console request works with: the database, the reads, who may act, how an action is sent, and whether
workers consume the participants' commands."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import asyncpg
from fastapi import HTTPException
from starlette.requests import Request

from ..client.saga_client import SagaInputError
from ..infra.kafka_clients import KafkaClients
from ..operations import bulk_jobs, parked_rows
from ..operations.attendance import Attendance
from ..operations.audit import OperatorAudit
from ..operations.levers import Levers
from ..operations.ports import BulkJobStore, LeverStore
from ..operations.postgres import bulk_job_store, dead_letter_index, lever_store
from ..operations.reads import Reads
from ..orchestrator.bootstrap import participants_of
from ..orchestrator.ports import DeadLetterIndex
from ..participants.kit.deferred import complete, why_not_awaiting
from ..participants.kit.outcome import Failed, Succeeded
from ..schemas.message_types import LeverRefused
from ..schemas.topics import Topics
from . import decisions, operating
from .identity import Identity


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Console:
    """One console process's parts (made by ``console.app.console_app``)."""

    pool: asyncpg.Pool
    reads: Reads
    identity: Identity
    control: operating.ControlPublisher
    topics: Topics
    kafka: KafkaClients  # replays dead letters (console.letter_replays)
    levers: bool = False
    control_partitions: tuple[int, ...] = (0,)  # saga.control's: a lever's outbox row goes in its saga's shard
    cookie: str = "saga_console"  # the session cookie's name (console.app.session_cookie)
    now_ms: Callable[[], int] = field(default=_wall_clock_ms)

    async def act(self, operator: str, saga_id: str, action: str, step: str | None,
                  reason: str | None) -> decisions.Pulled:
        """Queue ``action`` for ``operator`` and audit it in one transaction: the control command goes into the
        orchestrator's outbox beside its audit row (its relay publishes it on saga.control), so no lever goes
        out unaudited and none is audited unsent (``operations.levers``). What was pulled: the command's id and
        the saga's last seq before it, by which its decision is found (``decisions.decision``). HTTPException 404
        when there is no such saga, 400 when it is asked wrongly (both audited, nothing queued)."""
        after_seq = await self.reads.last_seq(saga_id)
        if after_seq is None:
            refusal = f"no saga {saga_id!r}: nothing to act on"
            await self.audit.record(operator, action, f"saga {saga_id}", {"step": step, "reason": reason},
                                    f"refused: {refusal}")
            raise HTTPException(404, refusal)
        try:
            action_id = await self.lever_queue.pull(operator, saga_id, action, step, reason)
        except LeverRefused as error:
            raise HTTPException(400, str(error)) from None
        return decisions.Pulled(saga_id, action, step, operator, action_id, after_seq)

    @cached_property
    def audit(self) -> OperatorAudit:
        """The operator audit, on the orchestrator's database."""
        return OperatorAudit(self._lever_store)

    @cached_property
    def lever_queue(self) -> Levers:
        """Levers pulled for operators: queued in the orchestrator's outbox with their audit entries."""
        return Levers(self._lever_store, self.topics, self.control_partitions, via="console")

    @cached_property
    def bulk_store(self) -> BulkJobStore:
        """Bulk jobs, on the orchestrator's database."""
        return bulk_job_store(self.pool)

    @cached_property
    def dead_letters(self) -> DeadLetterIndex:
        """The dead-letter index the orchestrator keeps, on its database."""
        return dead_letter_index(self.pool)

    @cached_property
    def attendance(self) -> Attendance:
        """Whether workers consume the command topics of the participants the definitions send to: a snapshot
        the console's lifespan refreshes in the background (``attendance.chore``), so no page waits on Kafka."""
        return Attendance(self.kafka, self.topics, participants_of(self.reads.definitions), self.now_ms)

    @cached_property
    def _lever_store(self) -> LeverStore:
        return lever_store(self.pool)

    async def signal(self, operator: str, saga_id: str, signal: str, payload: dict[str, Any],
                     signal_id: str | None) -> str:
        """Send ``signal`` to a saga for ``operator`` (its sender) and audit it; the signal's id. HTTPException 400
        when the signal is unknown or its payload does not fit its record (audited too)."""
        target = f"saga {saga_id}"
        detail = {"signal": signal, "signal_id": signal_id}
        try:
            sent = await self.control.signal(saga_id, signal, payload, signal_id=signal_id, sender=operator)
        except SagaInputError as error:
            await self.audit.record(operator, "Signal", target, detail, f"refused: {error}")
            raise HTTPException(400, str(error)) from None
        await self.audit.record(operator, "Signal", target, {**detail, "signal_id": sent}, "published on saga.control")
        return sent

    async def start_job(self, operator: str, selection: bulk_jobs.Selection, action: str, step: str | None,
                        reason: str, rate_per_s: float, expected: int | None) -> bulk_jobs.BulkJob:
        """Record a bulk job for ``operator``, who counted ``expected`` sagas first (``bulk_jobs.start_counted``;
        the orchestrator runs it) and audit it; HTTPException 422 when the count was not given, 409 when the
        selection matches another number now, 400 when the job cannot be (each audited too)."""
        detail = {"selection": selection.describe(), "step": step, "reason": reason, "rate_per_s": rate_per_s,
                  "expected": expected}
        try:
            job = await bulk_jobs.start_counted(self.bulk_store, selection, self.reads.definitions,
                                                expected=expected, action=action, operator=operator, reason=reason,
                                                step=step or None, rate_per_s=rate_per_s)
        except bulk_jobs.BulkJobError as error:
            await self.audit.record(operator, f"BulkJob {action}", "bulk", detail, f"refused: {error}")
            status = (422 if isinstance(error, bulk_jobs.NotCounted) else 409
                      if isinstance(error, bulk_jobs.CountChanged) else 400)
            raise HTTPException(status, str(error)) from None
        await self.audit.record(operator, f"BulkJob {action}", f"bulk job {job.id}", detail,
                                f"started: {job.total} sagas")
        return job

    async def cancel_job(self, operator: str, job_id: int) -> bulk_jobs.BulkJob:
        """Stop bulk job ``job_id`` for ``operator`` and audit it; HTTPException 404 when there is no such job,
        400 when it cannot be stopped."""
        try:
            job = await bulk_jobs.cancel(self.bulk_store, job_id, operator)
        except bulk_jobs.NoSuchJob as error:
            raise HTTPException(404, str(error)) from None
        except bulk_jobs.BulkJobError as error:
            raise HTTPException(400, str(error)) from None
        await self.audit.record(operator, "CancelBulkJob", f"bulk job {job_id}", {}, f"cancelled after {job.done}")
        return job

    async def handle_parked(self, operator: str, table: str, row_id: int, requeue: bool, reason: str | None) -> str:
        """Requeue (``requeue``) or discard parked row ``row_id`` of ``table`` for ``operator``, audited
        (``operations.parked_rows.pull``); what was done. HTTPException 404 when no such row is parked in an outbox
        of this deployment, 400 when it is asked wrongly: nothing changed either way (the refusal audited)."""
        try:
            return await parked_rows.pull(self.pool, self.reads, self.audit, operator, table, row_id, requeue, reason)
        except parked_rows.NotParked as error:
            raise HTTPException(404, str(error)) from None
        except parked_rows.ParkedRowRefused as error:
            raise HTTPException(400, str(error)) from None

    async def answer(self, operator: str, participant_name: str, key: str, outcome: Succeeded | Failed,
                     detail: str | None) -> None:
        """Answer a deferred command for ``operator`` (the saga's history records who, and why) and audit it;
        HTTPException 404 when no such command awaits an answer, 400 when the answer cannot be given."""
        found = {p.name: p for p in self.reads.participants}.get(participant_name)
        target = f"{participant_name} command {key}"
        verdict = {"outcome": "succeeded" if isinstance(outcome, Succeeded) else f"failed ({outcome.error_type})",
                   "detail": detail}
        if found is None:
            raise HTTPException(404, f"no participant {participant_name!r} in this deployment")
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                answered = await complete(conn, found, self.topics, key, outcome, operator=operator, detail=detail)
        except ValueError as error:
            await self.audit.record(operator, "Answer", target, verdict, f"refused: {error}")
            raise HTTPException(400, str(error)) from None
        if not answered:
            why = await why_not_awaiting(self.pool, found, key)
            await self.audit.record(operator, "Answer", target, verdict, f"refused: {why}")
            raise HTTPException(404, f"answer refused: {why}")
        await self.audit.record(operator, "Answer", target, verdict, "answered; the participant's relay replies")


def console_of(request: Request) -> Console:
    """The console of the app serving ``request``."""
    console: Console = request.app.state.console
    return console
