"""The ``SignalStore`` of the orchestrator's table signals (``orchestrator.signals``): over the orchestrator's
schema (``PostgresSignals``, every read under ``SIGNALS_TIMEOUT_S`` on tables that hold live work only) and over a
``MemoryStore`` (``MemorySignals``)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import asyncpg

from ....infra.db import check_identifier
from ....operations.ports import RetryTimer
from ....outbox.depth import SIGNALS_TIMEOUT_S
from ...ports import StoredEvent
from ..memory import MemoryStore
from .reads import MemoryReads, PostgresReads


class PostgresSignals:
    """``SignalStore`` over the orchestrator's tables in ``schema``."""

    def __init__(self, pool: asyncpg.Pool, schema: str = "saga") -> None:
        self._pool = pool
        self._s = check_identifier(schema)
        self._events = PostgresReads(pool, schema, SIGNALS_TIMEOUT_S)

    async def overdue_timers(self) -> tuple[int, float]:
        row = await self._pool.fetchrow(
            f"SELECT count(*) AS n, coalesce(extract(epoch FROM now() - min(due_at)), 0) AS age_s"
            f" FROM {self._s}.timers WHERE due_at <= now()", timeout=SIGNALS_TIMEOUT_S)
        assert row is not None
        return int(row["n"]), max(0.0, float(row["age_s"]))

    async def oldest_running(self) -> dict[str, float]:
        rows = await self._pool.fetch(
            f"SELECT saga_type, extract(epoch FROM now() - min(started_at)) AS age_s"
            f" FROM {self._s}.saga_summary WHERE status = 'RUNNING' GROUP BY saga_type", timeout=SIGNALS_TIMEOUT_S)
        return {row["saga_type"]: max(0.0, float(row["age_s"])) for row in rows}

    async def retry_timers(self, kinds: Sequence[str], timeout_kind: str, limit: int) -> list[RetryTimer]:
        rows = await self._pool.fetch(
            f"""SELECT t.saga_id, t.step, s.saga_type FROM {self._s}.timers t
                JOIN {self._s}.saga_summary s ON s.saga_id = t.saga_id
                WHERE t.kind = ANY($1::text[]) OR (t.kind = $2 AND t.attempt > 1)
                ORDER BY t.due_at LIMIT $3""", list(kinds), timeout_kind, limit, timeout=SIGNALS_TIMEOUT_S)
        return [RetryTimer(row["saga_id"], row["saga_type"], row["step"]) for row in rows]

    async def events_of(self, saga_ids: Collection[str], event_types: Collection[str]) -> list[StoredEvent]:
        return await self._events.events_of(saga_ids, event_types)


class MemorySignals:
    """``SignalStore`` over a ``MemoryStore`` (its clock is the database's ``now()``)."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._events = MemoryReads(store)

    async def overdue_timers(self) -> tuple[int, float]:
        now_ms = self._store.clock_ms()
        due = [t.due_at_ms for t in self._store.timers.values() if t.due_at_ms <= now_ms]
        return len(due), (now_ms - min(due)) / 1000 if due else 0.0

    async def oldest_running(self) -> dict[str, float]:
        now_ms = self._store.clock_ms()
        oldest: dict[str, float] = {}
        for row in self._store.summaries.values():
            if row.status == "RUNNING":
                age_s = max(0.0, (now_ms - row.started_at_ms) / 1000)
                oldest[row.saga_type] = max(oldest.get(row.saga_type, 0.0), age_s)
        return oldest

    async def retry_timers(self, kinds: Sequence[str], timeout_kind: str, limit: int) -> list[RetryTimer]:
        timers = sorted((t for t in self._store.timers.values()
                         if (t.kind in kinds or (t.kind == timeout_kind and t.attempt > 1))
                         and t.saga_id in self._store.summaries), key=lambda t: t.due_at_ms)
        return [RetryTimer(t.saga_id, self._store.summaries[t.saga_id].saga_type, t.step) for t in timers[:limit]]

    async def events_of(self, saga_ids: Collection[str], event_types: Collection[str]) -> list[StoredEvent]:
        return await self._events.events_of(saga_ids, event_types)
