"""The outbox row and its table: the DDL, and the one INSERT every writer uses.

A writer queues the Kafka records it wants published in the same transaction as its own changes; the relay
(``outbox.relay``) publishes the committed rows in id order and deletes them. The orchestrator's store and the
participant kit write their rows with ``insert_sql``, as a statement of its own or inside a larger one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from ..infra.db import check_identifier, check_table, ms_to_datetime


@dataclass(frozen=True)
class OutboxMessage:
    """A record for ``topic`` with Kafka key ``key``.

    ``message_id`` travels as the ``message_id`` header and stays the same if the relay publishes the row
    twice (after a crash), so consumers dedupe on it. ``available_at`` (epoch ms) delays publication until
    then; ``None`` means as soon as the transaction commits.
    """

    topic: str
    key: str
    value: bytes
    headers: dict[str, str]
    message_id: str
    available_at: int | None = None


def outbox_table_sql(schema: str) -> str:
    """DDL of ``<schema>.outbox`` and its ``<schema>.outbox_parked`` (idempotent: CREATE ... IF NOT EXISTS).

    The outbox is a queue (insert, publish, delete), so autovacuum is told to clean it early rather than
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
    created_at   timestamptz NOT NULL DEFAULT now(),
    shard        int         NOT NULL DEFAULT 0
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);
{parked_table_sql(schema)}{shards_sql(schema)}"""


def shards_sql(schema: str) -> str:
    """DDL of the outbox's shards (idempotent; adds them to a table made before them): the ``shard`` column of
    ``<schema>.outbox`` and ``<schema>.outbox_parked``, and ``<schema>.outbox_leases``, one row per shard a
    relay holds (``outbox.lease``)."""
    check_identifier(schema)
    return f"""
ALTER TABLE {schema}.outbox ADD COLUMN IF NOT EXISTS shard int NOT NULL DEFAULT 0;
ALTER TABLE {schema}.outbox_parked ADD COLUMN IF NOT EXISTS shard int NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS {schema}.outbox_leases (
    shard      int         PRIMARY KEY,
    holder     text        NOT NULL,
    epoch      bigint      NOT NULL,
    locked     boolean     NOT NULL,
    expires_at timestamptz NOT NULL
);
"""


def parked_table_sql(schema: str) -> str:
    """DDL of ``<schema>.outbox_parked``: rows the broker refused for good, with the reason. A row keeps its
    outbox id, so a requeued one goes back where it stood; while a key has a parked row, the relay holds that
    key's later rows back (their order kept) and publishes every other key's."""
    check_identifier(schema)
    return f"""
CREATE TABLE IF NOT EXISTS {schema}.outbox_parked (
    id           bigint      PRIMARY KEY,
    topic        text        NOT NULL,
    message_key  text        NOT NULL,
    value        bytea       NOT NULL,
    headers      jsonb       NOT NULL,
    message_id   text        NOT NULL,
    available_at timestamptz NOT NULL,
    created_at   timestamptz NOT NULL,
    parked_at    timestamptz NOT NULL DEFAULT now(),
    reason       text        NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_parked_key ON {schema}.outbox_parked (message_key);
"""


def parked_table(table: str) -> str:
    """The parked-rows table of outbox ``table`` (``<schema>.outbox`` -> ``<schema>.outbox_parked``)."""
    return f"{check_table(table)}_parked"


INSERT_PARAMETERS = 6
"""How many statement parameters ``insert_sql`` takes (the arrays of ``insert_params``)."""


def insert_sql(table: str, first_parameter: int = 1, shard_parameter: int | None = None) -> str:
    """An INSERT of the rows ``insert_params`` gives, from parameter ``$first_parameter`` on: one round trip
    whatever their number (the columns travel as arrays and unnest() zips them back into rows), ids in the
    given order (WITH ORDINALITY + ORDER BY), so the relay publishes them in that order. With
    ``shard_parameter``, that parameter is an int[] of the rows' shards (in their order); without, shard 0."""
    check_table(table)
    n = first_parameter
    shards = "0" if shard_parameter is None else f"(${shard_parameter}::int[])[ord]"
    return f"""INSERT INTO {table} (topic, message_key, value, headers, message_id, available_at, shard)
        SELECT topic, message_key, value, headers, message_id, coalesce(available_at, now()), {shards}
        FROM unnest(${n}::text[], ${n + 1}::text[], ${n + 2}::bytea[], ${n + 3}::jsonb[], ${n + 4}::text[],
                    ${n + 5}::timestamptz[])
             WITH ORDINALITY AS m(topic, message_key, value, headers, message_id, available_at, ord)
        ORDER BY ord"""


def insert_params(messages: Sequence[OutboxMessage]) -> list[list[Any]]:
    """The parameters of ``insert_sql`` for ``messages``, in their order."""
    return [
        [m.topic for m in messages],
        [m.key for m in messages],
        [m.value for m in messages],
        [orjson.dumps(m.headers).decode() for m in messages],
        [m.message_id for m in messages],
        [None if m.available_at is None else ms_to_datetime(m.available_at) for m in messages],
    ]


async def write_outbox(conn: asyncpg.Connection, table: str, messages: Sequence[OutboxMessage],
                       shards: Sequence[int] | None = None) -> None:
    """Insert ``messages`` into ``table`` in one statement, inside the caller's transaction, in ``shards``
    (one per message; all in shard 0 when not given).

    Rows get ids in ``messages`` order, and the relay publishes in id order, so messages of one key
    appear on Kafka in the order they were given here.
    """
    if not messages:
        return
    if shards is None:
        await conn.execute(insert_sql(table), *insert_params(messages))
    else:
        await conn.execute(insert_sql(table, 1, shard_parameter=INSERT_PARAMETERS + 1), *insert_params(messages),
                           list(shards))
