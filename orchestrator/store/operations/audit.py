"""The operator audit and a lever's writes (``operations.ports.AuditStore``, ``LeverStore``): the Postgres
adapter over ``<schema>.operator_audit`` and the orchestrator's outbox, and the memory adapter of the test kit."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import asyncpg

from ....infra.db import check_identifier, datetime_to_ms
from ....operations.ports import AuditEntry
from ....outbox.table import OutboxMessage, write_outbox
from ..memory import MemoryStore

TIMEOUT_S = 5.0  # an operator waits on these; a stuck database must not hang the page


class PostgresLevers:
    """``LeverStore`` on the orchestrator's database (``pool``), its tables in ``schema``."""

    def __init__(self, pool: asyncpg.Pool, schema: str = "saga") -> None:
        self._pool = pool
        self._audit = f"{check_identifier(schema)}.operator_audit"
        self._outbox = f"{schema}.outbox"

    async def record(self, entry: AuditEntry) -> None:
        await self._insert(self._pool, entry)

    async def entries(self, limit: int, before: int | None = None) -> list[AuditEntry]:
        # the place as an index condition on the primary key, so a deep page is read as cheaply as the first
        place, params = ("", [limit]) if before is None else ("WHERE id < $2", [limit, before])
        rows = await self._pool.fetch(
            f"SELECT id, at, operator, action, target, detail, outcome FROM {self._audit} {place}"
            " ORDER BY id DESC LIMIT $1", *params, timeout=TIMEOUT_S)
        return [AuditEntry(row["operator"], row["action"], row["target"], json.loads(row["detail"]), row["outcome"],
                           datetime_to_ms(row["at"]), row["id"]) for row in rows]

    async def queue_lever(self, entry: AuditEntry, commands: Sequence[OutboxMessage], shards: Sequence[int]) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            await self._insert(conn, entry)
            await write_outbox(conn, self._outbox, commands, shards)

    async def _insert(self, conn: asyncpg.Pool | asyncpg.Connection, entry: AuditEntry) -> None:
        await conn.execute(
            f"INSERT INTO {self._audit} (operator, action, target, detail, outcome) VALUES ($1, $2, $3, $4, $5)",
            entry.operator, entry.action, entry.target, json.dumps(dict(entry.detail), default=str), entry.outcome,
            timeout=TIMEOUT_S)


class MemoryLevers:
    """``LeverStore`` over a ``MemoryStore``: commands go into its outbox (``drain_outbox`` gives them), entries
    are kept here, timed by its clock. Like Postgres, it refuses text with a NUL character, writing nothing."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._entries: list[AuditEntry] = []

    async def record(self, entry: AuditEntry) -> None:
        self._entries.append(self._checked(entry))

    async def entries(self, limit: int, before: int | None = None) -> list[AuditEntry]:
        return [entry for entry in self._entries[::-1] if before is None or entry.entry_id < before][:limit]

    async def queue_lever(self, entry: AuditEntry, commands: Sequence[OutboxMessage], shards: Sequence[int]) -> None:
        checked = self._checked(entry)  # before anything is written: one transaction
        self._entries.append(checked)
        for command in commands:
            self._store.outbox.append((self._store.next_outbox_id, command))
            self._store.next_outbox_id += 1

    def _checked(self, entry: AuditEntry) -> AuditEntry:
        text = [entry.operator, entry.action, entry.target, entry.outcome,
                json.dumps(dict(entry.detail), default=str)]
        if any("\x00" in part or "\\u0000" in part for part in text):
            raise ValueError("the audit holds no NUL character (Postgres text and jsonb refuse it)")
        return dataclasses.replace(entry, at_ms=self._store.clock_ms(), entry_id=len(self._entries) + 1)
