"""Writing outbox rows inside the caller's transaction, and the outbox table's DDL."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import orjson

from ..infra.db import check_identifier, check_table, ms_to_datetime
from .message import OutboxMessage


def outbox_table_sql(schema: str) -> str:
    """DDL of ``<schema>.outbox`` (idempotent: CREATE ... IF NOT EXISTS).

    The table is a queue (insert, publish, delete), so autovacuum is told to clean it early rather than
    after the default 20% of dead rows.
    """
    check_identifier(schema)
    return f"""
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.outbox (
    id           bigserial   PRIMARY KEY,
    topic        text        NOT NULL,
    message_key  text        NOT NULL,
    value        bytea       NOT NULL,
    headers      jsonb       NOT NULL,
    message_id   text        NOT NULL,
    available_at timestamptz NOT NULL DEFAULT now(),
    created_at   timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);
"""


async def write_outbox(conn: asyncpg.Connection, table: str, messages: Sequence[OutboxMessage]) -> None:
    """Insert ``messages`` into ``table`` in one statement, inside the caller's transaction.

    Rows get ids in ``messages`` order, and the relay publishes in id order, so messages of one key
    appear on Kafka in the order they were given here.
    """
    if not messages:
        return
    check_table(table)
    # One round trip whatever the batch size: the columns travel as arrays and unnest() zips them back
    # into rows; WITH ORDINALITY + ORDER BY keeps the id order equal to the list order.
    await conn.execute(
        f"""
        INSERT INTO {table} (topic, message_key, value, headers, message_id, available_at)
        SELECT topic, message_key, value, headers, message_id, coalesce(available_at, now())
        FROM unnest($1::text[], $2::text[], $3::bytea[], $4::jsonb[], $5::text[], $6::timestamptz[])
             WITH ORDINALITY AS m(topic, message_key, value, headers, message_id, available_at, ord)
        ORDER BY ord
        """,
        [m.topic for m in messages],
        [m.key for m in messages],
        [m.value for m in messages],
        [orjson.dumps(m.headers).decode() for m in messages],
        [m.message_id for m in messages],
        [None if m.available_at is None else ms_to_datetime(m.available_at) for m in messages],
    )
