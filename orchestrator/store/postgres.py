"""Postgres adapter of the storage ports; its schema (``saga``) is made by the migrations beside it.

A unit of work handles a batch of messages of many sagas in one transaction, in a fixed number of round trips
whatever its size: the columns travel as arrays and ``unnest`` zips them back into rows, and a
data-modifying CTE writes every table in one statement.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg

from ...infra.chores import DELETE_BATCH, delete_older_sql, delete_older_than
from ...infra.db import apply_migrations, check_identifier, datetime_to_ms, ms_to_datetime
from ...infra.misconfigured import Misconfigured
from ...outbox.table import insert_params, insert_sql
from ...schemas.partitioning import partition_for
from ..domain.definition import SagaDefinition
from ..domain.deploys import RunningShape
from ..domain.model import UNSETTLED_STATUSES
from ..ports import ConcurrencyConflict, InboxKey, SagaSummaryRow, StoredEvent, TimerRow, Writes

MIGRATIONS = Path(__file__).parent / "migrations"
MIGRATIONS_TABLE = "saga.schema_migrations"
LEGACY_MIGRATIONS_TABLE = "public.schema_migrations"
"""Where releases up to 0.1.0 recorded the migrations applied (a name other migration tools use too)."""


async def migrate(conn_or_pool: asyncpg.Connection | asyncpg.Pool) -> list[str]:
    """Create or bring up to date the orchestrator's tables; the migrations applied now. Every service that
    uses them runs this at start (concurrent starters queue up)."""
    return await apply_migrations(conn_or_pool, MIGRATIONS, MIGRATIONS_TABLE, adopt_from=LEGACY_MIGRATIONS_TABLE)


class DeploymentMismatch(Misconfigured):
    """The database belongs to a deployment with another topic prefix."""


def _owned(param: str) -> str:
    """A timer whose saga is on one of the partitions ``param`` holds (any, when it is NULL); NULL-partition
    timers (armed before migration 004, or by a store without the partition count) fire on any instance."""
    return f"({param}::int[] IS NULL OR partition IS NULL OR partition = ANY({param}::int[]))"


SUMMARY_COLUMNS = ("saga_id, saga_type, tenant_id, status, started_at, updated_at, last_seq, failed_step, reason,"
                    " current_step, step_failures, last_error, definition_version, definition_fingerprint")


class PostgresUnitOfWork:
    """``UnitOfWork`` and ``PurgeUnitOfWork`` on one connection inside an open transaction (see
    ``PostgresStore.begin``)."""

    def __init__(self, conn: asyncpg.Connection, schema: str, topic_partitions: int | None = None) -> None:
        self.conn = conn
        self._s = schema
        self._partitions = tuple(range(topic_partitions)) if topic_partitions else None

    def _partition_of(self, saga_id: str) -> int | None:
        """The partition a saga's records land on (its key, the producers' partitioner), or None."""
        return None if self._partitions is None else partition_for(saga_id.encode(), self._partitions)

    async def claim_and_load(self, claims: Sequence[InboxKey], after_seq: Mapping[str, int]
                             ) -> tuple[set[InboxKey], dict[str, list[StoredEvent]]]:
        """The inbox insert and the events read in one statement (a data-modifying CTE)."""
        unique = sorted(set(claims))  # sorted: concurrent claimers lock the inbox keys in one order
        rows = await self.conn.fetch(
            f"WITH claimed AS (INSERT INTO {self._s}.inbox (consumer, message_id)"
            "   SELECT * FROM unnest($1::text[], $2::text[]) ON CONFLICT DO NOTHING RETURNING consumer, message_id)"
            " SELECT consumer, message_id, NULL AS saga_id, NULL::bigint AS seq, NULL AS event_type,"
            "        NULL::bytea AS body, NULL::timestamptz AS recorded_at FROM claimed"
            " UNION ALL"
            " SELECT NULL, NULL, e.saga_id, e.seq, e.event_type, e.body, e.recorded_at"
            " FROM unnest($3::text[], $4::bigint[]) AS w(saga_id, after_seq)"
            f" JOIN {self._s}.events e ON e.saga_id = w.saga_id AND e.seq > w.after_seq",
            [namespace for namespace, _ in unique],
            [message_id for _, message_id in unique],
            list(after_seq),
            list(after_seq.values()),
        )
        claimed: set[InboxKey] = set()
        loaded: dict[str, list[StoredEvent]] = {}
        for row in rows:
            if row["message_id"] is not None:
                claimed.add((row["consumer"], row["message_id"]))
            else:
                loaded.setdefault(row["saga_id"], []).append(_event(row))
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
                queued AS ({insert_sql(f"{self._s}.outbox", 8, shard_parameter=30)}),
                armed AS (INSERT INTO {self._s}.timers (saga_id, timer_id, kind, step, attempt, due_at, partition)
                          SELECT * FROM unnest($14::text[], $15::text[], $16::text[], $17::text[], $18::int[],
                                               $19::timestamptz[], $29::int[])
                          ON CONFLICT (saga_id, timer_id) DO UPDATE SET kind = excluded.kind,
                              step = excluded.step, attempt = excluded.attempt, due_at = excluded.due_at,
                              partition = excluded.partition),
                summarized AS (INSERT INTO {self._s}.saga_summary AS s ({SUMMARY_COLUMNS})
                               SELECT * FROM unnest($20::text[], $21::text[], $22::text[], $23::text[],
                                                    $24::timestamptz[], $25::timestamptz[], $26::bigint[],
                                                    $27::text[], $28::text[], $31::text[], $32::int[],
                                                    $33::text[], $37::int[], $38::text[])
                               ON CONFLICT (saga_id) DO UPDATE SET saga_type = excluded.saga_type,
                                   tenant_id = excluded.tenant_id, status = excluded.status,
                                   started_at = excluded.started_at, updated_at = excluded.updated_at,
                                   last_seq = excluded.last_seq, failed_step = excluded.failed_step,
                                   reason = excluded.reason, current_step = excluded.current_step,
                                   step_failures = excluded.step_failures, last_error = excluded.last_error,
                                   definition_version = excluded.definition_version,
                                   definition_fingerprint = excluded.definition_fingerprint
                               WHERE s.last_seq <= excluded.last_seq),
                indexed AS (INSERT INTO {self._s}.search_keys (field, value, saga_id)
                            SELECT * FROM unnest($34::text[], $35::text[], $36::text[]) ON CONFLICT DO NOTHING)
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
                [self._partition_of(t.saga_id) for t in timers],
                [self._partition_of(m.key) or 0 for m in writes.outbox],  # keyed by saga id: its partition
                *_summary_trouble_columns(summaries),
                [k.field for k in writes.search_keys],
                [k.value for k in writes.search_keys],
                [k.saga_id for k in writes.search_keys],
                [s.definition_version for s in summaries],
                [s.definition_fingerprint for s in summaries],
            )
        except asyncpg.UniqueViolationError as exc:
            sagas = sorted({e.saga_id for e in writes.events})
            raise ConcurrencyConflict(f"events already recorded for saga(s) {sagas}: {exc.detail}") from exc
        if writes.bulk_refusals:  # rare (a bulk job's lever refused by a saga): a statement of its own
            await self.conn.execute(
                f"UPDATE {self._s}.bulk_jobs AS j SET refused = j.refused + r.n, updated_at = now()"
                " FROM unnest($1::bigint[], $2::int[]) AS r(id, n) WHERE j.id = r.id",
                list(writes.bulk_refusals), list(writes.bulk_refusals.values()))
        if writes.marks:  # rare (a quarantine of a history that does not fold): a statement of its own
            await self.conn.execute(
                f"UPDATE {self._s}.saga_summary AS s SET status = m.status, reason = m.reason, last_seq = m.last_seq,"
                " updated_at = m.updated_at"
                " FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::timestamptz[])"
                "      AS m(saga_id, status, reason, last_seq, updated_at)"
                " WHERE s.saga_id = m.saga_id AND s.last_seq <= m.last_seq",
                [m.saga_id for m in writes.marks], [m.status for m in writes.marks], [m.reason for m in writes.marks],
                [m.last_seq for m in writes.marks], [ms_to_datetime(m.updated_at_ms) for m in writes.marks])

    async def claim_timers(self, due: Sequence[TimerRow]) -> list[TimerRow]:
        """Delete-and-return those of ``due`` still stored as given, skipping rows locked by other open
        transactions."""
        if not due:
            return []
        # ctid = ANY(ARRAY(...)): the claiming subquery runs once, then a TID scan deletes exactly its rows.
        # The IN (subquery) form let the planner, misled by statistics taken while the queue was empty, loop
        # over the whole table and re-run the subquery for each row.
        rows = await self.conn.fetch(
            f"DELETE FROM {self._s}.timers WHERE ctid = ANY(ARRAY("
            f"  SELECT t.ctid FROM {self._s}.timers t"
            "   JOIN unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::timestamptz[])"
            "     AS d(saga_id, timer_id, kind, step, attempt, due_at)"
            "     ON t.saga_id = d.saga_id AND t.timer_id = d.timer_id AND t.kind = d.kind AND t.step = d.step"
            "    AND t.attempt = d.attempt AND t.due_at = d.due_at"
            "   FOR UPDATE OF t SKIP LOCKED))"
            " RETURNING saga_id, timer_id",
            [t.saga_id for t in due], [t.timer_id for t in due], [t.kind for t in due], [t.step for t in due],
            [t.attempt for t in due], [ms_to_datetime(t.due_at_ms) for t in due],
        )
        claimed = {(row["saga_id"], row["timer_id"]) for row in rows}
        return [t for t in due if (t.saga_id, t.timer_id) in claimed]

    async def claim_ended(self, statuses: Sequence[str], ended_before_ms: int, limit: int,
                          skip: Sequence[str] = ()) -> list[str]:
        """Lock the read-model rows of up to ``limit`` sagas in ``statuses`` last updated before the cutoff,
        oldest first, passing over rows other transactions hold and the ids in ``skip``; their saga ids."""
        rows = await self.conn.fetch(
            f"SELECT saga_id FROM {self._s}.saga_summary WHERE status = ANY($1::text[]) AND updated_at < $2"
            " AND NOT saga_id = ANY($4::text[]) ORDER BY updated_at, saga_id LIMIT $3 FOR UPDATE SKIP LOCKED",
            list(statuses), ms_to_datetime(ended_before_ms), limit, list(skip))
        return [row["saga_id"] for row in rows]

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
            loaded.setdefault(row["saga_id"], []).append(_event(row))
        return loaded

    async def delete_events_through(self, through: Mapping[str, int]) -> None:
        """Delete each saga's events up to the mapped seq (retention), and the saga's timers."""
        if not through:
            return
        ids = list(through)
        await self.conn.execute(
            f"DELETE FROM {self._s}.events AS e USING unnest($1::text[], $2::bigint[]) AS p(saga_id, seq)"
            " WHERE e.saga_id = p.saga_id AND e.seq <= p.seq", ids, [through[saga_id] for saga_id in ids])
        await self.conn.execute(f"DELETE FROM {self._s}.timers WHERE saga_id = ANY($1::text[])", ids)


class PostgresStore:
    """``UnitOfWorkFactory``, ``PurgeStore`` and ``EventReader`` over an asyncpg pool, and the deployment
    claim and inbox pruning of the orchestrator's schema."""

    def __init__(self, pool: asyncpg.Pool, schema: str = "saga", topic_partitions: int | None = None) -> None:
        """``topic_partitions``: the partition count of the topics the orchestrator reads; timers armed here
        then record their saga's partition, and only the instance owning it fires them (None: any instance)."""
        self._pool = pool
        self._topic_partitions = topic_partitions
        self._s = check_identifier(schema)
        self._prune_inbox_sql = delete_older_sql(f"{schema}.inbox", ("consumer", "message_id"), "received_at")

    @property
    def pool(self) -> asyncpg.Pool:
        """The connection pool the store uses."""
        return self._pool

    async def due_timers(self, now_ms: int, limit: int, partitions: Collection[int] | None = None) -> list[TimerRow]:
        """Due timers (of sagas on ``partitions``, when given), earliest first."""
        rows = await self._pool.fetch(
            f"SELECT saga_id, timer_id, kind, step, attempt, due_at FROM {self._s}.timers"
            f" WHERE due_at <= $1 AND {_owned('$3')} ORDER BY due_at, saga_id, timer_id LIMIT $2",
            ms_to_datetime(now_ms), limit, None if partitions is None else list(partitions))
        return [TimerRow(saga_id=row["saga_id"], timer_id=row["timer_id"], kind=row["kind"], step=row["step"],
                         attempt=row["attempt"], due_at_ms=datetime_to_ms(row["due_at"])) for row in rows]

    async def next_due_ms(self, partitions: Collection[int] | None = None) -> int | None:
        """When the earliest timer (of sagas on ``partitions``, when given) is due (epoch ms; an index lookup),
        None when there is none."""
        due = await self._pool.fetchval(f"SELECT min(due_at) FROM {self._s}.timers WHERE {_owned('$1')}",
                                        None if partitions is None else list(partitions))
        return None if due is None else datetime_to_ms(due)

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[PostgresUnitOfWork]:
        """One pooled connection, one transaction: commit on normal exit, rollback on exception. (A deadlock or
        a serialization failure is a conflict to ``infra.failures`` as a duplicate seq is.)"""
        async with self._pool.acquire() as conn, conn.transaction():
            yield PostgresUnitOfWork(conn, self._s, self._topic_partitions)

    async def running_shapes(self) -> list[RunningShape]:
        """``ShapeStore.running_shapes``: one aggregate over the read model's (type, version, shape, status)
        index."""
        rows = await self._pool.fetch(
            f"SELECT saga_type, definition_version, definition_fingerprint, count(*) AS n"
            f" FROM {self._s}.saga_summary WHERE status = ANY($1::text[])"
            " GROUP BY 1, 2, 3 ORDER BY 1, 2 NULLS FIRST, 3 NULLS FIRST", sorted(UNSETTLED_STATUSES))
        return [RunningShape(row["saga_type"], row["definition_version"], row["definition_fingerprint"], row["n"])
                for row in rows]

    async def recorded_shapes(self, fingerprints: Collection[str]) -> dict[str, Mapping[str, Any]]:
        """``ShapeStore.recorded_shapes``."""
        rows = await self._pool.fetch(f"SELECT fingerprint, shape FROM {self._s}.definition_shapes"
                                      " WHERE fingerprint = ANY($1::text[])", list(fingerprints))
        return {row["fingerprint"]: json.loads(row["shape"]) for row in rows}

    async def record_shapes(self, definitions: Sequence[SagaDefinition]) -> None:
        """``ShapeStore.record_shapes``."""
        await self._pool.execute(
            f"INSERT INTO {self._s}.definition_shapes (fingerprint, saga_type, version, shape)"
            " SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::jsonb[]) ON CONFLICT DO NOTHING",
            [d.fingerprint for d in definitions], [d.saga_type for d in definitions],
            [d.version for d in definitions], [json.dumps(d.shape(), sort_keys=True) for d in definitions])

    async def running_histories(self) -> dict[str, list[bytes]]:
        """``ShapeStore.running_histories``: the read model's status index picks the sagas, so an ended saga's
        events are never read."""
        histories: dict[str, list[bytes]] = {}
        async with self._pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            rows = await conn.fetch(
                f"SELECT e.saga_id, e.body FROM {self._s}.events e WHERE e.saga_id IN"
                f" (SELECT saga_id FROM {self._s}.saga_summary WHERE status = ANY($1::text[]))"
                " ORDER BY e.saga_id, e.seq", sorted(UNSETTLED_STATUSES))
        for row in rows:
            histories.setdefault(row["saga_id"], []).append(bytes(row["body"]))
        return histories

    async def claim_deployment(self, topic_prefix: str) -> None:
        """Record this deployment's topic prefix in the database, or raise DeploymentMismatch when another
        prefix claimed it first (one database serves one deployment: its timers would command the other's
        topics)."""
        await self._pool.execute(f"INSERT INTO {self._s}.deployment (topic_prefix) VALUES ($1) ON CONFLICT DO NOTHING",
                                 topic_prefix)
        owner = await self._pool.fetchval(f"SELECT topic_prefix FROM {self._s}.deployment")
        if owner != topic_prefix:
            raise DeploymentMismatch(
                f"this database belongs to the deployment with SAGA_TOPIC_PREFIX={owner!r}, not {topic_prefix!r}; "
                "use that prefix or another DATABASE_URL"
            )

    async def prune_inbox(self, retention_s: float, batch: int = DELETE_BATCH) -> int:
        """Delete the inbox rows received more than ``retention_s`` ago, a batch per transaction; how many."""
        return await delete_older_than(self._pool, self._prune_inbox_sql, retention_s, batch)

    async def get_summary(self, saga_id: str) -> SagaSummaryRow | None:
        """The summary of one saga, or None."""
        row = await self._pool.fetchrow(
            f"SELECT {SUMMARY_COLUMNS} FROM {self._s}.saga_summary WHERE saga_id = $1", saga_id
        )
        return None if row is None else summary_row(row)

    async def count_by_status(self, timeout_s: float | None = None) -> dict[str, int]:
        """Number of sagas per status (``timeout_s``: give up after that long)."""
        rows = await self._pool.fetch(
            f"SELECT status, count(*) AS n FROM {self._s}.saga_summary GROUP BY status ORDER BY status",
            timeout=timeout_s,
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

    async def outbox_backlog(self) -> int:
        """Rows waiting in the orchestrator's outbox."""
        return int(await self._pool.fetchval(f"SELECT count(*) FROM {self._s}.outbox"))

    async def count_ended(self, statuses: Sequence[str], ended_before_ms: int) -> int:
        """Sagas in ``statuses`` whose read-model row was last updated before the cutoff."""
        return int(await self._pool.fetchval(
            f"SELECT count(*) FROM {self._s}.saga_summary WHERE status = ANY($1::text[]) AND updated_at < $2",
            list(statuses), ms_to_datetime(ended_before_ms)))

    async def summaries_of(self, saga_ids: Sequence[str]) -> dict[str, SagaSummaryRow]:
        """The read model's rows of these sagas (those that have one)."""
        rows = await self._pool.fetch(f"SELECT * FROM {self._s}.saga_summary WHERE saga_id = ANY($1::text[])",
                                      list(saga_ids))
        return {row["saga_id"]: summary_row(row) for row in rows}

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


def _summary_trouble_columns(rows: Sequence[SagaSummaryRow]) -> list[list[Any]]:
    return [[r.current_step for r in rows], [r.step_failures for r in rows], [r.last_error for r in rows]]


def _event_columns(events: Sequence[StoredEvent]) -> list[list[Any]]:
    return [
        [e.saga_id for e in events],
        [e.seq for e in events],
        [e.event_type for e in events],
        [e.body for e in events],
        [None if e.recorded_at_ms is None else ms_to_datetime(e.recorded_at_ms) for e in events],
    ]


def _event(row: asyncpg.Record) -> StoredEvent:
    return StoredEvent(row["saga_id"], row["seq"], row["event_type"], row["body"], datetime_to_ms(row["recorded_at"]))


def summary_row(row: asyncpg.Record) -> SagaSummaryRow:
    """A saga_summary row (its SUMMARY_COLUMNS) as the port's dataclass."""
    return SagaSummaryRow(
        saga_id=row["saga_id"], saga_type=row["saga_type"], tenant_id=row["tenant_id"], status=row["status"],
        started_at_ms=datetime_to_ms(row["started_at"]), updated_at_ms=datetime_to_ms(row["updated_at"]),
        last_seq=row["last_seq"], failed_step=row["failed_step"], reason=row["reason"],
        current_step=row["current_step"], step_failures=row["step_failures"], last_error=row["last_error"],
        definition_version=row["definition_version"], definition_fingerprint=row["definition_fingerprint"],
    )
