"""Many-row statements of the Postgres unit of work: one round trip for a whole batch of messages.

The orchestrator handles a batch of messages of different sagas in one transaction; these statements let
that transaction cost a fixed number of round trips instead of a few per message. Columns travel as arrays
and ``unnest`` zips them back into rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg

from ...infra.db import datetime_to_ms, ms_to_datetime
from ...outbox.table import insert_params, insert_sql
from ..ports import ConcurrencyConflict, SagaSummaryRow, StoredEvent, Writes

_SUMMARY_COLUMNS = "saga_id, saga_type, tenant_id, status, started_at, updated_at, last_seq, failed_step, reason"


class BulkStatements:
    """Mixed into ``PostgresUnitOfWork``: needs its open connection and schema name."""

    conn: asyncpg.Connection
    _s: str

    async def claim_ended(self, statuses: Sequence[str], ended_before_ms: int, limit: int,
                          skip: Sequence[str] = ()) -> list[str]:
        """Lock the read-model rows of up to ``limit`` sagas in ``statuses`` last updated before the cutoff,
        oldest first, passing over rows other transactions hold and the ids in ``skip``; their saga ids."""
        rows = await self.conn.fetch(
            f"SELECT saga_id FROM {self._s}.saga_summary WHERE status = ANY($1::text[]) AND updated_at < $2"
            " AND NOT saga_id = ANY($4::text[]) ORDER BY updated_at, saga_id LIMIT $3 FOR UPDATE SKIP LOCKED",
            list(statuses), ms_to_datetime(ended_before_ms), limit, list(skip))
        return [row["saga_id"] for row in rows]

    async def delete_events_through(self, through: Mapping[str, int]) -> None:
        """Delete each saga's events up to the mapped seq (retention), and the saga's timers."""
        if not through:
            return
        ids = list(through)
        await self.conn.execute(
            f"DELETE FROM {self._s}.events AS e USING unnest($1::text[], $2::bigint[]) AS p(saga_id, seq)"
            " WHERE e.saga_id = p.saga_id AND e.seq <= p.seq", ids, [through[saga_id] for saga_id in ids])
        await self.conn.execute(f"DELETE FROM {self._s}.timers WHERE saga_id = ANY($1::text[])", ids)

    async def claim_messages(self, consumer: str, message_ids: Sequence[str]) -> set[str]:
        """One inbox insert for every id; returns the ids inserted now."""
        # Sorted: concurrent claimers then take the inbox's index locks in one order (no deadlock).
        unique = sorted(set(message_ids))
        if not unique:
            return set()
        rows = await self.conn.fetch(
            f"INSERT INTO {self._s}.inbox (consumer, message_id) SELECT $1, m FROM unnest($2::text[]) AS m"
            " ON CONFLICT DO NOTHING RETURNING message_id",
            consumer,
            unique,
        )
        return {row["message_id"] for row in rows}

    async def load_events_after(self, after_seq: Mapping[str, int]) -> dict[str, list[StoredEvent]]:
        """The newer events of every given saga in one query, grouped by saga in seq order."""
        if not after_seq:
            return {}
        rows = await self.conn.fetch(
            f"SELECT e.saga_id, e.seq, e.event_type, e.body, e.recorded_at"
            f" FROM unnest($1::text[], $2::bigint[]) AS w(saga_id, after_seq)"
            f" JOIN {self._s}.events e ON e.saga_id = w.saga_id AND e.seq > w.after_seq"
            " ORDER BY e.saga_id, e.seq",
            list(after_seq),
            list(after_seq.values()),
        )
        loaded: dict[str, list[StoredEvent]] = {}
        for row in rows:
            loaded.setdefault(row["saga_id"], []).append(_stored(row))
        return loaded

    async def claim_and_load(self, consumer: str, message_ids: Sequence[str], after_seq: Mapping[str, int]
                             ) -> tuple[set[str], dict[str, list[StoredEvent]]]:
        """The inbox insert and the events read in one statement (a data-modifying CTE)."""
        rows = await self.conn.fetch(
            f"WITH claimed AS (INSERT INTO {self._s}.inbox (consumer, message_id)"
            "   SELECT $1, m FROM unnest($2::text[]) AS m ON CONFLICT DO NOTHING RETURNING message_id)"
            " SELECT message_id, NULL AS saga_id, NULL::bigint AS seq, NULL AS event_type, NULL::bytea AS body,"
            "        NULL::timestamptz AS recorded_at FROM claimed"
            " UNION ALL"
            " SELECT NULL, e.saga_id, e.seq, e.event_type, e.body, e.recorded_at"
            " FROM unnest($3::text[], $4::bigint[]) AS w(saga_id, after_seq)"
            f" JOIN {self._s}.events e ON e.saga_id = w.saga_id AND e.seq > w.after_seq",
            consumer,
            sorted(set(message_ids)),  # sorted: concurrent claimers lock the inbox keys in one order
            list(after_seq),
            list(after_seq.values()),
        )
        claimed: set[str] = set()
        loaded: dict[str, list[StoredEvent]] = {}
        for row in rows:
            if row["message_id"] is not None:
                claimed.add(row["message_id"])
            else:
                loaded.setdefault(row["saga_id"], []).append(_stored(row))
        for events in loaded.values():
            events.sort(key=lambda event: event.seq)
        return claimed, loaded

    async def write(self, writes: Writes) -> None:
        """Every part of ``writes`` in one statement: one data-modifying CTE per table."""
        timers = list({(t.saga_id, t.timer_id): t for t in writes.timers}.values())
        summaries = _latest_summaries(writes.summaries)
        try:
            await self.conn.execute(
                f"""WITH
                deleted AS (DELETE FROM {self._s}.timers WHERE ctid = ANY(ARRAY(
                                SELECT t.ctid FROM {self._s}.timers t
                                JOIN unnest($1::text[], $2::text[]) AS d(saga_id, timer_id)
                                  ON t.saga_id = d.saga_id AND t.timer_id = d.timer_id
                                FOR UPDATE OF t SKIP LOCKED))),
                appended AS (INSERT INTO {self._s}.events (saga_id, seq, event_type, body, recorded_at)
                             SELECT saga_id, seq, event_type, body, coalesce(recorded_at, now())
                             FROM unnest($3::text[], $4::bigint[], $5::text[], $6::bytea[], $7::timestamptz[])
                                  AS e(saga_id, seq, event_type, body, recorded_at)),
                queued AS ({insert_sql(f"{self._s}.outbox", 8)}),
                armed AS (INSERT INTO {self._s}.timers (saga_id, timer_id, kind, step, attempt, due_at)
                          SELECT * FROM unnest($14::text[], $15::text[], $16::text[], $17::text[], $18::int[],
                                               $19::timestamptz[])
                          ON CONFLICT (saga_id, timer_id) DO UPDATE SET kind = excluded.kind,
                              step = excluded.step, attempt = excluded.attempt, due_at = excluded.due_at),
                summarized AS (INSERT INTO {self._s}.saga_summary AS s ({_SUMMARY_COLUMNS})
                               SELECT * FROM unnest($20::text[], $21::text[], $22::text[], $23::text[],
                                                    $24::timestamptz[], $25::timestamptz[], $26::bigint[],
                                                    $27::text[], $28::text[])
                               ON CONFLICT (saga_id) DO UPDATE SET saga_type = excluded.saga_type,
                                   tenant_id = excluded.tenant_id, status = excluded.status,
                                   started_at = excluded.started_at, updated_at = excluded.updated_at,
                                   last_seq = excluded.last_seq, failed_step = excluded.failed_step,
                                   reason = excluded.reason
                               WHERE s.last_seq <= excluded.last_seq)
                SELECT 1""",
                [saga_id for saga_id, _ in writes.deleted_timers],
                [timer_id for _, timer_id in writes.deleted_timers],
                *_event_columns(writes.events),
                *insert_params(writes.outbox),
                [t.saga_id for t in timers],
                [t.timer_id for t in timers],
                [t.kind for t in timers],
                [t.step for t in timers],
                [t.attempt for t in timers],
                [ms_to_datetime(t.due_at_ms) for t in timers],
                *_summary_columns(summaries),
            )
        except asyncpg.UniqueViolationError as exc:
            sagas = sorted({e.saga_id for e in writes.events})
            raise ConcurrencyConflict(f"events already recorded for saga(s) {sagas}: {exc.detail}") from exc

    async def delete_timers(self, keys: Sequence[tuple[str, str]]) -> None:
        """One delete for every (saga_id, timer_id), skipping rows another transaction has locked."""
        if not keys:
            return
        # ctid = ANY(ARRAY(...)): see PostgresUnitOfWork.claim_due.
        await self.conn.execute(
            f"DELETE FROM {self._s}.timers WHERE ctid = ANY(ARRAY("
            f" SELECT t.ctid FROM {self._s}.timers t"
            " JOIN unnest($1::text[], $2::text[]) AS d(saga_id, timer_id)"
            " ON t.saga_id = d.saga_id AND t.timer_id = d.timer_id FOR UPDATE OF t SKIP LOCKED))",
            [saga_id for saga_id, _ in keys],
            [timer_id for _, timer_id in keys],
        )

    async def upsert_summaries(self, summaries: Sequence[SagaSummaryRow]) -> None:
        """One upsert for every saga; an update never lowers ``last_seq``."""
        rows = _latest_summaries(summaries)
        if not rows:
            return
        await self.conn.execute(
            f"INSERT INTO {self._s}.saga_summary AS s ({_SUMMARY_COLUMNS})"
            " SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[],"
            " $6::timestamptz[], $7::bigint[], $8::text[], $9::text[])"
            " ON CONFLICT (saga_id) DO UPDATE SET saga_type = excluded.saga_type,"
            " tenant_id = excluded.tenant_id, status = excluded.status, started_at = excluded.started_at,"
            " updated_at = excluded.updated_at, last_seq = excluded.last_seq,"
            " failed_step = excluded.failed_step, reason = excluded.reason"
            " WHERE s.last_seq <= excluded.last_seq",
            *_summary_columns(rows),
        )


def _latest_summaries(summaries: Sequence[SagaSummaryRow]) -> list[SagaSummaryRow]:
    # ON CONFLICT DO UPDATE refuses to touch one row twice in a statement: keep one row per saga, the one a
    # sequence of single upserts would have left (highest last_seq, the later of equals).
    latest: dict[str, SagaSummaryRow] = {}
    for summary in summaries:
        current = latest.get(summary.saga_id)
        if current is None or current.last_seq <= summary.last_seq:
            latest[summary.saga_id] = summary
    return list(latest.values())


def _summary_columns(rows: Sequence[SagaSummaryRow]) -> list[list[Any]]:
    return [
        [r.saga_id for r in rows],
        [r.saga_type for r in rows],
        [r.tenant_id for r in rows],
        [r.status for r in rows],
        [ms_to_datetime(r.started_at_ms) for r in rows],
        [ms_to_datetime(r.updated_at_ms) for r in rows],
        [r.last_seq for r in rows],
        [r.failed_step for r in rows],
        [r.reason for r in rows],
    ]


def _event_columns(events: Sequence[StoredEvent]) -> list[list[Any]]:
    return [
        [e.saga_id for e in events],
        [e.seq for e in events],
        [e.event_type for e in events],
        [e.body for e in events],
        [None if e.recorded_at_ms is None else ms_to_datetime(e.recorded_at_ms) for e in events],
    ]


def _stored(row: asyncpg.Record) -> StoredEvent:
    return StoredEvent(row["saga_id"], row["seq"], row["event_type"], row["body"], datetime_to_ms(row["recorded_at"]))
