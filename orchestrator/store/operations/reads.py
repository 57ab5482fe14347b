"""The operations wing's ``ReadsStore``: over the orchestrator's schema (``PostgresReads``), and over a
``MemoryStore`` (``MemoryReads``, for the test kit).

Every Postgres read runs under ``READ_TIMEOUT_S``, so a slow database slows a page and never piles up connections
behind it; none takes a lock a service waits for.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

import asyncpg

from ....infra.db import check_identifier, datetime_to_ms, ms_to_datetime
from ....operations.ports import (
    AGE_BUCKETS,
    EndedCounts,
    HeatCell,
    OutboxView,
    SagaFilter,
    SagaSearch,
    ShapeStatusCount,
    StoredSaga,
    StuckQuery,
    TimerView,
    WedgedGroup,
    age_bucket,
)
from ....participants.kit.ledger import AWAITING_COLUMNS, AwaitingCommand, awaiting
from ....participants.kit.participant import Participant
from ...ports import SagaSummaryRow, StoredEvent
from ..memory import MemoryStore
from ..postgres import SUMMARY_COLUMNS, PostgresStore, summary_row

READ_TIMEOUT_S = 5.0
DAY_MS = 86_400_000
HOUR_MS = 3_600_000

_AGE = "extract(epoch FROM now() - started_at)"
_BUCKET_SQL = "CASE " + " ".join(
    f"WHEN {_AGE} < {bound} THEN {index}" for index, (_, bound) in enumerate(AGE_BUCKETS) if bound is not None
) + f" ELSE {len(AGE_BUCKETS) - 1} END"
"""A saga's age bucket: its index in ``AGE_BUCKETS``."""
_STAMP = "date_trunc('milliseconds', updated_at AT TIME ZONE 'UTC')"
"""A row's updated_at to the millisecond, as ``saga_summary_inbox_idx`` holds it."""


VERSION_COUNTS_SQL = (
    "SELECT saga_type, definition_version, definition_fingerprint, status, count(*) AS n FROM {schema}.saga_summary"
    " GROUP BY saga_type, definition_version, definition_fingerprint, status")
"""The sagas per type, version, shape and state (``{schema}``: the orchestrator's). Grouped in the order of
``saga_summary_version_idx``, so an index-only scan feeds the aggregate, without a sort and without reading the
table's wide rows (``bench.version_counts`` times it and shows its plan)."""


CATALOG_FRESH_S = 30.0
"""How long the list of parked-row and deferred-command tables read from the catalogue is used."""
SEARCH_CANDIDATES = 1000
"""How many matching keys a search reads at most, in value order (so every exact match, then the values closest
to the text): a text as short as one letter may start most keys, and reading them all outlasts a read's timeout."""

_STARTED = ("($4::text IS NULL OR tenant_id = $4) AND ($5::timestamptz IS NULL OR started_at >= $5)"
            " AND ($6::timestamptz IS NULL OR started_at < $6)")
SEARCH_SQL = f"""
    WITH matched AS (
        SELECT k.saga_id, lower(k.value) = lower($2) AS exact
        FROM {{schema}}.search_keys AS k JOIN {{schema}}.saga_summary USING (saga_id)
        WHERE lower(k.value) COLLATE "C" >= lower($2) COLLATE "C"
          AND lower(k.value) COLLATE "C" < (lower($2) || chr(1114111)) COLLATE "C"
          AND ($3 = '' OR k.field = $3) AND {_STARTED}
        ORDER BY lower(k.value) COLLATE "C" LIMIT {SEARCH_CANDIDATES}),
    found AS (
        SELECT saga_id, bool_or(exact) AS exact FROM (SELECT * FROM matched UNION ALL SELECT $1, true) AS m
        GROUP BY saga_id)
    SELECT {SUMMARY_COLUMNS} FROM {{schema}}.saga_summary JOIN found USING (saga_id)
    WHERE {_STARTED} ORDER BY found.exact DESC, started_at DESC, saga_id LIMIT $7"""
"""The sagas a ``SagaSearch`` finds (``{schema}``: the orchestrator's; $1 the saga id, $2 the value, $3 the field or
'', $4 the tenant, $5 and $6 the start window, $7 the limit). A key's value starts with $2 whatever the case when
its lowered form lies in [lower($2), lower($2) || U+10FFFF) in byte order: one range of ``search_keys_folded_idx``
(014_search.sql), read in order and stopped after ``SEARCH_CANDIDATES`` keys of sagas the filters take, under a
generic plan too (a ``LIKE`` with a parameter would not use the index there). Case folds as the database's
``lower()`` does (every letter under a UTF-8 ctype, ASCII letters under C)."""


def _moment(epoch_ms: int | None) -> Any:
    return None if epoch_ms is None else ms_to_datetime(epoch_ms)


def _cell(row: asyncpg.Record) -> HeatCell:
    return HeatCell(row["saga_type"], row["status"], AGE_BUCKETS[row["bucket"]][0], row["n"])


def _stored(row: asyncpg.Record) -> StoredEvent:
    return StoredEvent(row["saga_id"], row["seq"], row["event_type"], bytes(row["body"]),
                       datetime_to_ms(row["recorded_at"]))


def filter_sql(selection: SagaFilter, as_of: str = "now()", first: int = 1, started_by: bool = False
               ) -> tuple[str, list[Any]]:
    """The condition on a ``saga_summary`` row that ``selection`` puts as seen at ``as_of`` (a trusted SQL
    expression), its parameters numbered from ``$first``; with ``started_by``, only sagas started by then. No
    value enters the SQL text."""
    conditions = [f"started_at <= {as_of}"] if started_by else []
    params: list[Any] = []

    def param(value: Any, cast: str = "") -> str:
        params.append(value)
        return f"${first + len(params) - 1}{cast}"

    if selection.saga_type is not None:
        conditions.append(f"saga_type = {param(selection.saga_type)}")
    if selection.statuses:
        conditions.append(f"status = ANY({param(list(selection.statuses), '::text[]')})")
    if selection.older_than_s is not None:
        conditions.append(f"updated_at < {as_of} - make_interval(secs => {param(selection.older_than_s)})")
    if selection.tenant is not None:
        conditions.append(f"tenant_id = {param(selection.tenant)}")
    if selection.error is not None:
        conditions.append(f"last_error = {param(selection.error)}")
    if selection.definition_version is not None:
        conditions.append(f"definition_version = {param(selection.definition_version)}")
    if selection.steps is not None:
        types, steps = param([t for t, _ in selection.steps], "::text[]"), param([s for _, s in selection.steps],
                                                                                  "::text[]")
        conditions.append(f"(saga_type, current_step) IN (SELECT * FROM unnest({types}, {steps}))")
    return " AND ".join(conditions) or "TRUE", params


class PostgresReads:
    """``ReadsStore`` over the orchestrator's tables in ``schema``, each read given up after ``timeout_s``."""

    def __init__(self, pool: asyncpg.Pool, schema: str = "saga", timeout_s: float = READ_TIMEOUT_S) -> None:
        self._pool = pool
        self._s = check_identifier(schema)
        self._timeout_s = timeout_s
        self._catalog: frozenset[str] = frozenset()
        self._catalog_at = -CATALOG_FRESH_S

    async def _existing(self) -> frozenset[str]:
        """The parked-row and deferred-command tables there are (``schema.table``), read from the catalogue at most
        every ``CATALOG_FRESH_S``: a participant's tables appear when it first starts, and reading the catalogue
        on every inbox page cost more than the tables' rows."""
        if time.monotonic() - self._catalog_at >= CATALOG_FRESH_S:
            rows = await self._pool.fetch(
                "SELECT table_schema || '.' || table_name AS name FROM information_schema.tables"
                " WHERE table_name IN ('outbox_parked', 'awaiting_commands')", timeout=self._timeout_s)
            self._catalog, self._catalog_at = frozenset(r["name"] for r in rows), time.monotonic()
        return self._catalog

    async def unfinished(self, statuses: Sequence[str], oldest: int) -> tuple[list[HeatCell], list[SagaSummaryRow]]:
        async with self._pool.acquire() as conn:
            cells = await conn.fetch(
                f"SELECT saga_type, status, {_BUCKET_SQL} AS bucket, count(*) AS n FROM {self._s}.saga_summary"
                " WHERE status = ANY($1::text[]) GROUP BY 1, 2, 3", list(statuses), timeout=self._timeout_s)
            rows = await conn.fetch(
                f"SELECT {SUMMARY_COLUMNS} FROM {self._s}.saga_summary WHERE status = ANY($1::text[])"
                " ORDER BY started_at LIMIT $2", list(statuses), oldest, timeout=self._timeout_s)
        return [_cell(r) for r in cells], [summary_row(r) for r in rows]

    async def ended_last_day(self, statuses: Sequence[str], undone: Collection[str]
                             ) -> tuple[list[HeatCell], EndedCounts]:
        # Through the (status, updated_at) index: the page costs the same after a month of ended sagas as on the
        # first day. One scan gives both the cells and the counts of the last hour and day.
        rows = await self._pool.fetch(
            f"SELECT saga_type, status, {_BUCKET_SQL} AS bucket, count(*) AS n,"
            "        count(*) FILTER (WHERE updated_at > now() - interval '1 hour') AS in_hour"
            f" FROM {self._s}.saga_summary WHERE status = ANY($1::text[]) AND updated_at > now() - interval '1 day'"
            " GROUP BY 1, 2, 3", list(statuses), timeout=self._timeout_s)
        done = [r for r in rows if r["status"] in undone]
        counts = EndedCounts(hour=sum(r["in_hour"] for r in rows), day=sum(r["n"] for r in rows),
                             undone_hour=sum(r["in_hour"] for r in done), undone_day=sum(r["n"] for r in done))
        return [_cell(r) for r in rows], counts

    async def list_sagas(self, selection: SagaFilter | None, limit: int,
                         after: tuple[int, str] | None = None) -> list[SagaSummaryRow]:
        condition, params = filter_sql(selection or SagaFilter())
        if after is not None:  # a row comparison, so saga_summary_started_idx serves the order and the place
            condition = f"({condition}) AND (started_at, saga_id) > (${len(params) + 1}, ${len(params) + 2})"
            params = [*params, ms_to_datetime(after[0]), after[1]]
        rows = await self._pool.fetch(
            f"SELECT {SUMMARY_COLUMNS} FROM {self._s}.saga_summary WHERE {condition}"
            f" ORDER BY started_at, saga_id LIMIT ${len(params) + 1}", *params, limit, timeout=self._timeout_s)
        return [summary_row(r) for r in rows]

    async def count_by_status(self) -> dict[str, int]:
        return await PostgresStore(self._pool, self._s).count_by_status(self._timeout_s)

    async def version_counts(self) -> list[ShapeStatusCount]:
        rows = await self._pool.fetch(VERSION_COUNTS_SQL.format(schema=self._s), timeout=self._timeout_s)
        return [ShapeStatusCount(r["saga_type"], r["definition_version"], r["definition_fingerprint"], r["status"],
                                 r["n"]) for r in rows]

    async def search(self, search: SagaSearch, limit: int) -> list[SagaSummaryRow]:
        async with self._pool.acquire() as conn, conn.transaction(readonly=True):
            # Planned for the values at hand, every time: a generic plan (what a prepared statement falls back to
            # after five runs) knows no prefix's width nor which filters are given, and joins by hashing every
            # saga, which for a one-letter text over 300 000 sagas took 1.3 s against 40 ms.
            await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan", timeout=self._timeout_s)
            rows = await conn.fetch(SEARCH_SQL.format(schema=self._s), search.saga_id, search.value, search.field,
                                    search.tenant, _moment(search.started_after_ms),
                                    _moment(search.started_before_ms), limit, timeout=self._timeout_s)
        return [summary_row(r) for r in rows]

    async def search_keys(self, saga_id: str) -> dict[str, str]:
        rows = await self._pool.fetch(f"SELECT field, value FROM {self._s}.search_keys WHERE saga_id = $1"
                                      " ORDER BY field", saga_id, timeout=self._timeout_s)
        return {r["field"]: r["value"] for r in rows}

    async def wedged(self, min_failures: int, per_group: int, ended: Collection[str]) -> list[WedgedGroup]:
        rows = await self._pool.fetch(
            "SELECT saga_type, current_step, last_error, count(*) AS n, max(step_failures) AS worst,"
            "       (array_agg(saga_id ORDER BY step_failures DESC, saga_id))[1:$3] AS ids"
            f" FROM {self._s}.saga_summary WHERE step_failures >= $1 AND status <> ALL($2::text[])"
            " GROUP BY 1, 2, 3 ORDER BY n DESC, worst DESC", min_failures, list(ended), per_group,
            timeout=self._timeout_s)
        return [WedgedGroup(r["saga_type"], r["current_step"], r["last_error"], r["n"], r["worst"], list(r["ids"]))
                for r in rows]

    async def stored_saga(self, saga_id: str) -> StoredSaga | None:
        async with self._pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            stored = await conn.fetch(f"SELECT saga_id, seq, event_type, body, recorded_at FROM {self._s}.events"
                                      " WHERE saga_id = $1 ORDER BY seq", saga_id, timeout=self._timeout_s)
            if not stored:
                return None
            timers = await conn.fetch(f"SELECT kind, step, attempt, due_at FROM {self._s}.timers WHERE saga_id = $1"
                                      " ORDER BY due_at", saga_id, timeout=self._timeout_s)
            outbox = await conn.fetch(
                f"SELECT '{self._s}.outbox' AS t, id, topic, created_at, NULL AS reason FROM {self._s}.outbox"
                " WHERE message_key = $1 UNION ALL"
                f" SELECT '{self._s}.outbox_parked', id, topic, created_at, reason FROM {self._s}.outbox_parked"
                " WHERE message_key = $1 ORDER BY 2", saga_id, timeout=self._timeout_s)
        return StoredSaga(
            events=[_stored(r) for r in stored],
            timers=[TimerView(r["kind"], r["step"], r["attempt"], datetime_to_ms(r["due_at"])) for r in timers],
            outbox=[OutboxView(r["t"], r["id"], r["topic"], datetime_to_ms(r["created_at"]), r["reason"])
                    for r in outbox])

    async def events_after(self, saga_id: str, after_seq: int) -> list[StoredEvent]:
        rows = await self._pool.fetch(
            f"SELECT saga_id, seq, event_type, body, recorded_at FROM {self._s}.events WHERE saga_id = $1"
            " AND seq > $2 ORDER BY seq", saga_id, after_seq, timeout=self._timeout_s)
        return [_stored(r) for r in rows]

    async def events_before(self, saga_id: str, before_seq: int, limit: int) -> list[StoredEvent]:
        rows = await self._pool.fetch(
            f"SELECT saga_id, seq, event_type, body, recorded_at FROM {self._s}.events WHERE saga_id = $1"
            " AND seq < $2 ORDER BY seq DESC LIMIT $3", saga_id, before_seq, limit, timeout=self._timeout_s)
        return [_stored(r) for r in reversed(rows)]

    async def last_seq(self, saga_id: str) -> int | None:
        found: int | None = await self._pool.fetchval(
            f"SELECT max(seq) FROM {self._s}.events WHERE saga_id = $1", saga_id, timeout=self._timeout_s)
        return found

    async def message_progress(self, message_id: str) -> str:
        found: str = await self._pool.fetchval(
            f"SELECT CASE WHEN EXISTS (SELECT 1 FROM {self._s}.inbox WHERE message_id = $1) THEN 'taken'"
            f" WHEN EXISTS (SELECT 1 FROM {self._s}.outbox WHERE message_id = $1) THEN 'queued' ELSE 'sent' END",
            message_id, timeout=self._timeout_s)
        return found

    async def events_of(self, saga_ids: Collection[str], event_types: Collection[str]) -> list[StoredEvent]:
        if not saga_ids:
            return []
        rows = await self._pool.fetch(
            f"SELECT saga_id, seq, event_type, body, recorded_at FROM {self._s}.events"
            " WHERE saga_id = ANY($1::text[]) AND event_type = ANY($2::text[]) ORDER BY saga_id, seq",
            sorted(saga_ids), sorted(event_types), timeout=self._timeout_s)
        return [_stored(r) for r in rows]

    async def saga_statuses(self, saga_ids: Collection[str]) -> dict[str, str]:
        if not saga_ids:
            return {}
        rows = await self._pool.fetch(f"SELECT saga_id, status FROM {self._s}.saga_summary"
                                      " WHERE saga_id = ANY($1::text[])", sorted(saga_ids), timeout=self._timeout_s)
        return {r["saga_id"]: r["status"] for r in rows}

    async def parked(self) -> list[OutboxView]:
        tables = sorted(name for name in await self._existing() if name.endswith(".outbox_parked"))
        if not tables:
            return []
        # One read of every parked table (their names from the catalogue, each part quoted as an identifier).
        union = " UNION ALL ".join(
            f"SELECT {i} AS t, id, topic, created_at, reason, message_key FROM {_quoted(name)}"
            for i, name in enumerate(tables))
        rows = await self._pool.fetch(f"{union} ORDER BY t, id", timeout=self._timeout_s)
        return [OutboxView(tables[r["t"]], r["id"], r["topic"], datetime_to_ms(r["created_at"]),
                           f"{r['message_key']}: {r['reason']}") for r in rows]

    async def awaiting(self, participant: Participant, saga_id: str | None = None) -> list[AwaitingCommand]:
        try:
            return await awaiting(self._pool, participant, saga_id)
        except asyncpg.UndefinedTableError:
            return []  # the participant has not started here yet

    async def awaiting_of(self, participants: Sequence[Participant]) -> dict[str, list[AwaitingCommand]]:
        existing = await self._existing()
        there = [p for p in participants if p.awaiting_table in existing]
        found: dict[str, list[AwaitingCommand]] = {p.name: [] for p in participants}
        if not there:
            return found
        union = " UNION ALL ".join(f"SELECT {i} AS p, {AWAITING_COLUMNS} FROM {_quoted(p.awaiting_table)}"
                                   for i, p in enumerate(there))
        try:
            rows = await self._pool.fetch(f"{union} ORDER BY deferred_at_ms, idempotency_key", timeout=self._timeout_s)
        except asyncpg.UndefinedTableError:  # dropped since the catalogue was read: one at a time
            return {p.name: await self.awaiting(p) for p in participants}
        for r in rows:
            fields = dict(r)
            found[there[fields.pop("p")].name].append(AwaitingCommand(**fields))
        return found

    async def stuck_sagas(self, query: StuckQuery, limit: int) -> list[SagaSummaryRow]:
        # Ordered and paged on updated_at truncated to the millisecond (what a row carries), so a cursor made of a
        # row's updated_at_ms takes the rows after it exactly once; in UTC, the order of saga_summary_inbox_idx
        # (migration 013): a page reads its rows off the index and stops.
        after_ms, after_id = query.after or (None, None)
        rows = await self._pool.fetch(
            f"SELECT {SUMMARY_COLUMNS} FROM {self._s}.saga_summary"
            " WHERE (status = ANY($1::text[]) OR (status = ANY($2::text[]) AND step_failures >= $3))"
            "   AND ($4::text IS NULL OR saga_type = $4)"
            "   AND ($5::int8 IS NULL OR updated_at >= to_timestamp($5::float8 / 1000))"
            "   AND ($6::int8 IS NULL OR updated_at < to_timestamp($6::float8 / 1000))"
            "   AND ($7::int8 IS NULL OR updated_at >= to_timestamp($7::float8 / 1000)"
            f"        AND ({_STAMP}, saga_id) > (to_timestamp($7::float8 / 1000) AT TIME ZONE 'UTC', $8))"
            f" ORDER BY {_STAMP}, saga_id LIMIT $9",
            list(query.statuses), list(query.failing), query.min_failures, query.saga_type, query.since_ms,
            query.before_ms, after_ms, after_id, limit, timeout=self._timeout_s)
        return [summary_row(r) for r in rows]


def matches(row: SagaSummaryRow, selection: SagaFilter, now_ms: int, started_by: bool = False) -> bool:
    """Whether ``selection`` takes ``row`` at ``now_ms`` (what ``filter_sql`` says in SQL)."""
    return ((not started_by or row.started_at_ms <= now_ms)
            and (selection.saga_type is None or row.saga_type == selection.saga_type)
            and (not selection.statuses or row.status in selection.statuses)
            and (selection.older_than_s is None or row.updated_at_ms < now_ms - selection.older_than_s * 1000)
            and (selection.tenant is None or row.tenant_id == selection.tenant)
            and (selection.error is None or row.last_error == selection.error)
            and (selection.steps is None or (row.saga_type, row.current_step) in selection.steps)
            and (selection.definition_version is None or row.definition_version == selection.definition_version))


class MemoryReads:
    """``ReadsStore`` over a ``MemoryStore`` (its clock is the database's ``now()``); no participant tables, no
    outbox parks a row here."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    def _cells(self, rows: Sequence[SagaSummaryRow]) -> list[HeatCell]:
        now_ms = self._store.clock_ms()
        counts: dict[tuple[str, str, str], int] = {}
        for row in rows:
            key = (row.saga_type, row.status, age_bucket((now_ms - row.started_at_ms) / 1000))
            counts[key] = counts.get(key, 0) + 1
        return [HeatCell(*key, count) for key, count in sorted(counts.items())]

    async def unfinished(self, statuses: Sequence[str], oldest: int) -> tuple[list[HeatCell], list[SagaSummaryRow]]:
        rows = [s for s in self._store.summaries.values() if s.status in statuses]
        return self._cells(rows), sorted(rows, key=lambda s: s.started_at_ms)[:oldest]

    async def ended_last_day(self, statuses: Sequence[str], undone: Collection[str]
                             ) -> tuple[list[HeatCell], EndedCounts]:
        now_ms = self._store.clock_ms()
        day = [s for s in self._store.summaries.values() if s.status in statuses and s.updated_at_ms > now_ms - DAY_MS]
        hour = [s for s in day if s.updated_at_ms > now_ms - HOUR_MS]
        return self._cells(day), EndedCounts(hour=len(hour), day=len(day),
                                             undone_hour=sum(s.status in undone for s in hour),
                                             undone_day=sum(s.status in undone for s in day))

    async def list_sagas(self, selection: SagaFilter | None, limit: int,
                         after: tuple[int, str] | None = None) -> list[SagaSummaryRow]:
        now_ms = self._store.clock_ms()
        rows = [s for s in self._store.summaries.values() if matches(s, selection or SagaFilter(), now_ms)
                and (after is None or (s.started_at_ms, s.saga_id) > after)]
        return sorted(rows, key=lambda s: (s.started_at_ms, s.saga_id))[:limit]

    async def count_by_status(self) -> dict[str, int]:
        return await self._store.count_by_status()

    async def version_counts(self) -> list[ShapeStatusCount]:
        counts: dict[tuple[str, int | None, str | None, str], int] = {}
        for row in self._store.summaries.values():
            key = (row.saga_type, row.definition_version, row.definition_fingerprint, row.status)
            counts[key] = counts.get(key, 0) + 1
        return [ShapeStatusCount(*key, count) for key, count in counts.items()]

    async def search(self, search: SagaSearch, limit: int) -> list[SagaSummaryRow]:
        value = search.value.lower()
        exact: dict[str, bool] = {}
        for key in self._store.search_keys:
            if key.value.lower().startswith(value) and (not search.field or key.field == search.field):
                exact[key.saga_id] = exact.get(key.saga_id, False) or key.value.lower() == value
        if search.saga_id in self._store.summaries:
            exact[search.saga_id] = True
        rows = [s for s in (self._store.summaries[i] for i in exact if i in self._store.summaries)
                if (search.tenant is None or s.tenant_id == search.tenant)
                and (search.started_after_ms is None or s.started_at_ms >= search.started_after_ms)
                and (search.started_before_ms is None or s.started_at_ms < search.started_before_ms)]
        return sorted(rows, key=lambda s: (not exact[s.saga_id], -s.started_at_ms, s.saga_id))[:limit]

    async def search_keys(self, saga_id: str) -> dict[str, str]:
        return {k.field: k.value for k in sorted(self._store.search_keys, key=lambda k: k.field)
                if k.saga_id == saga_id}

    async def wedged(self, min_failures: int, per_group: int, ended: Collection[str]) -> list[WedgedGroup]:
        groups: dict[tuple[str, str, str | None], list[SagaSummaryRow]] = {}
        for row in self._store.summaries.values():
            if row.step_failures >= min_failures and row.status not in ended:
                groups.setdefault((row.saga_type, row.current_step or "", row.last_error), []).append(row)
        found = [WedgedGroup(saga_type, step, error, len(rows), max(r.step_failures for r in rows),
                             [r.saga_id for r in sorted(rows, key=lambda r: (-r.step_failures, r.saga_id))][:per_group])
                 for (saga_type, step, error), rows in groups.items()]
        return sorted(found, key=lambda g: (-g.count, -g.max_failures))

    async def stored_saga(self, saga_id: str) -> StoredSaga | None:
        events = await self.events_after(saga_id, 0)
        if not events:
            return None
        timers = sorted((t for t in self._store.timers.values() if t.saga_id == saga_id), key=lambda t: t.due_at_ms)
        outbox = [OutboxView("saga.outbox", row_id, message.topic, self._store.clock_ms())
                  for row_id, message in self._store.outbox if message.key == saga_id]
        return StoredSaga(events, [TimerView(t.kind, t.step, t.attempt, t.due_at_ms) for t in timers], outbox)

    async def events_after(self, saga_id: str, after_seq: int) -> list[StoredEvent]:
        return [e for e in self._store.events.get(saga_id, []) if e.seq > after_seq]

    async def events_before(self, saga_id: str, before_seq: int, limit: int) -> list[StoredEvent]:
        return [e for e in self._store.events.get(saga_id, []) if e.seq < before_seq][-limit:] if limit > 0 else []

    async def last_seq(self, saga_id: str) -> int | None:
        events = self._store.events.get(saga_id)
        return events[-1].seq if events else None

    async def message_progress(self, message_id: str) -> str:
        if any(taken == message_id for _, taken in self._store.inbox):
            return "taken"
        return "queued" if any(m.message_id == message_id for _, m in self._store.outbox) else "sent"

    async def events_of(self, saga_ids: Collection[str], event_types: Collection[str]) -> list[StoredEvent]:
        return [e for saga_id in sorted(saga_ids) for e in self._store.events.get(saga_id, [])
                if e.event_type in event_types]

    async def saga_statuses(self, saga_ids: Collection[str]) -> dict[str, str]:
        return {i: self._store.summaries[i].status for i in saga_ids if i in self._store.summaries}

    async def parked(self) -> list[OutboxView]:
        return []

    async def awaiting(self, participant: Participant, saga_id: str | None = None) -> list[AwaitingCommand]:
        return []

    async def awaiting_of(self, participants: Sequence[Participant]) -> dict[str, list[AwaitingCommand]]:
        return {participant.name: await self.awaiting(participant) for participant in participants}

    async def stuck_sagas(self, query: StuckQuery, limit: int) -> list[SagaSummaryRow]:
        rows = [s for s in self._store.summaries.values()
                if (s.status in query.statuses or (s.status in query.failing and s.step_failures >= query.min_failures))
                and (query.saga_type is None or s.saga_type == query.saga_type)
                and (query.since_ms is None or s.updated_at_ms >= query.since_ms)
                and (query.before_ms is None or s.updated_at_ms < query.before_ms)
                and (query.after is None or (s.updated_at_ms, s.saga_id) > query.after)]
        return sorted(rows, key=lambda s: (s.updated_at_ms, s.saga_id))[:limit]


def _quoted(name: str) -> str:
    """``schema.table`` as two quoted identifiers."""
    schema, _, table = name.partition(".")
    return f'"{schema.replace(chr(34), chr(34) * 2)}"."{table.replace(chr(34), chr(34) * 2)}"'
