"""The ``VerifyStore`` of ``saga verify`` (``operations.verify``): over Postgres (``PostgresVerify``: the
orchestrator's tables in one repeatable-read snapshot, every outbox of the database, the participants' declared
effect tables) and over a ``MemoryStore`` (``MemoryVerify``: no participant tables)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import asyncpg

from ....infra.db import check_identifier, datetime_to_ms
from ....operations.ports import TimerView, VerifySnapshot
from ....participants.kit.effects import count_effects, duplicate_effects
from ....participants.kit.participant import Participant
from ...ports import StoredEvent
from ..memory import MemoryStore
from ..postgres import SUMMARY_COLUMNS, summary_row


class PostgresVerify:
    """``VerifyStore`` over the orchestrator's tables in ``schema`` and the database's other outboxes."""

    def __init__(self, pool: asyncpg.Pool, schema: str = "saga") -> None:
        self._pool = pool
        self._s = check_identifier(schema)

    async def snapshot(self, saga_ids: Collection[str] | None) -> VerifySnapshot:
        args: list[object] = [] if saga_ids is None else [sorted(saga_ids)]
        where, key_where = ("WHERE saga_id = ANY($1)", "WHERE message_key = ANY($1)") if args else ("", "")
        found = VerifySnapshot()
        async with self._pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            found.now_ms = datetime_to_ms(await conn.fetchval("SELECT now()"))
            if not await conn.fetchval(f"SELECT to_regclass('{self._s}.events') IS NOT NULL"):
                return found  # nothing ran here yet
            for row in await conn.fetch(f"SELECT saga_id, seq, event_type, body, recorded_at FROM {self._s}.events"
                                        f" {where} ORDER BY saga_id, seq", *args):
                found.events.setdefault(row["saga_id"], []).append(StoredEvent(
                    row["saga_id"], row["seq"], row["event_type"], bytes(row["body"]),
                    datetime_to_ms(row["recorded_at"])))
            for row in await conn.fetch(f"SELECT {SUMMARY_COLUMNS} FROM {self._s}.saga_summary {where}", *args):
                found.summaries[row["saga_id"]] = summary_row(row)
            for row in await conn.fetch(f"SELECT saga_id, kind, step, attempt, due_at FROM {self._s}.timers {where}"
                                        " ORDER BY due_at", *args):
                found.timers.setdefault(row["saga_id"], []).append(
                    TimerView(row["kind"], row["step"], row["attempt"], datetime_to_ms(row["due_at"])))
            # Every outbox: the orchestrator's and each participant's (same table shape, one per schema).
            # Their parked rows too (refused by the broker: the saga's later rows wait behind them).
            outboxes = await conn.fetch("SELECT table_schema, table_name FROM information_schema.tables"
                                        " WHERE table_name IN ('outbox', 'outbox_parked') ORDER BY 1, 2")
            for schema, table in ((row["table_schema"], row["table_name"]) for row in outboxes):
                for row in await conn.fetch(f'SELECT message_key, count(*) AS n FROM "{schema}".{table}'
                                            f" {key_where} GROUP BY 1", *args):
                    found.outbox_rows.setdefault(row["message_key"], {})[f"{schema}.{table}"] = row["n"]
        return found

    async def count_effects(self, participants: Sequence[Participant], saga_id: str) -> dict[str, dict[str, int]]:
        return await count_effects(self._pool, participants, saga_id)

    async def duplicate_effects(self, participants: Sequence[Participant]) -> dict[str, dict[str, int]]:
        return await duplicate_effects(self._pool, participants)


class MemoryVerify:
    """``VerifyStore`` over a ``MemoryStore``: its outbox is ``saga.outbox``; no participant records an effect."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    async def snapshot(self, saga_ids: Collection[str] | None) -> VerifySnapshot:
        def wanted(saga_id: str) -> bool:
            return saga_ids is None or saga_id in saga_ids

        found = VerifySnapshot(now_ms=self._store.clock_ms())
        found.events = {i: list(events) for i, events in sorted(self._store.events.items()) if wanted(i) and events}
        found.summaries = {i: row for i, row in self._store.summaries.items() if wanted(i)}
        for timer in sorted(self._store.timers.values(), key=lambda t: t.due_at_ms):
            if wanted(timer.saga_id):
                found.timers.setdefault(timer.saga_id, []).append(
                    TimerView(timer.kind, timer.step, timer.attempt, timer.due_at_ms))
        for _, message in self._store.outbox:
            if wanted(message.key):
                rows = found.outbox_rows.setdefault(message.key, {})
                rows["saga.outbox"] = rows.get("saga.outbox", 0) + 1
        return found

    async def count_effects(self, participants: Sequence[Participant], saga_id: str) -> dict[str, dict[str, int]]:
        return {}

    async def duplicate_effects(self, participants: Sequence[Participant]) -> dict[str, dict[str, int]]:
        return {}
