"""Postgres adapter of the storage ports; its schema (``saga``) is made by the migrations beside it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg

from ...infra.db import apply_migrations, check_identifier, datetime_to_ms, ms_to_datetime
from ...outbox.table import write_outbox
from ..ports import (
    ConcurrencyConflict,
    OutboxMessage,
    SagaSummaryRow,
    StoredEvent,
    TimerRow,
)
from .postgres_bulk import BulkStatements

MIGRATIONS = Path(__file__).parent / "migrations"
MIGRATIONS_TABLE = "saga.schema_migrations"
LEGACY_MIGRATIONS_TABLE = "public.schema_migrations"
"""Where releases up to 0.1.0 recorded the migrations applied (a name other migration tools use too)."""


async def migrate(conn_or_pool: asyncpg.Connection | asyncpg.Pool) -> list[str]:
    """Create or bring up to date the orchestrator's tables; the migrations applied now. Every service that
    uses them runs this at start (concurrent starters queue up)."""
    return await apply_migrations(conn_or_pool, MIGRATIONS, MIGRATIONS_TABLE, adopt_from=LEGACY_MIGRATIONS_TABLE)


_SUMMARY_COLUMNS = (
    "saga_id, saga_type, tenant_id, status, started_at, updated_at, last_seq, failed_step, reason"
)


def _event(row: asyncpg.Record) -> StoredEvent:
    return StoredEvent(
        saga_id=row["saga_id"],
        seq=row["seq"],
        event_type=row["event_type"],
        body=row["body"],
        recorded_at_ms=datetime_to_ms(row["recorded_at"]),
    )


def _summary(row: asyncpg.Record) -> SagaSummaryRow:
    return SagaSummaryRow(
        saga_id=row["saga_id"],
        saga_type=row["saga_type"],
        tenant_id=row["tenant_id"],
        status=row["status"],
        started_at_ms=datetime_to_ms(row["started_at"]),
        updated_at_ms=datetime_to_ms(row["updated_at"]),
        last_seq=row["last_seq"],
        failed_step=row["failed_step"],
        reason=row["reason"],
    )


class PostgresUnitOfWork(BulkStatements):
    """``UnitOfWork`` on one connection inside an open transaction (see ``PostgresStore.begin``).

    The many-row variants (``claim_messages``, ``load_events_after``, ...) live in ``BulkStatements``.
    """

    def __init__(self, conn: asyncpg.Connection, schema: str) -> None:
        self.conn = conn
        self._s = schema

    async def claim_message(self, consumer: str, message_id: str) -> bool:
        """Inbox insert; a concurrent claim of the same id waits for the other transaction, then sees it."""
        status: str = await self.conn.execute(
            f"INSERT INTO {self._s}.inbox (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            consumer,
            message_id,
        )
        return status == "INSERT 0 1"

    async def load_events(self, saga_id: str, after_seq: int = 0) -> list[StoredEvent]:
        """The saga's events after ``after_seq`` in seq order."""
        rows = await self.conn.fetch(
            f"SELECT saga_id, seq, event_type, body, recorded_at FROM {self._s}.events"
            " WHERE saga_id = $1 AND seq > $2 ORDER BY seq",
            saga_id,
            after_seq,
        )
        return [_event(row) for row in rows]

    async def append_events(self, events: Sequence[StoredEvent]) -> None:
        """One multi-row insert; a primary-key violation becomes ConcurrencyConflict."""
        if not events:
            return
        try:
            await self.conn.execute(
                f"INSERT INTO {self._s}.events (saga_id, seq, event_type, body, recorded_at)"
                " SELECT saga_id, seq, event_type, body, coalesce(recorded_at, now())"
                " FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bytea[], $5::timestamptz[])"
                " AS e(saga_id, seq, event_type, body, recorded_at)",
                [e.saga_id for e in events],
                [e.seq for e in events],
                [e.event_type for e in events],
                [e.body for e in events],
                [None if e.recorded_at_ms is None else ms_to_datetime(e.recorded_at_ms) for e in events],
            )
        except asyncpg.UniqueViolationError as exc:
            sagas = sorted({e.saga_id for e in events})
            raise ConcurrencyConflict(f"events already recorded for saga(s) {sagas}: {exc.detail}") from exc

    async def add_outbox(self, messages: Sequence[OutboxMessage]) -> None:
        """Rows of ``<schema>.outbox``, published by the relay after commit."""
        await write_outbox(self.conn, f"{self._s}.outbox", messages)

    async def schedule_timers(self, timers: Sequence[TimerRow]) -> None:
        """Multi-row upsert by (saga_id, timer_id)."""
        # ON CONFLICT DO UPDATE refuses to touch one row twice in a statement: keep the last duplicate.
        unique = list({(t.saga_id, t.timer_id): t for t in timers}.values())
        if not unique:
            return
        await self.conn.execute(
            f"INSERT INTO {self._s}.timers (saga_id, timer_id, kind, step, attempt, due_at)"
            " SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[],"
            " $6::timestamptz[])"
            " ON CONFLICT (saga_id, timer_id) DO UPDATE SET kind = excluded.kind, step = excluded.step,"
            " attempt = excluded.attempt, due_at = excluded.due_at",
            [t.saga_id for t in unique],
            [t.timer_id for t in unique],
            [t.kind for t in unique],
            [t.step for t in unique],
            [t.attempt for t in unique],
            [ms_to_datetime(t.due_at_ms) for t in unique],
        )

    async def delete_timer(self, saga_id: str, timer_id: str) -> None:
        """Delete one timer if present."""
        await self.conn.execute(
            f"DELETE FROM {self._s}.timers WHERE saga_id = $1 AND timer_id = $2", saga_id, timer_id
        )

    async def claim_due(self, now_ms: int, limit: int) -> list[TimerRow]:
        """Delete-and-return due timers, skipping rows locked by other open transactions."""
        # ctid = ANY(ARRAY(...)): the claiming subquery runs once, then a TID scan deletes exactly its rows.
        # The IN (subquery) form let the planner, misled by statistics taken while the queue was empty, loop
        # over the whole table and re-run the subquery for each row.
        rows = await self.conn.fetch(
            f"DELETE FROM {self._s}.timers WHERE ctid = ANY(ARRAY("
            f"  SELECT ctid FROM {self._s}.timers WHERE due_at <= $1"
            "   ORDER BY due_at LIMIT $2 FOR UPDATE SKIP LOCKED))"
            " RETURNING saga_id, timer_id, kind, step, attempt, due_at",
            ms_to_datetime(now_ms),
            limit,
        )
        timers = [
            TimerRow(
                saga_id=row["saga_id"],
                timer_id=row["timer_id"],
                kind=row["kind"],
                step=row["step"],
                attempt=row["attempt"],
                due_at_ms=datetime_to_ms(row["due_at"]),
            )
            for row in rows
        ]
        # RETURNING does not keep the subquery's order.
        return sorted(timers, key=lambda t: (t.due_at_ms, t.saga_id, t.timer_id))

    async def upsert_summary(self, summary: SagaSummaryRow) -> None:
        """Insert or update; an update never lowers ``last_seq``."""
        await self.conn.execute(
            f"INSERT INTO {self._s}.saga_summary AS s ({_SUMMARY_COLUMNS})"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
            " ON CONFLICT (saga_id) DO UPDATE SET saga_type = excluded.saga_type,"
            " tenant_id = excluded.tenant_id, status = excluded.status, started_at = excluded.started_at,"
            " updated_at = excluded.updated_at, last_seq = excluded.last_seq,"
            " failed_step = excluded.failed_step, reason = excluded.reason"
            " WHERE s.last_seq <= excluded.last_seq",
            summary.saga_id,
            summary.saga_type,
            summary.tenant_id,
            summary.status,
            ms_to_datetime(summary.started_at_ms),
            ms_to_datetime(summary.updated_at_ms),
            summary.last_seq,
            summary.failed_step,
            summary.reason,
        )


class PostgresStore:
    """``UnitOfWorkFactory`` and ``EventReader`` over an asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool, schema: str = "saga") -> None:
        self._pool = pool
        self._s = check_identifier(schema)

    @property
    def pool(self) -> asyncpg.Pool:
        """The connection pool the store uses."""
        return self._pool

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[PostgresUnitOfWork]:
        """One pooled connection, one transaction: commit on normal exit, rollback on exception."""
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                yield PostgresUnitOfWork(conn, self._s)
        except (asyncpg.DeadlockDetectedError, asyncpg.SerializationError) as exc:
            # Both mean "a concurrent transaction won": the same remedy as a duplicate seq.
            raise ConcurrencyConflict(str(exc)) from exc

    async def get_summary(self, saga_id: str) -> SagaSummaryRow | None:
        """The summary of one saga, or None."""
        row = await self._pool.fetchrow(
            f"SELECT {_SUMMARY_COLUMNS} FROM {self._s}.saga_summary WHERE saga_id = $1", saga_id
        )
        return None if row is None else _summary(row)

    async def list_summaries(
        self,
        *,
        status: str | None = None,
        saga_type: str | None = None,
        tenant_id: str | None = None,
        updated_before_ms: int | None = None,
        limit: int = 100,
    ) -> list[SagaSummaryRow]:
        """Filtered summaries, least recently updated first."""
        conditions: list[str] = []
        params: list[Any] = []
        for column, op, value in (
            ("status", "=", status),
            ("saga_type", "=", saga_type),
            ("tenant_id", "=", tenant_id),
            ("updated_at", "<", None if updated_before_ms is None else ms_to_datetime(updated_before_ms)),
        ):
            if value is not None:
                params.append(value)
                conditions.append(f"{column} {op} ${len(params)}")
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        params.append(limit)
        rows = await self._pool.fetch(
            f"SELECT {_SUMMARY_COLUMNS} FROM {self._s}.saga_summary {where}"
            f" ORDER BY updated_at, saga_id LIMIT ${len(params)}",
            *params,
        )
        return [_summary(row) for row in rows]

    async def count_by_status(self) -> dict[str, int]:
        """Number of sagas per status."""
        rows = await self._pool.fetch(
            f"SELECT status, count(*) AS n FROM {self._s}.saga_summary GROUP BY status ORDER BY status"
        )
        return {row["status"]: row["n"] for row in rows}

    async def load_events(self, saga_id: str, after_seq: int = 0) -> list[StoredEvent]:
        """The events of one saga after ``after_seq`` (all by default) in seq order."""
        rows = await self._pool.fetch(
            f"SELECT saga_id, seq, event_type, body, recorded_at FROM {self._s}.events"
            " WHERE saga_id = $1 AND seq > $2 ORDER BY seq",
            saga_id,
            after_seq,
        )
        return [_event(row) for row in rows]

    async def count_ended(self, statuses: Sequence[str], ended_before_ms: int) -> int:
        """Sagas in ``statuses`` whose read-model row was last updated before the cutoff."""
        return int(await self._pool.fetchval(
            f"SELECT count(*) FROM {self._s}.saga_summary WHERE status = ANY($1::text[]) AND updated_at < $2",
            list(statuses), ms_to_datetime(ended_before_ms)))

    async def summaries_of(self, saga_ids: Sequence[str]) -> dict[str, SagaSummaryRow]:
        """The read model's rows of these sagas (those that have one)."""
        rows = await self._pool.fetch(f"SELECT * FROM {self._s}.saga_summary WHERE saga_id = ANY($1::text[])",
                                      list(saga_ids))
        return {row["saga_id"]: _summary(row) for row in rows}

    async def remove_orphan_summaries(self, dry_run: bool = False) -> int:
        """Delete (or with ``dry_run`` count) read-model rows of sagas without events; how many."""
        orphans = f"FROM {self._s}.saga_summary s WHERE NOT EXISTS (SELECT 1 FROM {self._s}.events e" \
                  " WHERE e.saga_id = s.saga_id)"
        if dry_run:
            return int(await self._pool.fetchval(f"SELECT count(*) {orphans}"))
        status: str = await self._pool.execute(f"DELETE {orphans}")
        return int(status.split()[-1])

    async def iter_events(self, batch_size: int = 1000) -> AsyncIterator[StoredEvent]:
        """Every event by (saga_id, seq), with keyset paging: no long transaction, no server cursor."""
        last: tuple[str, int] | None = None
        while True:
            if last is None:
                rows = await self._pool.fetch(
                    f"SELECT saga_id, seq, event_type, body, recorded_at FROM {self._s}.events"
                    " ORDER BY saga_id, seq LIMIT $1",
                    batch_size,
                )
            else:
                rows = await self._pool.fetch(
                    f"SELECT saga_id, seq, event_type, body, recorded_at FROM {self._s}.events"
                    " WHERE (saga_id, seq) > ($1, $2) ORDER BY saga_id, seq LIMIT $3",
                    *last,
                    batch_size,
                )
            for row in rows:
                yield _event(row)
            if len(rows) < batch_size:
                return
            last = (rows[-1]["saga_id"], rows[-1]["seq"])
