"""What the console and its HTTP API read: the fleet, one saga, what waits on an operator.

Every query reads the orchestrator's own tables (``saga.saga_summary``, ``saga.search_keys``, ``saga.events``,
``saga.timers``, ``saga.outbox``…) under a statement timeout, so a slow database slows a page and never piles up
connections behind it; none takes a lock a service waits for.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from ..infra.db import datetime_to_ms
from ..orchestrator import bulk_jobs
from ..orchestrator.domain.definition import DefinitionRegistry, SagaDefinition
from ..orchestrator.domain.errors import DomainError
from ..orchestrator.domain.state import SagaState, SagaStatus, fold
from ..orchestrator.domain.waits import PersonWait
from ..orchestrator.ports import SagaSummaryRow
from ..orchestrator.store.postgres import SUMMARY_COLUMNS, summary_row
from ..participants.kit.ledger import awaiting
from ..participants.kit.participant import Participant
from ..schemas import wire
from ..schemas.codec import WireError
from ..schemas.event_types import Event
from ..schemas.registry import SchemaRegistry

READ_TIMEOUT_S = 5.0
FLEET_FRESH_S = 2.0
"""Pages and API calls within this long of a read of the unfinished sagas share it (the fleet page refreshes
every 5 s)."""
ENDED_FRESH_S = 15.0
"""The same for the sagas that ended in the last day: their count is the fleet's large part (every saga of the
day), changes by a small share in this long, and reading it every 2 s beside 200 sagas/s cost the services'
Postgres a measurable share of a core."""
OLDEST_SHOWN = 10
AGE_BUCKETS: tuple[tuple[str, int | None], ...] = (
    ("< 1 min", 60), ("< 10 min", 600), ("< 1 h", 3600), ("< 1 day", 86400), (">= 1 day", None))
"""The heat table's columns: a saga's age (since it started) up to each bound, in seconds."""
ENDED = tuple(status.value for status in SagaStatus if status.is_terminal)
UNFINISHED = tuple(status.value for status in SagaStatus if not status.is_terminal)
UNDONE = (SagaStatus.COMPENSATED.value, SagaStatus.COMPENSATION_FAILED.value, SagaStatus.CANCELLED.value)
"""The end states reached by compensating: the compensation rate counts them among the ended."""


@dataclass(frozen=True)
class HeatCell:
    saga_type: str
    status: str
    bucket: str
    count: int


@dataclass(frozen=True)
class Fleet:
    """The fleet at a glance: the unfinished sagas and those that ended in the last day, by type, state and age;
    the oldest unfinished sagas; the compensation rate."""

    cells: list[HeatCell]
    oldest: list[SagaSummaryRow]
    compensation_rate_hour: float | None  # compensated / ended in the last hour; None when none ended
    compensation_rate_day: float | None
    ended_hour: int
    ended_day: int

    def counts(self) -> dict[tuple[str, str], dict[str, int]]:
        """(saga type, state) → age bucket → count, rows in type then state order."""
        table: dict[tuple[str, str], dict[str, int]] = {}
        for cell in sorted(self.cells, key=lambda c: (c.saga_type, c.status)):
            table.setdefault((cell.saga_type, cell.status), {})[cell.bucket] = cell.count
        return table

    def by_status(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for cell in self.cells:
            totals[cell.status] = totals.get(cell.status, 0) + cell.count
        return dict(sorted(totals.items()))


@dataclass(frozen=True)
class EndedCounts:
    """How many sagas ended in the last hour and day, and how many of them by compensating (``UNDONE``)."""

    hour: int
    day: int
    undone_hour: int
    undone_day: int


_AGE = "extract(epoch FROM now() - started_at)"
_BUCKET_SQL = "CASE " + " ".join(
    f"WHEN {_AGE} < {bound} THEN {index}" for index, (_, bound) in enumerate(AGE_BUCKETS) if bound is not None
) + f" ELSE {len(AGE_BUCKETS) - 1} END"
"""A saga's age bucket: its index in ``AGE_BUCKETS``."""


def _cell(row: asyncpg.Record) -> HeatCell:
    return HeatCell(row["saga_type"], row["status"], AGE_BUCKETS[row["bucket"]][0], row["n"])


@dataclass(frozen=True)
class WedgedGroup:
    """Unfinished sagas stuck on one step of one type with one error, at least N failures each."""

    saga_type: str
    step: str
    error: str | None
    count: int
    max_failures: int
    saga_ids: list[str]


@dataclass(frozen=True)
class TimerView:
    kind: str
    step: str
    attempt: int
    due_at_ms: int


@dataclass(frozen=True)
class OutboxView:
    """A row the relay has not published yet (parked: the broker refused it for good, with why)."""

    table: str
    row_id: int
    topic: str
    created_at_ms: int
    parked_reason: str | None = None


@dataclass
class SagaView:
    """One saga: its events, its folded state (None when it does not fold here, with why), what waits."""

    saga_id: str
    events: list[Event]
    state: SagaState | None
    definition: SagaDefinition | None
    fold_error: str | None
    timers: list[TimerView] = field(default_factory=list)
    outbox: list[OutboxView] = field(default_factory=list)
    recorded_at_ms: dict[int, int] = field(default_factory=dict)  # seq → when it was stored
    persons: dict[str, PersonWait] = field(default_factory=dict)  # step → its command deferred to a person

    def output_of(self, step: str, schemas: SchemaRegistry) -> dict[str, Any] | None:
        """The step's output decoded from Avro (None when it gave none, or its schema is unknown here)."""
        if self.state is None or step not in self.state.steps:
            return None
        raw = self.state.steps[step].output
        if not raw:
            return None
        try:
            return schemas.decode(raw)[1]
        except WireError:
            return None


@dataclass(frozen=True)
class Deferred:
    participant: str
    saga_id: str
    step: str
    action: str
    idempotency_key: str
    deferred_at_ms: int


@dataclass(frozen=True)
class AuditEntry:
    at_ms: int
    operator: str
    action: str
    target: str
    detail: dict[str, Any]
    outcome: str


class ConsoleReads:
    """The console's queries over the orchestrator's database (``pool``), folding with ``definitions``."""

    def __init__(self, pool: asyncpg.Pool, definitions: DefinitionRegistry, schemas: SchemaRegistry,
                 participants: Sequence[Participant] = ()) -> None:
        self._pool = pool
        self.definitions = definitions
        self.schemas = schemas
        self.participants = list(participants)
        # (when read, monotonic s; what was read), for the unfinished sagas and for the ended ones
        self._unfinished: tuple[float, tuple[list[HeatCell], list[SagaSummaryRow]]] | None = None
        self._ended: tuple[float, tuple[list[HeatCell], EndedCounts]] | None = None
        self._fleet_read = asyncio.Lock()

    async def fleet(self) -> Fleet:
        """Counts by saga type, state and age bucket (of the unfinished sagas and those that ended in the last
        day), the oldest unfinished sagas, the compensation rates. The unfinished sagas are read at most once
        every ``FLEET_FRESH_S``, the ended ones every ``ENDED_FRESH_S``, however many pages and API callers ask
        (its cost to the database stays that of one viewer)."""
        async with self._fleet_read:
            now = time.monotonic()
            if self._unfinished is None or now - self._unfinished[0] >= FLEET_FRESH_S:
                self._unfinished = (now, await self._read_unfinished(OLDEST_SHOWN))
            if self._ended is None or now - self._ended[0] >= ENDED_FRESH_S:
                self._ended = (now, await self._read_ended())
            (unfinished, oldest), (ended, counts) = self._unfinished[1], self._ended[1]
        return Fleet(cells=unfinished + ended, oldest=oldest,
                     compensation_rate_hour=counts.undone_hour / counts.hour if counts.hour else None,
                     compensation_rate_day=counts.undone_day / counts.day if counts.day else None,
                     ended_hour=counts.hour, ended_day=counts.day)

    async def _read_unfinished(self, oldest: int) -> tuple[list[HeatCell], list[SagaSummaryRow]]:
        async with self._pool.acquire() as conn:
            cells = await conn.fetch(
                f"SELECT saga_type, status, {_BUCKET_SQL} AS bucket, count(*) AS n FROM saga.saga_summary"
                " WHERE status = ANY($1::text[]) GROUP BY 1, 2, 3", list(UNFINISHED), timeout=READ_TIMEOUT_S)
            rows = await conn.fetch(
                f"SELECT {SUMMARY_COLUMNS} FROM saga.saga_summary WHERE status = ANY($1::text[])"
                " ORDER BY started_at LIMIT $2", list(UNFINISHED), oldest, timeout=READ_TIMEOUT_S)
        return [_cell(r) for r in cells], [summary_row(r) for r in rows]

    async def _read_ended(self) -> tuple[list[HeatCell], EndedCounts]:
        # Through the (status, updated_at) index: the page costs the same after a month of ended sagas as on the
        # first day. One scan gives both the cells and the rates of the last hour and day.
        rows = await self._pool.fetch(
            f"SELECT saga_type, status, {_BUCKET_SQL} AS bucket, count(*) AS n,"
            "        count(*) FILTER (WHERE updated_at > now() - interval '1 hour') AS in_hour"
            " FROM saga.saga_summary WHERE status = ANY($1::text[]) AND updated_at > now() - interval '1 day'"
            " GROUP BY 1, 2, 3", list(ENDED), timeout=READ_TIMEOUT_S)
        undone = [r for r in rows if r["status"] in UNDONE]
        counts = EndedCounts(hour=sum(r["in_hour"] for r in rows), day=sum(r["n"] for r in rows),
                             undone_hour=sum(r["in_hour"] for r in undone), undone_day=sum(r["n"] for r in undone))
        return [_cell(r) for r in rows], counts

    async def sagas(self, selection: bulk_jobs.Selection | None = None, limit: int = 100) -> list[SagaSummaryRow]:
        """Sagas of the read model that ``selection`` takes (every saga when None; the same condition a bulk job's
        dry run counts), the oldest started first. BulkJobError for a saga type or participant not deployed."""
        condition = bulk_jobs.where(selection, self.definitions) if selection else bulk_jobs.Where("TRUE")
        rows = await self._pool.fetch(
            f"SELECT {SUMMARY_COLUMNS} FROM saga.saga_summary WHERE {condition.sql} ORDER BY started_at"
            f" LIMIT ${len(condition.params) + 1}", *condition.params, limit, timeout=READ_TIMEOUT_S)
        return [summary_row(r) for r in rows]

    async def search(self, query: str, limit: int = 100) -> list[SagaSummaryRow]:
        """Sagas whose id is ``query``, or one of whose searchable fields holds it (``field=value``: that field
        only); the newest first."""
        text = query.strip()
        if not text:
            return []
        name, _, value = text.partition("=") if "=" in text else ("", "", text)
        rows = await self._pool.fetch(
            f"SELECT {SUMMARY_COLUMNS} FROM saga.saga_summary WHERE saga_id = $1 OR saga_id IN ("
            "  SELECT saga_id FROM saga.search_keys WHERE value = $2 AND ($3 = '' OR field = $3))"
            " ORDER BY started_at DESC LIMIT $4", text, value.strip(), name.strip(), limit, timeout=READ_TIMEOUT_S)
        return [summary_row(r) for r in rows]

    async def search_keys(self, saga_id: str) -> dict[str, str]:
        rows = await self._pool.fetch("SELECT field, value FROM saga.search_keys WHERE saga_id = $1 ORDER BY field",
                                      saga_id, timeout=READ_TIMEOUT_S)
        return {r["field"]: r["value"] for r in rows}

    async def wedged(self, min_failures: int = 3, per_group: int = 20) -> list[WedgedGroup]:
        """Unfinished sagas whose current step failed or timed out at least ``min_failures`` times, grouped by
        type, step and error, the largest group first."""
        rows = await self._pool.fetch(
            "SELECT saga_type, current_step, last_error, count(*) AS n, max(step_failures) AS worst,"
            "       (array_agg(saga_id ORDER BY step_failures DESC, saga_id))[1:$3] AS ids"
            " FROM saga.saga_summary WHERE step_failures >= $1 AND status <> ALL($2::text[])"
            " GROUP BY 1, 2, 3 ORDER BY n DESC, worst DESC", min_failures, list(ENDED), per_group,
            timeout=READ_TIMEOUT_S)
        return [WedgedGroup(r["saga_type"], r["current_step"], r["last_error"], r["n"], r["worst"], list(r["ids"]))
                for r in rows]

    async def saga(self, saga_id: str) -> SagaView | None:
        """One saga's events, state, live timers and unpublished outbox rows; None for an unknown id."""
        async with self._pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            stored = await conn.fetch("SELECT seq, body, recorded_at FROM saga.events WHERE saga_id = $1 ORDER BY seq",
                                      saga_id, timeout=READ_TIMEOUT_S)
            if not stored:
                return None
            timers = await conn.fetch("SELECT kind, step, attempt, due_at FROM saga.timers WHERE saga_id = $1"
                                      " ORDER BY due_at", saga_id, timeout=READ_TIMEOUT_S)
            outbox = await conn.fetch(
                "SELECT 'saga.outbox' AS t, id, topic, created_at, NULL AS reason FROM saga.outbox"
                " WHERE message_key = $1 UNION ALL"
                " SELECT 'saga.outbox_parked', id, topic, created_at, reason FROM saga.outbox_parked"
                " WHERE message_key = $1 ORDER BY 2", saga_id, timeout=READ_TIMEOUT_S)
        events = [wire.decode_event(row["body"]) for row in stored]
        view = SagaView(saga_id, events, None, None, None,
                        timers=[TimerView(r["kind"], r["step"], r["attempt"], datetime_to_ms(r["due_at"]))
                                for r in timers],
                        outbox=[OutboxView(r["t"], r["id"], r["topic"], datetime_to_ms(r["created_at"]), r["reason"])
                                for r in outbox],
                        recorded_at_ms={r["seq"]: datetime_to_ms(r["recorded_at"]) for r in stored})
        try:
            view.definition = self.definitions.for_history(events)
            view.state = fold(view.definition, events)
        except DomainError as error:
            view.fold_error = f"{type(error).__name__}: {error}"
        if view.definition is not None and view.state is not None and not view.state.is_terminal:
            view.persons = await self._persons(saga_id, view.definition)
        return view

    async def _persons(self, saga_id: str, definition: SagaDefinition) -> dict[str, PersonWait]:
        """The saga's commands its participants deferred to a person, by step."""
        names = {step.participant for step in definition.steps if not step.waits}
        found: dict[str, PersonWait] = {}
        for participant in (p for p in self.participants if p.name in names):
            try:
                rows = await awaiting(self._pool, participant, saga_id)
            except asyncpg.UndefinedTableError:
                continue  # the participant has not started here yet
            found |= {r.step: PersonWait(participant.name, r.idempotency_key, r.deferred_at_ms, r.answer_by_ms)
                      for r in rows}
        return found

    async def events_after(self, saga_id: str, after_seq: int) -> list[tuple[int, Event]]:
        """The saga's events after ``after_seq`` (the live timeline's next lines), with when each was stored."""
        rows = await self._pool.fetch(
            "SELECT seq, body, recorded_at FROM saga.events WHERE saga_id = $1 AND seq > $2 ORDER BY seq",
            saga_id, after_seq, timeout=READ_TIMEOUT_S)
        return [(datetime_to_ms(r["recorded_at"]), wire.decode_event(r["body"])) for r in rows]

    async def encoded_events(self, saga_id: str) -> list[tuple[int, bytes]]:
        """The saga's events as stored: (seq, Avro single-object encoding), in seq order."""
        rows = await self._pool.fetch("SELECT seq, body FROM saga.events WHERE saga_id = $1 ORDER BY seq", saga_id,
                                      timeout=READ_TIMEOUT_S)
        return [(r["seq"], bytes(r["body"])) for r in rows]

    async def quarantined(self, limit: int = 200) -> list[SagaSummaryRow]:
        return await self.sagas(bulk_jobs.Selection(statuses=(SagaStatus.QUARANTINED.value,)), limit)

    async def parked(self) -> list[OutboxView]:
        """Every outbox row the broker refused for good, in the orchestrator's and each participant's outbox."""
        tables = await self._pool.fetch("SELECT table_schema FROM information_schema.tables"
                                        " WHERE table_name = 'outbox_parked' ORDER BY 1", timeout=READ_TIMEOUT_S)
        found: list[OutboxView] = []
        for table in tables:
            schema = table["table_schema"]
            rows = await self._pool.fetch(
                f'SELECT id, topic, created_at, reason, message_key FROM "{schema}".outbox_parked ORDER BY id',
                timeout=READ_TIMEOUT_S)
            found += [OutboxView(f"{schema}.outbox_parked", r["id"], r["topic"], datetime_to_ms(r["created_at"]),
                                 f"{r['message_key']}: {r['reason']}") for r in rows]
        return found

    async def deferred(self) -> list[Deferred]:
        """The commands each participant of the deployment deferred, waiting for an answer, oldest first."""
        found: list[Deferred] = []
        for participant in self.participants:
            try:
                rows = await awaiting(self._pool, participant)
            except asyncpg.UndefinedTableError:
                continue  # the participant has not started here yet
            found += [Deferred(participant.name, r.saga_id, r.step, r.action, r.idempotency_key, r.deferred_at_ms)
                      for r in rows]
        return sorted(found, key=lambda d: d.deferred_at_ms)

    async def audit(self, limit: int = 200) -> list[AuditEntry]:
        rows = await self._pool.fetch(
            "SELECT at, operator, action, target, detail, outcome FROM saga.operator_audit ORDER BY id DESC LIMIT $1",
            limit, timeout=READ_TIMEOUT_S)
        return [AuditEntry(datetime_to_ms(r["at"]), r["operator"], r["action"], r["target"], json.loads(r["detail"]),
                           r["outcome"]) for r in rows]

    async def record(self, operator: str, action: str, target: str, detail: dict[str, Any], outcome: str,
                     conn: asyncpg.Connection | None = None) -> None:
        """Add an entry to the console's audit (saga.operator_audit); in ``conn``'s transaction when given."""
        await (conn or self._pool).execute(
            "INSERT INTO saga.operator_audit (operator, action, target, detail, outcome) VALUES ($1, $2, $3, $4, $5)",
            operator, action, target, json.dumps(detail, default=str), outcome, timeout=READ_TIMEOUT_S)


def epoch_ms(moment: datetime) -> int:
    return datetime_to_ms(moment)
