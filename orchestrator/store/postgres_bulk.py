"""Many-row statements of the Postgres unit of work: one round trip for a whole batch of messages.

The orchestrator handles a batch of messages of different sagas in one transaction; these statements let
that transaction cost a fixed number of round trips instead of a few per message. Columns travel as arrays
and ``unnest`` zips them back into rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import asyncpg

from infra.db import datetime_to_ms, ms_to_datetime
from orchestrator.ports import SagaSummaryRow, StoredEvent


class BulkStatements:
    """Mixed into ``PostgresUnitOfWork``: needs its open connection and schema name."""

    conn: asyncpg.Connection
    _s: str

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
            loaded.setdefault(row["saga_id"], []).append(
                StoredEvent(row["saga_id"], row["seq"], row["event_type"], row["body"],
                            datetime_to_ms(row["recorded_at"]))
            )
        return loaded

    async def delete_timers(self, keys: Sequence[tuple[str, str]]) -> None:
        """One delete for every (saga_id, timer_id)."""
        if not keys:
            return
        await self.conn.execute(
            f"DELETE FROM {self._s}.timers t USING unnest($1::text[], $2::text[]) AS d(saga_id, timer_id)"
            " WHERE t.saga_id = d.saga_id AND t.timer_id = d.timer_id",
            [saga_id for saga_id, _ in keys],
            [timer_id for _, timer_id in keys],
        )

    async def upsert_summaries(self, summaries: Sequence[SagaSummaryRow]) -> None:
        """One upsert for every saga; an update never lowers ``last_seq``."""
        # ON CONFLICT DO UPDATE refuses to touch one row twice in a statement: keep one row per saga, the
        # one a sequence of single upserts would have left (highest last_seq, the later of equals).
        latest: dict[str, SagaSummaryRow] = {}
        for summary in summaries:
            current = latest.get(summary.saga_id)
            if current is None or current.last_seq <= summary.last_seq:
                latest[summary.saga_id] = summary
        if not latest:
            return
        rows = list(latest.values())
        await self.conn.execute(
            f"INSERT INTO {self._s}.saga_summary AS s (saga_id, saga_type, tenant_id, status, started_at,"
            " updated_at, last_seq, failed_step, reason)"
            " SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[],"
            " $6::timestamptz[], $7::bigint[], $8::text[], $9::text[])"
            " ON CONFLICT (saga_id) DO UPDATE SET saga_type = excluded.saga_type,"
            " tenant_id = excluded.tenant_id, status = excluded.status, started_at = excluded.started_at,"
            " updated_at = excluded.updated_at, last_seq = excluded.last_seq,"
            " failed_step = excluded.failed_step, reason = excluded.reason"
            " WHERE s.last_seq <= excluded.last_seq",
            [r.saga_id for r in rows],
            [r.saga_type for r in rows],
            [r.tenant_id for r in rows],
            [r.status for r in rows],
            [ms_to_datetime(r.started_at_ms) for r in rows],
            [ms_to_datetime(r.updated_at_ms) for r in rows],
            [r.last_seq for r in rows],
            [r.failed_step for r in rows],
            [r.reason for r in rows],
        )
