"""Tables every participant owns: the processed-command record, the outbox, and its business tables."""

from __future__ import annotations

import zlib

import asyncpg

from ...outbox.table import outbox_table_sql
from .ledger import awaiting_commands_sql, processed_commands_sql
from .participant import Participant


def _lock_id(schema: str) -> int:
    # A stable 32-bit id: concurrent CREATE ... IF NOT EXISTS can still collide in the catalog,
    # so workers of one participant serialise their DDL on this advisory lock.
    return zlib.crc32(f"participant-ddl:{schema}".encode())


async def ensure_participant_schema(pool: asyncpg.Pool, participant: Participant) -> None:
    """Create the participant's schema and tables if missing (idempotent, safe to run concurrently)."""
    schema = participant.schema
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _lock_id(schema))
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        await conn.execute(processed_commands_sql(schema))
        await conn.execute(awaiting_commands_sql(schema))
        await conn.execute(outbox_table_sql(schema))
        for statement in participant.business_ddl:
            await conn.execute(statement)
