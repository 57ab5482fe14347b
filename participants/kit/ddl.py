"""Tables every participant owns: the processed-command record, the outbox, and its business tables."""

from __future__ import annotations

import zlib

import asyncpg

from ...infra.db import MigrationsPending
from ...infra.roles import may_create_in
from ...outbox.table import outbox_table_sql
from .ledger import awaiting_commands_sql, processed_commands_sql
from .participant import Participant


def _lock_id(schema: str) -> int:
    # A stable 32-bit id: concurrent CREATE ... IF NOT EXISTS can still collide in the catalog,
    # so workers of one participant serialise their DDL on this advisory lock.
    return zlib.crc32(f"participant-ddl:{schema}".encode())


KIT_TABLES = ("processed_commands", "awaiting_commands", "outbox", "outbox_parked", "outbox_leases")
KIT_COLUMNS = (("outbox", "shard"), ("outbox_parked", "shard"), ("awaiting_commands", "shard"))
"""Columns the kit's tables gained after they were first made: a table made before lacks them until the DDL
runs again (at a start whose role may create, or ``saga migrate``)."""


async def ensure_participant_schema(pool: asyncpg.Pool, participant: Participant) -> None:
    """Create the participant's schema and tables if missing (idempotent, safe to run concurrently).

    A role that may not create in the schema (a least-privilege role, ``infra.roles``) creates nothing: it
    checks that the kit's tables and columns exist, made by ``saga migrate``, and MigrationsPending says so
    when not."""
    schema = participant.schema
    async with pool.acquire() as conn:
        if not await may_create_in(conn, schema):
            tables = [table for table in KIT_TABLES
                      if await conn.fetchval("SELECT to_regclass($1)", f"{schema}.{table}") is None]
            columns = [f"{table}.{column}" for table, column in KIT_COLUMNS if table not in tables
                       and not await conn.fetchval(
                           "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass($1)"
                           " AND attname = $2 AND NOT attisdropped)", f"{schema}.{table}", column)]
            if tables or columns:
                role = await conn.fetchval("SELECT current_user")
                missing = "; ".join(f"{kind} {', '.join(f'{schema}.{name}' for name in names)}"
                                    for kind, names in (("tables", tables), ("columns", columns)) if names)
                raise MigrationsPending(f"{missing} missing, and role {role} may not create them: run `saga migrate`"
                                        " with the DATABASE_URL of the migration role first")
            return
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _lock_id(schema))
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        await conn.execute(processed_commands_sql(schema))
        await conn.execute(awaiting_commands_sql(schema))
        await conn.execute(outbox_table_sql(schema))
        for statement in participant.business_ddl:
            await conn.execute(statement)
