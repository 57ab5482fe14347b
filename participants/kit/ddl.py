"""Tables every participant owns: the processed-command record, the outbox, and its business tables."""

from __future__ import annotations

import zlib

import asyncpg

from ...outbox.table import outbox_table_sql
from .participant import Participant


def processed_commands_sql(schema: str) -> str:
    """DDL of ``<schema>.processed_commands``: one row per idempotency key that reached a final outcome.

    The recorded reply (status, error, output) is what a redelivered command gets back; transient
    failures never leave a row, so a later attempt does the work.
    """
    return f"""
CREATE TABLE IF NOT EXISTS {schema}.processed_commands (
    idempotency_key text PRIMARY KEY,
    saga_id text NOT NULL,
    step text NOT NULL,
    kind text NOT NULL,
    action text NOT NULL,
    attempt integer NOT NULL,
    status text NOT NULL,
    error_type text,
    error_message text,
    output bytea,
    processed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS processed_commands_saga_id_idx ON {schema}.processed_commands (saga_id);
CREATE INDEX IF NOT EXISTS processed_commands_processed_at_idx ON {schema}.processed_commands (processed_at);
"""


def awaiting_commands_sql(schema: str) -> str:
    """DDL of ``<schema>.awaiting_commands``: the commands whose handler deferred its answer, with what the
    answer needs (the latest attempt, the saga type, the causation id and trace context of the command)."""
    return f"""
CREATE TABLE IF NOT EXISTS {schema}.awaiting_commands (
    idempotency_key text PRIMARY KEY,
    saga_id text NOT NULL,
    saga_type text NOT NULL,
    step text NOT NULL,
    kind text NOT NULL,
    action text NOT NULL,
    attempt integer NOT NULL,
    command_message_id text NOT NULL,
    traceparent text,
    deferred_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS awaiting_commands_saga_id_idx ON {schema}.awaiting_commands (saga_id);
"""


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
